"""Stage snapshots and rollbacks (gwtf.job.snapshots, IterationCoordinator.rollback), with no
I/O: docs/design.md 4.6."""

import pytest

from gwtf.job.iterations import (
    CommittedReport,
    IterationCoordinator,
    PreparedReport,
    ReportError,
    StepOrder,
)
from gwtf.job.snapshots import (
    LAUNCH_WINDOW_S,
    Boundaries,
    SnapshotPolicy,
    declare_due,
    keeper_keeps,
    own_kept,
    restore_point,
    snapshot_keepers,
    snapshot_landed,
    snapshot_sender,
)

PARTICIPANTS = {"h0": 0, "a0": 1, "a1": 1, "z0": 2}


def test_periodic_boundaries_thin_stages_and_the_sender() -> None:
    policy = SnapshotPolicy(every=4, thin=2, start=2)
    assert [k for k in range(2, 11) if policy.periodic(k)] == [2, 4, 8]
    assert [policy.last_periodic(k) for k in (2, 3, 4, 7, 8)] == [2, 2, 4, 4, 8]
    assert policy.due(5, live_replicas=2) and not policy.due(5, live_replicas=3)
    assert policy.due(8, live_replicas=3)
    alive = {"a0", "a1", "z0"}.__contains__
    assert snapshot_sender(PARTICIPANTS, set(), 1, alive) == ("a0", 2)
    assert snapshot_sender(PARTICIPANTS, {"a0"}, 1, alive) == ("a1", 1)
    assert snapshot_sender(PARTICIPANTS, set(), 1, lambda p: False) == ("", 0)


def test_declared_boundaries_come_one_at_a_time_after_the_last_landed_everywhere() -> None:
    policy = SnapshotPolicy(every=2, thin=0, start=1, declared=())
    landed: set[int] = {1}
    # Not before `every` iterations since the latest (the job's start counts as one).
    assert not declare_due(policy, 1, landed.__contains__)
    assert not declare_due(policy, 2, landed.__contains__)
    assert declare_due(policy, 3, landed.__contains__)
    policy = policy.declare(3)
    assert [k for k in range(1, 12) if policy.periodic(k)] == [1, 3]
    # The snapshot of 3 has not landed at every stage yet: no new boundary, however long it
    # takes; the nodes keep their own state of 1 and 3 meanwhile.
    assert not any(declare_due(policy, k, landed.__contains__) for k in range(4, 12))
    assert own_kept(policy, 9, landed=False) == {1, 3}
    assert policy.last_periodic(9) == 3 and policy.previous_periodic(3) == 1
    landed.add(3)
    assert declare_due(policy, 9, landed.__contains__)
    policy = policy.declare(9)
    assert own_kept(policy, 10, landed=True) == {9}
    assert restore_point(policy, 10, kept={3}, held=own_kept(policy, 10, landed=False)) == 3
    # A rollback to 3 forgets the boundaries after it.
    assert policy.undo(3).declared == (3,) and policy.undo(3).last_periodic(9) == 3
    # A snapshot of 9 that can never land (every node of a stage that kept its own state of 9
    # died): 13 is declared over it, and the nodes keep 13 and 3, the newest landed everywhere.
    assert not declare_due(policy, 13, landed.__contains__)
    assert declare_due(policy, 13, landed.__contains__, stuck=True)
    assert not declare_due(policy, 10, landed.__contains__, stuck=True)  # `every` still holds
    policy = policy.declare(13)
    assert own_kept(policy, 14, floor=3) == {13, 3} and own_kept(policy, 14, floor=13) == {13}
    assert restore_point(policy, 14, kept={9, 3}, held=own_kept(policy, 14, floor=3)) == 3
    # Undeclared, every `every`-th boundary, as before.
    assert SnapshotPolicy(every=2, thin=0).undo(0).periodic(4)


def test_the_sender_is_the_replica_with_the_fastest_declared_uplink() -> None:
    alive = lambda p: True  # noqa: E731
    swarm = {"a0": 1, "a1": 1, "a2": 1, "z0": 2}
    # 20 Mbit/s, 1 Gbit/s, not said: the fast one sends; without rates, the smallest id.
    rate = {"a0": 0.02, "a1": 1.0, "a2": 0.0, "z0": 0.0}.__getitem__
    assert snapshot_sender(swarm, set(), 1, alive, rate) == ("a1", 3)
    assert snapshot_sender(swarm, {"a1"}, 1, alive, rate) == ("a0", 2)
    assert snapshot_sender(swarm, set(), 1, alive) == ("a0", 3)
    # Equal rates (the simulator's pair model: every uplink infinite) fall back to the id.
    assert snapshot_sender(swarm, set(), 1, alive, lambda p: float("inf")) == ("a0", 3)


