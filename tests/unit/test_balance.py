"""Routing objectives between the maximum flow and the least cost (gwtf/flow/balance.py,
docs/design.md 2.2): the queueing cost (each node's modelled M/D/1 wait
in the cost, as convex pieces of its capacity) and the headroom rule (every node of a stage
within the headroom of its stage's even share, then least cost), the objective of jobs.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from gwtf.flow.balance import (
    BALANCE_HEADROOM,
    COMPUTE_BOUND,
    QUEUE_WEIGHT,
    Headroom,
    balanced_nodes,
    queue_cost_units,
    queue_pieces,
)
from gwtf.flow.generate import geo10
from gwtf.flow.localsolve import solve_members
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units
from gwtf.flow.topology import CAP_SCALE, LinkSpec, Members, NodeSpec, Topology


def _through(flows: dict[tuple[str, str], int], topo: Topology) -> dict[str, int]:
    """Units each node carries: what it sends on (stage 0), else what it receives."""
    out: dict[str, int] = defaultdict(int)
    for (src, dst), units in flows.items():
        out[dst] += units
        if topo.node(src).stage == 0:
            out[src] += units
    return out


def _objective(topo: Topology, flows: dict[tuple[str, str], int]) -> int:
    """Link cost plus every node's queueing cost, in cost units x flow units."""
    through = _through(flows, topo)
    return cost_units(topo, flows) + sum(
        queue_cost_units(queue_pieces(n.compute_s, n.cap_units), through[n.id])
        for n in topo.nodes
    )


def _homogeneous() -> Topology:
    """16 equal nodes at one site, 4 stages, the last slower: the first three stages have room."""
    nodes = [
        NodeSpec.make(f"s{s}n{i}", s, 0.72 if s == 3 else 0.59, "here")
        for s in range(4) for i in range(4)
    ]
    return Topology.build(8 * 2**20, nodes, {}, intra=LinkSpec(1.0, 10.0))


# ------------------------------------------------------------------ the queueing cost


def test_queue_pieces_split_the_capacity_into_convex_pieces() -> None:
    for count in (1, 3):
        pieces = queue_pieces(0.59, NodeSpec.make("a", 0, 0.59, "x").cap_units, count)
        assert sum(u for u, _ in pieces) == count * NodeSpec.make("a", 0, 0.59, "x").cap_units
        costs = [c for _, c in pieces]
        assert costs == sorted(costs) and len(set(costs)) == len(costs)
        # The first piece (busy up to a quarter of the time): the M/D/1 secant, s/2 * 1/3 s.
        assert costs[0] == pytest.approx(0.59 / 6 * 1e9, rel=1e-6)
    # No compute time, or a weight of 0: one free piece, least cost.
    assert queue_pieces(0.0, 5_000_000) == ((5_000_000, 0),)
    assert queue_pieces(0.5, 1_000_000, 2, 0.0) == ((2_000_000, 0),)
    # A capacity bound by something else (here a node busy 2% of the time at its capacity):
    # one cheap piece, so such a node is routed by the link cost.
    slot_bound = queue_pieces(0.001, 20 * CAP_SCALE)
    assert len(slot_bound) == 1 and slot_bound[0][1] < 20_000
    assert queue_pieces(0.5, 0) == ()


def test_a_wide_stage_is_not_filled_to_capacity_and_the_flow_stays_the_maximum() -> None:
    topo = _homogeneous()
    plain = solve_oracle(topo)
    queued = solve_oracle(topo, balance=QUEUE_WEIGHT)
    assert queued.flow_value_units == plain.flow_value_units
    cap = topo.node("s0n0").cap_units
    plain_through = _through(dict(plain.flows), topo)
    through = _through(dict(queued.flows), topo)
    for s in range(3):
        ids = topo.stage_nodes(s)
        # Least cost fills some node of a wide stage to its capacity (the case the objective is
        # for: if it did not here, this test would not show the objective doing anything) ...
        assert max(plain_through[i] for i in ids) == cap, s
        # ... the queueing cost keeps every node of the stage below the last break (7/8 busy)
        # while the stage's even share is 80% of its capacity.
        assert max(through[i] for i in ids) <= 0.875 * cap + 1, (s, [through[i] for i in ids])
    assert _objective(topo, dict(queued.flows)) < _objective(topo, dict(plain.flows))


