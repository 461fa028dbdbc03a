"""The coordinator's commit and recovery bookkeeping (gwtf.job.iterations), with no I/O."""

import pytest

from gwtf.job.iterations import (
    STALLED_ROUNDS,
    CommittedReport,
    IterationCoordinator,
    Outliers,
    PreparedReport,
    ReportError,
    StepOrder,
    assign,
)
from gwtf.recovery import CrashPlan, Evidence, NeighbourReport, Recovery, Rule
from gwtf.train.data import assign_microbatches

PARTICIPANTS = {"h0": 0, "h1": 0, "a": 1, "b": 1, "z": 2}


def coordinator(iterations: int = 3, microbatches: int = 5) -> IterationCoordinator:
    return IterationCoordinator(
        iterations=iterations,
        microbatches=microbatches,
        participants=PARTICIPANTS,
        num_stages=3,
        holders=("h1", "h0"),
    )


def prepared(
    c: IterationCoordinator, sender: str, contributed: range | list[int], **kw: object
) -> StepOrder | str | None:
    stage = PARTICIPANTS[sender]
    ids = frozenset(contributed)
    if stage == 2 and "losses" not in kw:
        kw = {"losses": {m: float(m) for m in ids}, "routes": {("h0", "a", "z"): len(ids)},
              **kw}
    return c.prepared(PreparedReport(sender, c.injecting, c.round, c.attempt, stage, ids,
                                     **kw))  # type: ignore[arg-type]


def all_prepared(c: IterationCoordinator, ids: range | list[int]) -> StepOrder:
    ids = list(ids)
    half = len(ids) // 2
    prepared(c, "h0", ids[:half])
    prepared(c, "h1", ids[half:])
    prepared(c, "a", ids)
    prepared(c, "b", [])
    order = prepared(c, "z", ids)
    assert isinstance(order, StepOrder), order
    return order


def committed(c: IterationCoordinator, k: int, sender: str, checksum: str = "c",
              **kw: object) -> list:  # type: ignore[type-arg]
    return c.committed(CommittedReport(sender, k, PARTICIPANTS[sender],
                                       checksum + str(PARTICIPANTS[sender]),
                                       **kw))  # type: ignore[arg-type]


def test_assign_is_the_trainers_assignment() -> None:
    for count, holders in ((8, ["b", "a"]), (3, ["x", "y", "z", "w"]), (0, ["a"])):
        assert assign(count, holders) == assign_microbatches(count, holders)


def test_shares_follow_the_weights_and_equal_weights_are_the_trainers() -> None:
    assert assign(8, ["a", "b"], {"a": 5, "b": 5}) == assign_microbatches(8, ["a", "b"])
    assert assign(8, ["a", "b"], {"a": 0, "b": 0}) == assign_microbatches(8, ["a", "b"])
    shares = assign(12, ["a", "b", "c"], {"a": 2000, "b": 1000, "c": 0})
    assert {h: len(ids) for h, ids in shares.items()} == {"a": 8, "b": 4, "c": 0}
    assert sorted(shares["a"] + shares["b"]) == list(range(12))
    assert shares["a"][:3] == (0, 2, 3)  # interleaved, not in one run


def test_the_next_shares_follow_the_holders_flows_once_all_are_settled() -> None:
    c = coordinator(iterations=4, microbatches=8)
    c.done("h0", 0, 0, [0, 2, 4, 6], flow=3000)
    c.done("h1", 0, 0, [1, 3, 5, 7], flow=1000)
    c.commit_order()
    order = all_prepared(c, range(8))
    assert order.weights() == {"h0": 3000, "h1": 1000}
    shares = c.assignment()
    assert (len(shares["h0"]), len(shares["h1"])) == (6, 2)
    c.done("h0", 1, 0, list(shares["h0"]), flow=3000)
    c.done("h1", 1, 0, list(shares["h1"]), flow=None)  # not settled: equal shares again
    c.commit_order()
    order = all_prepared(c, range(8))
    assert order.weights() is None
    assert c.assignment() == assign_microbatches(8, ["h0", "h1"])
    with pytest.raises(ReportError, match="negative"):
        c.done("h0", 2, 0, [0, 2, 4, 6], flow=-1)


