"""A drifting world in the simulator (docs/design.md 2.13 and 5, *Drift*): speed rows and generated
slow episodes, and the policies seeing them as they would: gwtf through each node's pace and the
gossip of its record, the oracle at once, a gwtf blind to paces never."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gwtf.sim import policies
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import Scenario, ScenarioError, load_scenario
from gwtf.sim.traces import TraceError, generate_stragglers, read_csv_trace

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "gwtf" / "data" / "geo10_aws.csv"

# Six equal machines in one region, two per stage: one of the relays is four times slower from
# 120 s on; its stage peer can carry the swarm's rate alone.
BASE = f"""
name = "drift"
seed = 0
duration_s = 600
[model]
stages = 3
params_per_stage = [3.0e8, 3.0e8, 3.0e8]
tokens_per_microbatch = 4096
hidden_size = 1024
grad_bytes_per_param = 1
state_bytes_per_param = 2
[training]
iterations = 1000
microbatches_per_iteration = 32
memory_slots = 4
[network]
matrix = "{MATRIX}"
[nodes]
count = 6
gpus = ["A100 80GB SXM4"]
locations = ["Virginia"]
"""


def scenario(tmp_path: Path, extra: str = "", rows: str = "") -> Scenario:
    text = BASE + extra
    if rows:
        (tmp_path / "speeds.csv").write_text(rows)
        text += '[drift]\ntrace = "speeds.csv"\n'
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_scenario(path)


def relay(sc: Scenario) -> str:
    return sorted(i for i, n in sc.nodes.items() if n.stage == 1)[0]


def test_speed_rows_are_read_and_checked(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,event,node\n10,speed,n1,4\n70,speed,n1,1\n")
    events = read_csv_trace(trace)
    assert [(e.time_s, e.kind, e.node, e.factor) for e in events] == [
        (10.0, "speed", "n1", 4.0), (70.0, "speed", "n1", 1.0)]
    for bad, words in (("5,speed,n1\n", "time_s,speed,node,factor"),
                       ("5,speed,n1,0\n", "factor must be a positive number")):
        trace.write_text(bad)
        with pytest.raises(TraceError, match=words):
            read_csv_trace(trace)
    with pytest.raises(ScenarioError, match="machines the scenario does not have: ghost"):
        scenario(tmp_path, rows="5,speed,ghost,2\n")
    (tmp_path / "speeds.csv").write_text("5,join,n9\n")
    path = tmp_path / "s.toml"
    path.write_text(BASE + '[drift]\ntrace = "speeds.csv"\n')
    with pytest.raises(ScenarioError, match="may only hold speed rows"):
        load_scenario(path)


def test_generated_episodes_follow_their_parameters_and_the_seed() -> None:
    def episodes(seed: int) -> list[tuple[float, str, float | None]]:
        return [(e.time_s, e.node, e.factor) for e in generate_stragglers(
            np.random.default_rng(seed), nodes=[f"n{i}" for i in range(50)],
            duration_s=36000.0, episodes_per_node_h=1.0, slowdowns=[(2.0, 4.0, 1.0)],
            median_s=300.0, sigma=1.0, min_s=20.0, max_s=3600.0)]

    first = episodes(7)
    assert first == episodes(7) and first != episodes(8)
    starts = [f for _, _, f in first if f != 1.0]
    assert all(2.0 <= f <= 4.0 for f in starts)
    # One episode per machine and hour on average, one at a time: a little under 10 per machine.
    assert 300 < len(starts) < 550
    per_node: dict[str, list[tuple[float, float | None]]] = {}
    for t, node, f in first:
        per_node.setdefault(node, []).append((t, f))
    for rows in per_node.values():  # each episode ends before the next begins
        kinds = [f == 1.0 for _, f in rows]
        assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False))


def test_a_drift_section_with_bad_values_is_one_sentence(tmp_path: Path) -> None:
    for extra, words in (
        ("[drift]\nepisodes_per_node_hour = 1.0\nslowdowns = [[2.0, 1.0, 1.0]]\n",
         "0 < low <= high"),
        ("[drift]\nepisodes_per_node_hour = 1.0\nslowdowns = [1.0]\n", "triples"),
        ("[drift]\nepisodes_per_node_hour = 1.0\nepisode_median_s = 5.0\n", "min_s <= median_s"),
        ("[drift]\nrate = 1\n", "unknown key 'rate'"),
    ):
        with pytest.raises(ScenarioError, match=words):
            scenario(tmp_path, extra)


def test_gwtf_moves_its_flows_off_a_straggler_and_back(tmp_path: Path) -> None:
    """The relay's pace reaches its record a few of its microbatches after the slowdown and
    again after its recovery; gwtf trains near what the oracle, which knows at once, trains, and
    much more than when blind to paces."""
    slow = relay(scenario(tmp_path))
    sc = scenario(tmp_path, rows=f"120,speed,{slow},4\n420,speed,{slow},1\n")
    sim = simulation(sc, "gwtf")
    result = sim.run()
    assert sim.paces is not None and sim.paces.publications >= 2
    node = sim.nodes[slow]
    assert node.slow == 1.0 and node.record_s == pytest.approx(node.compute_s)
    assert node.revision >= 2
    oracle = simulation(sc, "oracle").run().throughput_mean
    try:
        policies.GwtfPolicy.paced = False
        blind = simulation(sc, "gwtf").run().throughput_mean
    finally:
        policies.GwtfPolicy.paced = True
    assert result.throughput_mean > 0.9 * oracle
    assert result.throughput_mean > 1.2 * blind
