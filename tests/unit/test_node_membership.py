"""The member table: merge rules that make gossip order irrelevant, and the failure detector."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gwtf.node.control.membership import (
    MemberInfo,
    Membership,
    State,
    member_capacity,
    own_share_gbps,
    relay_share_gbps,
)

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


# ---------------------------------------------------------------- partial views


def swarm_of(n: int, clock: Clock) -> dict[str, Membership]:
    """n tables that all know each other, as after their joins."""
    infos = [member(f"n{i:03d}") for i in range(n)]
    tables = {}
    for i, info in enumerate(infos):
        t = Membership(
            info, clock, failure_timeout_s=TIMEOUT, ping_interval_s=0.5, tombstone_s=60.0,
            rng=np.random.default_rng(i),
        )  # fmt: skip
        t.merge(infos)
        t.forget_news()
        tables[info.id] = t
    return tables


def call(tables: dict[str, Membership], caller: str, callee: str) -> None:
    """One push-pull, as gwtf.node.control.membercontrol does it (the wire left out)."""
    a, b = tables[caller], tables[callee]
    events, answer = b.incoming(caller, a.outgoing(callee))
    a.merge(answer.members)


def period(tables: dict[str, Membership], clock: Clock, dead: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Every live table's heartbeat period: beat, check, call its partners."""
    clock.now += 0.5
    for node_id, t in tables.items():
        if node_id in dead:
            continue
        t.beat()
        _, to_ping = t.check()
        partners = {m.id for m in (*t.targets(3), *t.watch_targets(), *to_ping)}
        for p in sorted(partners - dead):
            call(tables, node_id, p)


def test_a_message_stays_bounded_whatever_the_size_of_the_swarm() -> None:
    clock = Clock()
    tables = swarm_of(200, clock)
    t = tables["n000"]
    assert len(t.digest()) == 200  # the whole table is still there for joiners
    watched = {m.id for m in t.watched()}
    assert len(watched) == t.watch
    stranger = next(i for i in sorted(tables) if i not in watched and i != "n000")
    quiet = t.outgoing(stranger)
    assert [m.id for m in quiet.members] == ["n000"] and not quiet.spreading
    to_neighbour = t.outgoing(sorted(watched)[0])
    assert 1 < len(to_neighbour.members) <= 1 + t.watch  # itself and the other neighbours
    # A burst of changes: the message grows to the piggyback bound, no further.
    t.merge([replace(member(f"n{i:03d}"), state=State.DEAD) for i in range(100, 150)])
    burst = t.outgoing(stranger)
    assert burst.spreading and len(burst.members) == 1 + t.piggyback


def test_watching_is_a_symmetric_ring_and_only_the_watched_are_timed_out() -> None:
    clock = Clock()
    tables = swarm_of(30, clock)
    for node_id, t in tables.items():
        for m in t.watched():
            assert node_id in {w.id for w in tables[m.id].watched()}
    t = tables["n000"]
    watched = {m.id for m in t.watched()}
    events = checks_until(t, clock, TIMEOUT)  # nobody heard from: only the watched time out
    assert {e.member.id for e in events} == watched and all(e.kind == "dead" for e in events)
    assert len(t.alive()) == 29 - len(watched)


def test_a_member_newly_watched_is_silent_from_when_watching_starts() -> None:
    clock = Clock()
    tables = swarm_of(12, clock)
    t = tables["n000"]
    before = {m.id for m in t.watched()}
    clock.now = 100.0  # long after anything was heard: nobody's silence matters unwatched
    neighbour = sorted(before)[0]
    t.leave(neighbour, 1)  # the ring moves: someone else becomes watched
    new = {m.id for m in t.watched()} - before
    assert len(new) == 1
    assert t.silence(new.pop()) == 0.0
    assert [e for e in t.check()[0] if e.member.id not in before] == []


