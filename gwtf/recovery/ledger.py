"""The per-iteration ledger of one node (docs/design.md 4), and what it tells about a dead
neighbour.

Every node keeps, for the iteration in progress and until it commits:

- for each microbatch whose activation it sent downstream: the receiver and the *mode* of the
  send (a plain forward, or a recovery send: "recompute" or "replay", see `Mode`); the
  activation itself is kept by the node next to this record (the ledger holds no tensors);
- for each microbatch whose gradient it sent upstream: the receiver;
- the node each microbatch's gradient must go to (its *gradient target*: the sender of the
  activation, or the replacement a recovery named), and whether the gradient came back;
- the ids of the microbatches whose gradient it has accumulated.

When a neighbour dies, `report_about(dead)` turns these records into *evidence* of how far the
dead node got with each microbatch: a downstream node that received the microbatch's activation
from it proves the dead node finished its forward; an upstream node that got its gradient back
proves it finished its backward (and accumulated). Recovery sends raise the floor: a node that
was sent a microbatch to *replay* holds (or was about to hold) an accumulated contribution, one
sent a microbatch to *recompute* holds its forward state. `gwtf.recovery.rules.plan_crash`
merges the evidence of all live neighbours and applies the rules.

Stage 0 (the data holders) has no upstream: its input is the microbatch's token ids, which travel
with the activation (like the labels, docs/design.md 1), so a stage-1 node can start a recovery at
another data holder; it records that with `gradient_target(mb, holder, mode)`.

A replacement that recomputes or replays a stage becomes the keeper of the activation the
downstream node already holds: it records `activation_sent(mb, downstream)` for it (the
microbatch's path, carried with it, names that node), so that a later death downstream is
covered by its reports too.

Bounded replay (docs/design.md 4.9). A node ships the running sum of its gradient (everything it
accumulated in the iteration) to one live stage peer, its *keeper*, every `replay_bound`
microbatches: the sender records `shipped(ids, keeper)`, the keeper `kept(sender, ids, hops)`
(a later shipment replaces an earlier one: running sums only grow; `hops` are the sender's records
of where each microbatch came from and whose gradient came back, `Ledger.hops`). While the sender
lives, the kept sum counts for nothing: the sender contributes its whole sum at the commit. When it
dies and the plan lets the keeper take it (`gwtf.recovery.rules.plan_crash`, rule `KEEP`), the
keeper `adopt`s it: from then on those ids are the keeper's contributions, it takes the dead
node's place in the records (from the plan's neighbours, else the carried hops), and the dead
node's neighbours re-point their records to the keeper (`contribution_moved`), so that the
keeper's own death is covered by their reports like any replay replacement's, and a later death
of a neighbour is covered by the keeper's.

Microbatch ids are ints unique within a job (a real node can pack holder and sequence number).
Nothing here does I/O or reads a clock; every method is O(1) but `report_about`, which is linear
in the iteration's records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Evidence", "Hops", "Ledger", "MicrobatchId", "Mode", "NeighbourReport"]

MicrobatchId = int

Hops = tuple[str | None, str | None]
"""One microbatch's neighbours at a node: the previous-stage node its activation came from (None
at stage 0) and the next-stage node its gradient came back from (None at the last stage, or
before the gradient came)."""


class Mode(IntEnum):
    """Why an activation (or, towards stage 0, a gradient with the token ids) was sent."""

    FORWARD = 0
    """Ordinary forward; also rule 1 (resend of an activation whose forward was lost)."""
    RECOMPUTE = 1
    """Rule 2: redo this stage's forward only and wait for the gradient; send nothing down."""
    REPLAY = 2
    """Rule 3: redo forward and backward, accumulate, send nothing up or down."""


class Evidence(IntEnum):
    """How far a node is known to have got with one microbatch at its stage."""

    SENT = 0
    """It was sent the microbatch; nothing proves it finished the forward."""
    FORWARD_DONE = 1
    """Its forward is done: it holds the stored activations, and its output went downstream."""
    BACKWARD_DONE = 2
    """Its backward is done: it accumulated the microbatch's gradient."""


@dataclass(frozen=True, slots=True)
class NeighbourReport:
    """What one live neighbour of a dead node knows about the dead node's microbatches.

    `evidence[mb]` is this neighbour's evidence for `mb` at the dead node's stage. A neighbour
    one stage *above* the dead node (upstream, stage - 1) is where a recovery takes the
    activation from; one stage *below* (downstream, stage + 1) is where it takes the gradient
    from (and, for a dead data holder, the token ids).
    """

    node: str
    stage: int
    evidence: tuple[tuple[MicrobatchId, Evidence], ...]

    def as_dict(self) -> dict[MicrobatchId, Evidence]:
        return dict(self.evidence)


