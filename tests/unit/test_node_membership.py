"""The member table: merge rules that make gossip order irrelevant, and the failure detector."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gwtf.node.membership import MemberInfo, Membership, State

TIMEOUT = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def member(node_id: str, epoch: int = 1, heartbeat: int = 0, stage: int = 0) -> MemberInfo:
    return MemberInfo(node_id, f"h:{node_id}", stage, "", 0.1, 10.0, epoch, heartbeat)


def table(clock: Clock, me: str = "me") -> Membership:
    return Membership(
        member(me),
        clock,
        failure_timeout_s=TIMEOUT,
        ping_interval_s=0.5,
        tombstone_s=60.0,
        rng=np.random.default_rng(0),
    )


def kinds(events: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(e.kind, e.member.id) for e in events]


def checks_until(t: Membership, clock: Clock, until: float, every: float = 0.5) -> list:  # type: ignore[type-arg]
    """Check every ping interval up to `until`, as the node's heartbeat loop does; the events."""
    events = []
    while clock.now + every <= until + 1e-9:
        clock.now += every
        events += t.check()[0]
    return events


def test_new_members_and_heartbeats() -> None:
    clock = Clock()
    t = table(clock)
    assert kinds(t.merge([member("a"), member("b")])) == [("alive", "a"), ("alive", "b")]
    assert t.merge([member("a")]) == []  # nothing new
    clock.now = 3.0
    t.merge([member("a", heartbeat=5)])
    assert t.silence("a") == 0.0 and t.silence("b") == 3.0
    t.merge([member("a", heartbeat=2)])  # an old rumour: no progress
    assert t.get("a").heartbeat == 5  # type: ignore[union-attr]


def test_merge_order_does_not_matter() -> None:
    updates = [
        member("a", epoch=1, heartbeat=3),
        replace(member("a", epoch=1, heartbeat=4), state=State.DEAD),
        member("a", epoch=2, heartbeat=1),
        member("b", epoch=1, heartbeat=9),
        replace(member("b", epoch=1), state=State.LEFT),
    ]
    results = set()
    for seed in range(20):
        order = np.random.default_rng(seed).permutation(len(updates))
        t = table(Clock())
        for i in order:
            t.merge([updates[i]])
        results.add(tuple((m.id, m.epoch, m.state) for m in (*t.alive(), *t.departed())))
    assert results == {(("a", 2, State.ALIVE), ("b", 1, State.LEFT))}


def test_a_new_incarnation_replaces_the_old_one() -> None:
    t = table(Clock())
    t.merge([member("a", epoch=1)])
    events = t.merge([member("a", epoch=7)])
    assert [(e.kind, e.member.epoch) for e in events] == [("dead", 1), ("alive", 7)]
    assert t.merge([member("a", epoch=3)]) == []  # older than what we know


def test_silence_declares_dead_after_the_timeout() -> None:
    clock = Clock()
    t = table(clock)
    t.merge([member("a")])
    assert checks_until(t, clock, TIMEOUT / 2 - 0.5) == []
    clock.now = TIMEOUT / 2 - 0.01
    assert t.check() == ([], [])
    clock.now = TIMEOUT / 2
    events, ping = t.check()
    assert events == [] and [m.id for m in ping] == ["a"]  # half the timeout: call it
    assert t.check() == ([], [])  # not again before the ping interval
    assert checks_until(t, clock, TIMEOUT - 0.5) == []
    clock.now = TIMEOUT
    events, _ = t.check()
    assert kinds(events) == [("dead", "a")] and "no heartbeat" in events[0].reason
    assert t.alive() == [] and t.check() == ([], [])  # declared once


def test_a_refused_call_declares_dead_only_after_half_the_timeout() -> None:
    clock = Clock()
    t = table(clock)
    t.merge([member("a")])
    clock.now = 0.5
    assert t.refused("a", 1) == []  # a blip: the heartbeats are fresh
    clock.now = TIMEOUT / 2 + 0.1
    assert t.refused("a", 2) == []  # another incarnation
    events = t.refused("a", 1)
    assert kinds(events) == [("dead", "a")] and "refused" in events[0].reason


def test_dead_and_left_are_final_within_an_epoch_and_spread() -> None:
    clock = Clock()
    t = table(clock)
    t.merge([member("a"), member("b")])
    assert kinds(t.leave("a", 1)) == [("left", "a")]
    assert t.leave("a", 1) == []
    assert t.merge([member("a", heartbeat=50)]) == []  # no coming back in the same epoch
    other = table(clock, me="x")
    other.merge([member("a"), member("b")])
    events = other.merge(t.digest())  # the verdict travels by gossip
    assert set(kinds(events)) == {("left", "a"), ("alive", "me")}


def test_a_member_hearing_of_its_own_death_must_come_back_anew() -> None:
    t = table(Clock())
    t.merge([replace(member("me"), state=State.DEAD)])
    assert t.declared_dead
    t.reincarnate(2)
    assert not t.declared_dead and t.me.epoch == 2 and t.me.heartbeat == 0


def test_digest_leaves_out_the_silent_and_tombstones_expire() -> None:
    clock = Clock()
    t = table(clock)
    t.merge([member("a"), member("b")])
    checks_until(t, clock, TIMEOUT / 2)
    t.merge([member("b", heartbeat=1)])
    assert [m.id for m in t.digest()] == ["me", "b"]  # a's last entry stops spreading
    checks_until(t, clock, TIMEOUT)
    assert [m.id for m in t.departed()] == ["a"]
    checks_until(t, clock, TIMEOUT + 61)
    assert t.get("a") is None  # forgotten; b died later and is still remembered
    assert [m.id for m in t.departed()] == ["b"]


def test_gossip_targets_cover_everyone_round_robin() -> None:
    t = table(Clock())
    t.merge([member(f"n{i}") for i in range(7)])
    seen: list[str] = []
    for _ in range(7):
        picks = t.targets(3)
        assert len({m.id for m in picks}) == 3
        seen += [m.id for m in picks]
    counts = {i: seen.count(i) for i in set(seen)}
    assert set(counts) == {f"n{i}" for i in range(7)} and max(counts.values()) == 3


def test_view_hash_names_the_live_incarnations() -> None:
    a, b = table(Clock()), table(Clock())
    for t in (a, b):
        t.merge([member("x"), member("y")])
    assert a.view_hash() == b.view_hash()
    b.merge([member("y", epoch=2)])
    assert a.view_hash() != b.view_hash()


def test_a_node_that_stalled_does_not_hold_its_stall_against_the_others() -> None:
    # Its checks stop for longer than the timeout (its process was starved); when they resume,
    # a member that was heard from just before the stall is not declared dead, and is declared
    # once it has been silent for a whole timeout of this node listening.
    clock = Clock()
    t = table(clock)
    t.merge([member("a")])
    assert checks_until(t, clock, 1.0) == []
    t.merge([member("a", heartbeat=1)])  # heard from at 1.0, the last check before the stall
    clock.now = 1.0 + TIMEOUT + 2.0  # no check for 6 s
    assert t.check()[0] == []
    assert kinds(checks_until(t, clock, clock.now + TIMEOUT - 1.0)) == []
    assert kinds(checks_until(t, clock, clock.now + 1.0)) == [("dead", "a")]


def test_checks_on_time_declare_at_the_timeout() -> None:
    # The same member silent, checks every ping interval: declared at the timeout, not later.
    clock = Clock()
    t = table(clock)
    t.merge([member("a")])
    assert checks_until(t, clock, TIMEOUT - 0.5) == []
    assert kinds(checks_until(t, clock, TIMEOUT)) == [("dead", "a")]