def test_a_thin_stage_declares_the_next_boundary_whether_the_latest_landed_or_not() -> None:
    """Under volunteer churn every stage's snapshot of a boundary rarely lands before the nodes
    that hold its state leave; the latest periodic boundary then stays for hours, and a thin
    stage wiped meanwhile rolled the swarm back to it although its keepers held its state of a
    few iterations before. While a stage is thin the boundaries come every `every` iterations
    all the same, and the floor keeps the newest one that landed everywhere."""
    policy = SnapshotPolicy(every=2, thin=2, start=0, declared=(2,))
    landed: set[int] = {0}
    assert not declare_due(policy, 4, landed.__contains__)
    assert declare_due(policy, 4, landed.__contains__, thin=True)
    assert not declare_due(policy, 3, landed.__contains__, thin=True)  # `every` still holds
    # The coordinator's record: thin is any stage at or below `thin` live replicas.
    boundaries = Boundaries(SnapshotPolicy(every=2, thin=2, start=0, declared=()), stages=3,
                            landed={0: {0}, 1: {0}, 2: {0}})
    three = [0, 0, 0, 1, 1, 1, 2, 2, 2]  # the stage of each live participant
    assert boundaries.step(1, three) == (True, 0)  # 2: the latest (0) landed
    assert boundaries.step(3, three) == (False, 0)  # 2 has not landed anywhere
    assert boundaries.step(3, [0, 0, 0, 1, 1, 2, 2, 2]) == (True, 0)  # stage 1 is thin: 4
    assert boundaries.policy.declared == (2, 4)
    # The nodes keep the latest and the floor, not every boundary declared since the floor.
    assert own_kept(boundaries.policy, 5, floor=0) == {4, 0}


def test_more_keepers_each_sharing_least_with_those_chosen_before() -> None:
    swarm = {"h0": 0, "h1": 0, "a0": 1, "a1": 1, "z0": 2, "z1": 2, "y0": 3, "y1": 3}
    alive = lambda p: True  # noqa: E731
    where = {"h0": "us", "h1": "eu", "a0": "us", "a1": "eu", "z0": "us", "z1": "ap",
             "y0": "us", "y1": "us"}.__getitem__
    # Stage 1 (in us and eu): the coordinator h0 (us); then, of a stage none chosen holds and
    # at a place neither the chosen nor the stage are at, z1 (ap), though stage 2 is next to
    # stage 1; then y0 of stage 3, the one stage left, before a second node of a chosen stage.
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, where, count=3) == ("h0", "z1", "y0")
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, where, count=2) == ("h0", "z1")
    # As many as there are nodes of other stages, at most.
    assert len(snapshot_keepers(swarm, set(), 1, "h0", alive, where, count=9)) == 6
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, where, count=1) == ("h0",)


def test_two_keepers_of_other_stages_the_second_sharing_least_with_the_first() -> None:
    swarm = {"h0": 0, "h1": 0, "a0": 1, "a1": 1, "z0": 2, "z1": 2}
    alive = lambda p: True  # noqa: E731
    # The coordinator first; the second of a third stage rather than the coordinator's.
    assert snapshot_keepers(swarm, set(), 1, "h0", alive) == ("h0", "z0")
    assert snapshot_keepers(swarm, set(), 2, "h0", alive) == ("h0", "a0")
    # The coordinator's own stage: two other stages' smallest ids.
    assert snapshot_keepers(swarm, set(), 0, "h0", alive) == ("a0", "z0")
    # A keeper that died or left is replaced by the rule's next choice.
    assert snapshot_keepers(swarm, {"z0"}, 1, "h0", alive) == ("h0", "z1")
    assert snapshot_keepers(swarm, set(), 1, "h0", lambda p: p[0] != "z") == ("h0", "h1")
    assert snapshot_keepers(swarm, set(), 1, "h0", lambda p: p != "h0") == ("h1", "z0")
    # With a third stage out of reach: another location than the first's before a smaller id.
    where = {"h0": "us", "h1": "us", "a0": "us", "a1": "eu", "z0": "us", "z1": "us"}.__getitem__
    assert snapshot_keepers({**swarm, "z0": 0, "z1": 0}, set(), 2, "h0", alive,
                            where) == ("h0", "a1")
    assert snapshot_keepers({"h0": 0, "h1": 0, "a0": 1, "a1": 1}, set(), 1, "h0",
                            alive, where) == ("h0", "h1")
    assert snapshot_keepers({"h0": 0, "a0": 1, "a1": 1, "z0": 2}, set(), 0, "h0", alive,
                            where) == ("a0", "z0")
    assert snapshot_keepers({"h0": 0, "a0": 1, "a1": 1}, set(), 0, "h0", alive,
                            {"h0": "us", "a0": "us", "a1": "eu"}.__getitem__) == ("a0", "a1")
    # Fewer candidates: one keeper, or none.
    assert snapshot_keepers({"h0": 0, "a0": 1}, set(), 1, "h0", alive) == ("h0",)
    assert snapshot_keepers({"h0": 0}, set(), 0, "h0", alive) == ()
    # Every node computes the same pair: it depends on nothing but its arguments.
    assert snapshot_keepers(dict(reversed(swarm.items())), set(), 1, "h0", alive) == ("h0", "z0")


