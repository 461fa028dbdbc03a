"""Routing objectives between the maximum flow and the least cost (docs/design.md 2.2).

Every microbatch crosses every stage, so every stage carries the whole flow `F`; only the
narrowest stage (the minimum cut) needs all of its capacity. The linear cost `sum(f_a d_a)` is
indifferent to how a wider stage is loaded, and a min-cost flow often fills some of its nodes
to their capacity and leaves others nearly idle. A pipeline is not indifferent: a node whose
compute is busy nearly all the time has a queue, and the microbatches that wait in it hold
memory slots upstream and starve the narrowest stage behind them.

**Queueing cost (`QUEUE_WEIGHT`; measured, not the default).** The cost counts what a unit of flow
costs in seconds per microbatch; `sum(f_a d_a)` is then the number of microbatches in flight
(Little's law). A node's queue adds its mean number of waiting microbatches `L_q`, in the same unit,
as a convex function of its load. The queue is the compute's: a node of compute time `s` carrying
`x` microbatches/s is busy `rho = x s` of the time, and with a fixed service time and arrivals
merged from many senders it is an M/D/1 queue (Pollaczek-Khinchine):

    L_q(rho) = rho^2 / (2 (1 - rho))        marginal, per microbatch/s:  s/2 (1/(1-rho)^2 - 1)

so loading a node from half to 94% busy costs `64 s` seconds per extra microbatch/s, against
link costs of milliseconds to a few hundred of them. The solver gets it as piecewise-linear
pieces of each node's capacity (`queue_pieces`): busy fractions cut at `QUEUE_BREAKS`, where
`1 - rho` halves, each piece costing the secant of `weight * L_q` (exact at the cuts); the last
piece, up to `rho = 1` where `L_q` has no bound, costs the marginal at its middle. A node whose
capacity is bound by something other than its compute (memory slots over a long round trip,
its access link) is less busy than its capacity says and queues little: the busy fraction is
`x s`, not `x / capacity`. The flow value is never traded: the solvers find the maximum flow
first and only then the least cost, queueing included, among maximum flows (the local
solver's hub relaxation may still trim a few units, as for any cost; `gwtf.flow.localsolve`).
Why it is not the default: docs/design.md 2.2.

**Headroom (`Headroom`: `JOB_OBJECTIVE`, the objective of jobs).** Among maximum flows, every
node of a stage loaded within `headroom` of its stage's even share, `F (1 + h) / C_s` of its
capacity, then least cost: two solves, the second on capacities scaled by `min(1, F (1 + h) / C_s)`,
the headroom widened four times over up to `HEADROOM_STEPS` times when the caps cannot carry
`F`, else the plain answer (`solve_balanced`). `Headroom(share, COMPUTE_BOUND)` caps only the
nodes whose compute would be busy at least `COMPUTE_BOUND` of the time at the even share.

Pure and deterministic: the pieces depend only on a node's compute time, its capacity and the
number of equal nodes it stands for, computed by the same float operations everywhere, so
every node with the same records builds the same network.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import networkx as nx

from gwtf.flow.topology import CAP_SCALE, COST_SCALE, NodeSpec

__all__ = [
    "BALANCE_HEADROOM",
    "COMPUTE_BOUND",
    "HEADROOM_STEPS",
    "JOB_OBJECTIVE",
    "QUEUE_BREAKS",
    "QUEUE_WEIGHT",
    "Balance",
    "Headroom",
    "add_node_arcs",
    "balanced_nodes",
    "carried",
    "compute_busy",
    "queue_cost_units",
    "queue_pieces",
    "solve_balanced",
]

QUEUE_WEIGHT = 1.0
"""The weight of the modelled queueing delay against the link cost: 1, as the queue model
says."""

QUEUE_BREAKS = (0.25, 0.5, 0.75, 0.875, 0.9375)
"""Busy fractions where a node's queueing cost changes slope (`1 - rho` halving near 1)."""

BALANCE_HEADROOM = 0.02
"""The headroom rule's share above a stage's even share (see the module doc)."""

COMPUTE_BOUND = 0.1
"""The compute-bound headroom rule caps only nodes whose compute would be busy at least this
fraction of the time at their stage's even share: below it a node has no queue worth a longer
path (M/D/1: 0.006 microbatches waiting at 10% busy). Nodes whose capacity is bound by memory
slots over a long round trip, or by their access link, or that sit in a stage far wider than
the flow, are left to the least cost."""

HEADROOM_STEPS = 3
"""How many times the headroom is quadrupled when the capped problem cannot carry the flow."""

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Headroom:
    """The headroom rule (module doc), as a `Balance`."""

    share: float = BALANCE_HEADROOM
    busy: float = 0.0
    """Only nodes whose compute would be busy at least this fraction of the time at their
    stage's even share are capped (`COMPUTE_BOUND`); 0: every node."""


Balance = float | Headroom | None
"""A routing objective: a float is the queueing cost's weight (`QUEUE_WEIGHT`), `Headroom` the
even-share rule, None the least cost alone."""


