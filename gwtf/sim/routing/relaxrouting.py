"""The gwtf policies' routing by the relaxation (`routing = "relax"`, `gwtf node --routing relax`).

The real decentralized flow state machines of `gwtf.flow` (`FlowNode`) run inside the
simulation; every control message takes the simulated link delay (times `1 + jitter * U(0, 1)`),
so routing after a change takes the time it really takes. A node handles its inbox in batches
(`control_batch_s`); scaling phases end swarm-wide `phase_end_s` after no message is in flight
(`PhaseClock`, as in `ControlPlane`); a machine that asks for a rescale rescales every machine.
A crash, a join and a link change touch every machine (`note_change`), a link change updates its
arcs in place as a new generation. Those rules and edits are `gwtf.flow.relax.swarm.FlowSwarm`'s, as
for the bus and the control plane; this module is their transport over the simulated links and
clock.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gwtf.flow.relax.bus import COST_HEADROOM, node_views
from gwtf.flow.relax.decentralized import FlowConfig, FlowMessage, FlowNode
from gwtf.flow.relax.swarm import FlowSwarm, PhaseClock, with_epochs
from gwtf.flow.topology import LinkSpec, NodeSpec
from gwtf.sim.compression import flow_topology
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.simulator import Simulation

__all__ = ["RelaxRouting"]


class _Machines(FlowSwarm):
    """The swarm's machines, their messages and timers handed to the simulation."""

    def __init__(self, routing: RelaxRouting) -> None:
        super().__init__()
        self.routing = routing

    def send(self, msgs: Iterable[FlowMessage]) -> None:
        self.routing.send(list(msgs))

    def schedule_tick(self, node: FlowNode) -> None:
        self.routing.tick(node)

    def clock(self) -> float:
        return self.routing.sim.engine.now

    def note_change(self) -> None:
        super().note_change()
        self.routing.phase.activity += 1


