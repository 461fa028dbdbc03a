"""Every node solves the same min-cost max-flow locally, on a compact aggregate of the swarm.

The routing problem of docs/design.md 2.1-2.2 has far more arcs than information: an arc's
capacity depends only on the link between the two locations, and its cost
`(c_i + c_j)/2 + rtt/2000 + 8A/b` only on the two compute times and that link. So nodes with the
same (stage, location, compute_s, cap_units) and no blocked arc are interchangeable. This module
solves the problem on *groups* of such nodes (docs/design.md 2.12):

- a group `A` of `n_A` nodes is one vertex pair with capacity `n_A * cap`;
- groups `A` (stage k) and `B` (stage k+1) at locations `a`, `b` are joined by one arc of
  capacity `n_A * n_B * u_ab` (`u_ab` the capacity of one node pair) and the exact arc cost.
  Averaging any optimal node flow over the permutations inside each group gives a group flow of
  the same value and cost, and a group flow splits back evenly (`f_AB / (n_A n_B)` per pair, at
  most `u_ab`): the group problem and the node problem have the same optimum;
- a node touching a blocked arc is a group of its own (its *cell* is itself).

Group pairs still grow as (groups per stage)^2. A *hub* replaces the group pairs between two
cells (the nodes of one stage at one location) by `A -> hub_out(C) -> hub_in(D) -> B`, costs
split as `c_A/2`, link, `c_B/2` (each rounded, so within 2 cost units of the arc's), capacity
`n_C * n_D * u_ab` on the middle arc. That is exact when a node pair's capacity cannot bind
(`u_ab >= min(max cap in C, max cap in D)`: a pair never carries more than either end), and a
relaxation otherwise, used only where the cells' link capacity is at least `hub_slack` times
what the smaller cell can carry, so that spreading the flow over the node pairs nearly always
fits. The split back to nodes respects every pair, node and conservation constraint exactly;
what it cannot place is trimmed (`_trim`), and the benchmarks check the result against the
oracle on the full node graph (section `flow` of benchmarks/RESULTS.md).

Everything is a pure function of the member records, in sorted order, so every node holding the
same records computes the same flows, bit for bit, and takes its own out-arcs from them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from gwtf.flow.balance import (
    Balance,
    Headroom,
    add_node_arcs,
    carried,
    queue_pieces,
    solve_balanced,
)
from gwtf.flow.simplex import Network, max_flow_min_cost
from gwtf.flow.solution import FLOW_EPSILON, FlowResult
from gwtf.flow.topology import (
    CAP_SCALE,
    Members,
    NodeSpec,
    cap_to_units,
    cost_to_units,
)

__all__ = ["HUB_SLACK", "LinkTerms", "Solved", "evaluate", "link_terms", "solve_members"]

HUB_SLACK = 2.0
"""Cells whose link capacity is at least this many times what the smaller cell can carry share
a hub even where a node pair's capacity could bind (see the module doc); None: exact only."""

Flows = dict[tuple[str, str], int]


@dataclass(frozen=True, slots=True)
class LinkTerms:
    """The link part of every arc between two locations, computed as Topology does."""

    half_rtt: float
    transfer: float
    cap_units: int


def link_terms(members: Members, loc_a: str, loc_b: str, stage: int = 0) -> LinkTerms | None:
    """The link terms between two locations (None when they are not joined), for an arc from
    `stage` to the next (whose bytes a compression plan may set)."""
    link = members.intra if loc_a == loc_b else members.links.get(frozenset((loc_a, loc_b)))
    if link is None:
        return None
    act = members.bytes_at(stage)
    bw = link.bandwidth_gbps
    return LinkTerms(link.rtt_ms / 2000, act * 8 / (bw * 1e9), cap_to_units(bw * 1e9 / 8 / act))


def _arc_cost(c_i: float, c_j: float, terms: LinkTerms) -> float:
    # The same float operations, in the same order, as Topology._build_arcs.
    return (c_i + c_j) / 2 + terms.half_rtt + terms.transfer


