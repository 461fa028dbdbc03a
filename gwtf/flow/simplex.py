"""networkx's `max_flow_min_cost`, the same answer to the unit, faster (docs/design.md 2.12).

The local solves (`gwtf.flow.localsolve`) must give every node the same flows for the same
records, and the simulator's results depend on those flows, ties included: a min-cost flow has
many optima and which one networkx returns is fixed by the order of its pivots. So this is not
another solver but networkx's own two steps, made faster where they spend their time:

- *The maximum flow value* (networkx: preflow-push on a residual network it builds in Python).
  The value is unique, so any exact algorithm gives the one networkx finds: here Dinic's, on
  integer arrays (`max_flow_value`).
- *The min-cost flow of that value* (networkx: `network_simplex`, a primal network simplex whose
  entering arc is the first of least reduced cost in a block of `ceil(sqrt(arcs))` arcs, the
  blocks taken cyclically). Transcribed step for step: the same arc and node numbering, the same
  initial tree, the same entering, leaving and tree-update rules, so the same pivots and the same
  final flow. What changes is the arithmetic of the entering search, the bulk of the time: the
  reduced costs of a block are one vectorised numpy expression over int64 arrays, and the first
  index of the least is `argmin`'s (`min` in networkx returns the first of equal keys too).
  Potentials are int64; the bound below keeps every potential and reduced cost exact, and an
  input beyond it (or with float weights) goes to networkx itself.

Only what the local solve builds is supported: a `DiGraph` with integer `weight`s (0 when
absent) and integer or absent (infinite) `capacity`s, no self-loops of negative weight.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterator
from typing import Any

import networkx as nx
import numpy as np

__all__ = ["Network", "as_digraph", "max_flow_min_cost", "max_flow_value", "min_cost_flow"]

_INF = float("inf")
_INT64_SAFE = 2**59
"""`faux_inf` must stay below this: potentials are at most a few `faux_inf` in magnitude (a
tree path holds at most two root arcs and the real weights sum to under `faux_inf / 3`), and a
reduced cost adds two of them and a weight, all well inside int64's 2^63."""

FlowDict = dict[Any, dict[Any, int]]

VECTOR_ARCS = 1000
"""Networks of at least this many arcs search for the entering arc with numpy (blocks of 32
arcs and more); smaller ones over Python lists, which is faster there."""


class Network:
    """The part of `nx.DiGraph` the solves use, with its order: nodes in the order they were
    first named (`add_node`, or as an end of `add_edge`, tail first), each node's out-arcs in
    the order they were first added; adding an arc again updates its data in place. The
    numbering above follows this order, so a `Network` and a `DiGraph` built by the same calls
    give the same flows; building one is several times cheaper."""

    __slots__ = ("_adj",)

    def __init__(self) -> None:
        self._adj: dict[Hashable, dict[Hashable, dict[str, int]]] = {}

    def add_node(self, node: Hashable) -> None:
        if node not in self._adj:
            self._adj[node] = {}

    def add_edge(self, u: Hashable, v: Hashable, **data: int) -> None:
        adj = self._adj
        out = adj.get(u)
        if out is None:
            out = adj[u] = {}
        if v not in adj:
            adj[v] = {}
        arc = out.get(v)
        if arc is None:
            out[v] = data
        else:
            arc.update(data)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._adj)

    def __contains__(self, node: object) -> bool:
        return node in self._adj

    def edges(self, data: bool = True) -> Iterator[tuple[Hashable, Hashable, dict[str, int]]]:
        """Every arc as (tail, head, data), in the order of the class doc."""
        for u, out in self._adj.items():
            for v, d in out.items():
                yield u, v, d