def test_an_iteration_commits_in_two_phases_once_every_microbatch_is_done() -> None:
    c = coordinator()
    assert c.assignment() == {"h0": (0, 2, 4), "h1": (1, 3)}
    c.done("h0", 0, 0, [4, 0])
    c.done("h1", 0, 0, [1, 3])
    assert c.commit_order() is None  # microbatch 2 is still out
    c.done("h0", 0, 0, [2])
    order = c.commit_order()
    assert order is not None
    assert (order.iteration, order.microbatches, order.final, order.attempt) == (
        0, (0, 1, 2, 3, 4), False, 1)
    assert dict(order.members) == PARTICIPANTS and order.next_holders == ("h0", "h1")
    assert c.commit_order() is None  # one attempt at a time
    step = all_prepared(c, range(5))
    assert (step.iteration, step.trained, step.loss) == (0, 5, sum(range(5)) / 5)
    # The holders go on with iteration 1 while the step of 0 is being reported.
    assert c.injecting == 1 and c.committing() == [0]
    c.done("h0", 1, 0, [0, 2, 4])
    for sender in ("h0", "h1", "a", "b"):
        assert committed(c, 0, sender) == []
    (outcome,) = committed(c, 0, "z")
    assert outcome.iteration == 0 and outcome.microbatches == 5 and not outcome.final
    assert outcome.loss == sum(range(5)) / 5 and outcome.mismatched == ()
    assert outcome.routes == {("h0", "a", "z"): 5}
    assert c.completed == 1


def test_rule_6_voids_an_attempt_whose_contributions_miss_or_repeat_a_microbatch() -> None:
    c = coordinator()
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    prepared(c, "h0", range(5))
    prepared(c, "h1", [])
    prepared(c, "a", [0, 1, 2, 3])  # 4 is missing at stage 1
    prepared(c, "b", [])
    reason = prepared(c, "z", range(5))
    assert isinstance(reason, str) and "stage 1: 1 missing" in reason
    order = c.commit_order()
    assert order is not None and order.attempt == 2
    prepared(c, "h0", range(5))
    prepared(c, "h1", [])
    prepared(c, "a", range(5))
    prepared(c, "b", [4])  # counted twice at stage 1
    reason = prepared(c, "z", range(5))
    assert isinstance(reason, str) and "duplicated" in reason


def test_a_death_in_phase_one_voids_the_attempt_and_the_replays_hold_the_next() -> None:
    c = coordinator()
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    prepared(c, "h0", range(5))
    prepared(c, "a", [0, 1, 2])
    assert c.member_down("b")  # b held 3 and 4: its sums died with it
    assert prepared(c, "z", range(5)) is None  # a report of the voided attempt
    c.recovering(CrashPlan("b", 1, (Recovery(3, 1, Rule.REPLAY, "h0", "z"),
                                    Recovery(4, 1, Rule.REPLAY, "h0", "z")), frozenset()))
    assert c.commit_order() is None
    c.replayed("a", 0, 0, 3, 1)
    assert c.commit_order() is None
    c.replayed("a", 0, 0, 4, 1)
    order = c.commit_order()
    assert order is not None and order.attempt == 2 and "b" not in order.members
    prepared(c, "h0", range(5))
    prepared(c, "h1", [])
    prepared(c, "a", range(5))
    assert isinstance(prepared(c, "z", range(5)), StepOrder)


def test_a_dead_holders_drops_leave_the_commit_and_its_share_is_known() -> None:
    c = coordinator()
    c.done("h1", 0, 0, [1])
    assert c.held_by("h1") == (3,)
    c.member_down("h1")
    c.recovering(CrashPlan("h1", 0, (), frozenset({3})))
    c.done("h0", 0, 0, [0, 2, 4])
    order = c.commit_order()
    assert order is not None and order.microbatches == (0, 1, 2, 4)
    assert order.next_holders == ("h0",)
    prepared(c, "h0", [0, 1, 2, 4])
    prepared(c, "a", [0, 1, 2, 4])
    prepared(c, "b", [])
    step = prepared(c, "z", [0, 1, 2, 4])
    assert isinstance(step, StepOrder) and step.dropped == (3,) and step.trained == 4
    with pytest.raises(ReportError, match="dropped"):
        c2 = coordinator()
        c2.recovering(CrashPlan("h1", 0, (), frozenset({3})))
        c2.done("h0", 0, 0, [3])


