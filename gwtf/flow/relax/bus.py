"""A deterministic in-process message bus that runs flow state machines to quiescence.

It stands in for the network wherever the state machines run without one: `gwtf route`, the tests
and the benchmarks. Time is counted in rounds: a message sent in round `t` arrives in round
`t + d`, `d` drawn from `1..max_delay` with a seeded generator, so delivery is delayed and
reordered; with `duplicate_p > 0` some messages also arrive twice. Within a round a node gets all
its messages as one batch, in seeded random order. Same seed, same run, bit for bit.

The bus also ends the scaling phases (`FlowConfig.quiet_s` None): when no message is in flight,
the phase's work is done everywhere, and it tells every node to tighten epsilon. When a node asks
for the scaling to be re-run (`FlowNode.wants_rescale`), it widens every node's epsilon. Those
rules, and the swarm's edits (crashes, joins, links), are `gwtf.flow.relax.swarm.FlowSwarm`'s, which
the simulator's drivers share.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from gwtf.flow.relax.decentralized import FlowConfig, FlowMessage, FlowNode, LocalArc, NodeView
from gwtf.flow.relax.swarm import FlowSwarm
from gwtf.flow.solution import FlowResult, make_result
from gwtf.flow.topology import Topology

__all__ = [
    "BusStats",
    "MessageBus",
    "NotConverged",
    "flow_config",
    "node_views",
    "solve_decentralized",
]

class NotConverged(RuntimeError):
    """The swarm did not reach quiescence within the round limit."""


@dataclass(frozen=True)
class BusStats:
    messages: int
    rounds: int
    mean_delay: float = 0.0
    """Rounds one message takes on average (the bus: (1 + max_delay) / 2); 0 where a driver
    does not count in rounds."""

    @property
    def delays(self) -> float | None:
        """The rounds in message delays: what a WAN turns into seconds (one delay, a one-way
        latency), None where the driver does not count in rounds."""
        return self.rounds / self.mean_delay if self.mean_delay > 0 else None


class MessageBus(FlowSwarm):
    """Delivers `FlowMessage`s between `FlowNode`s with seeded delays, order and duplicates; the
    swarm's edits and rules are `FlowSwarm`'s."""

    def __init__(self, seed: int = 0, *, max_delay: int = 3, duplicate_p: float = 0.0) -> None:
        if max_delay < 1:
            raise ValueError("max_delay must be at least 1 round")
        if not 0.0 <= duplicate_p < 1.0:
            raise ValueError("duplicate_p must be in [0, 1)")
        super().__init__()
        # The standard library's generator: as seedable as numpy's, and far cheaper per draw,
        # which matters at a draw or two per message.
        self.rng = random.Random(seed)
        self.max_delay = max_delay
        self.duplicate_p = duplicate_p
        self.now = 0
        self._round0 = 0
        self.messages = 0
        # In-flight messages per arrival round; rounds in a heap.
        self._inbox: dict[int, list[FlowMessage]] = {}
        self._rounds: list[int] = []
        self._ticks: list[tuple[float, str]] = []
        self._tick_at: dict[str, float] = {}  # the one live heap entry per node

    def clock(self) -> float:
        return float(self.now)

    def reset_counts(self) -> None:
        """Start counting messages and rounds afresh (to measure a warm restart alone)."""
        self.messages = 0
        self.rescales = 0
        self._round0 = self.now

    def send(self, msgs: Iterable[FlowMessage]) -> None:
        rand = self.rng.random
        spread = self.max_delay
        dup = self.duplicate_p
        for msg in msgs:
            copies = 2 if dup and rand() < dup else 1
            for _ in range(copies):
                at = self.now + 1 + int(rand() * spread)
                batch = self._inbox.get(at)
                if batch is None:
                    self._inbox[at] = batch = []
                    heapq.heappush(self._rounds, at)
                batch.append(msg)

    def schedule_tick(self, node: FlowNode) -> None:
        at = node.next_tick()
        if at is not None and self._tick_at.get(node.node_id) != at:
            self._tick_at[node.node_id] = at
            heapq.heappush(self._ticks, (at, node.node_id))

    def _next_time(self) -> float | None:
        times = []
        if self._rounds:
            times.append(float(self._rounds[0]))
        while self._ticks:
            at, node_id = self._ticks[0]
            if self._tick_at.get(node_id) != at or node_id not in self.nodes:
                heapq.heappop(self._ticks)  # superseded by a later schedule
                continue
            times.append(at)
            break
        return min(times) if times else None

    def run(self, max_rounds: int = 1_000_000) -> BusStats:
        """Deliver and tick until no message is in flight and no node has work left; when
        nothing is in flight, the phase ends everywhere (`FlowSwarm.tighten`)."""
        while True:
            nxt = self._next_time()
            if nxt is None:
                if not self.tighten():
                    return BusStats(
                        self.messages, self.now - self._round0, (1 + self.max_delay) / 2
                    )
                continue
            self.now = max(self.now, math.ceil(nxt))
            if self.now - self._round0 > max_rounds:
                raise NotConverged(f"no quiescence after {max_rounds} rounds")
            batches: dict[str, list[FlowMessage]] = {}
            if self._rounds and self._rounds[0] <= self.now:
                heapq.heappop(self._rounds)
                arrived = self._inbox.pop(self.now)
                self.messages += len(arrived)
                for msg in arrived:
                    batch = batches.get(msg.receiver)
                    if batch is None:
                        batches[msg.receiver] = batch = []
                    batch.append(msg)
            touched = set()
            receivers = sorted(batches)
            self.rng.shuffle(receivers)
            for receiver in receivers:
                node = self.nodes.get(receiver)
                if node is None:
                    continue  # sent to a node that has gone
                batch = batches[receiver]
                if len(batch) > 1:
                    self.rng.shuffle(batch)
                self.send(node.on_messages(batch))
                touched.add(receiver)
            while self._ticks and self._ticks[0][0] <= self.now:
                at, node_id = heapq.heappop(self._ticks)
                node = self.nodes.get(node_id)
                if node is not None and self._tick_at.get(node_id) == at:
                    del self._tick_at[node_id]
                    self.send(node.on_tick(float(self.now)))
                    touched.add(node_id)
            askers = [self.nodes[n] for n in touched if n in self.nodes]
            for node in askers:
                self.schedule_tick(node)
            self.rescale_if_asked(*askers)


def node_views(topology: Topology) -> dict[str, NodeView]:
    """What each node of `topology` knows about itself when it starts: its pipeline arcs, and
    for data holders and last-stage nodes the ring's return arcs between them."""
    holders = topology.stage_nodes(0)
    last = topology.stage_nodes(topology.num_stages - 1)
    caps = {node.id: node.cap_units for node in topology.nodes}
    views = {}
    for node in topology.nodes:
        upstream = [LocalArc(a.src, a.cap_units, a.cost_units) for a in topology.in_arcs(node.id)]
        downstream = [
            LocalArc(a.dst, a.cap_units, a.cost_units) for a in topology.out_arcs(node.id)
        ]
        if node.stage == 0:
            upstream = [LocalArc(z, min(caps[z], node.cap_units), 0) for z in last]
        if node.stage == topology.num_stages - 1:
            downstream = [LocalArc(h, min(caps[h], node.cap_units), 0) for h in holders]
        views[node.id] = NodeView(
            node_id=node.id,
            stage=node.stage,
            num_stages=topology.num_stages,
            capacity=node.cap_units,
            upstream=tuple(upstream),
            downstream=tuple(downstream),
        )
    return views


COST_HEADROOM = 2
"""`flow_config` sizes the swarm for arcs up to this many times the costliest arc it starts with,
so that joiners on slower machines or links are routed by their true costs."""


def flow_config(topology: Topology, *, quiet_s: float | None = None) -> FlowConfig:
    """The swarm-wide parameters for `topology`. `quiet_s` None: the driver ends the scaling
    phases (see `FlowConfig.quiet_s`); a number: each node tightens after that long (clock units)
    with nothing to do, a few message delays."""
    costs = [a.cost_units for a in topology.arcs] or [1]
    return FlowConfig.for_costs(
        topology.num_stages, COST_HEADROOM * max(costs), min(costs), quiet_s=quiet_s
    )


def config_for(topology: Topology, bus: MessageBus | None = None) -> FlowConfig:
    return flow_config(topology)


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