def test_a_node_bound_by_memory_slots_is_routed_by_link_cost() -> None:
    """The `fidelity` case: stage-1 nodes with a capacity well below their compute rate (memory
    slots over a long round trip). Their compute is idle most of the time, so queueing costs
    nothing there and the flow stays on the local node, where the headroom rule sends half of
    it over the 70 ms link."""
    nodes = [
        NodeSpec.make("a0", 0, 0.001, "x", 20.0), NodeSpec.make("a1", 0, 0.001, "x", 20.0),
        NodeSpec.make("b0", 1, 0.001, "x", 40.0), NodeSpec.make("b1", 1, 0.001, "y", 40.0),
    ]
    topo = Topology.build(
        2**17, nodes, {frozenset(("x", "y")): LinkSpec(70.0, 1.0)}, intra=LinkSpec(1.0, 10.0)
    )
    plain = solve_oracle(topo)
    queued = solve_oracle(topo, balance=QUEUE_WEIGHT)
    even = solve_oracle(topo, balance=Headroom())
    assert queued.flow_value_units == plain.flow_value_units == even.flow_value_units
    assert oracle_cost_units(topo, queued) == oracle_cost_units(topo, plain)
    assert _through(dict(queued.flows), topo).get("b1", 0) == 0
    assert _through(dict(even.flows), topo)["b1"] > 0.4 * plain.flow_value_units


def test_a_busy_node_gives_way_to_a_remote_one_only_as_far_as_its_queue_pays() -> None:
    """Two stage-1 nodes of 10 ms a microbatch, a local one and one 100 ms (RTT) away, each
    able to carry the whole flow: least cost fills the local one to its capacity; the queueing
    cost sends the remote one only what the local queue's marginal delay outweighs the link's
    ~50 ms for (the local node 3/4 busy: the next piece, to 7/8, costs 155 ms a microbatch)."""
    nodes = [
        NodeSpec.make("a0", 0, 0.02, "x"), NodeSpec.make("a1", 0, 0.02, "x"),
        NodeSpec.make("b0", 1, 0.01, "x"), NodeSpec.make("b1", 1, 0.01, "y"),
    ]
    topo = Topology.build(
        2**17, nodes, {frozenset(("x", "y")): LinkSpec(100.0, 1.0)}, intra=LinkSpec(1.0, 10.0)
    )
    plain = solve_oracle(topo)
    queued = solve_oracle(topo, balance=QUEUE_WEIGHT)
    assert queued.flow_value_units == plain.flow_value_units
    cap = topo.node("b0").cap_units
    assert _through(dict(plain.flows), topo)["b0"] == cap
    local = _through(dict(queued.flows), topo)["b0"]
    remote = _through(dict(queued.flows), topo).get("b1", 0)
    assert local == pytest.approx(0.75 * cap, abs=2) and remote == cap - local
    assert _objective(topo, dict(queued.flows)) < _objective(topo, dict(plain.flows))


@pytest.mark.parametrize("seed", range(6))
def test_the_local_solver_and_the_oracle_agree_on_the_queueing_cost(seed: int) -> None:
    topo = geo10(np.random.default_rng(seed), 24, 4)
    plain = solve_oracle(topo)
    oracle = solve_oracle(topo, balance=QUEUE_WEIGHT)
    local = solve_members(Members.of(topo), balance=QUEUE_WEIGHT)
    local_flows = {k: x for k, x in local.flows.items() if x > 0}
    # Exact in flow value against networkx's plain maximum flow.
    assert oracle.flow_value_units == plain.flow_value_units
    assert sum(x for (_, d), x in local_flows.items()
               if topo.node(d).stage == 3) == plain.flow_value_units
    # The oracle's answer is the optimum of the objective; the local solver's hubs are within
    # 2 cost units of an arc's cost and its even split is exact, so it is as good to 1%.
    best = _objective(topo, dict(oracle.flows))
    assert best <= _objective(topo, dict(plain.flows))
    assert best <= _objective(topo, local_flows) <= best * 1.01


