"""The phase termination rule: two identical quiet waves end a phase, nothing else does."""

from __future__ import annotations

from dataclasses import replace

from gwtf.node.control.phases import PhaseDetector, PhaseReportData

STAGES = {"a": 0, "b": 1}


def report(node_id: str, **kw: object) -> PhaseReportData:
    base = PhaseReportData(
        id=node_id, epoch=1, round=0, tightens=0, final=False, quiet=True, activity=5,
        wants_rescale=False, view=42,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def wave(**kw: object) -> dict[str, PhaseReportData]:
    return {i: report(i, **kw) for i in STAGES}


def test_two_identical_quiet_waves_end_the_phase() -> None:
    d = PhaseDetector(2)
    first = d.observe(wave(), STAGES)
    assert first.reason == "first quiet wave" and first.again and first.command.tightens == 0
    second = d.observe(wave(), STAGES)
    assert second.reason == "phase over" and second.command.tightens == 1
    # The next phase needs two fresh waves again.
    assert d.observe(wave(tightens=1, activity=6), STAGES).reason == "first quiet wave"


def test_activity_between_waves_is_no_termination() -> None:
    d = PhaseDetector(2)
    d.observe(wave(), STAGES)
    changed = wave()
    changed["b"] = report("b", activity=6)
    assert d.observe(changed, STAGES).reason == "activity between waves"
    assert d.observe(changed, STAGES).reason == "phase over"


def test_busy_members_different_views_or_an_empty_stage_hold_the_phase() -> None:
    d = PhaseDetector(2)
    busy = wave()
    busy["a"] = report("a", quiet=False)
    assert d.observe(busy, STAGES).reason == "busy"
    views = wave()
    views["a"] = report("a", view=7)
    d.observe(views, STAGES)
    assert d.observe(views, STAGES).reason == "members see different swarms"
    lonely = {"a": report("a")}
    d.observe(lonely, {"a": 0})
    assert d.observe(lonely, {"a": 0}).reason == "a stage has no member"


def test_members_changing_between_waves_restart_the_count() -> None:
    d = PhaseDetector(2)
    d.observe(wave(), STAGES)
    bigger = {**wave(), "c": report("c")}
    assert d.observe(bigger, {**STAGES, "c": 1}).reason == "first quiet wave"
    reborn = wave()
    reborn["b"] = report("b", epoch=2)
    d.observe(reborn, STAGES)
    assert d.observe(reborn, STAGES).reason == "phase over"


def test_final_everywhere_is_done_and_a_rescale_starts_a_new_round() -> None:
    d = PhaseDetector(2)
    over = d.observe(wave(final=True), STAGES)
    assert over.again and not over.done and not over.command.scaling  # one wave to tell them
    done = d.observe(wave(final=True), STAGES)
    assert done.done and not done.again and not done.command.scaling
    asked = wave(final=True)
    asked["a"] = report("a", final=True, wants_rescale=True, quiet=False)
    decision = d.observe(asked, STAGES)
    assert decision.reason == "rescale asked" and decision.command.round == 1
    assert decision.command.tightens == 0 and decision.again


def test_a_rescale_asked_from_behind_a_fresh_round_joins_it() -> None:
    d = PhaseDetector(2)
    asked = wave(final=True)
    asked["a"] = report("a", final=True, wants_rescale=True, quiet=False)
    assert d.observe(asked, STAGES).command.round == 1
    # b asks too, from the final epsilon of round 0: round 1, not yet past its first phase,
    # rescales it when its command arrives, so no round 2.
    late = wave(round=1, quiet=False)
    late["b"] = report("b", final=True, wants_rescale=True, quiet=False)
    decision = d.observe(late, STAGES)
    assert decision.reason == "rescale under way" and decision.again
    assert (decision.command.round, decision.command.tightens) == (1, 0)
    # Once a phase of the round is over, a member asking from within it starts another round.
    d.observe(wave(round=1), STAGES)
    assert d.observe(wave(round=1), STAGES).command.tightens == 1
    inside = wave(round=1, tightens=1)
    inside["a"] = report("a", round=1, tightens=1, wants_rescale=True, quiet=False)
    assert d.observe(inside, STAGES).command.round == 2


def test_a_new_coordinator_catches_up_with_the_furthest_member() -> None:
    d = PhaseDetector(2)
    ahead = wave()
    ahead["b"] = report("b", round=3, tightens=2, quiet=False)
    assert d.observe(ahead, STAGES).command.round == 3
    assert d.command.tightens == 2


def test_uncoordinated_mode_never_tightens() -> None:
    d = PhaseDetector(2, coordinated=False)
    d.observe(wave(), STAGES)
    assert d.observe(wave(), STAGES).command.tightens == 0


def test_a_topology_change_in_the_middle_of_the_scaling_restarts_it() -> None:
    d = PhaseDetector(2)
    d.observe(wave(), STAGES)
    assert d.observe(wave(), STAGES).command.tightens == 1  # phase 1 over
    d.observe(wave(tightens=1, activity=7), STAGES)
    edited = wave(tightens=1, activity=8)
    edited["a"] = report("a", tightens=1, activity=8, edits=1, quiet=False)
    decision = d.observe(edited, STAGES)
    assert decision.reason == "topology changed while scaling"
    assert (decision.command.round, decision.command.tightens) == (1, 0)
    # At phase 0 a restart would change nothing, and at the final epsilon the state machines
    # ask for a rescale themselves when they need one.
    fresh = PhaseDetector(2)
    fresh.observe(wave(), STAGES)
    assert fresh.observe(wave(edits=3, activity=9), STAGES).reason == "activity between waves"
    final = PhaseDetector(2)
    final.observe(wave(final=True), STAGES)
    final.observe(wave(final=True), STAGES)
    assert final.observe(wave(final=True, edits=2), STAGES).reason == "final everywhere"