def max_flow_value(graph: nx.DiGraph | Network, source: Hashable, sink: Hashable) -> int:
    """The value of a maximum `source` -> `sink` flow (Dinic's algorithm); an arc without
    `capacity` has infinite capacity. Raises `nx.NetworkXUnbounded` as networkx does when an
    infinite-capacity path joins them."""
    if source not in graph or sink not in graph:
        raise nx.NetworkXError(f"node {source if source not in graph else sink!r} not in graph")
    if source == sink:
        raise nx.NetworkXError("source and sink are the same node")
    index = {u: i for i, u in enumerate(graph)}
    finite = 0
    arcs: list[tuple[int, int, float]] = []
    for u, v, data in graph.edges(data=True):
        cap = data.get("capacity", _INF)
        if u != v and cap > 0:
            arcs.append((index[u], index[v], cap))
            if cap < _INF:
                finite += int(cap)
    big = 3 * finite or 1
    n = len(index)
    head: list[int] = []
    cap_left: list[int] = []
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b, cap in arcs:
        adj[a].append(len(head))
        head.append(b)
        cap_left.append(big if cap == _INF else int(cap))
        adj[b].append(len(head))
        head.append(a)
        cap_left.append(0)
    s, t = index[source], index[sink]
    total = 0
    while True:
        level = [-1] * n
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in adj[u]:
                if cap_left[e] > 0 and level[head[e]] < 0:
                    level[head[e]] = level[u] + 1
                    queue.append(head[e])
        if level[t] < 0:
            break
        nxt = [0] * n
        while True:
            pushed = _augment(s, t, adj, head, cap_left, level, nxt)
            if not pushed:
                break
            total += pushed
    if total >= big:
        raise nx.NetworkXUnbounded("Infinite capacity path, flow unbounded above.")
    return total


def _augment(s: int, t: int, adj: list[list[int]], head: list[int], cap_left: list[int],
             level: list[int], nxt: list[int]) -> int:
    """One augmenting path of the level graph (iterative depth-first search with current-arc
    pointers); the units pushed, 0 when none is left."""
    path: list[int] = []
    u = s
    while True:
        if u == t:
            pushed = min(cap_left[e] for e in path)
            for e in path:
                cap_left[e] -= pushed
                cap_left[e ^ 1] += pushed
            return pushed
        edges = adj[u]
        k = nxt[u]
        while k < len(edges):
            e = edges[k]
            if cap_left[e] > 0 and level[head[e]] == level[u] + 1:
                break
            k += 1
        nxt[u] = k
        if k < len(edges):
            path.append(edges[k])
            u = head[edges[k]]
            continue
        if u == s:
            return 0
        level[u] = -1  # a dead end: never entered again in this phase
        e = path.pop()
        u = head[e ^ 1]
        nxt[u] += 1


def max_flow_min_cost(graph: nx.DiGraph | Network, source: Hashable, sink: Hashable) -> FlowDict:
    """`nx.max_flow_min_cost(graph, source, sink, capacity="capacity", weight="weight")`, the
    same flow dict (module doc)."""
    value = max_flow_value(graph, source, sink)
    return min_cost_flow(graph, {source: -value, sink: value})


def as_digraph(graph: nx.DiGraph | Network) -> nx.DiGraph:
    """A `DiGraph` of `graph`'s nodes and arcs, in its order (networkx's answer on it is the
    same as on `graph`)."""
    copy = nx.DiGraph()
    copy.add_nodes_from(graph)
    copy.add_edges_from(graph.edges(data=True))
    return copy


def _fallback(graph: nx.DiGraph | Network, demand: dict[Hashable, int]) -> FlowDict:
    copy = as_digraph(graph)
    for node, d in demand.items():
        copy.add_node(node, demand=d)
    flow: FlowDict = nx.min_cost_flow(copy, capacity="capacity", weight="weight")
    return flow


