"""FlowDriver: one node's flow state machine and everything it has to send (pure, no I/O).

It wraps a `FlowNode` and owns what the algorithm leaves to its driver:

- *Arcs and their parameters.* This node is the tail of its arcs to the next stage (and, on the
  last stage, of the ring's return arcs to the data holders). The tail creates each arc from its
  own measurements (`own_arc`) and announces its generation, capacity and cost to the head
  (`ArcAnnounce`), which creates its end with the same numbers (`accept_arc`). A new generation
  replaces the arc at both ends.
- *Outboxes, one per peer, latest state per arc.* The state machine sends cumulative counters
  and rising prices, so the latest message on an arc supersedes every earlier one: the outbox
  keeps one message per (peer, direction). Up to `max_inflight` `Exchange` calls per peer may be
  in flight (pipelining: a state need not wait for the previous call's reply, which on a WAN link
  would add up to a round trip to every hop of the algorithm); beyond that, new states coalesce
  in the outbox, which turns a price war into a few calls.
- *Retransmission.* A unary call returns only after the receiver has merged the batch, so its
  reply is the acknowledgement. A failed call puts back the states it carried unless a newer
  state of the same arc was sent after it (that one is retransmitted if it fails in turn), and
  the node retries with backoff until a call succeeds or the peer is declared dead. A batch whose
  arc announcement was refused (the head did not know the tail yet) is sent again whole.
- *Phases.* The round (rescales) and phase (tightens) this node is in, commands from the
  coordinator, and the quiet/activity report of `gwtf.node.control.phases`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gwtf.flow.relax.decentralized import FlowConfig, FlowMessage, FlowNode, LocalArc, NodeView
from gwtf.node.control.links import ArcParamsSpec
from gwtf.node.control.phases import PhaseReportData

__all__ = ["ArcAnnounce", "FlowDriver", "OwnedArc", "Outgoing"]


@dataclass(frozen=True, slots=True)
class ArcAnnounce:
    """The tail's announcement of arc `tail -> head` (wire: ArcParams)."""

    tail: str
    head: str
    tail_epoch: int
    head_epoch: int
    gen: int
    cap: int
    cost: int


@dataclass(frozen=True, slots=True)
class OwnedArc:
    """An arc this node is the tail of, as announced."""

    peer: str
    peer_epoch: int
    gen: int
    params: ArcParamsSpec
    ring: bool


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One `Exchange` call's content: announcements first, then arc states."""

    peer: str
    arcs: tuple[ArcAnnounce, ...]
    messages: tuple[FlowMessage, ...]
    seq: int = 0
    """Order of the call among this node's calls (newer states have larger ones)."""