def test_a_death_after_the_step_order_only_stops_waiting_for_its_report() -> None:
    c = coordinator(iterations=1)
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    step = all_prepared(c, range(5))
    assert step.final and step.next_holders == ()
    committed(c, 0, "h0", digests={"embed.w": "e"})
    committed(c, 0, "h1", digests={"embed.w": "e"})
    committed(c, 0, "a", digests={"blocks.0.w": "a"})
    committed(c, 0, "z", digests={"head.w": "h"})
    assert not c.member_down("b")
    (outcome,) = c.completions()
    assert outcome.final and set(outcome.digests) == {"embed.w", "blocks.0.w", "head.w"}


def test_the_final_iteration_names_replicas_that_diverge() -> None:
    c = coordinator(iterations=1)
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    all_prepared(c, range(5))
    committed(c, 0, "h0")
    committed(c, 0, "h1")
    committed(c, 0, "a")
    committed(c, 0, "b", checksum="other")
    (outcome,) = committed(c, 0, "z")
    assert outcome.mismatched == ("a", "b")  # 1:1, which is right cannot be told


def test_a_replica_named_by_a_majority_of_its_stage_is_an_outlier_and_voids_the_attempt() -> None:
    trio = {"h0": 0, "a": 1, "b": 1, "x": 1, "z": 2}
    c = IterationCoordinator(iterations=2, microbatches=6, participants=trio, num_stages=3,
                             holders=("h0",))
    c.done("h0", 0, 0, range(6))
    order = c.commit_order()
    assert order is not None

    def report(sender: str, ids: list[int], outliers: frozenset[str] = frozenset()
               ) -> StepOrder | Outliers | str | None:
        stage = trio[sender]
        extra: dict[str, object] = {}
        if stage == 2:
            extra = {"losses": {m: 1.0 for m in ids}, "routes": {("h0", "a", "z"): len(ids)}}
        return c.prepared(PreparedReport(sender, 0, 0, c.attempt, stage, frozenset(ids),
                                         outliers=outliers, **extra))  # type: ignore[arg-type]

    # x accuses b alone: one vote of three is no majority, and nobody else is named.
    assert report("h0", list(range(6))) is None
    assert report("x", [4, 5], frozenset({"b"})) is None
    assert report("a", [0, 1], frozenset({"x"})) is None
    assert report("z", list(range(6)), frozenset({"x"})) is None  # not of its stage: ignored
    verdict = report("b", [2, 3], frozenset({"x"}))
    assert verdict == Outliers(0, {"x": (1, 2, 3)})
    assert not c.in_commit  # void: the coordinator excludes x, replays, and tries again
    c.member_down("x")
    assert c.commit_order() is None  # not before x's recovery is planned
    c.recovering(CrashPlan("x", 0, (), frozenset()))
    again = c.commit_order()
    assert again is not None and again.attempt == 2 and "x" not in again.members


def test_a_replica_outvoted_by_its_stage_checksums_is_named_and_a_tie_is_not() -> None:
    c = coordinator(iterations=2)
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    all_prepared(c, range(5))
    committed(c, 0, "h0")
    committed(c, 0, "h1", checksum="bad")
    committed(c, 0, "a")
    committed(c, 0, "b", checksum="other")
    (outcome,) = committed(c, 0, "z")
    # Stage 0 and stage 1 are both 1:1; nothing tells which replica is right.
    assert outcome.mismatched == ("a", "b", "h0", "h1") and outcome.outvoted == ()
    trio = {"h0": 0, "a": 1, "b": 1, "x": 1, "z": 2}
    c = IterationCoordinator(iterations=2, microbatches=2, participants=trio, num_stages=3,
                             holders=("h0",))
    c.done("h0", 0, 0, [0, 1])
    c.commit_order()
    for sender, ids in (("h0", [0, 1]), ("a", [0]), ("b", [1]), ("x", [])):
        c.prepared(PreparedReport(sender, 0, 0, 1, trio[sender], frozenset(ids)))
    step = c.prepared(PreparedReport("z", 0, 0, 1, 2, frozenset({0, 1}), losses={0: 1.0, 1: 1.0},
                                     routes={("h0", "a", "z"): 2}))
    assert isinstance(step, StepOrder)
    for sender, checksum in (("h0", "s0"), ("a", "s1"), ("b", "s1"), ("x", "wrong")):
        c.committed(CommittedReport(sender, 0, trio[sender], checksum))
    (outcome,) = c.committed(CommittedReport("z", 0, 2, "s2"))
    assert outcome.mismatched == ("x",) and outcome.outvoted == ("x",)