def min_cost_flow(graph: nx.DiGraph | Network, demand: dict[Hashable, int]) -> FlowDict:
    """`nx.min_cost_flow` of `graph` with node demands `demand` (the others 0), the same flow
    dict: networkx's network simplex, transcribed (module doc)."""
    node_list = list(graph)
    node_index = {u: i for i, u in enumerate(node_list)}
    demands = [demand.get(u, 0) for u in node_list]
    sources: list[int] = []
    targets: list[int] = []
    caps: list[float] = []
    weights: list[int] = []
    kept: list[tuple[Hashable, Hashable]] = []
    zero: list[tuple[Hashable, Hashable]] = []
    for u, v, data in graph.edges(data=True):
        cap = data.get("capacity", _INF)
        w = data.get("weight", 0)
        if not isinstance(w, int) or not (isinstance(cap, int) or cap == _INF):
            return _fallback(graph, demand)
        if cap < 0:
            raise nx.NetworkXUnfeasible(f"edge {(u, v)!r} has negative capacity")
        if u == v:
            if w < 0:
                return _fallback(graph, demand)
            zero.append((u, v))
            continue
        if cap == 0:
            zero.append((u, v))
            continue
        sources.append(node_index[u])
        targets.append(node_index[v])
        caps.append(cap)
        weights.append(w)
        kept.append((u, v))
    if sum(demands) != 0:
        raise nx.NetworkXUnfeasible("total node demand is not zero")
    n = len(node_list)
    count = len(kept)
    faux_inf = 3 * max(
        sum(int(c) for c in caps if c < _INF),
        sum(abs(w) for w in weights),
        sum(abs(d) for d in demands),
    ) or 1
    if faux_inf >= _INT64_SAFE:
        return _fallback(graph, demand)
    flows = _Simplex(n, sources, targets, caps, weights, demands, faux_inf).run()
    if any(flows[i] != 0 for i in range(count, count + n)):
        raise nx.NetworkXUnfeasible("no flow satisfies all node demands")
    if any(flows[i] * 2 >= faux_inf for i in range(count)):
        raise nx.NetworkXUnbounded("negative cycle with infinite capacity found")
    result: FlowDict = {u: {} for u in node_list}
    for (u, v), x in zip(kept, flows, strict=False):
        result[u][v] = x
    for u, v in zero:
        result[u][v] = 0
    return result


