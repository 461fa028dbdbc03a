"""Bounded replay (docs/design.md 4.9) on hand-made ledgers: shipped partial sums, the KEEP rule,
and the commit check counting every shipped sum exactly once.

A 3-stage pipeline: data holder h (stage 0) -> x or y (stage 1, peers) -> z (stage 2, last).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.recovery import (
    RECHECK,
    Evidence,
    HazardEstimate,
    Ledger,
    Recovery,
    Rule,
    ShipCost,
    best_cover,
    check_commit,
    pick_keeper,
    plan_crash,
    recheck_at,
    ship_due,
    ship_interval,
)

S = 3


def run(mb: int, *path: Ledger) -> None:
    """`mb` goes down `path` (one node per stage, e.g. h -> mid -> z) and all the way back
    (every stage accumulates it)."""
    hops = list(itertools.pairwise(path))
    for up, down in hops:
        up.activation_sent(mb, down.node)
        down.activation_received(mb, up.node)
    path[-1].accumulated(mb)
    for up, down in reversed(hops):
        down.gradient_sent(mb, up.node)
        up.gradient_received(mb, down.node)
        up.accumulated(mb)


def ship(sender: Ledger, keeper: Ledger) -> None:
    sender.shipped(sender.contributions(), keeper.node)
    keeper.kept(sender.node, sender.contributions())


def setup() -> tuple[Ledger, Ledger, Ledger, Ledger]:
    return Ledger("h", 0), Ledger("x", 1), Ledger("y", 1), Ledger("z", 2)


def test_ship_due_counts_unshipped_contributions_and_zero_is_off() -> None:
    h, x, y, z = setup()
    for mb in (1, 2, 3):
        run(mb, h, x, z)
    assert x.unshipped() == 3
    assert ship_due(x, 3) and not ship_due(x, 4)
    assert not ship_due(x, 0)
    ship(x, y)
    assert x.unshipped() == 0 and x.keeper == "y"
    run(4, h, x, z)
    assert x.unshipped() == 1
    x.keeper_lost()
    assert x.unshipped() == 4 and x.keeper is None


def test_pick_keeper_is_sticky_best_scored_and_none_for_a_lone_node() -> None:
    assert pick_keeper("x", {}) is None
    assert pick_keeper("x", {"x": 5.0}) is None  # a stage of one: nothing to ship to
    assert pick_keeper("x", {"a": 1.0, "b": 10.0, "c": 10.0}) == "b"
    assert pick_keeper("x", {"a": 1.0, "b": 10.0}, current="a") == "a"
    assert pick_keeper("x", {"b": 10.0}, current="a") == "b"  # the old keeper is gone


def test_best_cover_takes_the_largest_sum() -> None:
    assert best_cover("x", {"y": frozenset(), "w": frozenset()}) == (None, frozenset())
    assert best_cover("x", {"y": frozenset({1}), "w": frozenset({1, 2})}) == (
        "w", frozenset({1, 2}))
    assert best_cover("x", {"y": frozenset({1}), "w": frozenset({2})}) == ("w", frozenset({2}))


def test_covered_microbatches_are_kept_and_only_the_rest_replayed() -> None:
    h, x, y, z = setup()
    for mb in (1, 2):
        run(mb, h, x, z)
    ship(x, y)
    run(3, h, x, z)  # after the shipment: not covered
    reports = [h.report_about("x"), z.report_about("x")]
    plan = plan_crash("x", 1, S, reports, covered=y.held_for("x"), keeper="y")
    assert plan.recoveries == (
        Recovery(1, 1, Rule.KEEP, "h", "z", "y"),
        Recovery(2, 1, Rule.KEEP, "h", "z", "y"),
        Recovery(3, 1, Rule.REPLAY, "h", "z"),
    )
    assert plan.count(Rule.REPLAY) == 1
    # Without the shipment, all three are replayed, as rule 3 says.
    assert plan_crash("x", 1, S, reports).count(Rule.REPLAY) == 3


def test_commit_counts_an_adopted_sum_once_and_a_live_senders_kept_sum_never() -> None:
    h, x, y, z = setup()
    for mb in (1, 2):
        run(mb, h, x, z)
    run(3, h, y, z)
    ship(x, y)
    finished = {1, 2, 3}
    # The sender is alive: it contributes its whole sum, the keeper's copy is not counted.
    live = {0: [h.contributions()], 1: [x.contributions(), y.contributions()],
            2: [z.contributions()]}
    assert check_commit(S, finished, live).ok
    # x dies after one more microbatch: the keeper adopts 1 and 2, microbatch 4 is replayed.
    run(4, h, x, z)
    finished.add(4)
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")],
                      covered=y.held_for("x"), keeper="y")
    assert y.adopt("x") == frozenset({1, 2})
    for rec in plan.recoveries:
        if rec.rule == Rule.KEEP:
            h.contribution_moved(rec.mb, 1, "y")
            z.contribution_moved(rec.mb, 1, "y")
    before = {0: [h.contributions()], 1: [y.contributions()], 2: [z.contributions()]}
    verdict = check_commit(S, finished, before)
    assert not verdict.ok and verdict.missing[1] == frozenset({4})
    y.accumulated(4)  # the replay of rule 3
    after = {0: [h.contributions()], 1: [y.contributions()], 2: [z.contributions()]}
    assert check_commit(S, finished, after).ok


def test_a_dead_keeper_with_an_adopted_sum_is_replayed_from_the_moved_records() -> None:
    h, x, y, z = setup()
    run(1, h, x, z)
    ship(x, y)
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")],
                      covered=y.held_for("x"), keeper="y")
    y.adopt("x")
    for rec in plan.recoveries:
        h.contribution_moved(rec.mb, 1, "y")
        z.contribution_moved(rec.mb, 1, "y")
    # y dies before shipping anything: its neighbours now report microbatch 1 as y's backward.
    reports = [h.report_about("y"), z.report_about("y")]
    assert dict(reports[0].evidence) == {1: Evidence.BACKWARD_DONE}
    assert plan_crash("y", 1, S, reports).recoveries == (Recovery(1, 1, Rule.REPLAY, "h", "z"),)


def test_a_sum_with_an_unproven_backward_is_not_used() -> None:
    h, x, y, z = setup()
    run(1, h, x, z)
    # Microbatch 2: x accumulated it and shipped, but its input gradient never reached h.
    h.activation_sent(2, "x")
    x.activation_received(2, "h")
    x.activation_sent(2, "z")
    z.activation_received(2, "x")
    z.accumulated(2)
    z.gradient_sent(2, "x")
    x.gradient_received(2, "z")
    x.accumulated(2)
    ship(x, y)
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")],
                      covered=y.held_for("x"), keeper="y")
    # Taking the sum would count 2 twice (it must pass through stage 1 again): all or nothing.
    assert plan.count(Rule.KEEP) == 0
    assert plan.recoveries == (Recovery(1, 1, Rule.REPLAY, "h", "z"),
                               Recovery(2, 1, Rule.RECOMPUTE, "h", "z"))


def test_a_dead_data_holders_finished_microbatches_are_kept_at_stage_zero() -> None:
    h, g, x, z = Ledger("h", 0), Ledger("g", 0), Ledger("x", 1), Ledger("z", 2)
    for mb in (1, 2):
        run(mb, h, x, z)
    ship(h, g)
    run(3, h, x, z)
    plan = plan_crash("h", 0, S, [x.report_about("h")], finished={1, 2, 3},
                      held_by_dead=[1, 2, 3], covered=g.held_for("h"), keeper="g")
    assert plan.recoveries == (
        Recovery(1, 0, Rule.KEEP, "x", "x", "g"),
        Recovery(2, 0, Rule.KEEP, "x", "x", "g"),
        Recovery(3, 0, Rule.REPLAY, "x", "x"),
    )
    assert plan.dropped == frozenset()


def test_the_last_stage_keeps_too() -> None:
    h, x, z, w = Ledger("h", 0), Ledger("x", 1), Ledger("z", 2), Ledger("w", 2)
    run(1, h, x, z)
    ship(z, w)
    plan = plan_crash("z", 2, S, [x.report_about("z")], covered=w.held_for("z"), keeper="w")
    assert plan.recoveries == (Recovery(1, 2, Rule.KEEP, "x", None, "w"),)


def test_reset_forgets_shipments() -> None:
    h, x, y, z = setup()
    run(1, h, x, z)
    ship(x, y)
    y.reset(1)
    x.reset(1)
    assert y.held_for("x") == frozenset() and x.keeper is None and x.unshipped() == 0


def _keep_chain(records: bool) -> tuple[int, int]:
    """Four stages h -> x|y -> z|w -> t: x ships to y and dies; y keeps microbatch 1 (taking x's
    place in the records when `records`); then z, downstream of it, ships to w and dies.
    Returns (microbatches kept, recomputed) at z's death."""
    h, x, y, z, w, t = (Ledger("h", 0), Ledger("x", 1), Ledger("y", 1), Ledger("z", 2),
                        Ledger("w", 2), Ledger("t", 3))
    run(1, h, x, z, t)
    ship(x, y)
    ship(z, w)
    plan = plan_crash("x", 1, 4, [h.report_about("x"), z.report_about("x")],
                      covered=y.held_for("x"), keeper="y")
    assert plan.recoveries == (Recovery(1, 1, Rule.KEEP, "h", "z", "y"),)
    keeps = [r for r in plan.recoveries if r.rule == Rule.KEEP]
    if records:
        y.adopt("x", upstream={r.mb: r.activation_from for r in keeps if r.activation_from},
                downstream={r.mb: r.gradient_from for r in keeps if r.gradient_from})
    else:
        y.adopt("x")
    h.contribution_moved(1, 1, "y")
    z.contribution_moved(1, 1, "y")
    later = plan_crash("z", 2, 4, [y.report_about("z"), t.report_about("z")],
                       covered=w.held_for("z"), keeper="w")
    return later.count(Rule.KEEP), later.count(Rule.RECOMPUTE)