def test_the_same_records_give_the_same_flows_whatever_their_order() -> None:
    topo = geo10(np.random.default_rng(7), 24, 4)
    members = Members.of(topo)
    shuffled = list(members.nodes)
    np.random.default_rng(1).shuffle(shuffled)
    again = Members(members.activation_bytes, tuple(shuffled), members.links, members.intra,
                    members.blocked)
    assert solve_members(members, balance=QUEUE_WEIGHT).flows == solve_members(
        again, balance=QUEUE_WEIGHT).flows


# ------------------------------------------------------------------ the headroom rule


def test_the_headroom_rule_loads_a_wide_stage_evenly_and_keeps_the_maximum_flow() -> None:
    topo = _homogeneous()
    plain = solve_oracle(topo)
    balanced = solve_oracle(topo, balance=Headroom(BALANCE_HEADROOM))
    assert balanced.flow_value_units == plain.flow_value_units
    through = _through(dict(balanced.flows), topo)
    for s in range(3):
        ids = topo.stage_nodes(s)
        share = plain.flow_value_units / len(ids)
        loads = [through[i] for i in ids]
        assert max(loads) <= share * (1 + BALANCE_HEADROOM) + 1, (s, loads)
    plain_through = _through(dict(plain.flows), topo)
    assert any(
        max(plain_through[i] for i in topo.stage_nodes(s))
        > (1 + BALANCE_HEADROOM) * plain.flow_value_units / 4 + 1
        for s in range(3)
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_local_solver_and_the_oracle_agree_on_the_headroom_rule(seed: int) -> None:
    topo = geo10(np.random.default_rng(seed), 24, 4)
    oracle = solve_oracle(topo, balance=Headroom())
    local = solve_members(Members.of(topo), balance=Headroom())
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
    it; the headroom widens and at last the plain answer stands. The queueing cost, a cost and
    never a bound, keeps the maximum flow as it is."""
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
    for balance in (Headroom(BALANCE_HEADROOM), QUEUE_WEIGHT):
        balanced = solve_oracle(topo, balance=balance)
        assert balanced.flow_value_units == plain.flow_value_units
        local = solve_members(Members.of(topo), balance=balance)
        assert sum(x for (_, d), x in local.flows.items() if d.startswith("b")) == (
            plain.flow_value_units)


def test_the_compute_bound_rule_balances_busy_stages_and_leaves_idle_ones_to_least_cost() -> None:
    """The `fidelity` case again, with a last stage whose compute is tiny against the flow (busy
    0.2% of the time at an even split): the plain headroom rule caps it to its even share,
    which sends half the flow over the 70 ms link to reach it; capping only nodes that would be
    busy at least `COMPUTE_BOUND` keeps the least-cost flow there, and caps a busy stage as
    the plain rule does."""
    nodes = [
        NodeSpec.make("a0", 0, 0.001, "x", 20.0), NodeSpec.make("a1", 0, 0.001, "x", 20.0),
        NodeSpec.make("b0", 1, 0.001, "x", 40.0), NodeSpec.make("b1", 1, 0.001, "y", 40.0),
        NodeSpec.make("c0", 2, 1e-4, "x"), NodeSpec.make("c1", 2, 1e-4, "y"),
    ]
    topo = Topology.build(
        2**17, nodes, {frozenset(("x", "y")): LinkSpec(70.0, 1.0)}, intra=LinkSpec(1.0, 10.0)
    )
    plain = solve_oracle(topo)
    even = solve_oracle(topo, balance=Headroom())
    bound = Headroom(BALANCE_HEADROOM, COMPUTE_BOUND)
    busy_only = solve_oracle(topo, balance=bound)
    assert busy_only.flow_value_units == plain.flow_value_units == even.flow_value_units
    assert oracle_cost_units(topo, busy_only) == oracle_cost_units(topo, plain)
    assert oracle_cost_units(topo, even) > oracle_cost_units(topo, plain)
    local = solve_members(Members.of(topo), balance=bound)
    assert cost_units(topo, {k: x for k, x in local.flows.items() if x > 0}) == (
        oracle_cost_units(topo, plain))
    # A busy stage (homogeneous: 80% busy at an even split) is capped as by the plain rule.
    homogeneous = _homogeneous()
    assert _through(dict(solve_oracle(homogeneous, balance=bound).flows), homogeneous) == (
        _through(dict(solve_oracle(homogeneous, balance=Headroom()).flows), homogeneous))


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