def test_the_second_keeper_shares_least_with_the_stage_and_costs_the_data_plane_least() -> None:
    alive = lambda p: True  # noqa: E731
    # Five stages; stage 1's snapshots, the coordinator h0 first.
    swarm = {"h0": 0, "a0": 1, "a1": 1, "b0": 2, "c0": 3, "c1": 3, "d0": 4}
    # Everything else equal: not of stage 2 (next to stage 1: its sender's links to stage 2
    # carry activations the snapshot would queue ahead of), the smallest id of the rest.
    assert snapshot_keepers(swarm, set(), 1, "h0", alive) == ("h0", "c0")
    # Not at a site of the stage's own replicas (a0 in eu), before not next to it.
    where = {"h0": "us", "a0": "eu", "a1": "us", "b0": "ap", "c0": "eu", "c1": "eu",
             "d0": "eu"}.__getitem__
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, where) == ("h0", "b0")
    # Not started together with the stage's replicas or the first keeper (within
    # LAUNCH_WINDOW_S: nodes started together tend to be taken together), before the smallest
    # id; among those started apart the smallest id, not the newest, so the choice stays put.
    started = {"h0": 0.0, "a0": 0.0, "a1": 5.0, "b0": 0.0, "c0": 7.0, "c1": 3600.0,
               "d0": 7200.0}.__getitem__
    assert LAUNCH_WINDOW_S < 3600.0
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, None, started) == ("h0", "c1")
    assert snapshot_keepers(swarm, {"c1"}, 1, "h0", alive, None, started) == ("h0", "d0")
    close = {**{p: 0.0 for p in swarm}, "c1": LAUNCH_WINDOW_S / 2}.__getitem__
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, None, close) == ("h0", "c0")
    # The earlier criteria come first: another stage than the first's, then another site.
    assert snapshot_keepers({**swarm, "c1": 0}, set(), 1, "h0", alive, None,
                            started) == ("h0", "d0")
    assert snapshot_keepers(swarm, set(), 1, "h0", alive, where, started) == ("h0", "b0")


def test_a_restore_takes_the_newest_usable_snapshot_of_either_keeper() -> None:
    policy = SnapshotPolicy(every=4, thin=2)
    first, second = {4, 5}, {4, 6}  # a copy of 6 cut off on its way to the first keeper
    assert restore_point(policy, 6, first | second) == 6
    assert restore_point(policy, 6, first) == 4
    assert restore_point(policy, 6, set() | second) == 6  # the first keeper died with the stage


def test_a_wiped_stage_is_restored_at_the_iteration_in_progress_or_its_periodic_one() -> None:
    policy = SnapshotPolicy(every=4, thin=2)
    assert restore_point(policy, 6, {4, 6}) == 6  # a thin stage's snapshot of now: no loss
    assert restore_point(policy, 6, {4, 5}) == 4  # the other stages keep 4: roll back there
    assert restore_point(policy, 6, {5}) is None  # nobody else keeps 5
    assert restore_point(policy, 6, set()) is None
    # A fresh job's start is rebuilt by every node from the job's model and seed: the last
    # resort, and never before a snapshot the others can still roll back to.
    assert restore_point(policy, 6, {5}, rebuilt=True) == 0
    assert restore_point(policy, 6, set(), rebuilt=True) == 0
    assert restore_point(policy, 6, {4, 5}, rebuilt=True) == 4
    assert restore_point(policy, 6, {6}, rebuilt=True) == 6
    resumed = SnapshotPolicy(every=4, thin=2, start=2)
    assert restore_point(resumed, 6, set(), rebuilt=True) == 2