def test_a_keeper_takes_the_dead_senders_place_so_a_later_sum_downstream_is_kept() -> None:
    """x's backward of microbatch 1 was proven (KEEP), which proves z's: y, adopting it, records
    that its output went to z and z's gradient came back, and z's own shipped sum is kept when z
    dies. Without those records only t's FORWARD_DONE spoke for z's microbatch 1, and z's
    whole sum was refused (everything it covered recomputed and replayed)."""
    assert _keep_chain(records=True) == (1, 0)
    assert _keep_chain(records=False) == (0, 1)


def test_a_sum_covering_a_dropped_microbatch_is_not_used() -> None:
    """A microbatch dropped while the dead node, not yet noticed, held its contribution must not
    come back through the kept sum (check_commit would find it extra)."""
    h, x, y, z = setup()
    for mb in (1, 2):
        run(mb, h, x, z)
    ship(x, y)
    reports = [h.report_about("x"), z.report_about("x")]
    plan = plan_crash("x", 1, S, reports, covered=y.held_for("x"), keeper="y",
                      dropped_before={2})
    assert plan.count(Rule.KEEP) == 0 and plan.count(Rule.REPLAY) == 2


def _cost(k: float, c: ShipCost) -> float:
    """Seconds lost per second when shipping every `k` microbatches (the module doc's model)."""
    return c.rate * c.upload_s * c.contention / k + c.hazard * k * c.replay_s / 2


