"""Bounded replay in the simulator (docs/design.md 4.9): partial sums shipped to a stage peer
turn replays into kept contributions, cost the bytes they say, and keep every commit exact."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gwtf.recovery import REPLAY_AUTO
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import Scenario, load_scenario
from gwtf.sim.simulator import SimResult
from tests.unit.test_sim_run import BASE as RUN_BASE

# The small 3-stage swarm of the simulator's run tests, 300 s long.
BASE = RUN_BASE.replace("{duration}", "300")


def scenario(tmp_path: Path, rows: str, *, per_stage: int = 2, bound: int = 0,
             duration: float = 300, nodes: str = "") -> Scenario:
    trace = "time_s,event,node,stage,location\n"
    for stage in range(3):
        for i, loc in enumerate(["Oregon", "Ohio", "Virginia"][:per_stage]):
            trace += f"0,join,s{stage}{'abc'[i]},{stage},{loc}\n"
    (tmp_path / "trace.csv").write_text(trace + rows)
    path = tmp_path / "s.toml"
    base = BASE.replace("count = 9\n", f"count = 9\n{nodes}")
    path.write_text(base + 'trace = "trace.csv"\nformat = "csv"\n')
    return replace(load_scenario(path), replay_bound=bound, duration_s=duration)


def run(sc: Scenario, policy: str = "oracle") -> SimResult:
    return simulation(sc, policy).run()


def exact(result: SimResult) -> None:
    assert result.audit["conserved_iterations"] == result.iterations_completed >= 3
    assert result.audit["commit_checks"] >= result.iterations_completed
    assert result.lost_microbatches == 0 and result.dropped_microbatches == 0


def test_a_crash_after_backward_keeps_the_shipped_sum_and_replays_only_the_rest(
    tmp_path: Path,
) -> None:
    off = run(scenario(tmp_path, "6,crash,s1a\n"))
    on = run(scenario(tmp_path, "6,crash,s1a\n", bound=2))
    for result in (off, on):
        exact(result)
    assert off.recoveries["replay"] > 0 and off.recoveries["keep"] == 0
    assert on.recoveries["keep"] > 0
    assert on.recoveries["replay"] < off.recoveries["replay"]
    assert on.recoveries["replay"] + on.recoveries["keep"] >= off.recoveries["replay"] - 2
    assert on.wasted_compute_s < off.wasted_compute_s
    ship = on.shipping
    assert ship["replay_bound"] == 2 and ship["kept_microbatches"] == on.recoveries["keep"]
    assert ship["shipped_bytes"] == ship["shipments"] * 3.0e8 * 1
    assert off.shipping["shipments"] == 0


def test_a_stage_of_one_node_ships_nothing(tmp_path: Path) -> None:
    result = run(scenario(tmp_path, "", per_stage=1, bound=1, duration=120))
    assert result.iterations_completed >= 1
    assert result.shipping["shipments"] == 0


def test_a_dead_keeper_loses_what_it_kept_and_it_is_replayed(tmp_path: Path) -> None:
    # s1a dies (s1b adopts its sum, s1c replays the rest), then s1b dies with the adopted sum.
    sc = scenario(tmp_path, "6,crash,s1a\n14,crash,s1b\n", per_stage=3, bound=2)
    result = run(sc)
    exact(result)
    assert result.recoveries["keep"] > 0 and result.recoveries["replay"] > 0


def test_exact_under_churn_with_every_bound(tmp_path: Path) -> None:
    rows = "".join(f"{t},crash,{n}\n{t + 20},join,{n}x,{n[1]},Ohio\n"
                   for t, n in ((7, "s1a"), (30, "s2b"), (55, "s0a"), (80, "s1b"), (81, "s2a")))
    for bound in (1, 3, 8):
        for policy in ("gwtf", "oracle"):
            result = run(scenario(tmp_path, rows, bound=bound, duration=400), policy)
            # The crash of data holder s0a may drop what never left it (rule 4): no more.
            assert result.audit["conserved_iterations"] == result.iterations_completed >= 3
            assert result.lost_microbatches == 0
            assert result.dropped_microbatches <= 8
            assert result.recoveries["keep"] > 0


def test_swarm_keeps_no_ledger_and_ships_nothing(tmp_path: Path) -> None:
    result = run(scenario(tmp_path, "6,crash,s1a\n", bound=1), "swarm")
    assert result.shipping["shipments"] == 0 and result.recoveries["keep"] == 0


def test_the_adaptive_bound_ships_where_the_keeper_path_is_free(tmp_path: Path) -> None:
    # Pair links: a shipment to a stage peer delays no activation, so each node ships as soon as
    # its last shipment landed, and the crash replays less than with shipping off.
    off = run(scenario(tmp_path, "6,crash,s1a\n"))
    auto = run(scenario(tmp_path, "6,crash,s1a\n", bound=REPLAY_AUTO))
    exact(auto)
    assert auto.shipping["replay_bound"] == "auto" and auto.shipping["shipments"] > 0
    assert auto.recoveries["keep"] > 0
    assert auto.recoveries["replay"] < off.recoveries["replay"]


def test_the_adaptive_bound_never_ships_on_a_link_bound_swarm_with_few_deaths(
    tmp_path: Path,
) -> None:
    # 100 Mbit/s uplinks: a 300 MB sum takes 24 s, during which the node's activations wait;
    # one death in 900 s of 6 nodes does not make that worth it. A fixed bound ships anyway.
    home = "uplink_gbps = [0.1]\ndownlink_gbps = [0.5]\n"
    auto = run(scenario(tmp_path, "20,crash,s1a\n", bound=REPLAY_AUTO, nodes=home,
                        duration=900))
    fixed = run(scenario(tmp_path, "20,crash,s1a\n", bound=2, nodes=home, duration=900))
    assert auto.iterations_completed >= 1
    assert auto.shipping["shipments"] == 0 and auto.recoveries["keep"] == 0
    assert fixed.shipping["shipments"] > 0
