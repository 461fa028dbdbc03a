"""The split-brain rule (gwtf.job.quorum) and the coordinator's use of it
(IterationCoordinator.commit_order), with no I/O: a partition leaves at most one side that
commits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gwtf.job.iterations import IterationCoordinator, PreparedReport, StepOrder
from gwtf.job.quorum import commit_quorum
from gwtf.recovery import CrashPlan

SEVEN = {"h0": 0, "a0": 1, "z0": 2, "a2": 1, "h1": 0, "a1": 1, "z1": 2}
WEST = {"h0", "a0", "z0", "a2"}
EAST = {"h1", "a1", "z1"}


def test_a_strict_majority_of_the_voters_commits() -> None:
    assert commit_quorum(SEVEN, WEST).ok
    verdict = commit_quorum(SEVEN, EAST)
    assert not verdict.ok and (verdict.voters, verdict.present) == (7, 3)
    assert verdict.silent == ("a0", "a2", "h0", "z0")
    assert "only 3 of the 7 members of the last commit" in verdict.reason()
    assert "\n" not in verdict.reason() and commit_quorum(SEVEN, WEST).reason() == ""
    # Half is not a majority: two halves of an even base must not both commit.
    assert not commit_quorum({"a", "b", "c", "d"}, {"a", "b"}).ok


def test_members_shown_dead_do_not_vote_and_joiners_do_not_either() -> None:
    # A SIGKILL is refused at its address: the east's nodes shown dead, the west goes on...
    assert commit_quorum(SEVEN, {"h0", "a0", "z0"}, gone={"a2", "h1", "a1", "z1"}).ok
    # ...and a survivor of a mass kill goes on alone once the others are shown dead.
    assert commit_quorum(SEVEN, {"h1"}, gone=SEVEN.keys() - {"h1"}).ok
    assert not commit_quorum(SEVEN, EAST | {"j0", "j1", "j2"}).ok  # joiners hold no vote
    assert commit_quorum({"a"}, {"j"}, gone={"a"}).ok  # no voter left: nobody else commits


@given(
    st.sets(st.sampled_from([f"n{i}" for i in range(9)]), min_size=1),
    st.data(),
)
def test_two_sides_of_a_partition_never_both_hold_a_quorum(
    base: set[str], data: st.DataObject
) -> None:
    nodes = sorted(base)
    dead = data.draw(st.sets(st.sampled_from(nodes)))
    alive = [n for n in nodes if n not in dead]
    west = data.draw(st.sets(st.sampled_from(alive))) if alive else set()
    east = set(alive) - west
    # Each side can show dead only nodes that are dead (their address refuses calls).
    gone_w = data.draw(st.sets(st.sampled_from(nodes))) & dead if dead else set()
    gone_e = data.draw(st.sets(st.sampled_from(nodes))) & dead if dead else set()
    both = commit_quorum(base, west, gone_w).ok and commit_quorum(base, east, gone_e).ok
    assert not (both and west and east), (base, dead, west, gone_w, gone_e)


def coordinator(participants: dict[str, int]) -> IterationCoordinator:
    return IterationCoordinator(iterations=3, microbatches=2, participants=participants,
                                num_stages=3, holders=("h0",) if "h0" in participants
                                else ("h1",))  # fmt: skip


def down(c: IterationCoordinator, node: str) -> None:
    """`node` dies and the coordinator plans its recovery (nothing to recover here), as the
    node's coordinator does before it orders another commit."""
    stage = c.participants[node]
    c.member_down(node)
    c.recovering(CrashPlan(node, stage, (), frozenset()))


def step(c: IterationCoordinator) -> StepOrder:
    """Finish and commit the iteration in progress with every live participant."""
    holder = c.holders[0]
    c.done(holder, c.injecting, c.round, [0, 1])
    order = c.commit_order()
    assert order is not None
    out = None
    for node, stage in sorted(order.members.items()):
        first = min(n for n, s in order.members.items() if s == stage)
        ids = frozenset({0, 1}) if node == first else frozenset()
        last = stage == 2
        out = c.prepared(PreparedReport(
            node, c.injecting, c.round, order.attempt, stage, ids,
            losses={m: 1.0 for m in ids} if last else {},
            routes={("h", "a", "z"): len(ids)} if last and ids else {},
        )) or out
    assert isinstance(out, StepOrder), out
    return out


def test_each_side_of_a_partition_sees_the_other_dead_and_only_the_majority_commits() -> None:
    west, east = coordinator(SEVEN), coordinator(SEVEN)
    for node in EAST:
        down(west, node)
    for node in WEST:
        down(east, node)
    assert step(west).participants.keys() == WEST
    assert east.commit_order() is None  # 3 of 7: the east pauses, whatever its work
    assert "only 3 of the 7" in east.quorum().reason()
    # The west's next commits count against the west alone: losing one of four leaves 3 of 4.
    assert west.base == WEST
    down(west, "a2")
    assert step(west).iteration == 1
    assert west.base == WEST - {"a2"}
    down(west, "a0")
    down(west, "z0")
    assert west.commit_order() is None  # 1 of 3 silent ones... until they are shown dead
    west.admit("a9", 1)
    west.admit("z9", 2)
    west.shown_gone("a0")
    west.shown_gone("z0")
    assert step(west).iteration == 2