class Ledger:
    """The records of one node for one iteration (see the module doc). Reset at each commit."""

    __slots__ = (
        "node",
        "stage",
        "iteration",
        "_act_to",
        "_act_mode",
        "_grad_target",
        "_grad_back",
        "_target_mode",
        "_accumulated",
        "_adopted",
        "_shipped",
        "_keeper",
        "_kept",
        "_kept_hops",
    )

    def __init__(self, node: str, stage: int, iteration: int = 0) -> None:
        self.node = node
        self.stage = stage
        self.iteration = iteration
        self._act_to: dict[MicrobatchId, str] = {}
        self._act_mode: dict[MicrobatchId, Mode] = {}
        self._grad_target: dict[MicrobatchId, str] = {}
        self._grad_back: dict[MicrobatchId, str] = {}
        self._target_mode: dict[MicrobatchId, Mode] = {}
        self._accumulated: set[MicrobatchId] = set()
        self._adopted: set[MicrobatchId] = set()
        self._shipped: frozenset[MicrobatchId] = frozenset()
        self._keeper: str | None = None
        self._kept: dict[str, frozenset[MicrobatchId]] = {}
        self._kept_hops: dict[str, dict[MicrobatchId, Hops]] = {}

    # -- recording -------------------------------------------------------------------------

    def activation_sent(
        self, mb: MicrobatchId, receiver: str, mode: Mode = Mode.FORWARD
    ) -> None:
        """This node sent `mb`'s activation (its output) to `receiver` of the next stage."""
        self._act_to[mb] = receiver
        self._act_mode[mb] = mode
        self._grad_back.pop(mb, None)

    def activation_received(self, mb: MicrobatchId, sender: str) -> None:
        """`mb`'s activation came from `sender`: unless a recovery says otherwise, the gradient
        goes back to it."""
        self._grad_target[mb] = sender
        self._target_mode[mb] = Mode.FORWARD

    def gradient_target(self, mb: MicrobatchId, target: str, mode: Mode = Mode.FORWARD) -> None:
        """A recovery moved `mb`'s stage above this one to `target` (with the recovery's mode):
        the gradient now goes there. A stage-1 node that starts a recovery at a data holder
        (sending it the token ids) records it here too."""
        self._grad_target[mb] = target
        self._target_mode[mb] = mode

    def gradient_sent(self, mb: MicrobatchId, receiver: str) -> None:
        """This node sent `mb`'s gradient upstream to `receiver`."""
        if self._grad_target.get(mb) != receiver:
            self._grad_target[mb] = receiver
            self._target_mode[mb] = Mode.FORWARD

    def gradient_received(self, mb: MicrobatchId, sender: str) -> None:
        """`mb`'s gradient came back from `sender` (the next stage finished its backward)."""
        self._grad_back[mb] = sender

    def accumulated(self, mb: MicrobatchId) -> None:
        """This node added `mb`'s gradient to its accumulator."""
        self._accumulated.add(mb)

    # -- shipments of partial sums (bounded replay) ------------------------------------------

    def shipped(self, mbs: Iterable[MicrobatchId], keeper: str) -> None:
        """This node sent its running gradient sum, covering `mbs`, to `keeper` of its stage."""
        self._shipped = frozenset(mbs)
        self._keeper = keeper

    def keeper_lost(self) -> None:
        """This node's keeper died or left: what it held is gone, everything is unshipped."""
        self._shipped = frozenset()
        self._keeper = None

    def hops(self, mbs: Iterable[MicrobatchId]) -> dict[MicrobatchId, Hops]:
        """Where each of `mbs` came from and where its gradient came back from, as this node
        recorded them (`Hops`): what a shipment carries beside the sum (`kept`)."""
        return {mb: (self._grad_target.get(mb) if self.stage > 0 else None,
                     self._grad_back.get(mb)) for mb in mbs}

    def kept(
        self,
        sender: str,
        mbs: Iterable[MicrobatchId],
        hops: Mapping[MicrobatchId, Hops] | None = None,
    ) -> None:
        """A stage peer's running sum, covering `mbs`, arrived here (it replaces the last one),
        with the sender's `hops` of them (`Ledger.hops` at the sender, at the shipment)."""
        self._kept[sender] = frozenset(mbs)
        self._kept_hops[sender] = dict(hops or {})

    def held_for(self, sender: str) -> frozenset[MicrobatchId]:
        """The microbatches covered by the sum this node keeps for `sender` (empty if none)."""
        return self._kept.get(sender, frozenset())

    def drop_kept(self, sender: str) -> None:
        """Forget the sum kept for `sender` (it died and another keeper, or nobody, took it)."""
        self._kept.pop(sender, None)
        self._kept_hops.pop(sender, None)

    def adopt(
        self,
        sender: str,
        upstream: Mapping[MicrobatchId, str] | None = None,
        downstream: Mapping[MicrobatchId, str] | None = None,
    ) -> frozenset[MicrobatchId]:
        """`sender` died and the plan gave its kept sum to this node: its ids become this node's
        contributions (the node adds the kept sum to its accumulator). Returns them.

        The keeper takes the sender's place in the records too: for each kept microbatch,
        `downstream[mb]` (the plan's `gradient_from`) is the next-stage node whose gradient the
        sender consumed, and `upstream[mb]` the previous-stage node its activation came from;
        where the plan names none (that neighbour is dead too, not yet noticed), the hops the
        sum carried (`kept`) stand in. `Rule.KEEP` needs the sender's backward proven, which
        proves the downstream one, so the keeper records that the output went to the
        downstream node and its gradient came back: if that node dies in turn, the keeper's
        report proves its backward (BACKWARD_DONE) as the sender's would have. Without it, a
        later death downstream had only its own downstream's FORWARD_DONE for those
        microbatches, and any sum it had shipped was refused whole."""
        mbs = self._kept.pop(sender, frozenset())
        carried = self._kept_hops.pop(sender, {})
        self._adopted |= mbs
        for mb in mbs:
            up, down = carried.get(mb, (None, None))
            down = (downstream or {}).get(mb, down)
            up = (upstream or {}).get(mb, up)
            if down is not None:
                self._act_to[mb] = down
                self._act_mode[mb] = Mode.FORWARD
                self._grad_back[mb] = down
            if up is not None:
                self._grad_target[mb] = up
                self._target_mode[mb] = Mode.FORWARD
        return mbs

    def contribution_moved(self, mb: MicrobatchId, stage: int, keeper: str) -> None:
        """`mb`'s contribution at neighbouring stage `stage` now lives at `keeper` (rule KEEP):
        record it as a replay sent there, so a death of the keeper is reported as BACKWARD_DONE."""
        if stage == self.stage + 1:
            self._act_to[mb] = keeper
            self._act_mode[mb] = Mode.REPLAY
            self._grad_back.pop(mb, None)
        elif stage == self.stage - 1:
            self._grad_target[mb] = keeper
            self._target_mode[mb] = Mode.REPLAY

    # -- queries ---------------------------------------------------------------------------

    def contributions(self) -> frozenset[MicrobatchId]:
        """Microbatches whose gradient this node accumulated in this iteration, or adopted from a
        dead stage peer's kept sum."""
        return frozenset(self._accumulated | self._adopted)

    @property
    def keeper(self) -> str | None:
        """The stage peer this node's last shipment went to (None if none, or it died)."""
        return self._keeper

    def unshipped(self) -> int:
        """How many of this node's contributions its last shipment does not cover."""
        return len(self._accumulated) + len(self._adopted) - len(self._shipped)

    def activation_receiver(self, mb: MicrobatchId) -> str | None:
        return self._act_to.get(mb)

    def gradient_receiver(self, mb: MicrobatchId) -> str | None:
        """Where `mb`'s gradient goes (or went) upstream."""
        return self._grad_target.get(mb)

    def has_gradient_back(self, mb: MicrobatchId) -> bool:
        return mb in self._grad_back

    def report_about(self, dead: str) -> NeighbourReport:
        """This node's evidence about each microbatch `dead` held (see the module doc).

        As the dead node's upstream: every microbatch whose activation went to it, with
        BACKWARD_DONE if its gradient came back from it or the send was a replay, FORWARD_DONE if
        the send was a recompute, else SENT. As its downstream: every microbatch whose gradient
        target is the dead node, FORWARD_DONE (its output reached this node) or, for a recovery
        this node started at a dead data holder, the floor of that recovery's mode.
        """
        evidence: dict[MicrobatchId, Evidence] = {}
        for mb, receiver in self._act_to.items():
            if receiver != dead:
                continue
            mode = self._act_mode.get(mb, Mode.FORWARD)
            if self._grad_back.get(mb) == dead or mode == Mode.REPLAY:
                evidence[mb] = Evidence.BACKWARD_DONE
            elif mode == Mode.RECOMPUTE:
                evidence[mb] = Evidence.FORWARD_DONE
            else:
                evidence[mb] = Evidence.SENT
        for mb, target in self._grad_target.items():
            if target != dead:
                continue
            mode = self._target_mode.get(mb, Mode.FORWARD)
            floor = Evidence.BACKWARD_DONE if mode == Mode.REPLAY else Evidence.FORWARD_DONE
            if evidence.get(mb, Evidence.SENT) < floor:
                evidence[mb] = floor
        return NeighbourReport(self.node, self.stage, tuple(sorted(evidence.items())))

    def reset(self, iteration: int) -> None:
        """The iteration committed: forget everything (the kept tensors may be freed too)."""
        self.iteration = iteration
        self._act_to.clear()
        self._act_mode.clear()
        self._grad_target.clear()
        self._grad_back.clear()
        self._target_mode.clear()
        self._accumulated.clear()
        self._adopted.clear()
        self._shipped = frozenset()
        self._keeper = None
        self._kept.clear()
        self._kept_hops.clear()