def test_nothing_is_replaced_before_a_snapshot_has_landed() -> None:
    policy = SnapshotPolicy(every=4, thin=2)
    # A keeper holds the newest and the newest periodic one, once a new one has landed.
    assert keeper_keeps(policy, set(), 0) == {0}
    assert keeper_keeps(policy, {0}, 1) == {0, 1}
    assert keeper_keeps(policy, {0, 3}, 4) == {4}
    assert keeper_keeps(policy, {4}, 5) == {4, 5}
    assert policy.previous_periodic(8) == 4 and policy.previous_periodic(0) is None
    # Every node keeps its own state of the previous periodic boundary until every stage's
    # snapshot of the newer one has landed (by default: until the iteration after it).
    assert own_kept(policy, 8) == {4, 8}
    assert own_kept(policy, 9) == {8}
    assert own_kept(policy, 9, landed=False) == {4, 8}
    assert own_kept(policy, 8, landed=True) == {8}
    assert own_kept(policy, 0) == {0}
    # A stage wiped in iteration 8 with its snapshot of 8 still on the way: its keeper holds 4
    # (and 7 while it was thin), the others still keep 4: back to 4, not a failed job.
    assert restore_point(policy, 8, {4, 7}) == 4
    assert restore_point(policy, 9, {4, 7}) is None  # the others dropped 4 when 8 landed
    assert restore_point(policy, 9, {4, 7}, held=own_kept(policy, 9, landed=False)) == 4
    assert restore_point(policy, 8, {8}) == 8


def test_a_snapshot_has_landed_only_once_it_is_at_every_keeper() -> None:
    policy = SnapshotPolicy(every=4, thin=2)
    # Stage 1's snapshot of 8 went to h0 and z0; the sender died with the copy to z0 on its way.
    held = {"h0": {4, 8}, "z0": {4}}
    kept = lambda k: held.get(k, set())  # noqa: E731
    assert not snapshot_landed(8, ("h0", "z0"), kept)
    assert snapshot_landed(4, ("h0", "z0"), kept)
    assert not snapshot_landed(8, (), kept)  # sent nowhere: landed nowhere
    assert not snapshot_landed(4, ("h0", "a1"), kept)  # a keeper that died holds nothing
    # So the other nodes keep their state of 4: the stage wiped with h0 rolls back to z0's 4.
    landed = snapshot_landed(8, ("h0", "z0"), kept)
    assert restore_point(policy, 9, held["z0"], own_kept(policy, 9, landed=landed)) == 4
    # Counting the first copy's landing (the old reading) would leave nothing to go back to.
    assert restore_point(policy, 9, held["z0"], own_kept(policy, 9, landed=True)) is None


def run_iteration(c: IterationCoordinator) -> None:
    """Every microbatch done, every member prepared and stepped."""
    c.done("h0", c.injecting, c.round, range(c.microbatches))
    order = c.commit_order()
    assert order is not None
    step = None
    for node, stage in sorted(PARTICIPANTS.items()):
        last = stage == 2
        ids = frozenset(range(c.microbatches)) if node != "a1" else frozenset()
        step = c.prepared(PreparedReport(
            node, c.injecting, c.round, c.attempt, stage, ids,
            losses={m: 1.0 for m in ids} if last else {},
            routes={("h0", "a0", "z0"): len(ids)} if last else {},
        ))
    assert isinstance(step, StepOrder)
    for node, stage in sorted(PARTICIPANTS.items()):
        c.committed(CommittedReport(node, step.iteration, stage, f"c{stage}"))


def test_a_rollback_undoes_the_iterations_since_and_fences_off_their_rounds() -> None:
    c = IterationCoordinator(iterations=8, microbatches=4, participants=PARTICIPANTS,
                             num_stages=3, holders=("h0",))
    for _ in range(5):
        run_iteration(c)
    c.done("h0", 5, 0, [0, 1])
    assert (c.injecting, c.completed) == (5, 5)
    c.member_down("a0")
    c.member_down("a1")
    round_, holders, _ = c.rollback(4)
    assert (c.injecting, c.completed, c.round) == (4, 4, round_) and round_ >= 1
    assert holders == ("h0",) and c.finished == set()
    # A report from before the rollback, of the iteration it undid, is refused...
    with pytest.raises(ReportError):
        c.done("h0", 5, 0, [2])
    assert c.finished == set()
    # ...and so is one of the rolled-back iteration's earlier rounds.
    c.done("h0", 4, 0, [2])
    assert c.finished == set()
    c.admit("a9", 1)
    c.done("h0", 4, round_, range(4))
    order = c.commit_order()
    assert order is not None and order.iteration == 4 and "a9" in order.members
    # Every iteration from now on starts above the rounds used before the rollback.
    c.member_down("a9")
    c.admit("a0", 1)
    c.admit("a1", 1)
    c.restart()
    run_iteration(c)
    assert (c.injecting, c.round) == (5, round_)
    with pytest.raises(ValueError):
        c.rollback(6)
