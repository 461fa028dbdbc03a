"""The crash rules of docs/design.md 4 on hand-made cases, driven through real ledgers.

A 3-stage pipeline: data holder h (stage 0) -> x (stage 1) -> z (stage 2, last), plus spares.
Each case records what the nodes did, kills one, and checks the plan the survivors' ledgers give.
"""

from __future__ import annotations

import pytest

from gwtf.recovery import (
    Evidence,
    Ledger,
    Mode,
    Recovery,
    Rule,
    check_commit,
    merge_reports,
    plan_crash,
)

S = 3


def forward(mb: int, path: list[Ledger], upto: int) -> None:
    """`mb` goes forward through path[0..upto] (each hop recorded at both ends)."""
    for s in range(upto):
        path[s].activation_sent(mb, path[s + 1].node)
        path[s + 1].activation_received(mb, path[s].node)


def backward(mb: int, path: list[Ledger], down_to: int) -> None:
    """The last stage did forward + backward; gradients go up to path[down_to]."""
    last = len(path) - 1
    path[last].accumulated(mb)
    for s in range(last, down_to, -1):
        path[s].gradient_sent(mb, path[s - 1].node)
        path[s - 1].gradient_received(mb, path[s].node)
        path[s - 1].accumulated(mb)


def ledgers() -> tuple[Ledger, Ledger, Ledger]:
    return Ledger("h", 0), Ledger("x", 1), Ledger("z", 2)


def test_crash_in_forward_resends_the_kept_activation() -> None:
    h, x, z = ledgers()
    forward(1, [h, x, z], upto=1)  # at x, forward not done
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")])
    assert plan.recoveries == (Recovery(1, 1, Rule.RESEND, "h", None),)
    assert plan.dropped == frozenset()


def test_crash_after_forward_before_backward_recomputes_only_that_stage() -> None:
    h, x, z = ledgers()
    forward(2, [h, x, z], upto=2)  # x finished forward, z holds it: backward must return via x
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")])
    assert plan.recoveries == (Recovery(2, 1, Rule.RECOMPUTE, "h", "z"),)
    assert Rule.RECOMPUTE.mode == Mode.RECOMPUTE


def test_crash_in_backward_recomputes_and_the_gradient_is_resent() -> None:
    h, x, z = ledgers()
    forward(3, [h, x, z], upto=2)
    z.accumulated(3)
    z.gradient_sent(3, "x")  # the gradient reached x, x died during its backward
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")])
    assert plan.recoveries == (Recovery(3, 1, Rule.RECOMPUTE, "h", "z"),)


def test_crash_after_backward_replays_the_lost_contribution() -> None:
    h, x, z = ledgers()
    forward(4, [h, x, z], upto=2)
    backward(4, [h, x, z], down_to=0)  # finished: x had accumulated it
    plan = plan_crash("x", 1, S, [h.report_about("x"), z.report_about("x")], finished={4})
    assert plan.recoveries == (Recovery(4, 1, Rule.REPLAY, "h", "z"),)


def test_crash_of_the_last_stage_replays_or_redoes_in_full() -> None:
    h, x, z = ledgers()
    forward(5, [h, x, z], upto=2)  # at z, fused forward+backward not done
    forward(6, [h, x, z], upto=2)
    backward(6, [h, x, z], down_to=1)  # z done, gradient reached x
    plan = plan_crash("z", 2, S, [x.report_about("z")])
    assert plan.recoveries == (
        Recovery(5, 2, Rule.RESEND, "x", None),
        Recovery(6, 2, Rule.REPLAY, "x", None),
    )


def test_crash_of_a_data_holder_drops_only_what_never_left_it() -> None:
    h, x, z = ledgers()
    forward(7, [h, x, z], upto=0)  # still inside h
    forward(8, [h, x, z], upto=2)  # left h, in flight further down
    forward(9, [h, x, z], upto=2)
    backward(9, [h, x, z], down_to=0)  # finished
    plan = plan_crash(
        "h", 0, S, [x.report_about("h")], finished={9}, held_by_dead=[7, 8, 9]
    )
    assert plan.dropped == frozenset({7})
    # The token ids travel with the microbatch: x restarts 8 and replays 9 at another holder.
    assert plan.recoveries == (
        Recovery(8, 0, Rule.RECOMPUTE, "x", "x"),
        Recovery(9, 0, Rule.REPLAY, "x", "x"),
    )


def test_a_replacement_that_dies_is_recovered_by_the_same_rules() -> None:
    h, x, z = ledgers()
    x2 = Ledger("x2", 1)
    forward(10, [h, x, z], upto=2)
    backward(10, [h, x, z], down_to=0)
    # x died: h resends the activation to x2 for a replay, z resends its gradient there.
    h.activation_sent(10, "x2", Mode.REPLAY)
    z.gradient_target(10, "x2", Mode.REPLAY)
    z.gradient_sent(10, "x2")
    x2.activation_received(10, "h")
    x2.activation_sent(10, "z")  # it keeps what z holds
    plan = plan_crash("x2", 1, S, [h.report_about("x2"), z.report_about("x2")])
    assert plan.recoveries == (Recovery(10, 1, Rule.REPLAY, "h", "z"),)
    # A recompute replacement that had not sent its gradient up is recomputed again.
    h2, y, y2, w = Ledger("h2", 0), Ledger("y", 1), Ledger("y2", 1), Ledger("w", 2)
    forward(11, [h2, y, w], upto=2)
    h2.activation_sent(11, "y2", Mode.RECOMPUTE)
    w.gradient_target(11, "y2", Mode.RECOMPUTE)
    plan = plan_crash("y2", 1, S, [h2.report_about("y2"), w.report_about("y2")])
    assert plan.recoveries == (Recovery(11, 1, Rule.RECOMPUTE, "h2", "w"),)
    assert y2.report_about("w").evidence == ()


def test_evidence_merges_to_the_strongest() -> None:
    h, x, z = ledgers()
    forward(12, [h, x, z], upto=2)
    evidence, upstream, downstream = merge_reports(
        1, [h.report_about("x"), z.report_about("x")]
    )
    assert evidence == {12: Evidence.FORWARD_DONE}
    assert upstream == {12: "h"} and downstream == {12: "z"}


def test_reset_forgets_the_iteration() -> None:
    h, x, z = ledgers()
    forward(13, [h, x, z], upto=2)
    backward(13, [h, x, z], down_to=0)
    assert x.contributions() == frozenset({13})
    x.reset(1)
    assert x.contributions() == frozenset() and x.iteration == 1
    assert h.report_about("x").evidence != ()
    h.reset(1)
    assert h.report_about("x").evidence == ()


def test_plan_rejects_a_stage_out_of_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        plan_crash("x", 3, S, [])


def test_commit_needs_each_finished_microbatch_once_per_stage() -> None:
    ok = check_commit(2, {1, 2}, {0: [{1}, {2}], 1: [{1, 2}]})
    assert ok.ok and ok.reason() == "ok"
    missing = check_commit(2, {1, 2}, {0: [{1}], 1: [{1, 2}]})
    assert not missing.ok and missing.missing[0] == frozenset({2})
    assert "stage 0: 1 missing" in missing.reason()
    twice = check_commit(2, {1, 2}, {0: [{1, 2}, {2}], 1: [{1, 2}]})
    assert not twice.ok and twice.duplicated[0] == frozenset({2})
    extra = check_commit(2, {1}, {0: [{1, 3}], 1: [{1}]})  # 3 was dropped
    assert not extra.ok and extra.extra[0] == frozenset({3})