def test_a_restart_forgets_the_round_and_its_late_reports() -> None:
    c = coordinator()
    c.done("h0", 0, 0, [0, 2])
    c.member_down("h1")
    assert c.restart("test") == (0, 1, ("h0",), ())
    assert c.finished == set() and c.assignment() == {"h0": (0, 1, 2, 3, 4)}
    c.done("h0", 0, 0, [4])  # round 0: stale, ignored
    assert c.finished == set()
    c.done("h0", 0, 1, range(5))
    assert c.commit_order() is not None


def test_an_iteration_the_watchdog_restarts_for_good_fails_naming_what_it_waits_on() -> None:
    # The heal of a partition (docs/design.md 4.5): a member of the commit never hears it (its
    # coordinator skipped its calls), so every round ends in a commit attempt that waits on it.
    def waiting_on_z(c: IterationCoordinator) -> None:
        c.done("h0", 0, c.round, [0, 2, 4])
        c.done("h1", 0, c.round, [1, 3])
        assert c.commit_order() is not None
        for sender in ("h0", "h1", "a", "b"):
            prepared(c, sender, range(5) if sender == "a" else [])

    c = coordinator()
    for _ in range(STALLED_ROUNDS - 1):
        waiting_on_z(c)
        c.restart("no progress for 10 s", stalled=True)
    c.restart("z came back")  # restarts of other kinds are not counted
    waiting_on_z(c)
    assert c.waiting_on() == f"the prepared reports of z in commit attempt {c.attempt}"
    with pytest.raises(ValueError, match=rf"iteration 0 stalled in {STALLED_ROUNDS} rounds in a "
                       r"row .* round 5 still waited on the prepared reports of z"):
        c.restart("no progress for 10 s", stalled=True)
    # A commit starts the count again: each iteration gets its own rounds.
    c = coordinator()
    for _ in range(STALLED_ROUNDS - 1):
        c.restart("no progress for 10 s", stalled=True)
    assert c.waiting_on() == "the microbatches injected by h0, h1"
    c.done("h0", 0, c.round, range(5))
    c.commit_order()
    all_prepared(c, range(5))
    assert c.injecting == 1 and c.stalled == 0
    c.restart("no progress for 10 s", stalled=True)


def test_a_joiner_takes_part_from_its_admission() -> None:
    c = IterationCoordinator(iterations=2, microbatches=2, participants={"h": 0, "z": 1},
                             num_stages=2, holders=["h"])
    c.member_down("z")
    assert c.empty_stages() == [1]
    c.done("h", 0, 0, [0, 1])
    assert c.commit_order() is None and c.awaiting_plan() == ["z"]  # z's recovery unplanned
    c.recovering(CrashPlan("z", 1, (), frozenset()))
    assert c.commit_order() is None  # paused: stage 1 has no node
    c.admit("y", 1)
    assert c.commit_order() is None  # h alone is 1 of the 2 voters (gwtf.job.quorum)...
    c.shown_gone("z")  # ...until z is shown dead
    order = c.commit_order()
    assert order is not None and dict(order.members) == {"h": 0, "y": 1}


