"""Evaluating a flow on a topology: its value, its cost, its bottleneck path, its feasibility.

A flow is a mapping `(src, dst) -> flow units` on node-to-node arcs (CAP_SCALE units per
microbatch/s). The super source feeds stage 0 and stage S-1 drains into the super sink without
limit, so only node-to-node arcs are listed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gwtf.flow.topology import CAP_SCALE, Topology

__all__ = [
    "FLOW_EPSILON",
    "FlowResult",
    "cost_units",
    "feasibility_violations",
    "make_result",
]

FLOW_EPSILON = 1e-9
"""Microbatches/s below which an arc counts as carrying no flow (paths, JSON output)."""


@dataclass(frozen=True)
class FlowResult:
    """A flow and what it achieves.

    `flows` holds flow units on node-to-node arcs with flow > 0, in topology arc order;
    `flow_value` is microbatches/s, `total_cost` is sum(flow [mb/s] * arc cost [s]) and
    `max_path_cost` the cost (s) of the costliest source-to-sink path over arcs that carry flow.
    """

    flows: Mapping[tuple[str, str], int]
    flow_value_units: int
    flow_value: float
    total_cost: float
    max_path_cost: float
    messages: int = 0
    rounds: int = 0

    def to_json(self) -> dict[str, Any]:
        """`{"flow_value", "total_cost", "max_path_cost", "arcs", "messages", "rounds"}`."""
        arcs = []
        for (src, dst), units in self.flows.items():
            flow = units / CAP_SCALE
            if flow > FLOW_EPSILON:
                arcs.append({"src": src, "dst": dst, "flow": flow})
        return {
            "flow_value": self.flow_value,
            "total_cost": self.total_cost,
            "max_path_cost": self.max_path_cost,
            "arcs": arcs,
            "messages": self.messages,
            "rounds": self.rounds,
        }


def _ordered_flows(
    topology: Topology, flows_units: Mapping[tuple[str, str], int]
) -> list[tuple[tuple[str, str], int]]:
    for (src, dst), units in flows_units.items():
        if not topology.has_arc(src, dst):
            raise ValueError(f"flow on arc {src!r}->{dst!r}, which is not in the topology")
        if units < 0:
            raise ValueError(f"flow on arc {src!r}->{dst!r} is negative ({units} units)")
    return [
        ((a.src, a.dst), flows_units[(a.src, a.dst)])
        for a in topology.arcs
        if flows_units.get((a.src, a.dst), 0) > 0
    ]


def cost_units(topology: Topology, flows_units: Mapping[tuple[str, str], int]) -> int:
    """sum(flow_units * cost_units) over the arcs: the exact integer cost every solver minimizes."""
    return sum(
        units * topology.arc(src, dst).cost_units for (src, dst), units in flows_units.items()
    )


def _max_path_cost(topology: Topology, flows: Mapping[tuple[str, str], int]) -> float:
    # reach[v]: cost of the costliest path from a stage-0 node to v over arcs that carry flow;
    # a path that dead-ends before stage S-1 does not count.
    reach: dict[str, float] = {node_id: 0.0 for node_id in topology.stage_nodes(0)}
    for stage in range(1, topology.num_stages):
        for node_id in topology.stage_nodes(stage):
            best: float | None = None
            for arc in topology.in_arcs(node_id):
                if flows.get((arc.src, arc.dst), 0) / CAP_SCALE <= FLOW_EPSILON:
                    continue
                start = reach.get(arc.src)
                if start is not None and (best is None or start + arc.cost > best):
                    best = start + arc.cost
            if best is not None:
                reach[node_id] = best
    ends = [reach[n] for n in topology.stage_nodes(topology.num_stages - 1) if n in reach]
    return max(ends, default=0.0)


def make_result(
    topology: Topology,
    flows_units: Mapping[tuple[str, str], int],
    messages: int = 0,
    rounds: int = 0,
) -> FlowResult:
    """Evaluate a flow: value (into stage S-1), total cost and max path cost.

    Raises ValueError for a flow on an arc the topology does not have or a negative flow.
    """
    ordered = _ordered_flows(topology, flows_units)
    flows = dict(ordered)
    last = set(topology.stage_nodes(topology.num_stages - 1))
    value_units = sum(units for (_, dst), units in ordered if dst in last)
    total_cost = math.fsum(
        units / CAP_SCALE * topology.arc(src, dst).cost for (src, dst), units in ordered
    )
    return FlowResult(
        flows=flows,
        flow_value_units=value_units,
        flow_value=value_units / CAP_SCALE,
        total_cost=total_cost,
        max_path_cost=_max_path_cost(topology, flows),
        messages=messages,
        rounds=rounds,
    )


def feasibility_violations(
    topology: Topology, flows_units: Mapping[tuple[str, str], int]
) -> list[str]:
    """Every way `flows_units` breaks the rules, one sentence each; empty when it is feasible.

    Rules: each arc exists; 0 <= flow <= arc cap_units; in == out at stages 1..S-2; a node's
    throughput (out for stage 0, in otherwise) <= its cap_units. Stage 0's in-flow and stage
    S-1's out-flow come from the source and go to the sink, so they are not constrained.
    """
    problems: list[str] = []
    inflow: dict[str, int] = defaultdict(int)
    outflow: dict[str, int] = defaultdict(int)
    order = {(a.src, a.dst): i for i, a in enumerate(topology.arcs)}
    unknown = sorted(key for key in flows_units if key not in order)
    for src, dst in unknown:
        problems.append(
            f"arc {src!r}->{dst!r} carries {flows_units[(src, dst)]} units "
            "but is not in the topology"
        )
    for key in sorted((k for k in flows_units if k in order), key=order.__getitem__):
        src, dst = key
        units = flows_units[key]
        cap = topology.arc(src, dst).cap_units
        if units < 0:
            problems.append(f"arc {src!r}->{dst!r}: flow {units} units is negative")
        elif units > cap:
            problems.append(
                f"arc {src!r}->{dst!r}: flow {units} units exceeds its capacity {cap} units"
            )
        outflow[src] += units
        inflow[dst] += units
    last = topology.num_stages - 1
    for node in topology.nodes:
        in_units, out_units = inflow[node.id], outflow[node.id]
        if 0 < node.stage < last and in_units != out_units:
            problems.append(
                f"node {node.id!r} (stage {node.stage}): in-flow {in_units} units "
                f"!= out-flow {out_units} units"
            )
        throughput = out_units if node.stage == 0 else in_units
        if throughput > node.cap_units:
            problems.append(
                f"node {node.id!r} (stage {node.stage}): throughput {throughput} units "
                f"exceeds its capacity {node.cap_units} units"
            )
    return problems
