"""plan_churn: binding a trace's names to a local swarm's processes, and refusing what cannot
be replayed, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtf.local.churn import ChurnError, load_churn, plan_churn, trace_format
from gwtf.local.launch import plan_nodes
from gwtf.sim.traces import TraceEvent

SHARED_P3 = Path(__file__).parents[2] / "simulations" / "traces" / "spot_p3_bamboo.csv"


def swarm(n: int = 6, stages: int = 3) -> list:
    return plan_nodes(n, stages, locations=[], base_compute_s=0.1, seed=0)


def plan(events: list[TraceEvent], n: int = 6, stages: int = 3, **kw: object) -> list:
    options = {"num_stages": stages, "locations": [], "base_compute_s": 0.1, **kw}
    return plan_churn(events, swarm(n, stages), **options)  # type: ignore[arg-type]


def test_launched_ids_are_bound_by_name_and_joiners_go_to_the_emptiest_stage() -> None:
    actions = plan([
        TraceEvent(5.0, "crash", "s1n0"),
        TraceEvent(6.0, "leave", "s2n1"),
        TraceEvent(7.0, "join", "fresh"),
        TraceEvent(8.0, "join", "fresh2"),
    ], time_scale=0.5)
    assert [(a.at_s, a.kind, a.node) for a in actions] == [
        (2.5, "crash", "s1n0"), (3.0, "leave", "s2n1"), (3.5, "join", "fresh"),
        (4.0, "join", "fresh2"),
    ]
    # Stage 1 lost s1n0 first (1 left there, 1 on stage 2 after the leave): the lowest wins.
    assert actions[2].plan is not None and actions[2].plan.stage == 1
    assert actions[3].plan is not None and actions[3].plan.stage == 2
    assert all(a.plan.compute_s > 0 for a in actions[2:] if a.plan)


def test_time_zero_joiners_take_the_launched_nodes_in_order() -> None:
    events = [TraceEvent(0.0, "join", f"node{i}") for i in range(6)]
    events += [TraceEvent(10.0, "crash", "node4"), TraceEvent(20.0, "join", "node4")]
    actions = plan(events)
    launched = [p.id for p in swarm()]
    assert actions[0].kind == "crash" and actions[0].node == launched[4]
    # Back after its crash: a new process under the same id, as a new incarnation.
    assert actions[1].kind == "join" and actions[1].node == launched[4]


def test_the_real_p3_trace_binds_to_eighteen_nodes() -> None:
    events = load_churn(str(SHARED_P3))
    assert trace_format(str(SHARED_P3)) == "bamboo"
    actions = plan(events, n=18, stages=4, time_scale=0.01)
    kinds = {a.kind for a in actions}
    assert kinds <= {"join", "crash"} and "crash" in kinds and "join" in kinds
    assert actions == sorted(actions, key=lambda a: a.at_s)
    # Never more than one live process per id at a time.
    live = {p.id for p in swarm(18, 4)}
    for a in actions:
        if a.kind == "join":
            assert a.node not in live
            live.add(a.node)
        else:
            live.remove(a.node)
    with pytest.raises(ChurnError, match="give --nodes >= that many"):
        plan(events, n=10, stages=4)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([TraceEvent(3.0, "crash", "ghost")], "'ghost' is not alive"),
        ([TraceEvent(3.0, "join", "s0n0")], "'s0n0' is already alive"),
        ([TraceEvent(3.0, "join", "x", stage=7)], "stage 7 is outside the swarm's 0..2"),
        ([TraceEvent(3.0, "link", "A:B", rtt_ms=1, bandwidth_gbps=1)], "cannot be replayed"),
        ([TraceEvent(3.0, "join", "bad name ")], "not a short printable name"),
        ([TraceEvent(1.0, "crash", "s0n0"), TraceEvent(2.0, "leave", "s0n0")], "not alive"),
    ],
)
def test_traces_that_cannot_be_replayed_are_refused_with_the_event(
    events: list[TraceEvent], message: str
) -> None:
    with pytest.raises(ChurnError, match=message):
        plan(events)


def test_unreadable_and_malformed_trace_files(tmp_path: Path) -> None:
    with pytest.raises(ChurnError, match="cannot read trace"):
        load_churn(str(tmp_path / "missing.csv"))
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,event,node\n1.0,explode,n1\n")
    with pytest.raises(ChurnError, match="line 2"):
        load_churn(str(bad))