@settings(max_examples=200, deadline=None)
@given(upload=st.floats(0.01, 1e3), contention=st.floats(0.0, 2.0), rate=st.floats(0.01, 100.0),
       replay=st.floats(0.01, 100.0), hazard=st.floats(1e-7, 1e-2))
def test_ship_interval_is_the_least_cost_interval(
    upload: float, contention: float, rate: float, replay: float, hazard: float
) -> None:
    c = ShipCost(upload_s=upload, contention=contention, rate=rate, replay_s=replay,
                 hazard=hazard)
    k = ship_interval(c)
    assert k >= 1
    for other in (1.0, k / 2, k * 0.9, k * 1.1, 2 * k):
        if other >= 1:
            assert _cost(k, c) <= _cost(other, c) * (1 + 1e-9) + 1e-15


def test_ship_interval_never_free_and_link_bound() -> None:
    # A home node: a 302 MB sum on a saturated 20 Mbit/s uplink (121 s), 0.1 microbatches/s,
    # a replay of 4 s, one death per two hours: Young's interval is far above the ~40
    # microbatches it accumulates in an iteration, so it never ships.
    home = ShipCost(upload_s=121.0, contention=1.0, rate=0.1, replay_s=4.0, hazard=1 / 7200)
    assert ship_interval(home) > 100
    # The same node under churn ten times as heavy ships more often.
    assert ship_interval(replace(home, hazard=10 / 7200)) < ship_interval(home)
    # A path to the keeper that carries nothing else costs nothing: ship at once.
    assert ship_interval(replace(home, contention=0.0)) == 1.0
    # No deaths expected, or nothing to replay: never.
    assert ship_interval(replace(home, hazard=0.0)) == math.inf
    assert ship_interval(replace(home, replay_s=0.0)) == math.inf
    # The copy of the sum holds the sender's compute thread even on an idle path: not free.
    idle = replace(home, contention=0.0, copy_s=0.3)
    assert ship_interval(idle) > 1.0
    assert ship_interval(idle) == ship_interval(replace(home, contention=0.3 / 121.0))


def test_recheck_at_waits_for_the_interval_or_recheck_more_at_most() -> None:
    assert recheck_at(2.2, unshipped=1) == 3
    assert recheck_at(50.0, unshipped=1) == 1 + RECHECK
    assert recheck_at(math.inf, unshipped=7) == 7 + RECHECK


def test_hazard_estimate_starts_at_the_prior_and_follows_the_deaths() -> None:
    h = HazardEstimate()
    assert h.rate(0.0) == 1 / 86_400
    h.census(0.0, 10)
    assert h.exposure_s(100.0) == 1000.0
    h.census(100.0, 9)
    h.death()
    assert h.exposure_s(200.0) == 1900.0
    assert math.isclose(h.rate(200.0), 2 / (1900.0 + 86_400))
    for _ in range(99):
        h.death()
    assert h.rate(200.0) > 50 / 86_400  # a hundred deaths outweigh the prior
