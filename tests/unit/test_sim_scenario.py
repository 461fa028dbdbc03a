"""Scenario files: the shipped ones load with numbers from the real data; bad ones fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtf.sim.scenario import POLICIES, ScenarioError, load_scenario

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ["geo10_spot", "geo10_hetero_links", "homogeneous", "high_churn"]

MINIMAL = """
name = "tiny"
duration_s = 100
[model]
stages = 2
params_per_stage = [1.0e8, 1.0e8]
tokens_per_microbatch = 1024
hidden_size = 1024
[training]
iterations = 2
microbatches_per_iteration = 8
[network]
matrix = "{matrix}"
[nodes]
count = 4
"""


def write(tmp_path: Path, text: str) -> Path:
    matrix = REPO / "gwtf" / "data" / "geo10_aws.csv"
    path = tmp_path / "s.toml"
    path.write_text(text.replace("{matrix}", str(matrix)))
    return path


@pytest.mark.parametrize("name", SCENARIOS)
def test_shipped_scenarios_load(name: str) -> None:
    sc = load_scenario(REPO / "simulations" / f"{name}.toml")
    assert sc.name == name
    assert sc.stages == 4 and sc.activation_bytes == 32 * 2**20
    assert set(sc.policies) == set(POLICIES) - {"swarm-routing"}  # that one: benchmarks/versus.py
    assert sc.description.strip()
    assert len(sc.initial) >= 4
    stages = {sc.nodes[n].stage for n in sc.initial}
    assert stages == {0, 1, 2, 3}


def test_compute_comes_from_the_measured_gpu_speeds() -> None:
    sc = load_scenario(REPO / "simulations" / "geo10_spot.toml")
    # 6 * 302e6 * 8192 FLOP at 6 * 257e6 * 6071 FLOP/s (a V100 on Transformer-XL large).
    assert sc.compute_s_v100[0] == pytest.approx(6 * 3.02e8 * 8192 / (6 * 257e6 * 6071))
    assert sc.compute_s_v100[0] == pytest.approx(1.586, abs=1e-3)
    speeds = {info.gpu: info.speed for info in sc.nodes.values()}
    assert speeds["H100 80GB SXM5"] == 5.281 and speeds["LambdaCloud V100 16GB"] == 1.0
    assert len(sc.nodes) == 177  # every node of the p3 trace
    assert sc.duration_s == pytest.approx(40920)
    node = next(iter(sc.nodes.values()))
    assert sc.compute_s(node) == pytest.approx(sc.compute_s_v100[node.stage] / node.speed)


def test_given_compute_replaces_the_compute_model(tmp_path: Path) -> None:
    text = MINIMAL.replace("hidden_size = 1024", "hidden_size = 1024\ncompute_s_v100 = [0.3, 0.5]")
    sc = load_scenario(write(tmp_path, text))
    assert sc.compute_s_v100 == (0.3, 0.5)
    node = next(iter(sc.nodes.values()))
    assert sc.compute_s(node) == pytest.approx(sc.compute_s_v100[node.stage] / node.speed)
    # The fidelity swarm states the real nodes' emulated compute, not its tiny model's.
    fidelity = load_scenario(REPO / "simulations" / "fidelity.toml")
    assert fidelity.compute_s_v100 == (0.3, 0.3, 0.3)


def test_generated_churn_depends_on_the_seed_only(tmp_path: Path) -> None:
    text = MINIMAL + '[churn]\ngenerator = "poisson"\njoin_rate_per_h = 60\nsession_mean_s = 300\n'
    first = load_scenario(write(tmp_path, text))
    again = load_scenario(write(tmp_path, text))
    other = load_scenario(write(tmp_path, text.replace('name = "tiny"', 'name = "tiny"\nseed = 5')))
    assert first.events == again.events and first.nodes == again.nodes
    assert first.events != other.events


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('name = "tiny"\n', ""), "missing 'name'"),
        (lambda t: t + "[training]\n", "not valid TOML"),
        (lambda t: t.replace("count = 4", "count = 4\ncolour = 1"), "unknown key 'colour'"),
        (lambda t: t.replace("count = 4", 'count = 4\ngpus = ["GTX 480"]'), "unknown GPU"),
        (lambda t: t.replace("stages = 2", "stages = 3"), "'params_per_stage' must be a list of 3"),
        (lambda t: t + '[policies]\nnames = ["petals"]\n', "unknown policy 'petals'"),
        (lambda t: t + '[churn]\ntrace = "x.csv"\ngenerator = "poisson"\n', "not both"),
        (lambda t: t + '[churn]\ntrace = "missing.csv"\n', "cannot read trace"),
        (lambda t: t.replace("duration_s = 100", "duration_s = -1"), "must be positive"),
        (lambda t: t.replace("hidden_size = 1024", 'hidden_size = 1024\ncompute = "guess"'),
         "unknown compute 'guess'"),
        (lambda t: t.replace("hidden_size = 1024",
                             'hidden_size = 1024\ncompute = "peak"\nutilisation = 1.5'),
         "at most 1"),
        (lambda t: t.replace("hidden_size = 1024", "hidden_size = 1024\ncompute_s_v100 = [0.3]"),
         "'compute_s_v100' must be a list of 2"),
        (lambda t: t.replace("count = 4", "count = 4\nuplink_gbps = [0.1, 0]"),
         "'uplink_gbps' must be a list of positive numbers"),
        (lambda t: t.replace("count = 4", 'count = 4\ndownlink_gbps = ["fast"]'),
         "'downlink_gbps' must be a list of positive numbers"),
    ],
)
def test_bad_scenarios_fail_with_one_line(tmp_path: Path, change: object, message: str) -> None:
    assert callable(change)
    with pytest.raises(ScenarioError) as err:
        load_scenario(write(tmp_path, change(MINIMAL)))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_scenario_file() -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario("/nonexistent/scenario.toml")


@pytest.mark.parametrize("name", ["home_links", "volunteer_sessions"])
def test_home_scenarios_have_access_links_and_peak_compute(name: str) -> None:
    sc = load_scenario(REPO / "simulations" / f"{name}.toml")
    assert set(sc.policies) == set(POLICIES) - {"swarm-routing"} and sc.description.strip()
    infos = list(sc.nodes.values())
    assert all(0.02 <= i.uplink_gbps <= 1.0 and 0.1 <= i.downlink_gbps <= 1.0 for i in infos)
    assert len({i.uplink_gbps for i in infos}) > 1  # drawn per machine
    # 40% of an RTX 4090's 165.2 dense TFLOP/s (gwtf/data/gpu_peak_tflops.csv).
    node = next(i for i in infos if i.gpu == "RTX 4090")
    flops = 6 * sc.params_per_stage[0] * sc.tokens_per_microbatch
    assert sc.compute_s(node, 0) == pytest.approx(flops / (165.2e12 * 0.4))


def test_access_links_leave_the_other_draws_alone(tmp_path: Path) -> None:
    """Scenarios without access links draw the same machines as before they existed, and a
    rejoin keeps its machine's links."""
    plain = load_scenario(write(tmp_path, MINIMAL))
    links = load_scenario(write(tmp_path, MINIMAL.replace(
        "count = 4", "count = 4\nuplink_gbps = [0.05, 0.5]\ndownlink_gbps = [1.0]")))
    for node_id, info in plain.nodes.items():
        other = links.nodes[node_id]
        assert (info.stage, info.location, info.gpu) == (other.stage, other.location, other.gpu)
        assert info.uplink_gbps == float("inf") and other.uplink_gbps in (0.05, 0.5)
        assert other.downlink_gbps == 1.0
