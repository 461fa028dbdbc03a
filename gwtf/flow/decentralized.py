"""The decentralized routing algorithm: one sans-I/O state machine per node.

Problem (DESIGN.md 2). Every node `v` is split into an in half and an out half joined by an
internal arc of capacity `cap_v` and cost 0 (stage-0 nodes have only an out half, last-stage nodes
only an in half). Node-to-node arcs carry the costs and capacities of the topology. Each data
holder `h` (stage 0) has a supply of `cap_h` units and a *slack* arc to a virtual terminal `V` of
cost 0: what it cannot get through the pipeline it keeps. Each last-stage node `z` has a
*consumption* arc to `V` of capacity `cap_z` and cost `-M`. `V` has a fixed price 0 and never acts,
so no node has to play a global sink. When `M` exceeds the cost of every augmenting path, a flow of
least cost is a maximum flow, and among maximum flows one of least cost: the lexicographic
objective, in one linear program.

Method: asynchronous epsilon-relaxation (Bertsekas; Bertsekas & Eckstein 1987) with
epsilon-scaling. Why this one and not the alternatives DESIGN.md names:

- it is exact: at quiescence the flow is epsilon-optimal, so its value is the maximum (any
  augmenting path would contradict epsilon-complementary slackness once `M` is larger than the path
  cost plus `(length + 1) * eps`) and its cost is within `O(n * eps)` of the optimum. A local
  swap/annealing search (GWTF's own variant) has no such guarantee, and the issue asks for the
  oracle's exact flow value;
- every step is local: a node changes its own price and the flows on its own arcs, using only the
  prices its neighbours last announced; stale prices are lower bounds (prices only rise), which is
  what makes arbitrary message delays harmless;
- it restarts warm: after a change, the surviving flows and prices still satisfy
  epsilon-complementary slackness almost everywhere, so only the disturbed region does work.

Why epsilon-scaling: flow that cannot get past a bottleneck stage must travel back to the data
holders, whose prices must rise by about `M` first. With a single small `eps` that rise happens in
steps of `eps` (the classic "price war"); scaling does it with a large `eps` first, then tightens.
Each node tightens its own `eps` (by `eps_factor`) once it has been quiet for `quiet_s`; an arc
uses the larger `eps` of its two ends. No global phase barrier is needed: the final result depends
only on the final `eps`, the scaling schedule only on speed.

Wire discipline, so that messages may be delayed, reordered or duplicated: each message carries
the whole state of one arc as cumulative counters (`pushed` by the tail, `returned` by the head,
release requests by the tail, releases honoured by the head), the sender's price (monotone) and its
`eps` (monotone). A receiver takes the maximum of what it has and what it got, so an old or
repeated message changes nothing. Flow on an arc is only ever increased by its tail and decreased by
its head, so both views stay within `[0, cap]`.

Negative surplus appears when an arc must be saturated at an `eps` change, or when an arc or node
vanishes. A node in deficit runs the reverse iteration: it asks tails of in-arcs that want more
flow to push ("pull") and heads of out-arcs that want less to return ("release"), and lowers its
price when neither exists; prices therefore carry a version, and the newest wins. The slack and
consumption arcs to V belong wholly to their node, which fixes them itself. After a topology
change the nodes next to it widen `eps` again, so the disturbed region re-runs the scaling from
the current flows and prices (a warm restart) rather than a price war at the final `eps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "FlowConfig",
    "FlowMessage",
    "FlowNode",
    "LocalArc",
    "NodeView",
]

INF_CAP = 1 << 62
"""Capacity of the slack arc: unbounded for every practical purpose."""


@dataclass(frozen=True)
class FlowConfig:
    """Swarm-wide parameters of the algorithm (every node must use the same values)."""

    big_m: int
    """Reward per unit of flow that reaches the last stage, in cost units. Must exceed the cost of
    any augmenting path; `for_costs` derives a safe value."""
    eps_final: int
    """Epsilon the algorithm ends at, in cost units: bounds the distance to the least cost."""
    eps_start: int = 0
    """Epsilon a cold start begins with (0: `big_m`)."""
    eps_factor: int = 8
    """How much a node tightens epsilon at each step of the scaling."""
    quiet_s: float = 7.0
    """How long a node must see no activity before it tightens epsilon (clock units)."""

    @property
    def eps_initial(self) -> int:
        return max(self.eps_final, self.eps_start or self.big_m)

    @staticmethod
    def for_costs(
        num_stages: int, max_cost: int, min_cost: int, *, quiet_s: float = 7.0
    ) -> FlowConfig:
        """Parameters for a swarm of `num_stages` stages whose arc costs lie in
        `[min_cost, max_cost]` cost units.

        `M` is four times the cost of the costliest possible source-to-sink path of `S - 1` arcs
        (plus slack for the zig-zags of an augmenting path through two stages); the oracle
        comparison in the tests and benchmarks checks that no maximum flow was missed.
        Scaling starts at the costliest arc (a larger start makes prices overshoot the data
        holders' slack level, which later phases must undo) and ends at a thousandth of the
        cheapest arc, which keeps the cost within far less than 1% of the optimum.
        """
        big_m = 4 * (num_stages + 1) * max(1, max_cost) + 1
        eps_final = max(1, min_cost // 1000)
        return FlowConfig(
            big_m=big_m, eps_final=eps_final, eps_start=max(1, max_cost), quiet_s=quiet_s
        )


@dataclass(frozen=True)
class LocalArc:
    """An arc as one of its ends knows it: the peer at the other end, capacity and cost (units)."""

    peer: str
    cap: int
    cost: int


@dataclass(frozen=True)
class NodeView:
    """All a node knows when it starts: itself and its incident arcs."""

    node_id: str
    stage: int
    num_stages: int
    capacity: int
    upstream: tuple[LocalArc, ...] = ()
    """Arcs `peer -> node` (the peer is in stage `stage - 1`)."""
    downstream: tuple[LocalArc, ...] = ()
    """Arcs `node -> peer` (the peer is in stage `stage + 1`)."""


@dataclass(frozen=True)
class FlowMessage:
    """The state of the arc between `sender` and `receiver`, as the sender sees it.

    `from_tail` tells which end sent it. From the tail: `flow` is the cumulative amount pushed,
    `req` the cumulative amount it asked the head to return ("release"), `pull` the cumulative
    amount of the head's pull requests it has answered. From the head: `flow` is the cumulative
    amount returned, `req` the cumulative amount of release requests it has answered, `pull` the
    cumulative amount it asked the tail to push. `price` is the sender's price on this arc and
    `price_ver` counts its changes. All counters are cumulative and `eps` only falls, so a receiver
    merges by maximum (newest version for the price): delivery may be delayed, reordered or
    duplicated without changing the outcome.
    """

    sender: str
    receiver: str
    sender_epoch: int
    from_tail: bool
    price: int
    price_ver: int
    eps: int
    flow: int
    req: int
    pull: int


class _Vertex:
    """One half of a node in the flow network: a price (with a version) and a surplus."""

    __slots__ = ("name", "price", "ver", "surplus", "outs", "ins", "upstream_facing")

    def __init__(self, name: str, price: int, upstream_facing: bool) -> None:
        self.name = name
        self.price = price
        self.ver = 0
        self.surplus = 0
        self.outs: list[_Edge] = []
        self.ins: list[_Edge] = []
        self.upstream_facing = upstream_facing


class _Edge:
    """An arc incident to this node. Either end may be local, remote (`peer`) or the terminal V.

    `pushed - returned` is the flow as this node sees it. For a remote arc the local end owns its
    counters and merges the peer's from messages; for local and terminal arcs all are exact.
    """

    __slots__ = (
        "cap",
        "cost",
        "tail",
        "head",
        "peer",
        "peer_epoch",
        "peer_price",
        "peer_ver",
        "peer_eps",
        "pushed",
        "returned",
        "req",
        "done",
        "pull",
        "pulled",
    )

    def __init__(
        self,
        cap: int,
        cost: int,
        tail: _Vertex | None,
        head: _Vertex | None,
        peer: str | None = None,
        peer_epoch: int = 0,
        peer_price: int = 0,
        peer_eps: int = 0,
    ) -> None:
        self.cap = cap
        self.cost = cost
        self.tail = tail
        self.head = head
        self.peer = peer
        self.peer_epoch = peer_epoch
        self.peer_price = peer_price
        self.peer_ver = -1
        self.peer_eps = peer_eps
        self.pushed = 0
        self.returned = 0
        self.req = 0  # release asked by the tail (cumulative)
        self.done = 0  # release requests answered by the head (cumulative)
        self.pull = 0  # push asked by the head (cumulative)
        self.pulled = 0  # pull requests answered by the tail (cumulative)

    @property
    def flow(self) -> int:
        return self.pushed - self.returned


class FlowNode:
    """The routing state machine of one node (sans-I/O).

    Drive it with `start()`, `on_message()` / `on_messages()`, `on_tick()` and the topology edits
    `add_peer()` / `remove_peer()`; each returns the messages to send. `routes()` gives the current
    rate to each next-stage peer. Time comes only from the injected `clock`.
    """

    def __init__(
        self,
        view: NodeView,
        config: FlowConfig,
        clock: Callable[[], float],
        *,
        epoch: int = 0,
        warm: bool = False,
    ) -> None:
        """`warm=True` starts at the final epsilon: a node joining a converged swarm."""
        self.node_id = view.node_id
        self.stage = view.stage
        self.num_stages = view.num_stages
        self.epoch = epoch
        self.config = config
        self._clock = clock
        self.eps = config.eps_final if warm else config.eps_initial
        self._last_active = clock()
        self._dirty: set[str] = set()
        self._edges: dict[str, _Edge] = {}
        self._started = False

        low = -config.big_m
        first = view.stage == 0
        last = view.stage == view.num_stages - 1
        self._in: _Vertex | None = None if first else _Vertex("in", low, True)
        self._out: _Vertex | None = None if last else _Vertex("out", low, False)
        self._vertices = [v for v in (self._in, self._out) if v is not None]
        self._terminal: _Edge | None = None
        if first:
            assert self._out is not None
            # The data holder's supply, and a slack arc to V for what the pipeline cannot take.
            self._out.surplus = view.capacity
            self._terminal = self._link(_Edge(INF_CAP, 0, self._out, None))
        elif last:
            assert self._in is not None
            # Consumption at the last stage: bounded by the node's capacity, rewarded by M.
            self._terminal = self._link(_Edge(view.capacity, -config.big_m, self._in, None))
        else:
            self._link(_Edge(view.capacity, 0, self._in, self._out))
        for arc in view.upstream:
            self.add_peer(arc, upstream=True)
        for arc in view.downstream:
            self.add_peer(arc, upstream=False)
        self._dirty.clear()
        self._started = True

    # ------------------------------------------------------------------ topology

    @staticmethod
    def _link(edge: _Edge) -> _Edge:
        if edge.tail is not None:
            edge.tail.outs.append(edge)
        if edge.head is not None:
            edge.head.ins.append(edge)
        return edge

    def add_peer(self, arc: LocalArc, *, upstream: bool, peer_epoch: int = 0) -> list[FlowMessage]:
        """A new arc to or from `arc.peer` (a join, or a link coming back)."""
        if arc.peer in self._edges:
            self.remove_peer(arc.peer)
        low = -self.config.big_m
        if upstream:
            if self._in is None:
                raise ValueError(f"node {self.node_id!r} is in stage 0 and has no upstream peers")
            edge = _Edge(arc.cap, arc.cost, None, self._in, arc.peer, peer_epoch, low, self.eps)
        else:
            if self._out is None:
                raise ValueError(f"node {self.node_id!r} is in the last stage: no downstream peers")
            edge = _Edge(arc.cap, arc.cost, self._out, None, arc.peer, peer_epoch, low, self.eps)
        self._edges[arc.peer] = self._link(edge)
        self._dirty.add(arc.peer)
        self._rescale()
        return self._work()

    def remove_peer(self, peer: str) -> list[FlowMessage]:
        """The arc to or from `peer` is gone (the peer died or left, or the link failed).

        Flow this node had sent on it comes back as surplus; flow it had received becomes a
        deficit, which the reverse iterations resolve.
        """
        edge = self._edges.pop(peer, None)
        if edge is None:
            return []
        flow = edge.flow
        if edge.tail is not None:
            edge.tail.outs.remove(edge)
            edge.tail.surplus += flow
        if edge.head is not None:
            edge.head.ins.remove(edge)
            edge.head.surplus -= flow
        self._dirty.discard(peer)
        self._rescale()
        return self._work()

    def _set_eps(self, eps: int) -> None:
        self.eps = eps
        for vertex in self._vertices:
            vertex.ver += 1  # the price message now carries the new eps: make it the newest
        self._dirty.update(self._edges)

    def _rescale(self) -> None:
        """After a change of topology, widen epsilon again on this node's arcs: the disturbed
        region re-runs the scaling from the current flows and prices instead of fighting a price
        war at the final epsilon."""
        if self._started and self.eps < self.config.eps_initial:
            self._set_eps(self.config.eps_initial)

    def peers(self) -> list[str]:
        return sorted(self._edges)

    # ------------------------------------------------------------------ inputs

    def start(self) -> list[FlowMessage]:
        """Announce this node to its peers and route its supply, if it has one."""
        self._dirty.update(self._edges)
        return self._work()

    def on_message(self, msg: FlowMessage) -> list[FlowMessage]:
        return self.on_messages((msg,))

    def on_messages(self, msgs: Iterable[FlowMessage]) -> list[FlowMessage]:
        """Merge a batch of arc states from peers, then act once on the result."""
        for msg in msgs:
            self._merge(msg)
        return self._work()

    def on_tick(self, now: float) -> list[FlowMessage]:
        """Tighten epsilon after a quiet period (epsilon-scaling without a global barrier)."""
        if (
            self.eps > self.config.eps_final
            and self.idle()
            and now - self._last_active >= self.config.quiet_s
        ):
            self._set_eps(max(self.config.eps_final, self.eps // self.config.eps_factor))
            return self._work()
        return []

    def next_tick(self) -> float | None:
        """When this node next needs `on_tick`, or None if it has nothing left to do alone."""
        if self.eps <= self.config.eps_final:
            return None
        return self._last_active + self.config.quiet_s

    def _merge(self, msg: FlowMessage) -> None:
        edge = self._edges.get(msg.sender)
        if edge is None or msg.receiver != self.node_id or msg.sender_epoch != edge.peer_epoch:
            return  # an arc this node no longer has, or an old incarnation of the peer
        local_is_head = edge.head is not None
        if msg.from_tail != local_is_head:
            return  # the peer sees the arc the other way round: a malformed message
        if msg.price_ver > edge.peer_ver:
            edge.peer_ver = msg.price_ver
            edge.peer_price = msg.price
            edge.peer_eps = msg.eps
        if local_is_head:
            head = edge.head
            assert head is not None
            if msg.flow > edge.pushed:
                head.surplus += msg.flow - edge.pushed
                edge.pushed = msg.flow
            edge.req = max(edge.req, msg.req)
            edge.pulled = max(edge.pulled, msg.pull)
        else:
            tail = edge.tail
            assert tail is not None
            if msg.flow > edge.returned:
                tail.surplus += msg.flow - edge.returned
                edge.returned = msg.flow
            edge.done = max(edge.done, msg.req)
            edge.pull = max(edge.pull, msg.pull)

    # ------------------------------------------------------------------ the algorithm

    @staticmethod
    def _head_price(edge: _Edge) -> int:
        if edge.head is not None:
            return edge.head.price
        return 0 if edge.peer is None else edge.peer_price

    @staticmethod
    def _tail_price(edge: _Edge) -> int:
        return edge.tail.price if edge.tail is not None else edge.peer_price

    def _eps(self, edge: _Edge) -> int:
        return self.eps if edge.peer is None else max(self.eps, edge.peer_eps)

    def _reduced(self, edge: _Edge) -> int:
        return edge.cost + self._head_price(edge) - self._tail_price(edge)

    def _set_price(self, vertex: _Vertex, price: int) -> None:
        vertex.price = price
        vertex.ver += 1
        for edge in vertex.ins if vertex.upstream_facing else vertex.outs:
            if edge.peer is not None:
                self._dirty.add(edge.peer)

    def _work(self) -> list[FlowMessage]:
        """Act until this node can do nothing more without hearing from its peers."""
        self._last_active = self._clock()
        for _ in range(100_000):
            progressed = False
            for vertex in self._vertices:
                progressed |= self._answer_requests(vertex)
                progressed |= self._fix_slackness(vertex)
                if vertex.surplus > 0:
                    progressed |= self._forward(vertex)
                elif vertex.surplus < 0:
                    progressed |= self._reverse(vertex)
            if not progressed:
                break
        return self._flush()

    def _answer_requests(self, vertex: _Vertex) -> bool:
        """Answer peers' requests: as head, return what a tail asked to release; as tail, push
        what a head asked to pull; each as far as the flow or the room on the arc allows."""
        acted = False
        for edge in vertex.ins:
            if edge.peer is not None and edge.req > edge.done:
                amount = min(edge.req - edge.done, edge.flow)
                edge.done = edge.req
                if amount > 0:
                    edge.returned += amount
                    vertex.surplus -= amount
                self._dirty.add(edge.peer)
                acted = True
        for edge in vertex.outs:
            if edge.peer is not None and edge.pull > edge.pulled:
                amount = min(edge.pull - edge.pulled, edge.cap - edge.flow)
                edge.pulled = edge.pull
                if amount > 0:
                    edge.pushed += amount
                    vertex.surplus -= amount
                self._dirty.add(edge.peer)
                acted = True
        return acted

    def _fix_slackness(self, vertex: _Vertex) -> bool:
        """Restore epsilon-complementary slackness where this vertex owns the arc's fix.

        As head, an arc with flow whose reduced cost exceeds eps is emptied; as tail, an arc below
        capacity whose reduced cost is below -eps is filled. Violations come from messages that
        crossed a price change, from a smaller eps, and from arcs that appear: the surplus or
        deficit this creates is then settled by the forward and reverse iterations.
        """
        acted = False
        for edge in vertex.ins:
            flow = edge.flow
            if flow > 0 and self._reduced(edge) > self._eps(edge):
                self._return(vertex, edge, flow)
                acted = True
        for edge in vertex.outs:
            room = edge.cap - edge.flow
            if room > 0 and self._reduced(edge) < -self._eps(edge):
                if edge.cap < INF_CAP:
                    self._push(vertex, edge, room)
                else:
                    # An unbounded arc cannot be filled: the price above it must come down
                    # (the slack arc anchors a data holder's price at most eps above V's).
                    self._set_price(vertex, self._head_price(edge) + edge.cost + self._eps(edge))
                acted = True
            elif edge.head is None and edge.peer is None:
                # V never acts, so the node owns both ends of its terminal arc.
                flow = edge.flow
                if flow > 0 and self._reduced(edge) > self._eps(edge):
                    edge.returned += flow
                    vertex.surplus += flow
                    acted = True
        return acted

    def _push(self, vertex: _Vertex, edge: _Edge, amount: int) -> None:
        edge.pushed += amount
        vertex.surplus -= amount
        if edge.head is not None:
            edge.head.surplus += amount
        elif edge.peer is not None:
            self._dirty.add(edge.peer)

    def _return(self, vertex: _Vertex, edge: _Edge, amount: int) -> None:
        edge.returned += amount
        vertex.surplus -= amount
        if edge.tail is not None:
            edge.tail.surplus += amount
        elif edge.peer is not None:
            self._dirty.add(edge.peer)

    def _forward(self, vertex: _Vertex) -> bool:
        """Forward iteration at a vertex with surplus: push along admissible arcs (negative
        reduced cost forward, positive backward); when there are none, raise the price as far as
        epsilon-complementary slackness allows."""
        acted = False
        while vertex.surplus > 0:
            moved = False
            for edge in sorted(vertex.outs, key=self._reduced):
                room = edge.cap - edge.flow
                if room > 0 and self._reduced(edge) < 0:
                    self._push(vertex, edge, min(room, vertex.surplus))
                    moved = True
                    if vertex.surplus == 0:
                        break
            if vertex.surplus > 0:
                for edge in sorted(vertex.ins, key=self._reduced, reverse=True):
                    flow = edge.flow
                    if flow > 0 and self._reduced(edge) > 0:
                        self._return(vertex, edge, min(flow, vertex.surplus))
                        moved = True
                        if vertex.surplus == 0:
                            break
            if moved:
                acted = True
                continue
            bound = None
            for edge in vertex.outs:
                if edge.flow < edge.cap:
                    b = self._head_price(edge) + edge.cost + self._eps(edge)
                    bound = b if bound is None or b < bound else bound
            for edge in vertex.ins:
                if edge.flow > 0:
                    b = self._tail_price(edge) - edge.cost + self._eps(edge)
                    bound = b if bound is None or b < bound else bound
            if bound is None or bound <= vertex.price:
                return acted  # nothing residual: wait for the peers
            self._set_price(vertex, bound)
            acted = True
        return acted

    def _reverse(self, vertex: _Vertex) -> bool:
        """Reverse iteration at a vertex in deficit: pull flow in along arcs that want more
        (negative reduced cost) and take it off out-arcs that want less (positive reduced cost);
        remote ends are asked, local and terminal arcs change at once. When there are none,
        lower the price as far as epsilon-complementary slackness allows."""
        acted = False
        while True:
            need = -vertex.surplus - self._asked(vertex)
            if need <= 0:
                return acted
            moved = False
            for edge in sorted(vertex.ins, key=self._reduced):
                if need <= 0:
                    break
                room = edge.cap - edge.flow - (edge.pull - edge.pulled)
                if room > 0 and self._reduced(edge) < 0:
                    amount = min(room, need)
                    if edge.tail is not None:
                        edge.pushed += amount
                        edge.tail.surplus -= amount
                        vertex.surplus += amount
                    else:
                        edge.pull += amount
                        self._dirty.add(edge.peer)  # type: ignore[arg-type]
                    need -= amount
                    moved = True
            for edge in sorted(vertex.outs, key=self._reduced, reverse=True):
                if need <= 0:
                    break
                avail = edge.flow - (edge.req - edge.done)
                if avail > 0 and self._reduced(edge) > 0:
                    amount = min(avail, need)
                    if edge.peer is None:
                        edge.returned += amount
                        vertex.surplus += amount
                        if edge.head is not None:
                            edge.head.surplus -= amount
                    else:
                        edge.req += amount
                        self._dirty.add(edge.peer)
                    need -= amount
                    moved = True
            if moved:
                acted = True
                continue
            bound = None
            for edge in vertex.ins:
                if edge.flow < edge.cap:
                    b = self._tail_price(edge) - edge.cost - self._eps(edge)
                    bound = b if bound is None or b > bound else bound
            for edge in vertex.outs:
                if edge.flow > 0:
                    b = self._head_price(edge) + edge.cost - self._eps(edge)
                    bound = b if bound is None or b > bound else bound
            if bound is None or bound >= vertex.price:
                return acted  # wait for answers or for the peers
            self._set_price(vertex, bound)
            acted = True

    def _asked(self, vertex: _Vertex) -> int:
        """Flow this vertex has asked peers for and not yet heard back about."""
        return sum(e.pull - e.pulled for e in vertex.ins if e.peer is not None) + sum(
            e.req - e.done for e in vertex.outs if e.peer is not None
        )

    # ------------------------------------------------------------------ outputs

    def _flush(self) -> list[FlowMessage]:
        out = []
        for peer in sorted(self._dirty):
            edge = self._edges.get(peer)
            if edge is None:
                continue
            if edge.tail is not None:
                vertex, counters = edge.tail, (edge.pushed, edge.req, edge.pulled)
            else:
                assert edge.head is not None
                vertex, counters = edge.head, (edge.returned, edge.done, edge.pull)
            out.append(
                FlowMessage(
                    self.node_id, peer, self.epoch, edge.tail is not None,
                    vertex.price, vertex.ver, self.eps, *counters,
                )
            )
        self._dirty.clear()
        return out

    def idle(self) -> bool:
        """No surplus, no deficit and no request waiting for an answer."""
        return all(v.surplus == 0 and self._asked(v) == 0 for v in self._vertices)

    def routes(self) -> dict[str, int]:
        """Current rate (flow units) to each next-stage peer with flow."""
        if self._out is None:
            return {}
        return {e.peer: e.flow for e in self._out.outs if e.peer is not None and e.flow > 0}

    def throughput(self) -> int:
        """Flow units this node passes on (for the last stage: consumes)."""
        if self._out is None:
            assert self._terminal is not None
            return self._terminal.flow
        return sum(e.flow for e in self._out.outs if e.peer is not None)
