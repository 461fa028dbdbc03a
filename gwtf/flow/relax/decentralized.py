"""The decentralized routing algorithm: one sans-I/O state machine per node.

Problem (docs/design.md 2), as a circulation. Every node `v` is split into an in half `I_v` and an
out half `O_v` joined by an internal arc of capacity `cap_v` and cost 0. Arcs `O_u -> I_v` join
nodes of consecutive stages with the costs and capacities of the topology. The pipeline is closed
into a ring by *return arcs* `O_z -> I_h` from every last-stage node `z` to every data holder `h`,
of cost `-M` and capacity `min(cap_z, cap_h)`. Every vertex has supply 0. A unit that goes round the
ring earns `M`; once `M` exceeds the cost of every augmenting path, a circulation of least cost
carries the maximum flow and, among maximum flows, the one of least cost: the lexicographic
objective in one linear program, with no source, sink or terminal that a node would have to
play. The return arcs make the last stage and the data holders neighbours in the control plane;
they are quiet in steady state.

Method: asynchronous epsilon-relaxation (Bertsekas & Eckstein 1988; Bertsekas & Tsitsiklis,
*Parallel and Distributed Computation*, 5.4) with forward iterations and per-node epsilon-scaling.
Why this method: it is exact (at quiescence the circulation is epsilon-optimal, so its value is
the maximum and its cost within `O(n * eps)` of the least), every step is local (a vertex with
surplus pushes it on arcs whose reduced cost favours it, or raises its own price), prices only
rise, and it restarts warm from the current flows and prices after any change. GWTF's own
swap/annealing search has no optimality guarantee; distributed push-relabel solves only the
max-flow half.

Notation. A vertex's price is `p`; the reduced cost of arc `a = (x, y)` is
`r(a) = cost(a) + p(y) - p(x)`, so flow runs downhill, from high prices to low. Epsilon-
complementary slackness (eps-CS) asks, for every arc, `r(a) >= -eps` if it has room and
`r(a) <= eps` if it has flow.

What makes this version cheap in messages and safe under any delivery order:

- *Each condition has one owner.* The tail of an arc owns its room condition, the head its flow
  condition, and each owner checks its condition with its own `eps`. A node therefore never has
  to tell anybody its `eps`, and tightening `eps` is a purely local act.
- *Stale prices are safe.* Prices only rise, so the price a node last heard from a peer is a lower
  bound. With a lower bound for the head's price the tail's room check can only be stricter than
  the truth, and with a lower bound for the tail's price the head's flow check can only be
  stricter: whatever both ends accept locally holds for the real prices. A peer's price changes
  never break a node's own conditions either (a higher head price only raises `r`, a higher tail
  price only lowers it), so a node re-checks its conditions only when its own `eps` falls or when
  an arc gains flow or room.
- *Price announcements are targeted.* A node sends its price with every flow change on an arc.
  Besides, its in half tells every upstream tail that has ever pushed to it (tails choose where to
  push by the heads' prices), and its out half tells the heads of arcs that carry flow (a head
  needs the tail's price only to decide whether to return flow). A tail that acts on an old price
  learns the new one from the answer: its push comes back with the head's current price. On the
  geo10 benchmark at 200 nodes, telling every neighbour of every price change sent 458,000
  messages, telling only the ends of arcs with flow 326,000 but took 5.6 times the rounds, and
  this rule 389,000 in fewer rounds than either.
- *Counters, not deltas.* Each message carries the cumulative amount its sender has moved on the
  arc (`pushed` from the tail, `returned` from the head) and the sender's price; a receiver keeps
  the maximum of each, so delayed, reordered or duplicated messages change nothing, and a lost
  one is repaired by the next (messages also echo the peer's counter, so a driver can resend the
  unacknowledged ones). Flow on an arc is only ever increased by its tail and decreased by its
  head, so both views stay within `[0, cap]`.
- *Conservation survives any crash.* When an arc vanishes each end drops its own view: the tail
  gets back what it pushed and has not seen returned, the head loses what it has seen arrive and
  not returned. Whatever the dead node held and whatever was in flight, the surplus of the live
  vertices still sums to zero (every unit is counted by exactly one side), so the remaining
  surplus always has a deficit to go to and the algorithm always quiesces.

Epsilon-scaling, phase by phase. Each node starts at `eps_start` and divides its `eps` by
`eps_factor` when told to (`tighten`): the driver ends a phase for the whole swarm once it knows
that the phase's work is done everywhere (the bus and the simulator see it exactly: nothing in
flight). Left to tighten on their own after a quiet spell (`quiet_s`), nodes at a fine epsilon
receive work made at a wide one and settle it in many small price steps: 5 to 6 times the
messages on the same benchmark. After a change of topology the swarm stays at the final epsilon:
rerouting a lost node's flow is then a few local moves (1 to 4% of a cold start's messages on
most changes). A change that moves the minimum cut needs prices to move by about `M` between the
old cut and the new one, thousands of steps at the final epsilon; a node that relabels many times
there asks for a rescale (`wants_rescale`), and the swarm re-runs the scaling from the current
flows and prices, which costs about a cold start.

New parameters for an arc (a re-measured link) are applied in place (`update_arc`): the arc keeps
its flow and counters under a new generation, and only what the new numbers break moves. An end
whose own condition they break asks for a rescale at once: a parameter change past the node's
hysteresis moves prices by a good fraction of an arc's cost, far more than a few relabels at the
final epsilon, and only the two ends of the arc hear of it, so a price war elsewhere would have
nobody allowed to ask (on a 16-node geo10 swarm such a war ran 200,000 messages before an end
asked). Re-created empty instead, as arcs were, it re-routed all its flow for what is mostly
probe noise.

Two halves, one node: when the cheapest way on for the surplus of one half is through the other
half, both halves rise together (a set relaxation): raising them one at a time would bounce the
surplus between them, `eps` per bounce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "FlowConfig",
    "FlowMessage",
    "FlowNode",
    "LocalArc",
    "NodeView",
    "rescale_if_asked",
]

MAX_STEPS = 10_000_000
"""Bound on the local steps of one `FlowNode` call: a guard against a bug, never reached."""

RESCALES_PER_CHANGE = 1
"""How many times a node may ask for a rescale after one change of topology (see
`FlowNode.wants_rescale`): each one re-runs the whole scaling, and asking again could loop."""


@dataclass(frozen=True)
class FlowConfig:
    """Swarm-wide parameters of the algorithm (every node must use the same values)."""

    big_m: int
    """Reward per unit of flow round the ring, in cost units. Must exceed the cost of any
    augmenting path; `for_costs` derives a safe value from `max_cost`."""
    max_cost: int
    """The largest arc cost the swarm was configured for. A node clamps a costlier arc (a
    joiner on a slow link) to it, so that `big_m` stays valid and the maximum flow is never
    missed; only the cost of such an arc is then understated."""
    eps_final: int
    """Epsilon the algorithm ends at, in cost units: bounds the distance to the least cost."""
    eps_start: int
    """Epsilon a cold start begins with."""
    eps_factor: int = 8
    """How much a node tightens epsilon at each step of the scaling."""
    rescale_after: int = 64
    """How many relabels one node may make at its current epsilon, in the middle of a scaling,
    before it asks the swarm to re-run the scaling after a change (`FlowNode.wants_rescale`)."""
    rescale_after_final: int = 16
    """The same at the final epsilon. There, a change that needs no rescale settles in a few
    local moves (a relay with spare peers dies: no node relabels even 8 times), and one that
    needs it shows a price war at once, each relabel waited for costing a round trip before the
    rescale starts (3.5 s after the detection on a loaded loopback swarm). In the middle of a
    scaling, relabels are also the phase's own work, and a rescale throws the phases done away:
    16 there too settled isolated changes as fast but cost 4% of the throughput under high
    churn, where changes keep landing in scalings (`python -m benchmarks reconverge`;
    docs/results/routing.md, *Reconvergence of the relaxation*)."""
    quiet_s: float | None = None
    """None: the driver ends each scaling phase for the whole swarm (`FlowNode.tighten`), once it
    knows that the phase's work is done everywhere. A number: each node tightens on its own after
    it has had nothing to do for that long (clock units), which needs no coordination but lets
    work of a wide epsilon reach nodes already at a fine one, and costs several times more."""

    @staticmethod
    def for_costs(
        num_stages: int, max_cost: int, min_cost: int, *, quiet_s: float | None = None
    ) -> FlowConfig:
        """Parameters for a swarm of `num_stages` stages whose arc costs lie in
        `[min_cost, max_cost]` cost units.

        `M` is four times the cost of the costliest pipeline path of `S - 1` arcs, leaving room
        for the zig-zags of an augmenting path; the oracle comparisons in the tests and
        benchmarks check that no maximum flow is missed. Scaling starts at the costliest arc.

        The final epsilon guarantees a cost within 1% of the least. For an eps-optimal
        circulation `f` and an optimal `f*` of the same value, `cost(f) - cost(f*)` is the sum of
        `r(a) * (f(a) - f*(a))` over arcs, and eps-CS bounds each term by
        `eps * |f(a) - f*(a)|`; a unit of flow crosses `2S` arcs (S internal, S - 1 pipeline, one
        return), so the excess is at most `eps * 4S * F` against a cost of at least
        `F * (S - 1) * min_cost`. Hence `eps = (S - 1) * min_cost / (400 * S)`. In practice the
        cost comes out far closer than the bound (the benchmarks report the ratio).
        """
        max_cost = max(1, max_cost)
        min_cost = max(1, min(min_cost, max_cost))
        stages = max(2, num_stages)
        big_m = 4 * (stages - 1) * max_cost + 1
        eps_final = max(1, (stages - 1) * min_cost // (400 * stages))
        return FlowConfig(
            big_m=big_m,
            max_cost=max_cost,
            eps_final=eps_final,
            eps_start=max(eps_final, max_cost),
            quiet_s=quiet_s,
        )


@dataclass(frozen=True)
class LocalArc:
    """An arc as one of its ends knows it: the peer at the other end, capacity and cost (units).

    For a return arc (last stage -> data holder) the cost is ignored: it is always `-big_m`."""

    peer: str
    cap: int
    cost: int
    gen: int = 0
    """Generation of the arc, the same at both ends: a driver that re-creates an arc between the
    same two incarnations (a link that failed and came back) gives it a new one, so that nothing
    sent on the old arc is counted on the new; so does one that updates its parameters in place
    (`FlowNode.update_arc`), whose counters run on."""
    epoch: int = 0
    """The incarnation of the peer this arc leads to."""


@dataclass(frozen=True)
class NodeView:
    """All a node knows when it starts: itself and its incident arcs."""

    node_id: str
    stage: int
    num_stages: int
    capacity: int
    upstream: tuple[LocalArc, ...] = ()
    """Arcs `peer -> node`: from stage `stage - 1`, or for a data holder the return arcs from
    the last stage."""
    downstream: tuple[LocalArc, ...] = ()
    """Arcs `node -> peer`: to stage `stage + 1`, or for the last stage the return arcs to the
    data holders."""


class FlowMessage(NamedTuple):
    """The state of the arc between `sender` and `receiver`, as the sender sees it.

    `from_tail` tells which end sent it. `flow` is the sender's cumulative counter on the arc:
    the amount pushed (from the tail) or returned (from the head); `echo` is the receiver's
    counter as the sender has last seen it (an acknowledgement). `price` is the sender's price
    at this arc: of its out half from the tail, of its in half from the head. The epochs name the
    incarnations of both ends and `gen` the arc's generation, so that nothing meant for an earlier
    incarnation of either end, or of the arc, is ever used.
    """

    sender: str
    receiver: str
    sender_epoch: int
    receiver_epoch: int
    gen: int
    from_tail: bool
    price: int
    flow: int
    echo: int
    eps: int


class _Arc:
    """A remote arc as this node sees it. This node is its tail (`tail`) or its head.

    `mine` is this end's cumulative counter (pushed if tail, returned if head) and `theirs` the
    peer's, as last heard; the flow as this end sees it is `mine - theirs` at the tail and
    `theirs - mine` at the head. `known` turns true with the first message from the peer: until
    then its price is unknown and the arc takes no part in decisions.
    """

    __slots__ = (
        "peer",
        "cap",
        "cost",
        "tail",
        "peer_epoch",
        "gen",
        "base_gen",
        "mine",
        "theirs",
        "echo",
        "peer_price",
        "known",
    )

    def __init__(
        self, peer: str, cap: int, cost: int, tail: bool, peer_epoch: int, gen: int
    ) -> None:
        self.peer = peer
        self.cap = cap
        self.cost = cost
        self.tail = tail
        self.peer_epoch = peer_epoch
        self.gen = gen
        self.base_gen = gen  # the generation its counters started at (see `update_arc`)
        self.mine = 0
        self.theirs = 0
        self.echo = 0  # my counter as the peer has acknowledged it
        self.peer_price = 0
        self.known = False

    @property
    def flow(self) -> int:
        return self.mine - self.theirs if self.tail else self.theirs - self.mine


class FlowNode:
    """The routing state machine of one node (sans-I/O).

    Drive it with `start()`, `on_messages()`, `on_tick()` and the topology edits `add_peer()` /
    `remove_peer()`; each returns the messages to send. `routes()` gives the current rate to each
    next-stage peer. Time comes only from the injected `clock`.
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
        """`warm=True` starts at the final epsilon: a node joining a running swarm."""
        self.node_id = view.node_id
        self.stage = view.stage
        self.num_stages = view.num_stages
        self.epoch = epoch
        self.config = config
        self._clock = clock
        self.eps = config.eps_final if warm else config.eps_start
        self._holder = view.stage == 0
        self._last = view.stage == view.num_stages - 1
        # A data holder's in half starts `M` above everything else, so that the return arcs
        # start balanced and its internal arc, not every return arc, takes the first flow in.
        self.p_in = config.big_m if self._holder else 0
        self.p_out = 0
        self.s_in = 0
        self.s_out = 0
        self.cap = view.capacity
        self.internal = 0
        self._up: dict[str, _Arc] = {}
        self._down: dict[str, _Arc] = {}
        # Insertion-ordered sets (dicts), so that the order of actions follows the order of
        # messages and a run is the same for the same seed.
        self._dirty: dict[_Arc, None] = {}
        self._check: dict[_Arc, None] = {}  # arcs whose own condition must be re-checked
        self._check_all = True
        self._last_active = clock()
        self._relabels_here = 0  # relabels at the current epsilon
        # A cold start is a full scaling already; after a change of topology a node may ask for
        # a few rescales (each widening further), never more, so the phases always end.
        self._rescales_left = RESCALES_PER_CHANGE if warm else 0
        # An arc update that broke a condition here asks for a rescale at once (`update_arc`).
        self._rescale_now = False
        self._started = False
        for arc in view.upstream:
            self.add_peer(arc, upstream=True, peer_epoch=arc.epoch)
        for arc in view.downstream:
            self.add_peer(arc, upstream=False, peer_epoch=arc.epoch)
        self._started = True

    # ------------------------------------------------------------------ topology

    def add_peer(self, arc: LocalArc, *, upstream: bool, peer_epoch: int = 0) -> list[FlowMessage]:
        """A new arc to or from `arc.peer` (a join, or a link coming back)."""
        arcs = self._up if upstream else self._down
        if arc.peer in arcs:
            self._drop(arcs, arc.peer)
        is_return = self._holder if upstream else self._last
        cost = -self.config.big_m if is_return else min(arc.cost, self.config.max_cost)
        new = _Arc(arc.peer, arc.cap, cost, not upstream, peer_epoch, arc.gen)
        arcs[arc.peer] = new
        self._changed()
        self._dirty[new] = None  # introduce ourselves: the peer learns our price
        if not self._started:
            return []
        return self._work()

    def update_arc(self, arc: LocalArc, *, upstream: bool) -> list[FlowMessage]:
        """New capacity and cost for the arc to or from `arc.peer`, as generation `arc.gen`
        (a re-measured link), keeping its flow and counters; an arc this node does not have
        (or to another incarnation of the peer) is added as by `add_peer`.

        Re-creating the arc instead (`add_peer`) empties it: both ends drop their views, the
        flow it carried becomes surplus and deficit to route again, and re-measured noise then
        costs a re-routing of all that flow (often a rescale) for nothing. In place, only what
        the new numbers break moves: the end whose condition they violate fixes it, and a head
        returns whatever exceeds a smaller capacity. Both ends must keep their counters, so a
        driver uses it exactly when both had the arc (the tail announces the new generation;
        a head that never had the arc starts it from the tail's counters, which it never
        counted). Messages of the generations since the arc's counters started stay valid:
        the counters run on, so an old one in flight still says something true.
        """
        arcs = self._up if upstream else self._down
        old = arcs.get(arc.peer)
        if old is None or old.peer_epoch != arc.epoch:
            return self.add_peer(arc, upstream=upstream, peer_epoch=arc.epoch)
        if arc.gen < old.gen:
            return []  # an older generation than the arc's: nothing new
        is_return = self._holder if upstream else self._last
        old.gen = arc.gen
        old.cap = arc.cap
        if not is_return:
            old.cost = min(arc.cost, self.config.max_cost)
        self._changed()
        if old.known and self.eps < self.config.eps_start and self._violated(old):
            self._rescale_now = True  # (at eps_start, the scaling under way absorbs it)
        self._check[old] = None
        self._dirty[old] = None  # the peer learns the generation (and our price) from us too
        return self._work()

    def _violated(self, arc: _Arc) -> bool:
        """This end's condition on `arc` is broken, so flow must move on it: room with a reduced
        cost below `-eps` at the tail, flow above the capacity or with a reduced cost above
        `eps` at the head."""
        eps = self.eps
        flow = arc.flow
        if arc.tail:
            return flow < arc.cap and arc.cost + arc.peer_price - self.p_out < -eps
        return flow > arc.cap or (flow > 0 and arc.cost + self.p_in - arc.peer_price > eps)

    def remove_peer(self, peer: str) -> list[FlowMessage]:
        """The arcs to and from `peer` are gone (it died or left).

        Flow this node had sent on them comes back as surplus; flow it had received becomes a
        deficit, which surplus from elsewhere fills.
        """
        dropped = False
        for arcs in (self._up, self._down):
            if peer in arcs:
                self._drop(arcs, peer)
                dropped = True
        return self._work() if dropped else []

    def remove_arc(self, peer: str, *, upstream: bool) -> list[FlowMessage]:
        """One arc is gone: from `peer` (upstream) or to it (a link failure between the two)."""
        arcs = self._up if upstream else self._down
        if peer not in arcs:
            return []
        self._drop(arcs, peer)
        return self._work()

    def _changed(self) -> None:
        if self._started:
            self.note_change()

    def note_change(self) -> None:
        """The topology changed somewhere in the swarm (the driver calls this on every node,
        not only on the ends of the change): the price moves it calls for may happen anywhere,
        and this node may now ask for a rescale (`wants_rescale`); unless it is at `eps_start`,
        where the scaling just begun absorbs the change (several arcs updated at once, or a head
        hearing of an update after the tail's rescale, made a second rescale out of one)."""
        self._relabels_here = 0
        if self.eps < self.config.eps_start:
            self._rescales_left = RESCALES_PER_CHANGE

    def _drop(self, arcs: dict[str, _Arc], peer: str) -> None:
        self._changed()
        arc = arcs.pop(peer)
        if arc.tail:
            self.s_out += arc.flow
        else:
            self.s_in -= arc.flow
        self._dirty.pop(arc, None)
        self._check.pop(arc, None)

    def peers(self) -> list[str]:
        return sorted(set(self._up) | set(self._down))

    # ------------------------------------------------------------------ inputs

    def start(self) -> list[FlowMessage]:
        """Announce this node to its peers."""
        for arc in (*self._up.values(), *self._down.values()):
            self._dirty[arc] = None
        return self._work()

    def on_message(self, msg: FlowMessage) -> list[FlowMessage]:
        return self.on_messages((msg,))

    def on_messages(self, msgs: Iterable[FlowMessage]) -> list[FlowMessage]:
        """Merge a batch of arc states from peers, then act once on the result."""
        for msg in msgs:
            self._merge(msg)
        return self._work()

    def tighten(self) -> list[FlowMessage]:
        """End this node's scaling phase: divide epsilon by `eps_factor` (down to `eps_final`)
        and restore the conditions the tighter epsilon breaks."""
        if self.eps <= self.config.eps_final:
            return []
        self.eps = max(self.config.eps_final, self.eps // self.config.eps_factor)
        self._relabels_here = 0
        self._check_all = True
        return self._work()

    def rescale(self) -> None:
        """Widen epsilon to `eps_start`: the swarm re-runs the scaling from the current flows and
        prices. A wider epsilon breaks no condition, so this sends nothing."""
        self.eps = self.config.eps_start
        self._relabels_here = 0
        self._rescales_left = max(0, self._rescales_left - 1)
        self._rescale_now = False

    def wants_rescale(self) -> bool:
        """After a change of topology, this node has relabelled more than `rescale_after` times
        at its current epsilon, which is not yet `eps_start`; or an arc update broke one of its
        conditions (`update_arc`).

        After a change the swarm stays at the final epsilon, and rerouting the flow of a lost
        node is usually a few local moves. But the prices may have to move far: by the cost
        difference of a detour, or, when the change moves the minimum cut, by about `M` between
        the old cut and the new one. At the final epsilon that takes thousands of small steps;
        a long run of relabels is the sign, and re-running the scaling (every node widens, then
        the phases again) costs about a cold start, which is then far cheaper. The driver
        decides, and rescales every node at once. A node asks at most `RESCALES_PER_CHANGE`
        times after each change it sees (a cold start never). Widening less than all the way,
        in steps, was tried: each step adds its own phases and the total came out higher. So
        was widening once to less than `eps_start` (/8, /64, /512 of it) or to more (x2, x8),
        and tightening faster after a rescale (by 16 or 64 instead of `eps_factor`): on geo10
        swarms each took longer and more messages over crashes, joins and link changes (a
        crash off the cut alone settled sooner at /512), because a change that moves the cut
        needs prices to move by about `M`, which only a wide epsilon does in a few steps.
        """
        if self.eps >= self.config.eps_start:
            return False
        final = self.eps <= self.config.eps_final
        limit = self.config.rescale_after_final if final else self.config.rescale_after
        return self._rescale_now or (self._rescales_left > 0 and self._relabels_here > limit)

    def on_tick(self, now: float) -> list[FlowMessage]:
        """With `quiet_s` set, tighten epsilon after a quiet period (no coordination)."""
        quiet = self.config.quiet_s
        if quiet is not None and self.idle() and now - self._last_active >= quiet:
            return self.tighten()
        return []

    def next_tick(self) -> float | None:
        """When this node next needs `on_tick`, or None if it has nothing left to do alone."""
        if self.config.quiet_s is None or self.eps <= self.config.eps_final:
            return None
        return self._last_active + self.config.quiet_s

    @property
    def final(self) -> bool:
        """Epsilon is at its final value."""
        return self.eps <= self.config.eps_final

    def _merge(self, msg: FlowMessage) -> None:
        if msg.receiver != self.node_id or msg.receiver_epoch != self.epoch:
            return  # meant for another node, or for an earlier incarnation of this one
        # The peer is the tail of the arc exactly when it says it sent as tail.
        arc = (self._up if msg.from_tail else self._down).get(msg.sender)
        if arc is None or msg.sender_epoch != arc.peer_epoch or not (
            arc.base_gen <= msg.gen <= arc.gen
        ):
            return  # an arc this node no longer has, or an old incarnation of the peer or arc
        if not arc.known:
            arc.known = True
            self._check[arc] = None
        if msg.price > arc.peer_price:
            arc.peer_price = msg.price
        if msg.echo > arc.echo:
            arc.echo = msg.echo
        if msg.flow > arc.theirs:
            delta = msg.flow - arc.theirs
            arc.theirs = msg.flow
            if arc.tail:
                self.s_out += delta  # returned to us
            else:
                self.s_in += delta  # pushed to us
            self._check[arc] = None  # room (tail) or flow (head) appeared: our condition applies

    # ------------------------------------------------------------------ the algorithm

    def _work(self) -> list[FlowMessage]:
        """Act until this node can do nothing more without hearing from its peers."""
        self._last_active = self._clock()
        self._fix_conditions()
        for _ in range(MAX_STEPS):
            if self.s_out > 0 and self._forward(out_side=True):
                continue
            if self.s_in > 0 and self._forward(out_side=False):
                continue
            break
        return self._flush()

    def _fix_conditions(self) -> None:
        """Restore the conditions this node owns: room on its out-arcs (as tail) and flow on its
        in-arcs (as head), plus the internal arc. A violated room condition is fixed by filling
        the arc, a violated flow condition by emptying it; the surplus and deficit this makes
        are settled by forward iterations."""
        eps = self.eps
        arcs: Iterable[_Arc]
        if self._check_all:
            self._check_all = False
            arcs = [*self._down.values(), *self._up.values()]
            self._check.clear()
            internal_r = self.p_out - self.p_in
            if self.internal < self.cap and internal_r < -eps:
                self._move_internal(self.cap - self.internal)
            elif self.internal > 0 and internal_r > eps:
                self._move_internal(-self.internal)
        else:
            arcs = self._check
            self._check = {}
        p_out, p_in = self.p_out, self.p_in
        for arc in arcs:
            if not arc.known:
                continue
            if arc.tail:
                room = arc.cap - arc.flow
                if room > 0 and arc.cost + arc.peer_price - p_out < -eps:
                    self._push(arc, room)
            else:
                flow = arc.flow
                if flow > 0 and arc.cost + p_in - arc.peer_price > eps:
                    self._return(arc, flow)
                elif flow > arc.cap:
                    self._return(arc, flow - arc.cap)  # the capacity shrank under the flow

    def _push(self, arc: _Arc, amount: int) -> None:
        arc.mine += amount
        self.s_out -= amount
        self._dirty[arc] = None

    def _return(self, arc: _Arc, amount: int) -> None:
        arc.mine += amount
        self.s_in -= amount
        self._dirty[arc] = None

    def _move_internal(self, amount: int) -> None:
        """Move `amount` from the in half to the out half (negative: back)."""
        self.internal += amount
        self.s_in -= amount
        self.s_out += amount

    def _scan(self, out_side: bool) -> tuple[list[tuple[int, str, _Arc]], int | None]:
        """The external residual arcs of one half: those admissible now, as (value, peer, arc),
        and the least value among all of them. Moving a unit along an arc is admissible when its
        value is below the half's price. Out half: downstream arcs with room, value head price
        + cost. In half: upstream arcs backwards when they carry flow, value tail price - cost.
        """
        admissible: list[tuple[int, str, _Arc]] = []
        best: int | None = None
        if out_side:
            price = self.p_out
            for arc in self._down.values():
                if arc.known and arc.mine - arc.theirs < arc.cap:
                    value = arc.cost + arc.peer_price
                    if value < price:
                        admissible.append((value, arc.peer, arc))
                    if best is None or value < best:
                        best = value
        else:
            price = self.p_in
            for arc in self._up.values():
                if arc.known and arc.theirs > arc.mine:
                    value = arc.peer_price - arc.cost
                    if value < price:
                        admissible.append((value, arc.peer, arc))
                    if best is None or value < best:
                        best = value
        return admissible, best

    def _internal_value(self, out_side: bool) -> int | None:
        """Value of the internal arc as a way out of one half, None if it has no residual."""
        if out_side:
            return self.p_in if self.internal > 0 else None
        return self.p_out if self.internal < self.cap else None

    def _forward(self, *, out_side: bool) -> bool:
        """Forward iteration at the half with surplus: move it along admissible arcs, the most
        favourable first; when none is admissible, raise the price as far as eps-CS allows.
        False when the surplus has no residual arc at all (it waits for the topology)."""
        admissible, best = self._scan(out_side)
        internal = self._internal_value(out_side)
        price = self.p_out if out_side else self.p_in
        if internal is not None and internal < price:
            # The internal arc first: moving surplus between the halves costs no message.
            surplus = self.s_out if out_side else self.s_in
            if out_side:
                self._move_internal(-min(self.internal, surplus))
            else:
                self._move_internal(min(self.cap - self.internal, surplus))
            return True
        if admissible:
            admissible.sort(key=lambda w: (w[0], w[1]))
            for _, _, arc in admissible:
                if out_side:
                    if self.s_out <= 0:
                        break
                    self._push(arc, min(arc.cap - arc.flow, self.s_out))
                else:
                    if self.s_in <= 0:
                        break
                    self._return(arc, min(arc.flow, self.s_in))
            return True
        if best is None and internal is None:
            return False
        self._relabel(out_side, best, internal)
        return True

    def _relabel(self, out_side: bool, best: int | None, internal: int | None) -> None:
        """Raise the price of the half with surplus to the highest level at which every residual
        arc out of it still satisfies eps-CS (`best` and `internal` are the values of its
        external and internal ways out), so that at least one becomes admissible.

        When its cheapest way on is through the other half, and the other half has no deficit,
        both rise together (a set relaxation: the internal arc keeps its reduced cost) until an
        external arc of either becomes admissible; one at a time, the surplus would bounce
        between them, eps per bounce. A half with a deficit never rises: its deficit is what
        the surplus must reach (and the price of a vertex in deficit staying put is what bounds
        every other price, hence what makes the algorithm terminate).
        """
        eps = self.eps
        self._relabels_here += 1
        own = None if best is None else best + eps
        via = None if internal is None else internal + eps
        price = self.p_out if out_side else self.p_in
        other_surplus = self.s_in if out_side else self.s_out
        if via is not None and (own is None or via < own) and other_surplus >= 0:
            other_price = self.p_in if out_side else self.p_out
            _, other_best = self._scan(not out_side)
            other = None if other_best is None else other_best + eps
            rises = [x - y for x, y in ((own, price), (other, other_price)) if x is not None]
            rise = min(rises) if rises else 0
            if rise > 0:
                self._set_prices(self.p_in + rise, self.p_out + rise)
                return
        target = via if own is None or (via is not None and via < own) else own
        assert target is not None and target > price, "a relabel must raise the price"
        if out_side:
            self._set_prices(self.p_in, target)
        else:
            self._set_prices(target, self.p_out)

    def _set_prices(self, p_in: int, p_out: int) -> None:
        # Tell the peers whose decisions depend on the new price. The in half tells every
        # upstream tail that has ever pushed to it (a tail chooses where to push by the heads'
        # prices; one that never pushed here learns the price when it first does, from the
        # answer); the out half tells the heads of arcs that carry flow (a head needs the tail's
        # price only to decide whether to return flow).
        if p_in != self.p_in:
            self.p_in = p_in
            for arc in self._up.values():
                if arc.theirs > 0:
                    self._dirty[arc] = None
        if p_out != self.p_out:
            self.p_out = p_out
            for arc in self._down.values():
                if arc.mine > arc.theirs:
                    self._dirty[arc] = None

    # ------------------------------------------------------------------ outputs

    def _flush(self) -> list[FlowMessage]:
        if not self._dirty:
            return []
        out = []
        for arc in self._dirty:
            out.append(
                FlowMessage(
                    self.node_id,
                    arc.peer,
                    self.epoch,
                    arc.peer_epoch,
                    arc.gen,
                    arc.tail,
                    self.p_out if arc.tail else self.p_in,
                    arc.mine,
                    arc.theirs,
                    self.eps,
                )
            )
        self._dirty.clear()
        return out

    def idle(self) -> bool:
        """No half has surplus left to move."""
        return self.s_in <= 0 and self.s_out <= 0

    def routes(self) -> dict[str, int]:
        """Current rate (flow units) to each next-stage peer with flow."""
        if self._last:
            return {}  # its out-arcs are the ring's return arcs
        return {peer: arc.flow for peer, arc in sorted(self._down.items()) if arc.flow > 0}

    def throughput(self) -> int:
        """Flow units this node carries (for the last stage: completes)."""
        return self.internal


def rescale_if_asked(machines: Iterable[FlowNode], askers: Iterable[FlowNode]) -> bool:
    """The swarm's rescale rule (`FlowNode.wants_rescale`): when one of `askers` (the machines
    a step just touched) asks, every one of `machines` rescales, at once. True when they did.
    The bus, the simulator's control plane and its relaxation routing apply it here; the node's
    phase coordinator applies it over the wire (gwtf.node.control.phases: an asker starts a
    round)."""
    if not any(node.wants_rescale() for node in askers):
        return False
    for machine in machines:
        machine.rescale()
    return True
