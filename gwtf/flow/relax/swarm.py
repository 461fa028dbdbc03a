"""FlowSwarm: every flow state machine of a swarm, and the swarm-wide rules of driving them.

A driver that holds every machine (docs/design.md 2.7) moves messages between them and decides,
from what it sees of the whole swarm, what the algorithm leaves to drivers. Those decisions are
written here once, for all such drivers:

    MessageBus      (gwtf.flow.relax.bus)            messages delayed by whole rounds
    ControlPlane    (gwtf.sim.routing.control)         messages delayed by simulated WAN links
    RelaxRouting    (gwtf.sim.routing.relaxrouting)    the same inside the full simulation

- *Membership.* A crash (`remove`) drops the arcs to the dead machine at its peers; a joiner
  (`join`) starts warm with its peers' current incarnations, and its peers add the mirrored
  arcs. Either is a change every machine sees (`note_change`), as the node's membership tells
  every member.
- *Links.* An arc that appears (`link`), is cut (`cut`) or is re-measured (`update`,
  `recreate`, `link_changed`) gets a new generation, so that messages of an earlier arc between
  the same two machines still in flight are not counted on it; a re-measured arc is updated in
  place (`FlowNode.update_arc`: its flow stays where the new numbers allow it) unless the swarm
  measures the old way (`in_place` False: re-created empty).
- *Rescales.* When one machine asks for the scaling to be run again, every machine rescales at
  once (`rescale_if_asked`, gwtf.flow.relax.decentralized).
- *Phase ends.* When nothing is in flight, every machine not yet at the final epsilon tightens
  (`tighten`). A driver on a clock learns that a while after the fact, as a real swarm does:
  `PhaseClock` ends the phase `after` seconds past the moment nothing was in flight, unless
  anything happened meanwhile (the bus, in rounds, ends it at once).

Transport and time are the driver's: `send` puts messages on their way, `schedule_tick` arranges
a machine's next timer, `clock` is the time machines are built with. The node holds one machine
and learns of the swarm over the wire (gwtf.node.control.driver, gwtf.node.control.phases), so it
applies the same rules as messages, not calls. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gwtf.flow.relax.decentralized import (
    FlowConfig,
    FlowMessage,
    FlowNode,
    LocalArc,
    NodeView,
    rescale_if_asked,
)
from gwtf.flow.topology import Topology

__all__ = ["FlowSwarm", "PhaseClock", "peer_edits", "with_epochs"]


def with_epochs(view: NodeView, epochs: Mapping[str, int]) -> NodeView:
    """`view` with each arc leading to its peer's current incarnation (from `epochs`): what a
    joiner must know, or its messages to peers that restarted since would be ignored."""

    def current(arcs: tuple[LocalArc, ...]) -> tuple[LocalArc, ...]:
        return tuple(replace(a, epoch=epochs.get(a.peer, a.epoch)) for a in arcs)

    return replace(view, upstream=current(view.upstream), downstream=current(view.downstream))


def peer_edits(view: NodeView) -> list[tuple[str, LocalArc, bool]]:
    """What the peers of a joining node must add, as `(peer_id, arc, peer_sees_upstream)`:
    a peer upstream of the joiner sees the new arc as downstream, and the other way round."""
    edits = []
    for arcs, peer_sees_upstream in ((view.upstream, False), (view.downstream, True)):
        for arc in arcs:
            mirrored = LocalArc(view.node_id, arc.cap, arc.cost, arc.gen)  # epoch: the caller's
            edits.append((arc.peer, mirrored, peer_sees_upstream))
    return edits


class PhaseClock:
    """When a scaling phase ends, for a driver with a clock (docs/design.md 2.7): `after`
    seconds past the last moment nothing was in flight, if nothing happened since.

    The driver counts the messages on their way in `in_flight` and bumps `activity` at every
    delivery and change, and calls `quiet` after each; the clock asks the driver for a timer
    (`schedule(at)`) when one is due, one pending at a time (each quiet moment moves it later).
    When a timer fires the driver calls `fire`: True ends the phase (the driver tightens every
    machine, then calls `quiet` again).
    """

    def __init__(self, after: float, schedule: Callable[[float], None]) -> None:
        self.after = after
        self.in_flight = 0
        self.activity = 0
        self._schedule = schedule
        self._at: float | None = None
        self._stamp = 0

    def quiet(self, now: float, settled: bool) -> None:
        """Set the timer if nothing is in flight now. `settled`: every machine is at the final
        epsilon already (no phase left to end)."""
        if self.in_flight or settled:
            return
        at = now + self.after
        if self._at is not None and self._at >= at:
            return
        self._at, self._stamp = at, self.activity
        self._schedule(at)

    def fire(self, at: float, settled: bool) -> bool:
        """The timer set for `at` fired (now is `at`): does the phase end? A timer overtaken by
        activity with no quiet moment after it (a change that sent nothing) is set again."""
        if self._at != at:
            return False  # superseded by a later quiet moment
        self._at = None
        if self.in_flight or self._stamp != self.activity:
            self.quiet(at, settled)
            return False
        return True


class FlowSwarm:
    """The machines of one swarm by id, and the rules of the module docstring."""

    in_place = True
    """Re-measured arcs are updated in place (False: re-created empty, to measure the
    difference)."""

    def __init__(self) -> None:
        self.nodes: dict[str, FlowNode] = {}
        self.rescales = 0
        self._gen = 0

    # ------------------------------------------------------------------ the driver's part

    def send(self, msgs: Iterable[FlowMessage]) -> None:
        raise NotImplementedError

    def schedule_tick(self, node: FlowNode) -> None:
        """Arrange `node`'s next timer (`FlowNode.next_tick`); none by default."""

    def clock(self) -> float:
        raise NotImplementedError

    # ------------------------------------------------------------------ membership

    def note_change(self) -> None:
        """The swarm changed: every machine may ask for a rescale again."""
        for node in self.nodes.values():
            node.note_change()

    def add(self, node: FlowNode, *, start: bool = True) -> None:
        self.nodes[node.node_id] = node
        if start:
            self.send(node.start())
        self.schedule_tick(node)

    def remove(self, node_id: str) -> FlowNode | None:
        """`node_id` vanishes (a crash or a leave): its peers drop their arcs to it at once.
        Returns its machine (None if it had none)."""
        node = self.nodes.pop(node_id, None)
        if node is None:
            return None
        self.note_change()
        for peer in node.peers():
            other = self.nodes.get(peer)
            if other is not None:
                self.send(other.remove_peer(node_id))
                self.schedule_tick(other)
        return node

    def join(
        self, view: NodeView, config: FlowConfig | None = None, *, epoch: int = 0,
        epochs: Mapping[str, int] | None = None,
    ) -> FlowNode:
        """A node joins the running swarm (warm); its peers learn of the new arcs at once, as a
        membership service would tell them. `config` defaults to the swarm's: every node must
        use the same one (it is not recomputed from the grown topology). `epochs`: the peers'
        incarnations where the driver knows them (default: those of the machines present)."""
        config = config or next(iter(self.nodes.values())).config
        known = {node_id: node.epoch for node_id, node in self.nodes.items()}
        view = with_epochs(view, {**known, **(epochs or {})})
        self.note_change()
        node = FlowNode(view, config, self.clock, epoch=epoch, warm=True)
        self.nodes[view.node_id] = node
        for peer_id, arc, peer_sees_upstream in peer_edits(view):
            peer = self.nodes.get(peer_id)
            if peer is not None and peer is not node:
                self.send(peer.add_peer(arc, upstream=peer_sees_upstream, peer_epoch=epoch))
                self.schedule_tick(peer)
        self.send(node.start())
        self.schedule_tick(node)
        return node

    # ------------------------------------------------------------------ links

    def cut(self, src: str, dst: str) -> None:
        """The arc `src -> dst` fails (both ends notice at once)."""
        self.note_change()
        for node_id, peer, upstream in ((src, dst, False), (dst, src, True)):
            node = self.nodes.get(node_id)
            if node is not None:
                self.send(node.remove_arc(peer, upstream=upstream))

    def link(self, src: str, dst: str, cap: int, cost: int) -> None:
        """The arc `src -> dst` appears (or comes back), with capacity and cost in units; it
        gets a new generation."""
        self._gen += 1
        self.note_change()
        for node_id, peer, upstream in ((src, dst, False), (dst, src, True)):
            node = self.nodes.get(node_id)
            if node is not None:
                epoch = self.nodes[peer].epoch if peer in self.nodes else 0
                arc = LocalArc(peer, cap, cost, self._gen)
                self.send(node.add_peer(arc, upstream=upstream, peer_epoch=epoch))

    def update(self, src: str, dst: str, cap: int, cost: int) -> None:
        """The arc `src -> dst` gets new parameters (a re-measured link), seen by every
        machine: both ends update it in place (`in_place`), as a new generation that keeps its
        flow; nothing when either end is gone."""
        self._gen += 1
        self.note_change()
        if src in self.nodes and dst in self.nodes:
            self._renew(self.nodes[src], self.nodes[dst], cap, cost)

    def recreate(self, src: str, dst: str, cap: int, cost: int) -> None:
        """The tail of `src -> dst` re-measured it: the arc gets new parameters at both ends, as
        a new generation; only the two ends see the change (as in the node)."""
        self._gen += 1
        tail, head = self.nodes[src], self.nodes[dst]
        self._renew(tail, head, cap, cost)
        self.rescale_if_asked(tail, head)

    def link_changed(self, topology: Topology, loc_a: str, loc_b: str) -> None:
        """The link between two locations changed (`topology` has it already): every arc over
        it between machines of consecutive stages gets its new parameters as a new generation,
        or goes where the topology no longer has it; every machine sees the change."""
        self.note_change()
        self._gen += 1
        pair = {loc_a, loc_b}
        present = [n for n in topology.nodes if n.id in self.nodes]
        for u in present:
            for v in present:
                if v.stage != u.stage + 1 or {u.location, v.location} != pair:
                    continue
                tail, head = self.nodes[u.id], self.nodes[v.id]
                if topology.has_arc(u.id, v.id):
                    spec = topology.arc(u.id, v.id)
                    self._renew(tail, head, spec.cap_units, spec.cost_units)
                else:
                    self.send(tail.remove_arc(head.node_id, upstream=False))
                    self.send(head.remove_arc(tail.node_id, upstream=True))
                self.schedule_tick(tail)
                self.schedule_tick(head)
                self.rescale_if_asked(tail, head)

    def _renew(self, tail: FlowNode, head: FlowNode, cap: int, cost: int) -> None:
        """Arc `tail -> head` as generation `self._gen` with new numbers, at both ends."""
        for node, peer, upstream in ((tail, head, False), (head, tail, True)):
            arc = LocalArc(peer.node_id, cap, cost, self._gen, peer.epoch)
            if self.in_place:
                self.send(node.update_arc(arc, upstream=upstream))
            else:
                self.send(node.add_peer(arc, upstream=upstream, peer_epoch=arc.epoch))

    # ------------------------------------------------------------------ rescales, phases

    def rescale_if_asked(self, *nodes: FlowNode) -> bool:
        """One of `nodes` asks for the scaling again: every machine rescales (counted)."""
        if rescale_if_asked(self.nodes.values(), nodes):
            self.rescales += 1
            return True
        return False

    def tighten(self) -> bool:
        """A phase ends (nothing is in flight): every machine not at the final epsilon
        tightens, in id order. False when all are there (quiescent for good)."""
        pending = [n for n in sorted(self.nodes) if not self.nodes[n].final]
        for node_id in pending:
            self.send(self.nodes[node_id].tighten())
        return bool(pending)

    def flows(self) -> dict[tuple[str, str], int]:
        """Arc flows as their tails see them (exact once the swarm is quiescent)."""
        out: dict[tuple[str, str], int] = {}
        for node_id in sorted(self.nodes):
            for peer, flow in self.nodes[node_id].routes().items():
                out[(node_id, peer)] = flow
        return out
