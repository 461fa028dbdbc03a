"""A deterministic in-process message bus that runs flow state machines to quiescence.

It stands in for the network wherever the state machines run without one: `gwtf route`, the tests,
the benchmarks and the simulator. Time is counted in rounds: a message sent in round `t` arrives
in round `t + d`, `d` drawn from `1..max_delay` with a seeded generator, so delivery is delayed and
reordered; with `duplicate_p > 0` some messages also arrive twice. Within a round a node gets all
its messages as one batch, in seeded random order. Same seed, same run, bit for bit.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gwtf.flow.decentralized import FlowConfig, FlowMessage, FlowNode, LocalArc, NodeView
from gwtf.flow.solution import FlowResult, make_result
from gwtf.flow.topology import Topology

__all__ = [
    "BusStats",
    "MessageBus",
    "NotConverged",
    "flow_config",
    "node_views",
    "peer_edits",
    "solve_decentralized",
]


class NotConverged(RuntimeError):
    """The swarm did not reach quiescence within the round limit."""


@dataclass(frozen=True)
class BusStats:
    messages: int
    rounds: int


class MessageBus:
    """Delivers `FlowMessage`s between `FlowNode`s with seeded delays, order and duplicates."""

    def __init__(self, seed: int = 0, *, max_delay: int = 3, duplicate_p: float = 0.0) -> None:
        if max_delay < 1:
            raise ValueError("max_delay must be at least 1 round")
        self.rng = np.random.default_rng(seed)
        self.max_delay = max_delay
        self.duplicate_p = duplicate_p
        self.now = 0
        self._round0 = 0
        self.nodes: dict[str, FlowNode] = {}
        self.messages = 0
        self._queue: list[tuple[int, int, FlowMessage]] = []
        self._seq = 0
        self._ticks: list[tuple[float, str]] = []
        self._tick_at: dict[str, float] = {}  # the one live heap entry per node

    def clock(self) -> float:
        return float(self.now)

    @property
    def quiet_rounds(self) -> float:
        """A quiet period long enough for a request and its answer to cross any arc twice."""
        return float(4 * self.max_delay + 1)

    def add(self, node: FlowNode, *, start: bool = True) -> None:
        self.nodes[node.node_id] = node
        if start:
            self.send(node.start())
        self._schedule_tick(node)

    def remove(self, node_id: str) -> None:
        """`node_id` vanishes (a crash): its peers drop their arcs to it at once."""
        node = self.nodes.pop(node_id)
        for peer in node.peers():
            other = self.nodes.get(peer)
            if other is not None:
                self.send(other.remove_peer(node_id))
                self._schedule_tick(other)

    def join(self, view: NodeView, config: FlowConfig, *, epoch: int = 0) -> None:
        """A node joins a running swarm (warm: it starts at the final epsilon); its peers learn
        of the new arcs at once, as a membership service would tell them."""
        node = FlowNode(view, config, self.clock, epoch=epoch, warm=True)
        self.nodes[view.node_id] = node
        for peer_id, arc, peer_sees_upstream in peer_edits(view):
            peer = self.nodes.get(peer_id)
            if peer is not None:
                self.send(peer.add_peer(arc, upstream=peer_sees_upstream, peer_epoch=epoch))
                self._schedule_tick(peer)
        self.send(node.start())
        self._schedule_tick(node)

    def reset_counts(self) -> None:
        """Start counting messages and rounds afresh (to measure a warm restart alone)."""
        self.messages = 0
        self._round0 = self.now

    def send(self, msgs: Iterable[FlowMessage]) -> None:
        for msg in msgs:
            copies = 2 if self.duplicate_p > 0 and self.rng.random() < self.duplicate_p else 1
            for _ in range(copies):
                delay = int(self.rng.integers(1, self.max_delay + 1))
                self._seq += 1
                heapq.heappush(self._queue, (self.now + delay, self._seq, msg))

    def _schedule_tick(self, node: FlowNode) -> None:
        at = node.next_tick()
        if at is not None and self._tick_at.get(node.node_id) != at:
            self._tick_at[node.node_id] = at
            heapq.heappush(self._ticks, (at, node.node_id))

    def _next_time(self) -> float | None:
        times = []
        if self._queue:
            times.append(float(self._queue[0][0]))
        while self._ticks:
            at, node_id = self._ticks[0]
            if self._tick_at.get(node_id) != at or node_id not in self.nodes:
                heapq.heappop(self._ticks)  # superseded by a later schedule
                continue
            times.append(at)
            break
        return min(times) if times else None

    def run(self, max_rounds: int = 1_000_000) -> BusStats:
        """Deliver and tick until no message is in flight and no node has work left."""
        while True:
            nxt = self._next_time()
            if nxt is None:
                return BusStats(self.messages, self.now - self._round0)
            self.now = max(self.now, int(np.ceil(nxt)))
            if self.now - self._round0 > max_rounds:
                raise NotConverged(f"no quiescence after {max_rounds} rounds")
            batches: dict[str, list[FlowMessage]] = defaultdict(list)
            while self._queue and self._queue[0][0] <= self.now:
                _, _, msg = heapq.heappop(self._queue)
                batches[msg.receiver].append(msg)
            touched = set()
            receivers = sorted(batches)
            for idx in self.rng.permutation(len(receivers)):
                receiver = receivers[int(idx)]
                batch = batches[receiver]
                self.messages += len(batch)
                node = self.nodes.get(receiver)
                if node is None:
                    continue  # sent to a node that has gone
                order = self.rng.permutation(len(batch))
                self.send(node.on_messages([batch[int(i)] for i in order]))
                touched.add(receiver)
            while self._ticks and self._ticks[0][0] <= self.now:
                at, node_id = heapq.heappop(self._ticks)
                node = self.nodes.get(node_id)
                if node is not None and self._tick_at.get(node_id) == at:
                    del self._tick_at[node_id]
                    self.send(node.on_tick(float(self.now)))
                    touched.add(node_id)
            for node_id in touched:
                node = self.nodes.get(node_id)
                if node is not None:
                    self._schedule_tick(node)

    def flows(self) -> dict[tuple[str, str], int]:
        """Arc flows as their tails see them (exact once the bus is quiescent)."""
        out: dict[tuple[str, str], int] = {}
        for node_id in sorted(self.nodes):
            for peer, flow in self.nodes[node_id].routes().items():
                out[(node_id, peer)] = flow
        return out


def node_views(topology: Topology) -> dict[str, NodeView]:
    """What each node of `topology` knows about itself when it starts."""
    views = {}
    for node in topology.nodes:
        views[node.id] = NodeView(
            node_id=node.id,
            stage=node.stage,
            num_stages=topology.num_stages,
            capacity=node.cap_units,
            upstream=tuple(
                LocalArc(a.src, a.cap_units, a.cost_units) for a in topology.in_arcs(node.id)
            ),
            downstream=tuple(
                LocalArc(a.dst, a.cap_units, a.cost_units) for a in topology.out_arcs(node.id)
            ),
        )
    return views


def peer_edits(view: NodeView) -> list[tuple[str, LocalArc, bool]]:
    """What the peers of a joining node must add, as `(peer_id, arc, peer_sees_upstream)`:
    a peer upstream of the joiner sees the new arc as downstream, and the other way round."""
    edits = []
    for arcs, peer_sees_upstream in ((view.upstream, False), (view.downstream, True)):
        for arc in arcs:
            edits.append((arc.peer, LocalArc(view.node_id, arc.cap, arc.cost), peer_sees_upstream))
    return edits


def flow_config(topology: Topology, *, quiet_s: float) -> FlowConfig:
    """The swarm-wide parameters for `topology`; `quiet_s` is how long (clock units) a node waits
    with nothing to do before it tightens epsilon: a few message delays."""
    costs = [a.cost_units for a in topology.arcs] or [1]
    return FlowConfig.for_costs(
        topology.num_stages, max(costs), max(1, min(costs)), quiet_s=quiet_s
    )


def config_for(topology: Topology, bus: MessageBus) -> FlowConfig:
    return flow_config(topology, quiet_s=bus.quiet_rounds)


def solve_decentralized(
    topology: Topology,
    *,
    seed: int = 0,
    max_delay: int = 3,
    duplicate_p: float = 0.0,
    max_rounds: int = 1_000_000,
) -> tuple[FlowResult, MessageBus]:
    """Run one state machine per node of `topology` on a fresh bus until quiescence."""
    bus = MessageBus(seed, max_delay=max_delay, duplicate_p=duplicate_p)
    config = config_for(topology, bus)
    views = node_views(topology)
    for node_id in sorted(views):
        bus.add(FlowNode(views[node_id], config, bus.clock), start=False)
    for node_id in sorted(views):
        bus.send(bus.nodes[node_id].start())
    stats = bus.run(max_rounds)
    return make_result(topology, bus.flows(), stats.messages, stats.rounds), bus