@dataclass
class _Group:
    stage: int
    cell: int
    compute_s: float
    cap_units: int
    members: list[str]


@dataclass
class _Cell:
    stage: int
    location: str
    solo: str  # the node id of a node with blocked arcs, "" for a location's ordinary nodes
    groups: list[int] = field(default_factory=list)
    size: int = 0
    cap_total: int = 0
    cap_max: int = 0


@dataclass(frozen=True)
class Solved:
    """A node flow and how it was found: group, cell, hub and direct arc counts of the network."""

    flows: Flows
    groups: int
    cells: int
    hub_arcs: int
    direct_arcs: int
    trimmed_units: int
    solves: int


class _Terms:
    """Link terms per location pair, computed once."""

    def __init__(self, members: Members) -> None:
        self._members = members
        self._cache: dict[tuple[str, str, int], LinkTerms | None] = {}
        # Without a plan every stage's arcs have the same terms: one cache entry per pair.
        self._per_stage = members.boundary_bytes is not None

    def __call__(self, a: str, b: str, stage: int) -> LinkTerms | None:
        key = (a, b, stage if self._per_stage else 0)
        if key not in self._cache:
            self._cache[key] = link_terms(self._members, a, b, key[2])
        return self._cache[key]


def _groups(members: Members) -> tuple[list[_Group], list[_Cell]]:
    solo = {end for pair in members.blocked for end in pair}
    cell_index: dict[tuple[int, str, str], int] = {}
    group_index: dict[tuple[int, float, int], int] = {}
    cells: list[_Cell] = []
    groups: list[_Group] = []
    for node in sorted(members.nodes, key=lambda n: (n.stage, n.location, n.id)):
        key = (node.stage, node.location, node.id if node.id in solo else "")
        ci = cell_index.get(key)
        if ci is None:
            ci = cell_index[key] = len(cells)
            cells.append(_Cell(*key))
        gkey = (ci, node.compute_s, node.cap_units)
        gi = group_index.get(gkey)
        if gi is None:
            gi = group_index[gkey] = len(groups)
            groups.append(_Group(node.stage, ci, node.compute_s, node.cap_units, []))
            cells[ci].groups.append(gi)
        groups[gi].members.append(node.id)
        cell = cells[ci]
        cell.size += 1
        cell.cap_total += node.cap_units
        cell.cap_max = max(cell.cap_max, node.cap_units)
    return groups, cells


def _blocked_between(
    members: Members, cell_of: Mapping[str, int], c: int, d: int, solo_cells: set[int]
) -> int:
    if c not in solo_cells and d not in solo_cells:
        return 0
    return sum(1 for s, t in members.blocked if cell_of.get(s) == c and cell_of.get(t) == d)


# Vertices of the group network: group g is 2g (in) and 2g+1 (out); hubs follow; a group's
# queueing-cost pieces after the first pass through ("q", g, k).
_SOURCE = -1
_SINK = -2


def _pieces(g: _Group, queue: float | None) -> tuple[tuple[int, int], ...]:
    """The group's internal arc(s): its members' capacity, split into queueing-cost pieces
    when `queue` is a weight (a group's convex cost is its members' at an even split)."""
    if queue is None:
        return ((len(g.members) * g.cap_units, 0),)
    return queue_pieces(g.compute_s, g.cap_units, len(g.members), queue)


def _via(gi: int) -> Callable[[int], tuple[str, int, int]]:
    return lambda k: ("q", gi, k)


@dataclass
class _Network:
    graph: Network
    hub_base: int
    group_pair_cap: dict[tuple[int, int], int]  # arcs a node-level split must respect
    direct: list[tuple[int, int]]
    hubs: list[tuple[int, int]]  # (C, D) cell pairs joined through hubs


