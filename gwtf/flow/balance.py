"""Balanced utilisation: among the maximum flows, one that loads a stage's nodes evenly
(docs/design.md 2.2).

Every microbatch crosses every stage, so every stage carries the whole flow `F`; only the
narrowest stage (the minimum cut) needs all of its capacity. A min-cost flow is free to fill the
cheapest nodes of a wider stage to their capacity and leave the others nearly idle, and a linear
cost sees no difference. A pipeline does: a node loaded to its capacity has a queue that grows
without bound, so the microbatches that cross it wait, hold memory slots upstream for that long,
and starve the bottleneck stage behind them. In the simulator's homogeneous swarm (16 equal
nodes, 4 stages, the last one the narrowest) the min-cost flow gave one node of each wider stage
a third of its peers' load and the others 100%; an iteration took 108 s on the oracle's flow,
95.3 s once every node of a stage is capped at its stage's share.

So a solver solves twice: once for the maximum flow `F`, and again with every node's capacity
scaled by its stage's factor `min(1, F (1 + headroom) / C_s)` (`C_s` the stage's total node
capacity), keeping the least-cost flow of the same value. Nodes of one stage keep their
proportions (a node twice as fast may carry twice as much), and within the headroom the cost
still picks the cheaper nodes and links. If the capped problem cannot carry `F` (links bind
before nodes do), the headroom is widened, and at the last resort the uncapped flow stands: the
flow value is never traded for balance. `headroom = 0.02`: on the simulator's scenarios (oracle
policy, seed 0) 0.02 and 0.05 gave the same throughput within 2%, and 0 risks losing a unit of
flow to rounding; the figures are in benchmarks/RESULTS.md, section `balance`.

Pure and deterministic: the factors depend only on the nodes' stages and capacities, so every
node with the same records scales them the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TypeVar

from gwtf.flow.topology import CAP_SCALE, NodeSpec

__all__ = ["BALANCE_HEADROOM", "HEADROOM_STEPS", "balanced_nodes", "solve_balanced"]

BALANCE_HEADROOM = 0.02
"""A node may carry up to this fraction above its stage's even share (see the module doc)."""

R = TypeVar("R")

HEADROOM_STEPS = 3
"""How many times the headroom is quadrupled when the capped problem cannot carry the flow."""


def balanced_nodes(
    nodes: Iterable[NodeSpec], flow_units: int, headroom: float
) -> tuple[NodeSpec, ...]:
    """`nodes` with each capacity scaled by its stage's factor `min(1, F (1 + h) / C_s)`."""
    listed = tuple(nodes)
    total: dict[int, int] = defaultdict(int)
    for node in listed:
        total[node.stage] += node.cap_units
    out = []
    for node in listed:
        stage_units = total[node.stage]
        factor = min(1.0, flow_units * (1.0 + headroom) / stage_units) if stage_units else 1.0
        if factor >= 1.0:
            out.append(node)
            continue
        # Rounded up to a whole unit (and half a unit above it, so that `cap_units` floors back
        # to that unit): rounding never takes flow the stage could carry.
        units = math.ceil(node.cap_units * factor)
        out.append(replace(node, capacity=min(node.capacity, (units + 0.5) / CAP_SCALE)))
    return tuple(out)


def solve_balanced(
    nodes: Sequence[NodeSpec],
    solve: Callable[[Sequence[NodeSpec]], R],
    value: Callable[[R], int],
    headroom: float = BALANCE_HEADROOM,
) -> R:
    """The maximum flow of `solve(nodes)`, balanced: `solve` again on the capped nodes, keeping
    the first answer that carries the same flow value (in units), widening the headroom
    `HEADROOM_STEPS` times, else the uncapped answer."""
    first = solve(nodes)
    flow_units = value(first)
    if flow_units <= 0:
        return first
    h = headroom
    for _ in range(HEADROOM_STEPS + 1):
        capped = balanced_nodes(nodes, flow_units, h)
        if capped == tuple(nodes):
            return first
        answer = solve(capped)
        if value(answer) >= flow_units:
            return answer
        h *= 4
    return first