class RelaxRouting:
    """The flow machines of one simulation, and their messages on the simulated links."""

    def __init__(self, sim: Simulation, *, placement: bool) -> None:
        self.sim = sim
        self.sink = sim.sink
        self.swarm = _Machines(self)
        self.flow = self.swarm.nodes  # the machines by id: the swarm's own dict, not a copy
        self.tick_at: dict[str, float] = {}
        self.inbox: dict[str, tuple[float, list[FlowMessage]]] = {}
        self.batch_s = sim.sc.control_batch_s
        self.jitter = sim.sc.control_jitter
        self.rng = np.random.default_rng([sim.seed, 11])
        self.config = self._config(placement)
        # Scaling phases end swarm-wide: once no control message is in flight, and after the
        # time a real swarm takes to learn it (`phase_end_s`), every machine tightens epsilon.
        self.phase = PhaseClock(sim.sc.phase_end_s, self._timer)

    def _config(self, placement: bool) -> FlowConfig:
        """One config for the whole run, from every node the scenario will ever have and the
        worst version of every link, so that `M` stays above any path cost."""
        sc = self.sim.sc
        links: dict[frozenset[str], LinkSpec] = dict(sc.links)
        for event in sc.events:
            if event.kind == "link":
                assert event.rtt_ms is not None and event.bandwidth_gbps is not None
                key = frozenset(event.link_pair)
                old = links.get(key)
                if old is None:
                    links[key] = LinkSpec(event.rtt_ms, event.bandwidth_gbps)
                else:
                    links[key] = LinkSpec(max(old.rtt_ms, event.rtt_ms),
                                          min(old.bandwidth_gbps, event.bandwidth_gbps))
        # Joiners of every stage are included. With placement a machine may hold any stage:
        # its slowest and its fastest stage bound the costs of its arcs.
        costs: list[int] = []
        for pick in (max, min):
            nodes = [
                NodeSpec.make(i.id, i.stage, pick(
                    sc.compute_s(i, s) for s in (range(sc.stages) if placement else [i.stage])
                ), i.location)
                for i in sc.nodes.values()
            ]
            universe = flow_topology(sc, nodes, links)
            costs += [a.cost_units for a in universe.arcs]
        costs = costs or [1]
        return FlowConfig.for_costs(sc.stages, COST_HEADROOM * max(costs), min(costs))

    # -- the bus
    def send(self, msgs: list[FlowMessage]) -> None:
        sim = self.sim
        nodes = sim.nodes
        size = sim.sc.message_bytes
        now = sim.engine.now
        for msg in msgs:
            a = nodes.get(msg.sender)
            b = nodes.get(msg.receiver)
            if a is None or b is None:
                continue
            sim.control_messages += 1
            self.phase.in_flight += 1
            # Real links jitter; without it equal delays make the machines run in lockstep,
            # and a synchronous epsilon-relaxation can cycle (seen on one-region swarms).
            at = now + sim.one_way(a, b, size) * (1.0 + self.jitter * float(self.rng.random()))
            # A node handles its inbox in batches: messages landing within `batch_s` of the
            # first one waiting are handed over together (one `on_messages` call).
            inbox = self.inbox.get(msg.receiver)
            if inbox is not None and inbox[0] <= at <= inbox[0] + self.batch_s:
                inbox[1].append(msg)
                continue
            if inbox is not None and at < inbox[0]:
                # An earlier arrival than the pending batch: deliver it on its own.
                sim.sink.emit(at, Kind.CONTROL, self._deliver, (msg.receiver, [msg], None))
                continue
            batch: list[FlowMessage] = [msg]
            entry = (at, batch)
            if inbox is None or at > inbox[0] + self.batch_s:
                self.inbox[msg.receiver] = entry
            sim.sink.emit(at + self.batch_s, Kind.CONTROL, self._deliver,
                                (msg.receiver, batch, entry))

    @returns_events
    def _deliver(self, payload: tuple[str, list[FlowMessage], object]) -> None:
        receiver, batch, entry = payload
        if entry is not None and self.inbox.get(receiver) is entry:
            del self.inbox[receiver]
        self.phase.in_flight -= len(batch)
        self.phase.activity += 1
        node = self.flow.get(receiver)
        if node is not None:
            self.send(node.on_messages(batch))
            self.tick(node)
            self.swarm.rescale_if_asked(node)
        self._maybe_end_phase()

    def _settled(self) -> bool:
        return all(m.final for m in self.flow.values())

    def _maybe_end_phase(self) -> None:
        self.phase.quiet(self.sim.engine.now, self._settled())

    def _timer(self, at: float) -> None:
        self.sim.sink.emit(at, Kind.TICK, self._end_phase, at)

    @returns_events
    def _end_phase(self, at: float) -> None:
        if not self.phase.fire(at, self._settled()):
            return
        self.phase.activity += 1
        self.swarm.tighten()
        self._maybe_end_phase()

    def tick(self, node: FlowNode) -> None:
        at = node.next_tick()
        if at is not None and self.tick_at.get(node.node_id) != at:
            self.tick_at[node.node_id] = at
            self.sim.sink.emit(at, Kind.TICK, self._on_tick, (node, at))

    @returns_events
    def _on_tick(self, payload: tuple[FlowNode, float]) -> None:
        node, at = payload
        if self.flow.get(node.node_id) is not node or self.tick_at.get(node.node_id) != at:
            return
        del self.tick_at[node.node_id]
        now = self.sim.engine.now
        self.send(node.on_tick(now))
        following = node.next_tick()
        if following is not None and following <= now:
            # Not idle yet (waiting for answers): the next message it gets reschedules it.
            return
        self.tick(node)

    # -- the router (GwtfPolicy's questions)
    def routes(self, node: SimNode) -> dict[str, int]:
        machine = self.flow.get(node.id)
        return machine.routes() if machine is not None else {}

    def start(self) -> None:
        topo = self.sim.topology()
        if topo is None:
            return
        views = node_views(topo)
        clock = self.sim.engine.clock
        epochs = {node_id: self.sim.incarnation(node_id) for node_id in views}
        for node_id in sorted(views):
            view = with_epochs(views[node_id], epochs)
            self.flow[node_id] = FlowNode(view, self.config, clock, epoch=epochs[node_id])
        for node_id in sorted(views):
            self.send(self.flow[node_id].start())
            self.tick(self.flow[node_id])
        self._maybe_end_phase()

    def retire(self, node: SimNode, *, left: bool) -> None:
        """The node's flow machine goes; its peers drop their arcs to it (a leave and a crash
        alike: the peers learn it as the membership does)."""
        self.tick_at.pop(node.id, None)
        if self.swarm.remove(node.id) is not None:
            self._maybe_end_phase()

    def activated(self, node: SimNode) -> None:
        topo = self.sim.topology()
        if topo is None:
            return
        views = node_views(topo)
        # Usually just the joiner; after a stage was empty, every node that waited for it.
        epochs = {node_id: self.sim.incarnation(node_id) for node_id in views}
        for node_id in sorted(views):
            if node_id not in self.flow:
                self.swarm.join(views[node_id], self.config, epoch=epochs[node_id],
                                epochs=epochs)
        self._maybe_end_phase()

    def record_changed(self, node: SimNode) -> None:
        """Not seen: the relaxation's arcs keep the capacities they were built with, as the
        node's `--routing relax` does (docs/design.md 2.13)."""

    def link_changed(self, loc_a: str, loc_b: str) -> None:
        """The arcs over the link get the new capacity and cost at both ends, as a new
        generation updated in place (`FlowNode.update_arc`: the flow stays where the new numbers
        allow it), or vanish with the link (`FlowSwarm.link_changed`)."""
        topo = self.sim.topology()
        if topo is None:
            return
        self.swarm.link_changed(topo, loc_a, loc_b)
        self._maybe_end_phase()