def _network(
    members: Members,
    groups: list[_Group],
    cells: list[_Cell],
    hub_slack: float | None,
    direct_only: set[tuple[int, int]],
    queue: float | None = None,
) -> _Network:
    terms = _Terms(members)
    graph = Network()
    graph.add_node(_SOURCE)
    last = max(g.stage for g in groups)
    for gi, g in enumerate(groups):
        if g.stage == 0:
            graph.add_edge(_SOURCE, 2 * gi, weight=0)
        add_node_arcs(graph, 2 * gi, 2 * gi + 1, _pieces(g, queue), _via(gi))
        if g.stage == last:
            graph.add_edge(2 * gi + 1, _SINK, weight=0)
    hub_base = 2 * len(groups)
    cell_of = {m: g.cell for g in groups for m in g.members}
    solo_cells = {i for i, c in enumerate(cells) if c.solo}
    by_stage: dict[int, list[int]] = defaultdict(list)
    for ci, cell in enumerate(cells):
        by_stage[cell.stage].append(ci)
    net = _Network(graph, hub_base, {}, [], [])
    hub_ends: set[int] = set()
    for stage in range(last):
        for c in by_stage[stage]:
            tail = cells[c]
            for d in by_stage[stage + 1]:
                head = cells[d]
                t = terms(tail.location, head.location, stage)
                if t is None or t.cap_units == 0:
                    continue
                blocked = _blocked_between(members, cell_of, c, d, solo_cells)
                pairs = tail.size * head.size - blocked
                if pairs <= 0:
                    continue
                exact = t.cap_units >= min(tail.cap_max, head.cap_max)
                loose = hub_slack is not None and pairs * t.cap_units >= hub_slack * min(
                    tail.cap_total, head.cap_total
                )
                for a in tail.groups:
                    for b in head.groups:
                        n = len(groups[a].members) * len(groups[b].members)
                        if blocked:
                            n -= sum(
                                1
                                for s in groups[a].members
                                for u in groups[b].members
                                if (s, u) in members.blocked
                            )
                        if n > 0:
                            net.group_pair_cap[(a, b)] = n * t.cap_units
                hub = (
                    blocked == 0
                    and (c, d) not in direct_only
                    and (exact or loose)
                    and len(tail.groups) * len(head.groups) > 1
                )
                if hub:
                    h_out, h_in = hub_base + 2 * c, hub_base + 2 * d + 1
                    for a in tail.groups if h_out not in hub_ends else ():
                        half = cost_to_units(groups[a].compute_s / 2)
                        graph.add_edge(2 * a + 1, h_out, weight=half)
                    for b in head.groups if h_in not in hub_ends else ():
                        half = cost_to_units(groups[b].compute_s / 2)
                        graph.add_edge(h_in, 2 * b, weight=half)
                    hub_ends.update((h_out, h_in))
                    graph.add_edge(
                        h_out,
                        h_in,
                        capacity=pairs * t.cap_units,
                        weight=cost_to_units(t.half_rtt + t.transfer),
                    )
                    net.hubs.append((c, d))
                    continue
                for a in tail.groups:
                    for b in head.groups:
                        cap = net.group_pair_cap.get((a, b), 0)
                        if cap > 0:
                            cost = _arc_cost(groups[a].compute_s, groups[b].compute_s, t)
                            graph.add_edge(
                                2 * a + 1, 2 * b, capacity=cap, weight=cost_to_units(cost)
                            )
                            net.direct.append((a, b))
    return net


def _even(total: int, ids: list[str]) -> dict[str, int]:
    base, extra = divmod(total, len(ids))
    return {node_id: base + (1 if i < extra else 0) for i, node_id in enumerate(ids)}