class FlowDriver:
    """The flow side of one node incarnation."""

    def __init__(
        self,
        node_id: str,
        stage: int,
        num_stages: int,
        capacity_units: int,
        config: FlowConfig,
        clock: Callable[[], float],
        *,
        epoch: int,
        warm: bool,
        round_: int = 0,
        tightens: int = 0,
        max_inflight: int = 4,
    ) -> None:
        self.node_id = node_id
        self.max_inflight = max_inflight
        self.stage = stage
        self.num_stages = num_stages
        self.epoch = epoch
        self.config = config
        self._clock = clock
        view = NodeView(node_id, stage, num_stages, capacity_units)
        self.node = FlowNode(view, config, clock, epoch=epoch, warm=warm)
        for _ in range(tightens):
            self.node.tighten()  # a joiner catching up with the swarm's phase (no arcs yet)
        self.round = round_
        self.tightens = tightens
        self.owned: dict[str, OwnedArc] = {}
        self.incoming: dict[str, tuple[int, int]] = {}  # tail -> (its epoch, arc gen)
        self._outbox: dict[str, dict[bool, FlowMessage]] = {}
        self._announce: dict[str, ArcAnnounce] = {}
        self._inflight: dict[str, dict[int, Outgoing]] = {}
        self._sent_seq: dict[tuple[str, bool], int] = {}  # the last call that carried each arc
        self._seq = 0
        self._gen = 0
        self.activity = 0
        self.edits = 0
        self.messages_emitted = 0
        """Messages the state machine produced; fewer are sent (see the outbox)."""
        self.messages_sent = 0
        self.messages_received = 0
        self.batches_sent = 0

    # ------------------------------------------------------------------ arcs

    def own_arc(self, peer: str, peer_epoch: int, params: ArcParamsSpec, *, ring: bool) -> None:
        """Create the arc `self -> peer`, or give it new parameters (a re-measured link) as a
        new generation. Either way the state machine keeps the flow of an arc it already has
        (`FlowNode.update_arc`): re-creating it empty would re-route all its flow, often at the
        price of a rescale, for what is mostly probe noise."""
        self._gen += 1
        arc = OwnedArc(peer, peer_epoch, self._gen, params, ring)
        self.owned[peer] = arc
        self._announce[peer] = ArcAnnounce(
            self.node_id, peer, self.epoch, peer_epoch, arc.gen, params.cap, params.cost
        )
        local = LocalArc(peer, params.cap, params.cost, arc.gen, peer_epoch)
        self.edits += 1
        self._emit(self.node.update_arc(local, upstream=False))

    def accept_arc(self, ann: ArcAnnounce) -> None:
        """The head's side of an announcement (validated by the caller). Idempotent: the same
        or an older generation of the same tail incarnation changes nothing. A newer one updates
        the arc in place, as the tail did (a head that never had the arc starts it at the
        tail's counters, which it never counted: both ends still agree on the flow)."""
        known = self.incoming.get(ann.tail)
        if known is not None and known[0] == ann.tail_epoch and known[1] >= ann.gen:
            return
        self.incoming[ann.tail] = (ann.tail_epoch, ann.gen)
        local = LocalArc(ann.tail, ann.cap, ann.cost, ann.gen, ann.tail_epoch)
        self.edits += 1
        self._emit(self.node.update_arc(local, upstream=True))

    def drop_peer(self, peer: str) -> None:
        """`peer` died or left: its arcs leave the state machine, its queue is dropped."""
        if peer in self.node.peers():
            self.edits += 1
        self.owned.pop(peer, None)
        self.incoming.pop(peer, None)
        self._outbox.pop(peer, None)
        self._announce.pop(peer, None)
        self._inflight.pop(peer, None)  # their replies no longer matter
        self._emit(self.node.remove_peer(peer))
        self.activity += 1

    # ------------------------------------------------------------------ messages

    def note_change(self) -> None:
        """The swarm's topology changed somewhere (a member joined, left or died)."""
        self.node.note_change()

    def receive(self, messages: list[FlowMessage]) -> None:
        self.messages_received += len(messages)
        self._emit(self.node.on_messages(messages))
        self.activity += 1

    def _emit(self, messages: list[FlowMessage]) -> None:
        self.messages_emitted += len(messages)
        for msg in messages:
            box = self._outbox.get(msg.receiver)
            if box is None:
                self._outbox[msg.receiver] = box = {}
            box[msg.from_tail] = msg  # supersedes any older state of the same arc
        if messages:
            self.activity += 1

    def ready_peers(self) -> list[str]:
        """Peers with something to send and room for another call in flight."""
        peers = set(self._outbox) | set(self._announce)
        return sorted(p for p in peers if self._room(p))

    def _room(self, peer: str) -> bool:
        calls = self._inflight.get(peer)
        if not calls:
            return True
        if len(calls) >= self.max_inflight:
            return False
        # A pending announcement alone is not re-sent while a call carrying it is in flight.
        return peer in self._outbox

    def take(self, peer: str) -> Outgoing | None:
        """What to send `peer` now (marked in flight), or None."""
        if not self._room(peer):
            return None
        ann = self._announce.get(peer)
        box = self._outbox.pop(peer, {})
        if ann is None and not box:
            return None
        self._seq += 1
        out = Outgoing(peer, (ann,) if ann is not None else (), tuple(box.values()), self._seq)
        for msg in out.messages:
            self._sent_seq[(peer, msg.from_tail)] = out.seq
        self._inflight.setdefault(peer, {})[out.seq] = out
        return out

    def _landed(self, out: Outgoing) -> None:
        calls = self._inflight.get(out.peer)
        if calls is not None:
            calls.pop(out.seq, None)
            if not calls:
                del self._inflight[out.peer]

    def delivered(self, out: Outgoing, *, accepted: bool) -> None:
        """The call returned: merged by the peer. `accepted` False: it refused the announced
        arc, so the batch is queued again (its messages on that arc were ignored)."""
        self._landed(out)
        self.messages_sent += len(out.messages)
        self.batches_sent += 1
        self.activity += 1
        if accepted:
            if out.arcs and self._announce.get(out.peer) == out.arcs[0]:
                del self._announce[out.peer]
        else:
            self._requeue(out)

    def failed(self, out: Outgoing) -> None:
        """The call failed: nothing is known to have arrived; send it again later."""
        self._landed(out)
        self._requeue(out)

    def _requeue(self, out: Outgoing) -> None:
        if out.peer not in self.owned and out.peer not in self.incoming:
            return  # the peer is gone
        box = self._outbox.setdefault(out.peer, {})
        for msg in out.messages:
            if self._sent_seq.get((out.peer, msg.from_tail), 0) > out.seq:
                continue  # a newer state of this arc went out after it
            box.setdefault(msg.from_tail, msg)  # anything queued since is newer
        if not box:
            del self._outbox[out.peer]

    # ------------------------------------------------------------------ phases

    def apply(self, round_: int, tightens: int) -> None:
        """A coordinator's command: rescale into `round_`, then end phases up to `tightens`.
        Idempotent; older rounds are ignored."""
        if round_ < self.round:
            return
        if round_ > self.round:
            self.node.rescale()
            self.round, self.tightens = round_, 0
            self.activity += 1
        while self.tightens < tightens:
            self.tightens += 1
            self._emit(self.node.tighten())
            self.activity += 1

    def tick(self) -> None:
        """`quiet_s` mode: let the state machine tighten on its own when due."""
        self._emit(self.node.on_tick(self._clock()))

    def next_tick(self) -> float | None:
        return self.node.next_tick()

    def busy_reasons(self) -> list[str]:
        """Why this node is not quiet (empty when it is): for status and debugging."""
        node = self.node
        reasons = []
        if node.s_in > 0 or node.s_out > 0:
            reasons.append(f"surplus in {node.s_in} out {node.s_out}")
        if self._outbox:
            reasons.append("queued for " + ",".join(sorted(self._outbox)))
        if self._announce:
            reasons.append("announcing to " + ",".join(sorted(self._announce)))
        if self._inflight:
            reasons.append("in flight to " + ",".join(sorted(self._inflight)))
        return reasons

    def quiet(self) -> bool:
        """Idle, nothing queued, announced-and-unacknowledged or in flight."""
        return self.node.idle() and not self._outbox and not self._announce and not self._inflight

    def report(self, *, measuring: bool, view: int) -> PhaseReportData:
        return PhaseReportData(
            id=self.node_id,
            epoch=self.epoch,
            round=self.round,
            tightens=self.tightens,
            final=self.node.final,
            quiet=self.quiet() and not measuring,
            activity=self.activity,
            wants_rescale=self.node.wants_rescale(),
            view=view,
            edits=self.edits,
        )

    # ------------------------------------------------------------------ results

    def routes(self) -> dict[str, int]:
        """Flow units to each next-stage peer: what the data plane splits microbatches by."""
        return self.node.routes()

    def throughput(self) -> int:
        return self.node.throughput()