def test_a_death_reaches_everyone_and_the_messages_stop() -> None:
    clock = Clock()
    tables = swarm_of(40, clock)
    victim = "n017"
    tables["n003"].refused(victim, 1)  # too early: heard from recently
    assert all(t.is_alive(victim, 1) for t in tables.values() if t.me.id != victim)
    for _ in range(int(TIMEOUT / 0.5) + 8):
        period(tables, clock, dead={victim})
    survivors = [t for i, t in tables.items() if i != victim]
    assert all(not t.is_alive(victim, 1) for t in survivors)
    assert all(len(t.alive()) == 38 for t in survivors)
    assert len({t.view_hash() for t in survivors}) == 1
    for _ in range(20):  # the news dies out: messages are back to their quiet size
        period(tables, clock, dead={victim})
    assert not any(t.spreading for t in survivors)


def test_digests_that_still_differ_when_quiet_bring_the_whole_table() -> None:
    # a missed nothing; b missed x's death, and the news of it is no longer spreading.
    clock = Clock()
    a, b = table(clock, me="a"), table(clock, me="b")
    a.merge([member("b"), replace(member("x"), state=State.DEAD)])
    b.merge([member("a"), member("x")])
    a.forget_news()
    b.forget_news()
    _, answer = b.incoming("a", a.outgoing("b"))  # b's digest differs: its whole table
    assert {m.id for m in answer.members} == {"b", "a", "x"} and not answer.spreading
    assert a.merge(answer.members) == []  # x's death is final: b's old entry changes nothing
    _, answer = a.incoming("b", b.outgoing("a"))  # and a's whole table carries the death
    assert kinds(b.merge(answer.members)) == [("dead", "x")]
    assert a.view_hash() == b.view_hash()
    # While a change is spreading, a differing digest is expected: only the bounded lists.
    b.merge([member("z")])
    assert b.spreading and a.view_hash() != b.view_hash()
    _, answer = a.incoming("b", b.outgoing("a"))
    assert a.get("z") is not None  # the change itself travelled in b's list
    assert "x" not in {m.id for m in answer.members}  # not a's whole table (x's tombstone)


def test_a_joiner_is_spread_by_the_node_that_let_it_in_not_the_joiner() -> None:
    clock = Clock()
    tables = swarm_of(50, clock)
    joiner = table(clock, me="new")
    bootstrap = tables["n000"]
    assert kinds(bootstrap.merge([joiner.me])) == [("alive", "new")]
    joiner.merge(bootstrap.digest())  # the join reply
    joiner.forget_news()  # as the node does when it starts
    assert not joiner.spreading and bootstrap.spreading
    tables["new"] = joiner
    for _ in range(12):
        period(tables, clock)
    assert all(t.get("new") is not None for t in tables.values())
    assert len(joiner.alive()) == 50


def test_an_unwatched_member_is_declared_dead_by_two_refusals_periods_apart() -> None:
    clock = Clock()
    tables = swarm_of(20, clock)
    t = tables["n000"]
    watched = {m.id for m in t.watched()}
    x, y = [i for i in sorted(tables) if i not in watched and i != "n000"][:2]
    checks_until(t, clock, TIMEOUT - 1.0)  # silent to this node, not yet timed out
    assert t.refused(x, 1) == [] and t.refused(x, 1) == []  # one reset seen by two calls
    events, to_ping = t.check()
    assert events == [] and x in {m.id for m in to_ping}  # confirm it with a call of ours
    events = t.refused(x, 1)
    assert kinds(events) == [("dead", x)] and "two calls" in events[0].reason
    # A member that answers between two refusals is not doubted any more.
    assert t.refused(y, 1) == []
    t.check()
    t.merge([member(y, heartbeat=1)])
    t.check()
    assert t.refused(y, 1) == [] and t.is_alive(y, 1)


def test_two_sides_of_a_healed_partition_hear_of_each_other_through_their_dead() -> None:
    # w and e each declared the other dead while cut apart; nobody gossips with the dead, so
    # each calls the dead it holds now and then (reconnect_target): the answer carries the
    # other side's verdict, and each hears that it must come back as a new incarnation.
    clock = Clock()
    w, e = table(clock, me="w"), table(clock, me="e")
    w.merge([replace(member("e"), state=State.DEAD), replace(member("gone"), state=State.LEFT)])
    e.merge([replace(member("w"), state=State.DEAD)])
    w.forget_news()
    e.forget_news()
    assert w.targets(3) == [] and e.targets(3) == []  # neither calls the other any more
    # The dead, not those that left.
    assert {w.reconnect_target().id for _ in range(3)} == {"e"}  # type: ignore[union-attr]
    assert table(clock).reconnect_target() is None  # no tombstone, nobody to call
    _, answer = e.incoming("w", w.outgoing("e"))  # w's call to e gets through the heal
    assert w.merge(answer.members) == [] and w.declared_dead
    _, answer = w.incoming("e", e.outgoing("w"))
    assert e.merge(answer.members) == [] and e.declared_dead