def _take(pieces: list[list[int]], sinks: list[list[int]], cap: Mapping[tuple[int, int], int],
          used: dict[tuple[int, int], int]) -> list[tuple[int, int, int]]:
    """Match source pieces `[key, amount]` to sinks `[key, amount]`, largest sink first, each
    (source, sink) pair up to its capacity less what it already carries; both lists are spent
    in place, what does not fit stays in them."""
    out = []
    for piece in pieces:
        while piece[1] > 0:
            best = None
            for sink in sinks:
                if sink[1] <= 0:
                    continue
                room = cap.get((piece[0], sink[0]), 0) - used.get((piece[0], sink[0]), 0)
                if room > 0 and (best is None or sink[1] > best[0][1]):
                    best = (sink, room)
            if best is None:
                break
            sink, room = best
            x = min(piece[1], sink[1], room)
            piece[1] -= x
            sink[1] -= x
            used[(piece[0], sink[0])] = used.get((piece[0], sink[0]), 0) + x
            out.append((piece[0], sink[0], x))
    return out


def _group_split(
    net: _Network, groups: list[_Group], cells: list[_Cell], flow: Mapping[int, Mapping[int, int]]
) -> tuple[dict[tuple[int, int], int], set[tuple[int, int]]]:
    """Group-to-group amounts from the network flow: direct arcs as they are; hub flows matched
    greedily, so that few group pairs carry flow, each within its capacity. What a hub cannot
    place this way (a relaxation's excess) goes to any next-stage group with room, and the cell
    pairs concerned are returned, to be joined directly in the next solve."""
    amount: dict[tuple[int, int], int] = defaultdict(int)
    for a, b in net.direct:
        x = flow[2 * a + 1].get(2 * b, 0)
        if x > 0:
            amount[(a, b)] += x
    base = net.hub_base
    by_tail: dict[int, list[int]] = defaultdict(list)
    for c, d in net.hubs:
        by_tail[c].append(d)
    # Pieces (group A, cell D) from each hub_out(C), then matched to groups B at each hub_in(D).
    into: dict[int, list[list[int]]] = defaultdict(list)
    for c in sorted(by_tail):
        h_out = base + 2 * c
        sources = [[a, flow[2 * a + 1].get(h_out, 0)] for a in cells[c].groups]
        sources = [s for s in sources if s[1] > 0]
        for d in by_tail[c]:
            need = flow[h_out].get(base + 2 * d + 1, 0)
            for s in sources:
                if need <= 0:
                    break
                x = min(need, s[1])
                if x > 0:
                    into[d].append([s[0], x])
                    s[1] -= x
                    need -= x
    used: dict[tuple[int, int], int] = dict(amount)
    failed: set[tuple[int, int]] = set()
    leftover_out: dict[int, int] = defaultdict(int)
    leftover_in: dict[int, int] = defaultdict(int)
    for d in sorted(into):
        h_in = base + 2 * d + 1
        pieces = sorted(into[d], key=lambda p: (-p[1], p[0]))
        sinks = [[b, flow[h_in].get(2 * b, 0)] for b in cells[d].groups]
        for a, b, x in _take(pieces, sinks, net.group_pair_cap, used):
            amount[(a, b)] += x
        for a, x in pieces:
            leftover_out[a] += x
            if x > 0:
                failed.add((groups[a].cell, d))
        for b, x in sinks:
            leftover_in[b] += x
    if leftover_out:
        by_stage: dict[int, list[list[int]]] = defaultdict(list)
        for b, x in sorted(leftover_in.items()):
            if x > 0:
                by_stage[groups[b].stage].append([b, x])
        pieces = [[a, x] for a, x in sorted(leftover_out.items()) if x > 0]
        for stage in sorted({groups[a].stage for a, _ in pieces}):
            mine = [p for p in pieces if groups[p[0]].stage == stage]
            for a, b, x in _take(mine, by_stage[stage + 1], net.group_pair_cap, used):
                amount[(a, b)] += x
    return amount, failed