def test_wrong_reports_are_refused_and_change_nothing() -> None:
    c = coordinator()
    with pytest.raises(ReportError, match="not a live data holder"):
        c.done("a", 0, 0, [0])
    with pytest.raises(ReportError, match="outside the job"):
        c.done("h0", 0, 0, [7])
    with pytest.raises(ReportError, match="in progress"):
        c.done("h0", 2, 0, [0])
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    with pytest.raises(ReportError, match="not on the last stage"):
        prepared(c, "a", range(5), losses={0: 1.0})
    with pytest.raises(ReportError, match="not finished"):
        prepared(c, "z", [], losses={9: 1.0}, routes={("h0", "a", "z"): 1})
    with pytest.raises(ReportError, match="routes"):
        prepared(c, "z", [0], losses={0: 1.0}, routes={})
    with pytest.raises(ReportError, match="holds stage"):
        c.prepared(PreparedReport("a", 0, 0, 1, 2, frozenset()))
    step = all_prepared(c, range(5))
    assert step.iteration == 0
    with pytest.raises(ReportError, match="does not take part"):
        c.committed(CommittedReport("stranger", 0, 1, "x"))
    with pytest.raises(ReportError, match="holds stage"):
        c.committed(CommittedReport("a", 0, 2, "x"))
    committed(c, 0, "a")
    assert committed(c, 0, "a") == []  # a retry
    with pytest.raises(ReportError, match="another commit"):
        committed(c, 0, "a", checksum="changed")
    with pytest.raises(ReportError, match="not being committed"):
        committed(c, 5, "a")


def test_two_last_stage_replicas_cannot_both_count_a_loss() -> None:
    c = IterationCoordinator(iterations=1, microbatches=2, participants={"h": 0, "y": 1, "z": 1},
                             num_stages=2, holders=["h"])
    c.done("h", 0, 0, [0, 1])
    c.commit_order()
    c.prepared(PreparedReport("h", 0, 0, 1, 0, frozenset({0, 1})))
    c.prepared(PreparedReport("y", 0, 0, 1, 1, frozenset({0, 1}), {0: 1.0, 1: 1.0},
                              {("h", "y"): 2}))
    reason = c.prepared(PreparedReport("z", 0, 0, 1, 1, frozenset(), {0: 1.0},
                                       {("h", "z"): 1}))
    assert isinstance(reason, str) and "two last-stage nodes" in reason


def test_holders_must_be_data_holders() -> None:
    with pytest.raises(ValueError, match="not a data holder"):
        IterationCoordinator(iterations=1, microbatches=1, participants=PARTICIPANTS,
                             num_stages=3, holders=["a"])


def test_no_commit_is_ordered_before_a_dead_participants_recovery_is_planned() -> None:
    """A death voids the attempt; an order for the next one given before the dead node's
    recovery is planned would be prepared on sums without its replays (fresh-clone CI: the
    replicas stepped on sums lacking the replayed microbatches 3 and 4, and the job failed)."""
    c = coordinator()
    c.done("h0", 0, 0, range(5))
    c.commit_order()
    assert c.member_down("b")
    assert c.commit_order() is None and c.awaiting_plan() == ["b"]
    assert "recovery plan of b" in c.waiting_on()
    c.recovering(CrashPlan("b", 1, (Recovery(3, 1, Rule.REPLAY, "h0", "z"),), frozenset()))
    assert c.commit_order() is None  # now the replay holds it
    c.replayed("a", 0, 0, 3, 1)
    order = c.commit_order()
    assert order is not None and order.attempt == 2 and "b" not in order.members


def test_a_kept_sum_is_waited_for_until_adopted_and_the_keeper_contributes_it() -> None:
    """Bounded replay (docs/design.md 4.9): b shipped its sum of 3 to a before dying, so only 4
    is replayed; a's adopted 3 is its contribution at the commit, counted once. No commit is
    ordered before a says it adopted the sum: a commit prepared before would lack it."""
    c = coordinator()
    c.done("h0", 0, 0, range(5))
    c.member_down("b")
    c.recovering(CrashPlan("b", 1, (Recovery(3, 1, Rule.KEEP, "h0", "z", "a"),
                                    Recovery(4, 1, Rule.REPLAY, "h0", "z")), frozenset()))
    assert c.commit_order() is None
    c.replayed("a", 0, 0, 4, 1)
    assert c.commit_order() is None
    c.replayed("a", 0, 0, 3, 1)
    order = c.commit_order()
    assert order is not None and "b" not in order.members
    prepared(c, "h0", range(5))
    prepared(c, "h1", [])
    prepared(c, "a", range(5))
    assert isinstance(prepared(c, "z", range(5)), StepOrder)