def test_a_measured_pace_is_a_new_revision_that_gossip_carries() -> None:
    """A node's pace (gwtf.flow.pace) changes its compute time and capacity in its record, as a
    new revision; a peer takes it from gossip only from a newer revision, whatever the order."""
    clock = Clock()
    a, b = table(clock, "a"), table(clock, "b")
    a.merge([b.me])
    b.merge([a.me])
    assert not a.set_pace(0.1, 10.0)  # what it says already: no new revision
    assert a.set_pace(0.4, 2.5)
    assert (a.me.compute_s, a.me.capacity, a.me.revision) == (0.4, 2.5, 1)
    events = b.merge([a.me])
    assert kinds(events) == [("links", "a")]
    assert (b.get("a").compute_s, b.get("a").capacity) == (0.4, 2.5)  # type: ignore[union-attr]
    stale = replace(a.me, compute_s=0.1, capacity=10.0, revision=0, heartbeat=7)
    assert b.merge([stale]) == []  # an older revision moves the heartbeat, not the pace
    assert b.get("a").compute_s == 0.4  # type: ignore[union-attr]
    assert b.view_hash() != table(clock, "b").view_hash()


def test_a_declared_uplink_bounds_a_members_capacity() -> None:
    """Every microbatch crosses a node's uplink once per neighbouring stage: 256 KiB activations
    through a middle stage's 10 Mbit/s uplink, 10e6 / (2 * 2 ** 21) microbatches/s, below its
    compute's 12.5; an edge stage crosses it once; no uplink said, no bound."""
    act = 2**18
    assert member_capacity(0.08, 1, 0.01, 3, act) == pytest.approx(0.01e9 / (2 * act * 8))
    assert member_capacity(0.08, 0, 0.01, 3, act) == pytest.approx(0.01e9 / (act * 8))
    assert member_capacity(0.08, 1, 0.0, 3, act) == pytest.approx(12.5)
    assert member_capacity(0.08, 1, 1.0, 3, act) == pytest.approx(12.5)


def test_a_relayed_member_counts_on_its_share_of_its_relay_s_uplink() -> None:
    """docs/design.md 3.11: the relay's uplink carries what comes to a member it relays (the
    same boundaries' bytes as the member's own uplink sends), shared evenly with the relay's own
    traffic and the other members it relays; no relay, or one that declared no uplink: no bound."""
    act = 2**18
    relay = replace(member("r"), uplink_gbps=0.02)
    me = replace(member("x", stage=1), relay="r")
    other = replace(member("y", stage=1), relay="r")
    # r relays x and y: a third of its 20 Mbit/s each, and a third for its own traffic.
    share = relay_share_gbps(me, [relay, other])
    assert share == pytest.approx(0.02 / 3)
    bound = member_capacity(0.08, 1, 1.0, 3, act, relay_gbps=share)
    assert bound == pytest.approx(share * 1e9 / (2 * act * 8))
    assert bound < member_capacity(0.08, 1, 1.0, 3, act)
    assert relay_share_gbps(replace(me, relay=""), [relay]) == 0.0
    assert relay_share_gbps(me, [replace(relay, uplink_gbps=0.0)]) == 0.0
    assert relay_share_gbps(me, []) == 0.0  # its relay not known (yet): no bound
    # The relay itself keeps a third of its uplink for its own traffic, all of it once it
    # relays for none; no uplink declared, nothing to share.
    assert own_share_gbps(relay, [me, other]) == pytest.approx(0.02 / 3)
    assert own_share_gbps(relay, []) == 0.02
    assert own_share_gbps(replace(relay, uplink_gbps=0.0), [me, other]) == 0.0
