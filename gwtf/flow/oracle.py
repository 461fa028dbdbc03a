"""The reference solver: the routing problem solved centrally with networkx.

The oracle is the yardstick for tests and benchmarks (and the `oracle` policy of the simulator,
the upper bound); it never runs inside a node, which only sees its neighbours.

The network is built from the integer-scaled values of the topology, so the oracle and the
decentralized solver optimize exactly the same numbers:

    source -> h:in            every stage-0 node h, unbounded, cost 0
    v:in -> v:out             every node v, capacity v.cap_units, cost 0 (with a queueing
                              cost: its pieces, gwtf.flow.balance.queue_pieces)
    u:out -> v:in             every arc u->v, capacity cap_units, weight cost_units
    t:out -> sink             every stage S-1 node t, unbounded, cost 0

`networkx.max_flow_min_cost` finds a maximum flow and, among maximum flows, one of least
sum(flow * weight): the lexicographic objective of docs/design.md 2.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import networkx as nx

from gwtf.flow.balance import (
    Balance,
    Headroom,
    add_node_arcs,
    queue_pieces,
    solve_balanced,
)
from gwtf.flow.simplex import max_flow_min_cost
from gwtf.flow.solution import FlowResult, cost_units, make_result
from gwtf.flow.topology import NodeSpec, Topology

__all__ = ["build_oracle_network", "oracle_cost_units", "solve_oracle"]

SOURCE = "source"
SINK = "sink"
# Node halves are (id, _IN) / (id, _OUT) tuples, which never equal the string SOURCE or SINK,
# whatever the node ids are.
_IN = 0
_OUT = 1


def _pieces(node: NodeSpec, queue: float | None) -> tuple[tuple[int, int], ...]:
    if queue is None:
        return ((node.cap_units, 0),)
    return queue_pieces(node.compute_s, node.cap_units, 1, queue)


def _via(node_id: str) -> Callable[[int], Hashable]:
    return lambda k: (node_id, _OUT + k)


def build_oracle_network(topology: Topology, queue: float | None = None) -> nx.DiGraph:
    """The split-node flow network of `topology`, with SOURCE and SINK (see the module doc);
    with `queue` (a weight), each node's halves joined by its queueing-cost pieces
    (`gwtf.flow.balance.queue_pieces`)."""
    graph = nx.DiGraph()
    last = topology.num_stages - 1
    # Insertion order is fixed (nodes by (stage, id), arcs by (stage, src, dst)), and networkx's
    # network simplex is deterministic for a given order, so the oracle's answer never flaps.
    graph.add_node(SOURCE)
    for node in topology.nodes:
        node_in: Hashable = (node.id, _IN)
        node_out: Hashable = (node.id, _OUT)
        if node.stage == 0:
            graph.add_edge(SOURCE, node_in, weight=0)  # no 'capacity' attribute: unbounded
        add_node_arcs(graph, node_in, node_out, _pieces(node, queue), _via(node.id))
    for arc in topology.arcs:
        graph.add_edge(
            (arc.src, _OUT), (arc.dst, _IN), capacity=arc.cap_units, weight=arc.cost_units
        )
    for node_id in topology.stage_nodes(last):
        graph.add_edge((node_id, _OUT), SINK, weight=0)
    return graph


def solve_oracle(topology: Topology, *, balance: Balance = None) -> FlowResult:
    """The maximum flow of least cost, solved centrally (messages = rounds = 0). With `balance`
    a `Headroom` (`JOB_OBJECTIVE`, docs/design.md 2.2): of least cost among the maximum flows
    that load each stage's nodes evenly within it; a weight (`QUEUE_WEIGHT`): the cost counts
    each node's modelled queueing delay too; None: of least cost among all maximum flows.
    The flow value is the maximum flow's in every case."""
    if isinstance(balance, Headroom):
        return solve_balanced(
            topology.nodes,
            lambda nodes: _solve(topology.with_capacities({n.id: n.capacity for n in nodes})),
            lambda result: result.flow_value_units,
            balance.share,
            balance.busy,
        )
    return _solve(topology, balance)


def _solve(topology: Topology, queue: float | None = None) -> FlowResult:
    graph = build_oracle_network(topology, queue)
    # networkx's max_flow_min_cost, the same flows, faster (docs/design.md 2.12).
    flow_dict = max_flow_min_cost(graph, SOURCE, SINK)
    flows: dict[tuple[str, str], int] = {}
    for arc in topology.arcs:
        units = int(flow_dict[(arc.src, _OUT)][(arc.dst, _IN)])
        if units > 0:
            flows[(arc.src, arc.dst)] = units
    return make_result(topology, flows)


def oracle_cost_units(topology: Topology, result: FlowResult) -> int:
    """sum(flow_units * cost_units) of `result`: compare solvers' costs exactly with this."""
    return cost_units(topology, result.flows)