JOB_OBJECTIVE: Balance = Headroom(BALANCE_HEADROOM)
"""The objective jobs route by (the node's local solves, the simulator's oracle): the headroom
rule, whose mean gain over least cost on the simulator's scenarios is the largest (1.026,
against 1.014 for the queueing cost and 1.018 for the compute-bound headroom; docs/design.md
2.2, benchmarks/RESULTS.md `balance`)."""


def _lq(rho: float) -> float:
    """Mean waiting microbatches of an M/D/1 queue busy `rho` of the time (rho < 1)."""
    return rho * rho / (2.0 * (1.0 - rho))


def _marginal(rho: float) -> float:
    """d L_q / d rho."""
    return (1.0 / ((1.0 - rho) * (1.0 - rho)) - 1.0) / 2.0


def queue_pieces(
    compute_s: float, cap_units: int, count: int = 1, weight: float = QUEUE_WEIGHT
) -> tuple[tuple[int, int], ...]:
    """(capacity units, cost units per flow unit) of the pieces of the capacity of `count`
    equal nodes of compute time `compute_s` and capacity `cap_units` each, cheapest first;
    their capacities sum to `count * cap_units`. One free piece when the node has no compute
    time or the weight is 0."""
    total = count * cap_units
    if total <= 0:
        return ()
    if not compute_s > 0 or not weight > 0:
        return ((total, 0),)
    # Busy fraction at the node's capacity (above 1 only for a stated capacity beyond 1/s).
    rho_cap = cap_units / CAP_SCALE * compute_s
    pieces: list[tuple[int, int]] = []
    done_units = 0
    lo = 0.0
    for hi in (*QUEUE_BREAKS, 1.0):
        top = min(hi, rho_cap)
        last = top >= rho_cap or hi >= 1.0
        units = total - done_units if last else min(
            total, count * math.floor(top / compute_s * CAP_SCALE)
        ) - done_units
        if hi < 1.0 and top > lo:
            slope = (_lq(top) - _lq(lo)) / (top - lo)
        else:  # above the last break: L_q has no bound at 1, so the marginal at the middle
            slope = _marginal((lo + 1.0) / 2.0)
        if units > 0:
            pieces.append((units, round(weight * compute_s * slope * COST_SCALE)))
            done_units += units
        if last:
            break
        lo = top
    return tuple(pieces)


def queue_cost_units(pieces: Sequence[tuple[int, int]], units: int) -> int:
    """The queueing cost of carrying `units` over `pieces`, cheapest first (what a min-cost
    flow pays: a convex cost fills its pieces in order)."""
    cost = 0
    for cap, unit_cost in pieces:
        take = min(cap, units)
        cost += take * unit_cost
        units -= take
    return cost


def add_node_arcs(
    graph: nx.DiGraph,
    tail: Hashable,
    head: Hashable,
    pieces: Sequence[tuple[int, int]],
    via: Callable[[int], Hashable],
) -> None:
    """Join a node's halves by its pieces: the first as the arc `tail -> head`, the others each
    through a vertex `via(k)` (a DiGraph has no parallel arcs)."""
    for k, (units, cost) in enumerate(pieces):
        if k == 0:
            graph.add_edge(tail, head, capacity=units, weight=cost)
        else:
            graph.add_edge(tail, via(k), capacity=units, weight=cost)
            graph.add_edge(via(k), head, weight=0)


def carried(
    flow: Mapping[Any, Mapping[Any, int]],
    tail: Hashable,
    head: Hashable,
    pieces: Sequence[tuple[int, int]],
    via: Callable[[int], Hashable],
) -> int:
    """Units a node carries in `flow`, over all its pieces (`add_node_arcs`)."""
    total = 0
    for k in range(len(pieces)):
        total += int(flow[tail].get(head if k == 0 else via(k), 0))
    return total


def compute_busy(node: NodeSpec) -> float:
    """The fraction of time `node`'s compute is busy when it carries its capacity."""
    return node.cap_units / CAP_SCALE * node.compute_s


def balanced_nodes(
    nodes: Iterable[NodeSpec], flow_units: int, headroom: float, busy: float = 0.0
) -> tuple[NodeSpec, ...]:
    """`nodes` with each capacity scaled by its stage's factor `min(1, F (1 + h) / C_s)`, but
    those whose compute would be busy less than `busy` of the time at that share."""
    listed = tuple(nodes)
    total: dict[int, int] = defaultdict(int)
    for node in listed:
        total[node.stage] += node.cap_units
    out = []
    for node in listed:
        stage_units = total[node.stage]
        factor = min(1.0, flow_units * (1.0 + headroom) / stage_units) if stage_units else 1.0
        if factor >= 1.0 or factor * compute_busy(node) < busy:
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
    busy: float = 0.0,
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
        capped = balanced_nodes(nodes, flow_units, h, busy)
        if capped == tuple(nodes):
            return first
        answer = solve(capped)
        if value(answer) >= flow_units:
            return answer
        h *= 4
    return first
