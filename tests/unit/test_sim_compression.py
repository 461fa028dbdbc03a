"""Activation compression in the simulator (gwtf/sim/compression.py): the bytes each boundary
is charged, the codecs' compute, who compresses what, the plan from `swarm_plan`, and that a
scenario without compression runs as it did before."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import gwtf.sim.compression as compression
from gwtf.flow.compression import boundary_sizes, swarm_plan, uplink_capacity, wire_bytes
from gwtf.flow.localsolve import solve_members
from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network
from gwtf.flow.simplex import max_flow_value
from gwtf.flow.topology import CAP_SCALE, Members, NodeSpec, Topology
from gwtf.sim.cli import parse_policies
from gwtf.sim.compression import (
    CODEC_S_PER_BYTE,
    SWARM_CODEC,
    codec_rate,
    codec_side_seconds,
    for_policy,
    job_plan,
    route_view,
    with_plan,
)
from gwtf.sim.policies import GwtfPolicy, simulation
from gwtf.sim.routing.localrouting import LocalRouting
from gwtf.sim.scenario import POLICIES, Scenario, ScenarioError, load_scenario
from gwtf.sim.simulator import Simulation

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "gwtf" / "data" / "geo10_aws.csv"

# Four stages on home connections: the access links bind, as in simulations/home_links.toml.
HOME = f"""
name = "home"
seed = 1
duration_s = {{duration}}
[model]
stages = 4
params_per_stage = [1.0e7, 1.0e7, 1.0e7, 1.0e7]
tokens_per_microbatch = 2048
hidden_size = 1024
grad_bytes_per_param = 1
state_bytes_per_param = 2
compute = "peak"
[training]
iterations = 50
microbatches_per_iteration = 16
memory_slots = 8
[network]
matrix = "{MATRIX}"
[nodes]
count = 8
gpus = ["RTX 4090"]
locations = ["Oregon", "Ohio", "Virginia"]
uplink_gbps = [0.05, 0.1]
downlink_gbps = [0.2]
"""


def home(tmp_path: Path, *, duration: float = 120, compression: str = "") -> Scenario:
    path = tmp_path / "home.toml"
    path.write_text(HOME.replace("{duration}", str(duration)) + compression)
    return load_scenario(path)


ON = '[compression]\nallow = ["int8"]\n'


def values(sc: Scenario) -> int:
    return sc.tokens_per_microbatch * sc.hidden_size


def test_the_compression_table_is_read_and_checked(tmp_path: Path) -> None:
    assert home(tmp_path).compression == ()
    sc = home(tmp_path, compression='[compression]\nallow = ["int4", "int8"]\n')
    assert sc.compression == ("int8", "int4")
    assert "gwtf-uncompressed" in sc.policies and set(POLICIES) <= set(sc.policies)
    assert "gwtf-uncompressed" not in home(tmp_path).policies
    with pytest.raises(ScenarioError, match="unknown codec 'int2'"):
        home(tmp_path, compression='[compression]\nallow = ["int2"]\n')
    # `gwtf simulate --policy` takes the comparison too.
    assert parse_policies("gwtf,gwtf-uncompressed,swarm", sc) == [
        "gwtf", "gwtf-uncompressed", "swarm"]


def test_each_boundary_is_charged_its_codecs_bytes(tmp_path: Path) -> None:
    sc = with_plan(home(tmp_path, compression=ON), ("int8", "none", "int4"))
    act = sc.activation_bytes  # 2048 x 1024 values of 2 bytes
    assert [sc.boundary(k) for k in range(3)] == [
        wire_bytes("int8", values(sc)), act, wire_bytes("int4", values(sc))]
    assert sc.boundary(0) == values(sc) + values(sc) // 64 * 4  # a byte a value, a scale a block
    # A 4-byte activation is charged what the flow layer's boundary_sizes says.
    fp32 = with_plan(replace(sc, activation_bytes=4 * values(sc)), ("int8", "none", "int4"))
    assert fp32.boundary_bytes == boundary_sizes(4 * values(sc), ("int8", "none", "int4"))


def test_transfers_and_capacities_use_the_boundarys_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = home(tmp_path, compression=ON)
    plan = ("int8", "none", "int4")
    sent: list[tuple[int, int, float]] = []
    original = Simulation.transfer

    def spy(self: Simulation, a: Any, b: Any, nbytes: float) -> float:
        sent.append((a.stage, b.stage, nbytes))
        return original(self, a, b, nbytes)

    monkeypatch.setattr(Simulation, "transfer", spy)
    monkeypatch.setattr(compression, "job_plan", lambda sc, allowed=None: plan)
    sim = simulation(base, "gwtf")
    result = sim.run()
    sc = sim.sc
    assert sc.codec_plan == plan and result.codecs == plan and result.committed_microbatches > 0
    # Every node's routing prices the boundaries with the plan, as the node's does.
    policy = sim.policy
    assert isinstance(policy, GwtfPolicy) and isinstance(policy.router, LocalRouting)
    members = policy.router.members.values()
    assert members and all(m.route._boundary_bytes == sc.boundary_bytes for m in members)
    for k in range(3):
        across = [n for a, b, n in sent if {a, b} == {k, k + 1}]
        # An activation and a gradient per microbatch and boundary, at the boundary's bytes;
        # nothing across it at another boundary's size.
        assert across.count(sc.boundary(k)) >= 2 * result.committed_microbatches
        others = {sc.boundary(j) for j in range(3)} - {sc.boundary(k)}
        assert not others & set(across)
    # The access links bound a node by the boundaries it sends across, as the flow layer says
    # (here they bind most nodes; memory binds the others).
    bound_by_access = 0
    for node in sim.nodes.values():
        info = node.info
        bound = uplink_capacity(min(info.uplink_gbps, info.downlink_gbps), node.stage,
                                sc.boundary_bytes)
        assert sim.capacity_at(info, node.stage) <= bound
        bound_by_access += sim.capacity_at(info, node.stage) == bound
    assert bound_by_access >= len(sim.nodes) // 2


def test_a_node_pays_the_codecs_compute_at_each_lossy_side(tmp_path: Path) -> None:
    base = home(tmp_path, compression=ON)
    sc = with_plan(base, ("int8", "none", "int4"))
    tensor = 4 * values(sc)
    int8 = CODEC_S_PER_BYTE["int8"][0][1] * tensor
    int4 = CODEC_S_PER_BYTE["int4"][0][1] * tensor
    assert codec_rate("int8", tensor) == CODEC_S_PER_BYTE["int8"][0][1]  # 8 MiB: the small one
    assert codec_rate("int8", 64 * 2**20) == CODEC_S_PER_BYTE["int8"][-1][1]
    assert sc.codec_s == pytest.approx((int8, int8, int4, int4))
    info = sc.nodes[sc.initial[0]]
    for stage in range(4):
        assert sc.compute_s(info, stage) == pytest.approx(
            base.compute_s(info, stage) + sc.codec_s[stage])
    free = with_plan(replace(base, codec_cost=0.0), ("int8", "none", "int4"))
    assert free.compute_s(info, 1) == base.compute_s(info, 1)


@pytest.mark.parametrize("policy", ["swarm", "swarm-rebalance", "swarm-routing"])
def test_swarm_policies_send_8_bit_on_every_boundary(tmp_path: Path, policy: str) -> None:
    sc = home(tmp_path, compression='[compression]\nallow = ["int4"]\n')
    run = for_policy(sc, policy)
    assert SWARM_CODEC == "int8"
    assert run.codec_plan == ("int8",) * 3
    assert run.boundary_bytes == (wire_bytes("int8", values(sc)),) * 3
    assert all(c > 0 for c in run.codec_s)
    assert for_policy(sc, "dtfm").boundary_bytes == ()  # DT-FM does not compress


def test_swarm_sends_8_bit_in_a_run(tmp_path: Path) -> None:
    result = simulation(home(tmp_path, duration=60, compression=ON), "swarm").run()
    assert result.codecs == ("int8",) * 3 and result.summary()["codecs"] == ["int8"] * 3


@pytest.mark.parametrize("policy", ["gwtf", "gwtf-fixed", "oracle"])
def test_the_planning_policies_plan_with_swarm_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    sc = home(tmp_path, compression='[compression]\nallow = ["int8", "int4"]\n')
    calls: list[tuple[Any, ...]] = []
    keywords: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> tuple[str, ...]:
        calls.append(args)
        keywords.append(kwargs)
        return swarm_plan(*args, **kwargs)

    monkeypatch.setattr(compression, "swarm_plan", spy)
    planned = simulation(sc, policy).sc
    assert len(calls) == 1
    stages, act, members, links, intra, allowed = calls[0]
    assert (stages, act, links, intra, tuple(allowed)) == (
        4, sc.activation_bytes, sc.links, sc.intra, ("int8", "int4"))
    # The job's first members, their compute and their access links (the least of the two).
    assert [n.id for n, _ in members] == list(sc.initial)
    for node, access in members:
        info = sc.nodes[node.id]
        assert node.compute_s == sc.compute_s(info) and node.location == info.location
        assert access == min(info.uplink_gbps, info.downlink_gbps)
    # fp16 activations: the values the codecs see, and the codecs' compute as charged.
    assert keywords[0]["values"] == sc.tokens_per_microbatch * sc.hidden_size
    assert keywords[0]["codec_seconds"]("int8") == codec_side_seconds(sc, "int8") > 0
    assert planned.codec_plan == swarm_plan(*calls[0], **keywords[0]) == job_plan(sc)
    assert any(c != "none" for c in planned.codec_plan)  # the home links bind


def _summary(sc: Scenario, policy: str) -> dict[str, Any]:
    summary = simulation(sc, policy).run().summary()
    for key in ("sim_wall_s", "events_per_s"):
        summary.pop(key)
    return summary


def test_compression_off_changes_nothing(tmp_path: Path) -> None:
    sc = home(tmp_path)
    for policy in (*POLICIES, "gwtf-uncompressed"):
        assert for_policy(sc, policy) is sc
    # gwtf-uncompressed on a compressing scenario is gwtf with compression off, figure for figure.
    plain = _summary(sc, "gwtf")
    uncompressed = _summary(home(tmp_path, compression=ON), "gwtf-uncompressed")
    assert uncompressed.pop("codecs") == ["none"] * 3
    assert uncompressed == plain
    # So is gwtf itself where its plan compresses nothing: slow GPUs on datacenter links.
    slow = {i: replace(n, uplink_gbps=math.inf, downlink_gbps=math.inf)
            for i, n in sc.nodes.items()}
    compute_bound = replace(sc, compute_s_v100=(1.0,) * 4, nodes=slow)
    on = replace(compute_bound, compression=("int8", "int4"))
    assert job_plan(on) == ("none",) * 3
    planned = _summary(on, "gwtf")
    assert planned.pop("codecs") == ["none"] * 3
    assert planned == _summary(compute_bound, "gwtf")


def test_compression_lifts_gwtf_where_the_home_links_bind(tmp_path: Path) -> None:
    sc = home(tmp_path, duration=300, compression=ON)
    with_ = simulation(sc, "gwtf").run()
    without = simulation(sc, "gwtf-uncompressed").run()
    assert with_.codecs == ("int8",) * 3
    assert with_.throughput_mean > 1.3 * without.throughput_mean


def _flow(topology: Topology) -> float:
    return max_flow_value(build_oracle_network(topology), SOURCE, SINK) / CAP_SCALE


def test_a_mixed_plan_is_the_same_flow_problem_for_placement(tmp_path: Path) -> None:
    """Placement takes one activation size: a plan that mixes sizes gives it stage-tagged
    locations with scaled links (`RouteView`), which must be the problem
    `Topology.with_boundary_bytes` states, arc by arc, and the local solver's with the plan."""
    sc = with_plan(home(tmp_path, compression=ON), ("int8", "none", "int4"))
    view = route_view(sc)
    assert view.tagged == sc.boundary_bytes
    nodes = [NodeSpec.make(f"n{i}", i % 4, 0.05 + 0.01 * i, loc, 30.0)
             for i, loc in enumerate(["Oregon", "Ohio", "Virginia", "Oregon", "Ohio", "Oregon",
                                      "Virginia", "Ohio"])]
    exact = Topology.build(sc.activation_bytes, nodes, dict(sc.links),
                           sc.intra).with_boundary_bytes(sc.boundary_bytes)
    links = view.links(sc.links, sc.intra, {n.location for n in nodes})
    tagged_nodes = [replace(n, location=view.location(n.location, n.stage)) for n in nodes]
    tagged = Topology.build(view.activation_bytes, tagged_nodes, links, sc.intra)
    arcs = {(a.src, a.dst): a for a in exact.arcs}
    assert len(arcs) == len(tagged.arcs)
    for arc in tagged.arcs:
        twin = arcs[(arc.src, arc.dst)]
        assert arc.cap_units == twin.cap_units
        assert abs(arc.cost_units - twin.cost_units) <= 1
    assert _flow(tagged) == pytest.approx(_flow(exact))
    solved = solve_members(Members(view.activation_bytes, tuple(sorted(
        tagged_nodes, key=lambda n: (n.stage, n.id))), links, sc.intra, frozenset()))
    into_last = sum(u for (_, dst), u in solved.flows.items() if dst in {"n3", "n7"})
    assert into_last / CAP_SCALE == pytest.approx(_flow(exact), rel=1e-6)
    native = solve_members(Members(sc.activation_bytes, tuple(sorted(
        nodes, key=lambda n: (n.stage, n.id))), dict(sc.links), sc.intra, frozenset(),
        sc.boundary_bytes))
    assert native.flows == {(a, b): u for (a, b), u in solved.flows.items()}
    # One size on every boundary needs no tags: that size is given as the activation's.
    uniform = route_view(with_plan(sc, ("int8",) * 3))
    assert not uniform.tagged and uniform.activation_bytes == wire_bytes("int8", values(sc))


def test_the_shipped_wan_bound_scenario_is_bound_by_its_links() -> None:
    """simulations/geo10_wan_bound.toml: measured links and spot trace, fast GPUs; the maximum
    flow with its links is well below its GPUs', and int8 would lift it; but the codecs' CPU
    time per microbatch (0.29 s a side) is far above an H100's stage, so the plan compresses
    only where that compute is free."""
    sc = load_scenario(REPO / "simulations" / "geo10_wan_bound.toml")
    assert sc.stages == 8 and sc.activation_bytes == 8192 * 2560 * 2 and sc.compression == ()
    none = compression.plan_flow(sc, ("none",) * 7)
    assert none < 0.6 * compression.compute_bound_flow(sc)
    assert compression.plan_flow(sc, ("int8",) * 7) > 1.5 * none
    assert job_plan(sc, ("int8",)) == ("none",) * 7
    assert "int8" in job_plan(replace(sc, codec_cost=0.0), ("int8",))
