"""The balanced routing objective (gwtf/flow/balance.py, docs/design.md 2.2): the maximum flow,
every node of a stage loaded to within the headroom of its stage's even share, then least cost.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from gwtf.flow.balance import BALANCE_HEADROOM, balanced_nodes
from gwtf.flow.generate import geo10
from gwtf.flow.localsolve import solve_members
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units
from gwtf.flow.topology import LinkSpec, Members, NodeSpec, Topology


def _through(flows: dict[tuple[str, str], int], topo: Topology) -> dict[str, int]:
    """Units each node carries: what it sends on (stage 0), else what it receives."""
    out: dict[str, int] = defaultdict(int)
    for (src, dst), units in flows.items():
        out[dst] += units
        if topo.node(src).stage == 0:
            out[src] += units
    return out


def _homogeneous() -> Topology:
    """16 equal nodes at one site, 4 stages, the last slower: the first three stages have room."""
    nodes = [
        NodeSpec.make(f"s{s}n{i}", s, 0.72 if s == 3 else 0.59, "here")
        for s in range(4) for i in range(4)
    ]
    return Topology.build(8 * 2**20, nodes, {}, intra=LinkSpec(1.0, 10.0))


def test_a_wide_stage_is_loaded_evenly_and_the_flow_stays_the_maximum() -> None:
    topo = _homogeneous()
    plain = solve_oracle(topo)
    balanced = solve_oracle(topo, balance=BALANCE_HEADROOM)
    assert balanced.flow_value_units == plain.flow_value_units
    through = _through(dict(balanced.flows), topo)
    for s in range(3):
        ids = topo.stage_nodes(s)
        share = plain.flow_value_units / len(ids)
        loads = [through[i] for i in ids]
        assert max(loads) <= share * (1 + BALANCE_HEADROOM) + 1, (s, loads)
    # The linear objective alone is free to leave a node of a wide stage nearly idle and fill
    # the others to their capacity: the case the balance is for (if it did not here, this test
    # would not show the objective doing anything).
    plain_through = _through(dict(plain.flows), topo)
    assert any(
        max(plain_through[i] for i in topo.stage_nodes(s))
        > (1 + BALANCE_HEADROOM) * plain.flow_value_units / 4 + 1
        for s in range(3)
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_local_solver_and_the_oracle_agree_on_the_balanced_objective(seed: int) -> None:
    topo = geo10(np.random.default_rng(seed), 24, 4)
    oracle = solve_oracle(topo, balance=BALANCE_HEADROOM)
    local = solve_members(Members.of(topo), balance=BALANCE_HEADROOM)
    assert sum(x for (_, d), x in local.flows.items()
               if topo.node(d).stage == 3) == oracle.flow_value_units
    assert oracle.flow_value_units == solve_oracle(topo).flow_value_units
    plain_cost = oracle_cost_units(topo, solve_oracle(topo))  # a lower bound of both
    balanced_cost = oracle_cost_units(topo, oracle)
    local_cost = cost_units(topo, {k: x for k, x in local.flows.items() if x > 0})
    assert plain_cost <= balanced_cost
    assert plain_cost <= local_cost <= balanced_cost * 1.02


def test_the_flow_value_is_never_traded_for_balance() -> None:
    """Arcs that bind before nodes do: b0 is reached only from a0 and b1 (slow) only from a1,
    so the maximum flow needs a0 near its capacity. Capped at its even share a0 could not carry
    it; the headroom widens and at last the plain answer stands."""
    nodes = [
        NodeSpec.make("a0", 0, 0.1, "x"), NodeSpec.make("a1", 0, 0.1, "x"),
        NodeSpec.make("b0", 1, 0.1, "x"), NodeSpec.make("b1", 1, 1.0, "x"),
    ]
    topo = Topology.build(
        8 * 2**20, nodes, {}, intra=LinkSpec(1.0, 10.0), blocked=[("a0", "b1"), ("a1", "b0")]
    )
    plain = solve_oracle(topo)
    capped = balanced_nodes(topo.nodes, plain.flow_value_units, BALANCE_HEADROOM)
    narrow = solve_oracle(topo.with_capacities({n.id: n.capacity for n in capped}))
    assert narrow.flow_value_units < plain.flow_value_units  # the cap alone would lose flow
    balanced = solve_oracle(topo, balance=BALANCE_HEADROOM)
    assert balanced.flow_value_units == plain.flow_value_units
    local = solve_members(Members.of(topo), balance=BALANCE_HEADROOM)
    assert sum(x for (_, d), x in local.flows.items() if d.startswith("b")) == (
        plain.flow_value_units)


def test_balanced_nodes_keep_proportions_and_only_shrink() -> None:
    nodes = (
        NodeSpec.make("a", 0, 0.1, "x"), NodeSpec.make("b", 0, 0.2, "x"),
        NodeSpec.make("c", 1, 0.5, "x"),
    )
    flow = nodes[2].cap_units  # stage 1 is the cut: its node keeps its capacity
    capped = balanced_nodes(nodes, flow, 0.0)
    assert capped[2] == nodes[2]
    assert all(c.cap_units <= n.cap_units for c, n in zip(capped, nodes, strict=True))
    assert sum(c.cap_units for c in capped[:2]) >= flow
    assert abs(capped[0].cap_units / capped[1].cap_units - 2.0) < 1e-3