def test_plan_recovery_orders_each_microbatch_once_per_round() -> None:
    c = coordinator()
    c.member_down("b")
    # a sent 3 to b and got its gradient back (b accumulated it); z holds 4's output from b.
    reports = [NeighbourReport("h0", 0, ((3, Evidence.BACKWARD_DONE), (4, Evidence.SENT))),
               NeighbourReport("z", 2, ((4, Evidence.FORWARD_DONE),))]
    orders = c.plan_recovery("b", 1, reports)
    assert [(r.mb, r.rule) for r in orders.plan.recoveries] == [(3, Rule.REPLAY),
                                                               (4, Rule.RECOMPUTE)]
    assert orders.sources == ("h0", "h0") and orders.restart == ""
    assert c.replays == {(3, 1)}
    # A sweep of the same death orders nothing again; a new round plans afresh.
    assert c.plan_recovery("b", 1, reports).plan.recoveries == ()
    c.restart("test")
    assert len(c.plan_recovery("b", 1, reports).plan.recoveries) == 2


def test_plan_recovery_keeps_the_largest_sum_a_live_stage_peer_reported() -> None:
    """Bounded replay (docs/design.md 4.9): b's running sum of 2 and 3 at a is taken as a
    whole (`Rule.KEEP`, sent to a); 4, which no shipment covered, is replayed. The commit
    waits for a's adoption as for the replay. A sum kept by a node not of b's stage, or by
    nobody live, is not used; nor is one that covers a microbatch planned before."""
    c = coordinator()
    c.done("h0", 0, 0, range(5))
    c.member_down("b")
    reports = [NeighbourReport("h0", 0, tuple((m, Evidence.BACKWARD_DONE) for m in (2, 3, 4))),
               NeighbourReport("z", 2, tuple((m, Evidence.FORWARD_DONE) for m in (2, 3, 4)))]
    orders = c.plan_recovery("b", 1, reports, {"a": frozenset({2, 3}), "z": frozenset({4}),
                                               "gone": frozenset({2, 3, 4})})
    assert [(r.mb, r.rule, r.keeper) for r in orders.plan.recoveries] == [
        (2, Rule.KEEP, "a"), (3, Rule.KEEP, "a"), (4, Rule.REPLAY, None)]
    assert orders.sources == ("a", "a", "h0") and orders.restart == ""
    assert c.replays == {(2, 1), (3, 1), (4, 1)}
    c.replayed("a", 0, 0, 4, 1)
    assert c.commit_order() is None  # the kept sum is not adopted yet
    c.replayed("a", 0, 0, 2, 1)
    c.replayed("a", 0, 0, 3, 1)
    assert c.commit_order() is not None
    # A later round: 2 was planned before in it, so a sum covering it is not taken.
    c.restart("test")
    c.done("h0", 0, c.round, range(5))
    c.plan_recovery("b", 1, [NeighbourReport("h0", 0, ((2, Evidence.BACKWARD_DONE),))])
    again = c.plan_recovery("b", 1, reports, {"a": frozenset({2, 3})})
    assert [(r.mb, r.rule) for r in again.plan.recoveries] == [(3, Rule.REPLAY),
                                                              (4, Rule.REPLAY)]


def test_plan_recovery_deals_a_dead_holders_work_round_the_live_holders() -> None:
    c = IterationCoordinator(iterations=1, microbatches=6, num_stages=3, holders=("h0", "h1",
                             "h2"), participants={"h0": 0, "h1": 0, "h2": 0, "a": 1, "z": 2})
    c.done("h2", 0, 0, [2])
    c.member_down("h2")
    # h2's share is 2 and 5: 2 finished (replayed at stage 0), 5 never left it (dropped).
    orders = c.plan_recovery("h2", 0, [NeighbourReport("a", 1, ((2, Evidence.FORWARD_DONE),))])
    assert [(r.mb, r.rule) for r in orders.plan.recoveries] == [(2, Rule.REPLAY)]
    assert orders.plan.dropped == {5} and orders.sources == ("h0",)
    again = c.plan_recovery("h2", 0, [NeighbourReport("a", 1, ((2, Evidence.FORWARD_DONE),
                                                               (5, Evidence.SENT)))])
    assert again.plan.recoveries == () and again.plan.dropped == frozenset()