def _spread(total: int, room: Mapping[str, int]) -> dict[str, int]:
    """`total` over the keys of `room` as evenly as their room allows (water-filling): the
    smallest rooms fill first, the rest share what is left, ties by key."""
    keys = sorted(room, key=lambda k: (room[k], k))
    share: dict[str, int] = {}
    for n_left in range(len(keys), 0, -1):
        key = keys[len(keys) - n_left]
        give = min(room[key], -(-total // n_left))
        if give > 0:
            share[key] = give
            total -= give
    return share


def _node_split(
    members: Members,
    groups: list[_Group],
    amount: Mapping[tuple[int, int], int],
    through: Mapping[str, int],
    terms: _Terms,
) -> tuple[Flows, set[tuple[int, int]]]:
    """Node flows from group amounts. Each pair (A, B) is spread evenly over A's members and each
    member's share evenly over B's: members are interchangeable, so even shares are what the
    symmetry argument of the module doc splits, and they fit every node pair's capacity."""
    left_out = dict(through)
    left_in = dict(through)
    where = {n.id: n.location for n in members.nodes}
    flows: Flows = {}
    failed: set[tuple[int, int]] = set()
    blocked = members.blocked
    for (a, b), x in sorted(amount.items()):
        ga, gb = groups[a], groups[b]
        t = terms(where[ga.members[0]], where[gb.members[0]], ga.stage)
        if x <= 0 or t is None:
            continue
        u = t.cap_units
        while x > 0:
            placed = 0
            for i, share in sorted(_spread(x, {m: left_out[m] for m in ga.members}).items()):
                room = {
                    j: min(left_in[j], u - flows.get((i, j), 0))
                    for j in gb.members
                    if not (blocked and (i, j) in blocked)
                }
                for j, give in _spread(share, room).items():
                    flows[(i, j)] = flows.get((i, j), 0) + give
                    left_out[i] -= give
                    left_in[j] -= give
                    placed += give
            if placed == 0:
                failed.add((ga.cell, gb.cell))
                break
            x -= placed
    return flows, failed


def _trim(nodes: Iterable[NodeSpec], flows: Flows, last: int) -> int:
    """Restore in == out at every middle node by lowering flows (never raising one): forward,
    a node sends at most what it gets; backward, it gets at most what it sends. Returns the
    units removed from the value (0 when the split placed everything)."""
    stage_of = {n.id: n.stage for n in nodes}
    out_arcs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    in_arcs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in sorted(flows):
        out_arcs[key[0]].append(key)
        in_arcs[key[1]].append(key)
    before = sum(x for (_, d), x in flows.items() if stage_of[d] == last)

    def lower(arcs: list[tuple[str, str]], excess: int) -> None:
        for key in reversed(arcs):
            if excess <= 0:
                return
            cut = min(excess, flows[key])
            flows[key] -= cut
            excess -= cut

    by_stage: dict[int, list[str]] = defaultdict(list)
    for node_id, stage in sorted(stage_of.items(), key=lambda kv: (kv[1], kv[0])):
        by_stage[stage].append(node_id)
    for stage in range(1, last):
        for v in by_stage[stage]:
            excess = sum(flows[k] for k in out_arcs[v]) - sum(flows[k] for k in in_arcs[v])
            lower(out_arcs[v], excess)
    for stage in range(last - 1, 0, -1):
        for v in by_stage[stage]:
            excess = sum(flows[k] for k in in_arcs[v]) - sum(flows[k] for k in out_arcs[v])
            lower(in_arcs[v], excess)
    for key in [k for k, x in flows.items() if x <= 0]:
        del flows[key]
    return before - sum(x for (_, d), x in flows.items() if stage_of[d] == last)


REFINE_ROUNDS = 4
"""At most this many re-solves with the cell pairs whose hub flow did not split back to node
pairs joined directly instead (each round only adds direct arcs, so it can only tighten)."""


def solve_members(
    members: Members, *, hub_slack: float | None = HUB_SLACK, balance: Balance = None
) -> Solved:
    """The maximum flow of least cost of the swarm `members` describes, by node pair (units);
    with `balance` a `Headroom` (`gwtf.flow.balance.JOB_OBJECTIVE`, docs/design.md 2.2), of
    least cost among the maximum flows that load each stage's nodes evenly within it; a weight
    (`QUEUE_WEIGHT`), the cost counts each node's modelled queueing delay too.

    Deterministic: the answer depends only on the records, not on their order. When a hub's
    relaxation does not split back (a node pair's capacity binds), the cell pairs concerned are
    joined directly and the network solved again, up to REFINE_ROUNDS times; what still does not
    fit is trimmed, so the flow is always feasible.
    """
    if isinstance(balance, Headroom):
        final = max(n.stage for n in members.nodes)
        sinks = {n.id for n in members.nodes if n.stage == final}
        return solve_balanced(
            members.nodes,
            lambda nodes: solve_members(
                replace(members, nodes=tuple(nodes)), hub_slack=hub_slack
            ),
            lambda solved: sum(u for (_, dst), u in solved.flows.items() if dst in sinks),
            balance.share,
            balance.busy,
        )
    groups, cells = _groups(members)
    last = max(g.stage for g in groups)
    terms = _Terms(members)
    direct_only: set[tuple[int, int]] = set()
    for attempt in range(REFINE_ROUNDS + 1):
        net = _network(members, groups, cells, hub_slack, direct_only, balance)
        flow = max_flow_min_cost(net.graph, _SOURCE, _SINK)
        through: dict[str, int] = {}
        for gi, g in enumerate(groups):
            units = carried(flow, 2 * gi, 2 * gi + 1, _pieces(g, balance), _via(gi))
            through.update(_even(units, sorted(g.members)))
        amount, failed = _group_split(net, groups, cells, flow)
        flows, failed_nodes = _node_split(members, groups, amount, through, terms)
        hubbed = set(net.hubs)
        failed = (failed | failed_nodes) & hubbed
        if not failed or attempt == REFINE_ROUNDS:
            break
        direct_only |= failed
    trimmed = _trim(members.nodes, flows, last)
    return Solved(
        flows=dict(sorted(flows.items(), key=lambda kv: kv[0])),
        groups=len(groups),
        cells=len(cells),
        hub_arcs=len(net.hubs),
        direct_arcs=len(net.direct),
        trimmed_units=trimmed,
        solves=attempt + 1,
    )


def evaluate(
    members: Members, flows: Mapping[tuple[str, str], int], messages: int = 0, rounds: int = 0
) -> FlowResult:
    """A FlowResult for node flows on `members`, as solution.make_result computes it for a
    Topology, without building the topology's arcs (arcs in (stage, src, dst) order)."""
    node = {n.id: n for n in members.nodes}
    terms = _Terms(members)
    last = max(n.stage for n in members.nodes)
    ordered = sorted(
        ((k, x) for k, x in flows.items() if x > 0), key=lambda kx: (node[kx[0][0]].stage, kx[0])
    )
    cost: dict[tuple[str, str], float] = {}
    for (s, d), _ in ordered:
        t = terms(node[s].location, node[d].location, node[s].stage)
        if t is None:
            raise ValueError(f"flow on arc {s!r}->{d!r}, which is not in the topology")
        cost[(s, d)] = _arc_cost(node[s].compute_s, node[d].compute_s, t)
    value = sum(x for (_, d), x in ordered if node[d].stage == last)
    total = math.fsum(x / CAP_SCALE * cost[k] for k, x in ordered)
    reach: dict[str, float] = {n.id: 0.0 for n in members.nodes if n.stage == 0}
    for (s, d), x in ordered:
        if x / CAP_SCALE <= FLOW_EPSILON or s not in reach:
            continue
        reach[d] = max(reach.get(d, -math.inf), reach[s] + cost[(s, d)])
    ends = [r for n, r in reach.items() if node[n].stage == last]
    return FlowResult(
        flows=dict(ordered),
        flow_value_units=value,
        flow_value=value / CAP_SCALE,
        total_cost=total,
        max_path_cost=max(ends, default=0.0),
        messages=messages,
        rounds=rounds,
    )
