"""The oracle on hand-solved examples, certified optimal on random ones; flow evaluation."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.flow.generate import random_layered
from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network, oracle_cost_units, solve_oracle
from gwtf.flow.solution import FlowResult, feasibility_violations, make_result
from gwtf.flow.topology import LinkSpec, NodeSpec, Topology, parse_topology

MB = 1_000_000


def node(node_id: str, stage: int, location: str, capacity: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": node_id, "stage": stage, "compute_s": 0.01, "location": location}
    if capacity is not None:
        entry["capacity"] = capacity
    return entry


def link(a: str, b: str, rtt_ms: float, bandwidth_gbps: float) -> dict[str, Any]:
    return {"src": a, "dst": b, "rtt_ms": rtt_ms, "bandwidth_gbps": bandwidth_gbps}


# -- hand-solved examples ---------------------------------------------------------------------


def test_max_flow_limited_by_an_arc() -> None:
    # Both nodes could do 10 mb/s, but 0.024 Gbit/s carries only 0.024e9/8/1e6 = 3 mb/s.
    topo = parse_topology(
        {
            "activation_bytes": MB,
            "nodes": [node("h", 0, "A", 10), node("r", 1, "B", 10)],
            "links": [link("A", "B", 20, 0.024)],
        }
    )
    result = solve_oracle(topo)
    assert result.flows == {("h", "r"): 3_000_000}
    assert result.flow_value_units == 3_000_000
    assert result.flow_value == 3.0
    cost = 0.01 + 20 / 2000 + 8e6 / 0.024e9  # = 0.02 + 1/3
    assert topo.arc("h", "r").cost == pytest.approx(cost)
    assert result.total_cost == pytest.approx(3 * cost)
    assert result.max_path_cost == pytest.approx(cost)
    assert oracle_cost_units(topo, result) == 3_000_000 * round(cost * 1e9)
    assert result.messages == 0 and result.rounds == 0


def two_routes(source_capacity: float) -> Topology:
    # h can reach 'near' (same location, cost 0.01 + 0.0005 + 0.0008 = 0.0113 s) and 'far'
    # (100 ms, 1 Gbit/s: cost 0.01 + 0.05 + 0.008 = 0.068 s), each able to do 10 mb/s.
    return parse_topology(
        {
            "activation_bytes": MB,
            "nodes": [
                node("h", 0, "A", source_capacity),
                node("near", 1, "A", 10),
                node("far", 1, "B", 10),
            ],
            "links": [link("A", "B", 100, 1)],
        }
    )


def test_oracle_picks_the_cheaper_of_two_maximum_flows() -> None:
    topo = two_routes(10)
    assert topo.arc("h", "near").cost_units == 11_300_000
    assert topo.arc("h", "far").cost_units == 68_000_000
    result = solve_oracle(topo)
    # 10 mb/s either way; all of it on the cheap arc
    assert result.flows == {("h", "near"): 10_000_000}
    assert result.flow_value == 10.0
    assert oracle_cost_units(topo, result) == 10_000_000 * 11_300_000
    assert result.total_cost == pytest.approx(0.113)
    assert result.max_path_cost == pytest.approx(0.0113)


def test_oracle_maximizes_flow_before_cost() -> None:
    topo = two_routes(15)
    result = solve_oracle(topo)
    # 15 mb/s needs both: 10 on the cheap arc, the remaining 5 on the costly one
    assert result.flows == {("h", "far"): 5_000_000, ("h", "near"): 10_000_000}
    assert result.flow_value_units == 15_000_000
    assert oracle_cost_units(topo, result) == 10_000_000 * 11_300_000 + 5_000_000 * 68_000_000
    assert result.total_cost == pytest.approx(10 * 0.0113 + 5 * 0.068)
    assert result.max_path_cost == pytest.approx(0.068)
    assert result.to_json() == {
        "flow_value": 15.0,
        "total_cost": result.total_cost,
        "max_path_cost": result.max_path_cost,
        "arcs": [
            {"src": "h", "dst": "far", "flow": 5.0},
            {"src": "h", "dst": "near", "flow": 10.0},
        ],
        "messages": 0,
        "rounds": 0,
    }


def test_oracle_takes_a_costly_first_hop_when_the_cheap_one_leads_nowhere() -> None:
    # h -> x is cheap but x cannot reach stage 2 (no A-D link); h -> y -> z is the only route.
    topo = parse_topology(
        {
            "activation_bytes": MB,
            "nodes": [
                node("h", 0, "A", 10),
                node("x", 1, "A", 10),
                node("y", 1, "B", 4),
                node("z", 2, "D", 10),
            ],
            "links": [link("A", "B", 100, 1), link("B", "D", 10, 1)],
        }
    )
    assert topo.arc("h", "x").cost < topo.arc("h", "y").cost
    assert not topo.has_arc("x", "z")
    result = solve_oracle(topo)
    assert result.flow_value_units == 4_000_000
    assert result.flows == {("h", "y"): 4_000_000, ("y", "z"): 4_000_000}
    expected = topo.arc("h", "y").cost + topo.arc("y", "z").cost
    assert result.max_path_cost == pytest.approx(expected)
    assert feasibility_violations(topo, result.flows) == []


def test_oracle_on_a_topology_with_no_route() -> None:
    topo = parse_topology(
        {
            "activation_bytes": MB,
            "nodes": [node("h", 0, "A"), node("g", 0, "A"), node("r", 1, "B"), node("s", 1, "B")],
            "links": [link("A", "C", 1, 1), link("B", "C", 1, 1)],
        }
    )
    result = solve_oracle(topo)
    assert result.flows == {}
    assert result.flow_value == 0.0 and result.total_cost == 0.0 and result.max_path_cost == 0.0


# -- optimality certificates on random topologies ---------------------------------------------


def certify_optimal(topo: Topology, result: FlowResult) -> None:
    """A flow is a min-cost maximum flow iff its residual network has no source-sink path and
    no negative cycle: checked independently of the solver."""
    network = build_oracle_network(topo)
    inflow: dict[str, int] = defaultdict(int)
    outflow: dict[str, int] = defaultdict(int)
    for (src, dst), units in result.flows.items():
        outflow[src] += units
        inflow[dst] += units

    def flow_on(u: Any, v: Any) -> int:
        if u == SOURCE:
            return outflow[v[0]]
        if v == SINK:
            return inflow[u[0]]
        if u[0] == v[0]:  # a node's in -> out half
            n = topo.node(u[0])
            return outflow[n.id] if n.stage == 0 else inflow[n.id]
        return result.flows.get((u[0], v[0]), 0)

    residual = nx.DiGraph()
    for u, v, data in network.edges(data=True):
        f = flow_on(u, v)
        capacity = data.get("capacity")
        if capacity is None or f < capacity:
            residual.add_edge(u, v, weight=data["weight"])
        if f > 0:
            residual.add_edge(v, u, weight=-data["weight"])
    assert not (residual.has_node(SINK) and nx.has_path(residual, SOURCE, SINK)), "not maximum"
    assert not nx.negative_edge_cycle(residual, weight="weight"), "not of least cost"


def test_the_certificate_rejects_suboptimal_flows() -> None:
    topo = two_routes(15)
    costly = make_result(topo, {("h", "far"): 10_000_000, ("h", "near"): 5_000_000})
    with pytest.raises(AssertionError, match="not of least cost"):
        certify_optimal(topo, costly)
    short = make_result(topo, {("h", "near"): 10_000_000})
    with pytest.raises(AssertionError, match="not maximum"):
        certify_optimal(topo, short)


@pytest.mark.parametrize("seed", range(20))
def test_oracle_is_feasible_and_optimal_on_random_topologies(seed: int) -> None:
    rng = np.random.default_rng(seed)
    topo = random_layered(rng, int(rng.integers(4, 30)), int(rng.integers(2, 6)))
    result = solve_oracle(topo)
    assert feasibility_violations(topo, result.flows) == []
    certify_optimal(topo, result)
    assert result == make_result(topo, dict(result.flows))
    # the value is what stage S-1 takes in, which conservation makes what stage 0 sends
    sent = sum(u for (src, _), u in result.flows.items() if topo.node(src).stage == 0)
    assert sent == result.flow_value_units


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_stages=st.integers(2, 5),
    extra=st.integers(0, 15),
    missing=st.floats(0.0, 0.9),
)
def test_oracle_property_feasible_and_optimal(
    seed: int, n_stages: int, extra: int, missing: float
) -> None:
    topo = random_layered(
        np.random.default_rng(seed), n_stages + extra, n_stages, missing_link_p=missing
    )
    result = solve_oracle(topo)
    assert feasibility_violations(topo, result.flows) == []
    certify_optimal(topo, result)


# -- feasibility checks and results on hand-made flows ----------------------------------------


def chain() -> Topology:
    # stage 0: h (cap 10); stage 1: x (cap 6), y (cap 10); stage 2: t (cap 8). All at A, so every
    # arc exists with capacity 1250 mb/s.
    return parse_topology(
        {
            "activation_bytes": MB,
            "nodes": [
                node("h", 0, "A", 10),
                node("x", 1, "A", 6),
                node("y", 1, "A", 10),
                node("t", 2, "A", 8),
            ],
            "links": [],
        }
    )


def test_feasible_hand_flow() -> None:
    flows = {("h", "x"): 3_000_000, ("x", "t"): 3_000_000, ("h", "y"): 5_000_000}
    flows[("y", "t")] = 5_000_000
    assert feasibility_violations(chain(), flows) == []
    assert feasibility_violations(chain(), {}) == []


@pytest.mark.parametrize(
    ("flows", "expected"),
    [
        ({("h", "t"): 1}, "arc 'h'->'t' carries 1 units but is not in the topology"),
        ({("x", "h"): 1}, "not in the topology"),
        ({("h", "x"): -1, ("x", "t"): -1}, "arc 'h'->'x': flow -1 units is negative"),
        (
            {("h", "x"): 1_250_000_001, ("x", "t"): 1_250_000_001},
            "arc 'h'->'x': flow 1250000001 units exceeds its capacity 1250000000 units",
        ),
        (
            {("h", "x"): 2_000_000, ("x", "t"): 1_000_000},
            "node 'x' (stage 1): in-flow 2000000 units != out-flow 1000000 units",
        ),
        (
            {("h", "x"): 7_000_000, ("x", "t"): 7_000_000},
            "node 'x' (stage 1): throughput 7000000 units exceeds its capacity 6000000 units",
        ),
        (
            {("h", "x"): 6_000_000, ("x", "t"): 6_000_000, ("h", "y"): 5_000_000},
            "node 'h' (stage 0): throughput 11000000 units exceeds its capacity",
        ),
        (
            {
                ("h", "x"): 5_000_000,
                ("x", "t"): 5_000_000,
                ("h", "y"): 4_000_000,
                ("y", "t"): 4_000_000,
            },
            "node 't' (stage 2): throughput 9000000 units exceeds its capacity 8000000",
        ),
    ],
)
def test_feasibility_violations_catch_each_kind(
    flows: dict[tuple[str, str], int], expected: str
) -> None:
    problems = feasibility_violations(chain(), flows)
    assert any(expected in p for p in problems), problems


def test_make_result_max_path_cost_by_hand() -> None:
    topo = chain()
    hx, xt = topo.arc("h", "x").cost, topo.arc("x", "t").cost
    hy, yt = topo.arc("h", "y").cost, topo.arc("y", "t").cost
    # all compute 0.01, all intra: every arc costs 0.01 + 0.0005 + 0.0008
    assert hx == pytest.approx(0.0113)
    flows = {("h", "x"): 1_000_000, ("x", "t"): 1_000_000, ("h", "y"): 2_000_000}
    flows[("y", "t")] = 2_000_000
    result = make_result(topo, flows, messages=7, rounds=3)
    assert result.max_path_cost == pytest.approx(max(hx + xt, hy + yt))
    assert result.total_cost == pytest.approx(1 * hx + 1 * xt + 2 * hy + 2 * yt)
    assert result.flow_value_units == 3_000_000
    assert result.messages == 7 and result.rounds == 3
    assert list(result.flows) == [("h", "x"), ("h", "y"), ("x", "t"), ("y", "t")]

    # a path over a costlier link counts; one that dead-ends before the last stage does not
    slow = topo.with_link("A", "B", LinkSpec(rtt_ms=300, bandwidth_gbps=0.1))
    slow = slow.with_node(NodeSpec.make("z", 1, 0.01, "B", 10.0))
    dead_end = {("h", "z"): 1_000_000, ("h", "x"): 1_000_000, ("x", "t"): 1_000_000}
    assert slow.arc("h", "z").cost > hx + xt
    assert make_result(slow, dead_end).max_path_cost == pytest.approx(hx + xt)
    through = {**dead_end, ("z", "t"): 1_000_000}
    expected = slow.arc("h", "z").cost + slow.arc("z", "t").cost
    assert make_result(slow, through).max_path_cost == pytest.approx(expected)

    assert make_result(topo, {}).max_path_cost == 0.0
    assert make_result(topo, {("h", "x"): 0}).flows == {}


def test_make_result_rejects_unknown_arcs_and_negative_flows() -> None:
    with pytest.raises(ValueError, match="not in the topology"):
        make_result(chain(), {("h", "t"): 1})
    with pytest.raises(ValueError, match="negative"):
        make_result(chain(), {("h", "x"): -1})