def test_plan_recovery_restarts_a_round_whose_input_died_too() -> None:
    c = coordinator()
    c.member_down("a")
    c.member_down("h0")  # a's upstream died too: only z reports what a held
    orders = c.plan_recovery("a", 1, [NeighbourReport("z", 2, ((1, Evidence.FORWARD_DONE),))])
    assert orders.sources == () and "microbatch 1 of a has no live node" in orders.restart


def _declaring(every: int = 2, **kw: object) -> IterationCoordinator:
    return IterationCoordinator(iterations=12, microbatches=2, participants=PARTICIPANTS,
                                num_stages=3, holders=("h0", "h1"), snapshot_every=every,
                                **kw)  # type: ignore[arg-type]


def _iterate(c: IterationCoordinator, landed: dict[str, tuple[int, ...]] | None = None,
             lacking: dict[str, int] | None = None) -> StepOrder:
    """One iteration through to its step and every committed report (the senders reporting
    what `landed` and `lacking` say)."""
    c.done("h0", c.injecting, c.round, [0, 1])
    assert c.commit_order() is not None
    order = all_prepared(c, [0, 1])
    for sender in PARTICIPANTS:
        committed(c, order.iteration, sender,
                  snapshots_landed=(landed or {}).get(sender, ()),
                  snapshot_lacking=(lacking or {}).get(sender))
    return order


def test_a_periodic_boundary_is_declared_once_the_last_one_landed_at_every_stage() -> None:
    c = _declaring(every=2)
    first = _iterate(c)
    assert (first.periodic, first.floor) == (False, 0)
    # Boundary 2 is due and the job's start counts as landed: declared with the step of 1.
    second = _iterate(c)
    assert (second.periodic, second.floor) == (True, 0)
    # Its snapshots land at stages 0 and 1 only: no new boundary, the floor stays at 0.
    landed = {"h0": (2,), "a": (2,)}
    for _ in range(3):
        order = _iterate(c, landed)
        assert (order.periodic, order.floor) == (False, 0)
    # The last stage's lands, reported with the step of 5 (ordered before the reports):
    # the step of 6 declares 7, floor 2.
    assert not _iterate(c, {"z": (2,)}).periodic
    order = _iterate(c)
    assert (order.iteration, order.periodic, order.floor) == (6, True, 2)
    assert c.boundaries is not None and c.boundaries.policy.declared == (2, 7)


def test_a_boundary_no_sender_can_send_is_declared_over() -> None:
    c = _declaring(every=2)
    _iterate(c)
    assert _iterate(c).periodic  # 2 declared
    order = _iterate(c, {"h0": (2,), "a": (2,)}, lacking={"z": 2})
    # Stage 2's sender joined after 2 and holds nothing of it: 4 is declared all the same,
    # and the floor stays where every stage landed (the start).
    assert (order.iteration, order.periodic, order.floor) == (2, False, 0)
    order = _iterate(c, lacking={"z": 2})
    assert (order.iteration, order.periodic, order.floor) == (3, True, 0)


def test_a_rollback_undoes_the_boundaries_after_it_and_a_new_coordinator_keeps_the_floor(
) -> None:
    c = _declaring(every=1)
    everyone = {p: (1, 2, 3) for p in PARTICIPANTS}
    orders = [_iterate(c, everyone) for _ in range(3)]
    assert [o.periodic for o in orders] == [True, True, True]
    assert c.boundaries is not None and c.boundaries.floor(3) == 3
    c.rollback(2)
    assert c.boundaries.policy.declared == (1, 2) and c.boundaries.floor(3) == 2
    taken = _declaring(every=1, iteration=3, declared=(1, 2, 3), floor=2)
    assert taken.boundaries is not None and taken.boundaries.floor(3) == 2