class _Simplex:
    """networkx's `_DataEssentialsAndFunctions` and pivot loop, numbered the same way: real
    arcs 0..count-1, then one root arc per node; the root is node `n` (index -1 of the tree
    lists, as in networkx)."""

    def __init__(self, n: int, sources: list[int], targets: list[int], caps: list[float],
                 weights: list[int], demands: list[int], faux_inf: int) -> None:
        self.count = count = len(sources)
        src = list(sources)
        tgt = list(targets)
        for i, d in enumerate(demands):
            if d > 0:
                src.append(-1)
                tgt.append(i)
            else:
                src.append(i)
                tgt.append(-1)
        self.src = src
        self.tgt = tgt
        self.cap = [*caps, *([faux_inf] * n)]
        self.weight = [*weights, *([faux_inf] * n)]
        # Any: an int, or inf on an unbounded cycle (networkx raises on it after the loop).
        self.flow: list[Any] = [*([0] * count), *(abs(d) for d in demands)]
        potentials = [faux_inf if d <= 0 else -faux_inf for d in demands]
        self.n = n
        self.parent: list[int | None] = [*([-1] * n), None]
        self.parent_edge: list[int | None] = list(range(count, count + n))
        self.size = [*([1] * n), n + 1]
        self.next = [*range(1, n), -1, 0]
        self.prev = list(range(-1, n))
        self.last = [*range(n), n - 1]
        self.vector = count >= VECTOR_ARCS
        self.pi: Any
        if self.vector:
            # The entering search's arrays (real arcs only): sign is +1 where the flow is 0
            # (the reduced cost as it is), -1 elsewhere (negated), as networkx's reduced_cost.
            self.pi = np.array(potentials, dtype=np.int64)
            self.w_np = np.array(weights, dtype=np.int64)
            self.s_np = np.array(sources, dtype=np.intp)
            self.t_np = np.array(targets, dtype=np.intp)
            self.sign = np.ones(count, dtype=np.int64)
        else:
            self.pi = potentials

    # -- the tree (networkx's methods, the same steps)
    def find_apex(self, p: int, q: int) -> int:
        parent, size = self.parent, self.size
        size_p = size[p]
        size_q = size[q]
        while True:
            while size_p < size_q:
                p = parent[p]  # type: ignore[assignment]
                size_p = size[p]
            while size_p > size_q:
                q = parent[q]  # type: ignore[assignment]
                size_q = size[q]
            if size_p == size_q:
                if p != q:
                    p = parent[p]  # type: ignore[assignment]
                    size_p = size[p]
                    q = parent[q]  # type: ignore[assignment]
                    size_q = size[q]
                else:
                    return p

    def trace_path(self, p: int, w: int) -> tuple[list[int], list[int]]:
        wn = [p]
        we: list[int] = []
        parent, parent_edge = self.parent, self.parent_edge
        while p != w:
            we.append(parent_edge[p])  # type: ignore[arg-type]
            p = parent[p]  # type: ignore[assignment]
            wn.append(p)
        return wn, we

    def find_cycle(self, i: int, p: int, q: int) -> tuple[list[int], list[int]]:
        w = self.find_apex(p, q)
        wn, we = self.trace_path(p, w)
        wn.reverse()
        we.reverse()
        if we != [i]:
            we.append(i)
        wn_r, we_r = self.trace_path(q, w)
        del wn_r[-1]
        wn += wn_r
        we += we_r
        return wn, we

    def augment_flow(self, wn: list[int], we: list[int], f: Any) -> None:
        flow, src, count = self.flow, self.src, self.count
        for i, p in zip(we, wn, strict=False):
            if src[i] == p:
                flow[i] += f
            else:
                flow[i] -= f
        if self.vector:
            sign = self.sign
            for i in we:
                if i < count:
                    sign[i] = 1 if flow[i] == 0 else -1

    def remove_edge(self, s: int, t: int) -> None:
        size_t = self.size[t]
        prev_t = self.prev[t]
        last_t = self.last[t]
        next_last_t = self.next[last_t]
        self.parent[t] = None
        self.parent_edge[t] = None
        self.next[prev_t] = next_last_t
        self.prev[next_last_t] = prev_t
        self.next[last_t] = t
        self.prev[t] = last_t
        parent, size, last = self.parent, self.size, self.last
        node: int | None = s
        while node is not None:
            size[node] -= size_t
            if last[node] == last_t:
                last[node] = prev_t
            node = parent[node]

    def make_root(self, q: int) -> None:
        ancestors = []
        node: int | None = q
        while node is not None:
            ancestors.append(node)
            node = self.parent[node]
        ancestors.reverse()
        parent, parent_edge, size = self.parent, self.parent_edge, self.size
        nxt, prev, last = self.next, self.prev, self.last
        for p, q in zip(ancestors, ancestors[1:], strict=False):
            size_p = size[p]
            last_p = last[p]
            prev_q = prev[q]
            last_q = last[q]
            next_last_q = nxt[last_q]
            parent[p] = q
            parent[q] = None
            parent_edge[p] = parent_edge[q]
            parent_edge[q] = None
            size[p] = size_p - size[q]
            size[q] = size_p
            nxt[prev_q] = next_last_q
            prev[next_last_q] = prev_q
            nxt[last_q] = q
            prev[q] = last_q
            if last_p == last_q:
                last[p] = prev_q
                last_p = prev_q
            prev[p] = last_q
            nxt[last_q] = p
            nxt[last_p] = q
            prev[q] = last_p
            last[q] = last_p

    def add_edge(self, i: int, p: int, q: int) -> None:
        nxt, prev, last, size, parent = self.next, self.prev, self.last, self.size, self.parent
        last_p = last[p]
        next_last_p = nxt[last_p]
        size_q = size[q]
        last_q = last[q]
        parent[q] = p
        self.parent_edge[q] = i
        nxt[last_p] = q
        prev[q] = last_p
        prev[next_last_p] = last_q
        nxt[last_q] = next_last_p
        node: int | None = p
        while node is not None:
            size[node] += size_q
            if last[node] == last_p:
                last[node] = last_q
            node = parent[node]

    def update_potentials(self, i: int, p: int, q: int) -> None:
        pi = self.pi
        if q == self.tgt[i]:
            d = int(pi[p]) - self.weight[i] - int(pi[q])
        else:
            d = int(pi[p]) + self.weight[i] - int(pi[q])
        nxt = self.next
        end = self.last[q]
        if not self.vector:
            pi[q] += d
            while q != end:
                q = nxt[q]
                pi[q] += d
            return
        nodes = [q]
        while q != end:
            q = nxt[q]
            nodes.append(q)
        pi[nodes] += d

    # -- the pivots
    def find_entering_edges(self) -> Any:
        count = self.count
        if count == 0:
            return
        if not self.vector:
            yield from self._find_entering_edges_lists()
            return
        block = int(math.ceil(math.sqrt(count)))
        blocks = (count + block - 1) // block
        w, s, t, sign, pi = self.w_np, self.s_np, self.t_np, self.sign, self.pi
        misses = 0
        f = 0
        while misses < blocks:
            end = f + block
            if end <= count:
                reduced = (w[f:end] - pi[s[f:end]] + pi[t[f:end]]) * sign[f:end]
                k = int(reduced.argmin())
                i = f + k
            else:
                end -= count
                idx = np.concatenate((np.arange(f, count), np.arange(end)))
                reduced = (w[idx] - pi[s[idx]] + pi[t[idx]]) * sign[idx]
                k = int(reduced.argmin())
                i = int(idx[k])
            f = end
            if reduced[k] >= 0:
                misses += 1
            else:
                yield self._oriented(i)
                misses = 0

    def _find_entering_edges_lists(self) -> Any:
        """The same search over Python lists (small networks, where numpy's per-call cost
        exceeds a block's): the first arc of least reduced cost in the block, if negative."""
        count = self.count
        block = int(math.ceil(math.sqrt(count)))
        blocks = (count + block - 1) // block
        w, src, tgt, flow, pi = self.weight, self.src, self.tgt, self.flow, self.pi
        misses = 0
        f = 0
        while misses < blocks:
            end = f + block
            if end <= count:
                arcs: Any = range(f, end)
            else:
                end -= count
                arcs = (*range(f, count), *range(end))
            f = end
            best = 0
            i = -1
            for k in arcs:
                c = w[k] - pi[src[k]] + pi[tgt[k]]
                if flow[k] != 0:
                    c = -c
                if c < best:
                    best = c
                    i = k
            if i < 0:
                misses += 1
            else:
                yield self._oriented(i)
                misses = 0

    def _oriented(self, i: int) -> tuple[int, int, int]:
        """Entering arc `i` as networkx yields it: (i, tail, head) along its residual
        direction (reversed when it carries flow)."""
        if self.flow[i] == 0:
            return i, self.src[i], self.tgt[i]
        return i, self.tgt[i], self.src[i]

    def residual_capacity(self, i: int, p: int) -> float:
        return self.cap[i] - self.flow[i] if self.src[i] == p else self.flow[i]

    def find_leaving_edge(self, wn: list[int], we: list[int]) -> tuple[int, int, int]:
        cap, flow, src = self.cap, self.flow, self.src
        best_j = best_s = -1
        best = _INF
        first = True
        # networkx: min over zip(reversed(We), reversed(Wn)) by residual capacity, the first
        # of equal ones.
        for j, p in zip(reversed(we), reversed(wn), strict=False):
            r = cap[j] - flow[j] if src[j] == p else flow[j]
            if first or r < best:
                best, best_j, best_s, first = r, j, p, False
        j, s = best_j, best_s
        t = self.tgt[j] if src[j] == s else src[j]
        return j, s, t

    def run(self) -> list[Any]:
        for i, p, q in self.find_entering_edges():
            wn, we = self.find_cycle(i, p, q)
            j, s, t = self.find_leaving_edge(wn, we)
            self.augment_flow(wn, we, self.residual_capacity(j, s))
            if i != j:
                if self.parent[t] != s:
                    s, t = t, s
                if we.index(i) > we.index(j):
                    p, q = q, p
                self.remove_edge(s, t)
                self.make_root(q)
                self.add_edge(i, p, q)
                self.update_potentials(i, p, q)
        return self.flow[: self.count + self.n]
