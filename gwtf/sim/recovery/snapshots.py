"""Stage snapshots in the simulation (docs/design.md 4.6), driven by the pure rules of
`gwtf.job.snapshots`:

- the periodic boundaries are declared one at a time (`declare_due`): at the first boundary at
  least `snapshot_every` iterations after the latest one, once the latest one's snapshot has
  landed at every keeper of every stage, or while some stage is thin whether it landed or not
  (and every stage has a live replica to send it). At a declared boundary every stage's sender
  (`snapshot_sender`: its replica with the fastest uplink, the scenario's access link, ties by
  the smallest id) sends the stage's state (`params * state_bytes_per_param`) to each of the
  stage's keepers (`snapshot_keepers`, `snapshot_keepers` of them, as the node chooses them:
  the coordinator, then nodes of other stages sharing the fewest failure domains, by stage,
  location and start, with those chosen);
  a thin stage (at most `snapshot_thin` live replicas) sends its state at every other boundary
  too, and when a death makes it thin mid-iteration (the state of the iteration's start), each
  unless one of its snapshots is still on its way. A stage whose copies of the latest periodic
  snapshot were cut off sends it again at the next boundary, from a node that keeps its own
  state of it (`holders`); when none is left, it can never land and the next one is declared
  over it (`declare_due(stuck=True)`);
- a copy streams in the background: in chunks of `SNAPSHOT_CHUNK_BYTES`, each sent only once
  the sender's uplink, the keeper's downlink and the pair's link carry nothing queued before it
  (`Network.idle_at`), so the data plane waits behind at most one chunk and the snapshot takes
  the capacity the training leaves idle; the iterations go on meanwhile;
- a copy counts once it has fully landed: one whose sender or keeper died on the way is cut
  off and counts for nothing. A keeper replaces what it holds of the stage only then
  (`keeper_keeps`: the newest and the newest periodic one). The snapshot counts as landed once
  every keeper it was sent to holds it (`snapshot_landed`; a keeper that died on the way drops
  out and its replacement gets a copy): one copy through and another cut off by its sender's
  death is not landed. Every node keeps its own state of the previous periodic boundary until
  every stage's snapshot of the newer one has landed (`own_kept`), which with declared
  boundaries is always one that landed everywhere. A keeper that dies takes its snapshots with
  it; the others keep theirs, and the rule's next choice gets the stage's next snapshot. A stage
  left with no keeper holding anything sends its state to the new keepers at once. A sender that
  dies before its stage's latest periodic snapshot landed is replaced by the stage's next
  sender, which sends its own state of that boundary;
- when the last replica of a stage is gone (its death noticed), the stage is restored from the
  newest usable snapshot any live keeper holds (`restore_point` over their union): the snapshot
  of the iteration in progress loses nothing (the rules replay the stage's work on the joiners);
  an older one the other stages still keep rolls the swarm back to it (`Simulation.rollback`,
  reported in the result, the iterations undone counted as lost progress; a stage whose snapshot
  of that boundary had not landed sends it again); none fails the job with its reason
  (`Simulation.fail`). A joiner of a wiped stage downloads the state from a keeper holding it;
- the state of the job's first iteration is the job's own: every node builds it from the job's
  model and seed (the simulated jobs are fresh, never resumed), so it is not sent, and it is
  always a restore point (`restore_point(rebuilt=True)`): a stage wiped together with every
  keeper of its snapshots sends the whole swarm back to the job's start, reported as a
  rollback, rather than failing the job. The node sends it all the same, as its joiners cannot
  rebuild a stage yet, and fails such a job (docs/design.md 4.6);
- where the job's client keeps checkpoints (`[client] checkpoint_every`), a wipe no snapshot
  of the swarm restores is resumed from the client's newest copy instead of the job's start
  (gwtf/sim/recovery/clientcopy.py), as the client does when the node fails the job.

The node streams its snapshots in the background by the same rule: its job coordinator declares
the boundaries (`gwtf.job.snapshots.Boundaries`) on its senders' reports (docs/design.md 4.6).

Only `RuleRecovery` (the policies that recover by the rules) keeps snapshots; the baselines'
joiners of an empty stage load a checkpoint stored near them, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gwtf.job.snapshots import (
    SNAPSHOT_CHUNK_BYTES,
    SnapshotPolicy,
    declare_due,
    keeper_keeps,
    own_kept,
    restore_point,
    sender_rank,
    snapshot_keepers,
    snapshot_landed,
    stage_lost,
)
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.recovery.clientcopy import ClientCopies
from gwtf.sim.simulator import Simulation

__all__ = ["StageSnapshots"]


def _rank(node: SimNode) -> tuple[float, str]:
    """`sender_rank` of a simulated node: its declared uplink is its scenario's access link
    (every node's is infinite in the pair model, where the smallest id sends)."""
    return sender_rank(node.id, node.info.uplink_gbps)


@dataclass
class Stream:
    """One copy of a stage's snapshot on its way from its sender to a keeper, in chunks."""

    stage: int
    index: int
    sender: SimNode
    sender_epoch: int
    keeper: SimNode
    keeper_epoch: int
    generation: int
    left: float
    """Bytes not sent yet."""

    def through(self) -> bool:
        """Are both ends the lives it was sent between, the keeper still of another stage?"""
        return (self.sender.alive and self.sender.epoch == self.sender_epoch
                and self.keeper.alive and self.keeper.epoch == self.keeper_epoch
                and self.keeper.stage != self.stage)


class StageSnapshots:
    """Who keeps which stage's snapshots, what has landed, and what a wipe does."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink
        sc = sim.sc
        self.policy = SnapshotPolicy(sc.snapshot_every, sc.snapshot_thin, declared=())
        self.kept: list[dict[SimNode, frozenset[int]]] = [{} for _ in range(sim.S)]
        """Per stage, each live keeper's iterations of its snapshots (landed ones only)."""
        self.landed_periodic: list[set[int]] = [{self.policy.start} for _ in range(sim.S)]
        """Per stage, the periodic boundaries whose snapshot landed at every keeper it was sent
        to (`snapshot_landed`; the job's start: every node rebuilds it)."""
        self.holders: list[set[tuple[SimNode, int]]] = [set() for _ in range(sim.S)]
        """Per stage, the node lives that keep their own state of the latest periodic boundary:
        those of the stage when it was declared (or rolled back to)."""
        self.streams: list[Stream] = []
        """The copies on their way."""
        self.sent_to: dict[tuple[int, int, int], set[SimNode]] = {}
        """(stage, iteration, generation) of a snapshot with copies on their way -> the keepers
        it must land at (`snapshot_landed`) once the last of them ends."""
        self.generation = 0
        """Bumped by a rollback: a snapshot sent before it is of an undone iteration."""
        self.sent = 0
        self.landed = 0
        self.cut = 0
        self.bytes = 0.0
        self.declared = 0
        every = sc.client_checkpoint_every
        self.client = ClientCopies(sim, every) if every > 0 else None
        """The client's checkpoints, the job's copy off the swarm
        (gwtf/sim/recovery/clientcopy.py)."""

    def _live(self, stage: int) -> list[SimNode]:
        return [n for n in self.sim.active_nodes(stage) if not n.detected]

    def _sender(self, stage: int, but: SimNode | None = None) -> SimNode | None:
        """The stage's snapshot sender (`snapshot_sender`: its live replica with the fastest
        uplink, ties by the smallest id)."""
        return min((n for n in self._live(stage) if n is not but), key=_rank, default=None)

    def _keepers_for(self, stage: int) -> list[SimNode]:
        """The stage's keepers by the node's rule, over the live nodes as the swarm sees them."""
        live = {n.id: n for n in self.sim.active_nodes() if not n.detected}
        coordinator = min((i for i, n in live.items() if n.stage == 0), default="")
        ids = snapshot_keepers({i: n.stage for i, n in live.items()}, (), stage, coordinator,
                               lambda _: True, lambda i: live[i].location,
                               lambda i: live[i].started, count=self.sim.sc.snapshot_keepers)
        return [live[i] for i in ids]

    def _held(self, stage: int) -> frozenset[int]:
        """The iterations of `stage`'s snapshots any live keeper holds: one that died with the
        stage in one wave holds nothing even while its death is not noticed yet (the node could
        not fetch from it either)."""
        return frozenset().union(*(held for k, held in self.kept[stage].items() if k.alive))

    def _landed_everywhere(self, boundary: int) -> bool:
        """Has every stage's snapshot of the periodic `boundary` landed (`declare_due`)?"""
        return all(boundary in landed for landed in self.landed_periodic)

    def _streaming(self, stage: int) -> bool:
        return any(st.stage == stage and st.generation == self.generation
                   for st in self.streams)

    def boundary(self, index: int) -> None:
        """Iteration `index` starts: declare the next periodic snapshot if it is due
        (`declare_due`; only while every stage has a sender) and send it, else send the thin
        stages' snapshots that are not already streaming one."""
        if index == self.policy.start:
            return  # the job's initial state (module doc)
        if self.client is not None:
            self.client.boundary(index)
        latest = self.policy.last_periodic(index)
        stuck = False
        for stage, landed in enumerate(self.landed_periodic):
            if latest in landed or self._streaming(stage):
                continue
            # Its copies were cut off (a sender or keepers died): a node that keeps its own
            # state of `latest` sends it again; when none does (every node of the stage then
            # has died since), it can never land, and a new one is declared over it.
            holder = min((n for n, epoch in self.holders[stage]
                          if n.alive and n.epoch == epoch and n.stage == stage and not n.detected),
                         key=_rank, default=None)
            if holder is None:
                stuck = True
            else:
                self._send(stage, latest, holder)
        senders = [self._sender(stage) for stage in range(self.sim.S)]
        thin = any(self.policy.is_thin(len(self._live(stage))) for stage in range(self.sim.S))
        if all(senders) and declare_due(self.policy, index, self._landed_everywhere,
                                        stuck=stuck, thin=thin):
            self.policy = self.policy.declare(index)
            self.declared += 1
            self.holders = [{(n, n.epoch) for n in self._live(stage)}
                            for stage in range(self.sim.S)]
            for stage, sender in enumerate(senders):
                assert sender is not None
                self._send(stage, index, sender)
            return
        for stage, sender in enumerate(senders):
            if sender is not None and self.policy.is_thin(len(self._live(stage))) \
                    and not self._streaming(stage):
                self._send(stage, index, sender)

    def thinned(self, stage: int) -> None:
        """A death left `stage` with few replicas: send the state of the iteration's start."""
        it = self.sim.iteration
        sender = self._sender(stage)
        if it is not None and sender is not None and it.index != self.policy.start \
                and self.policy.is_thin(len(self._live(stage))) and not self._streaming(stage):
            self._send(stage, it.index, sender)

    def _send(self, stage: int, index: int, sender: SimNode, skip: SimNode | None = None
              ) -> None:
        """Stream one copy to each of the stage's keepers that lacks it and is not being sent
        it (but `skip`), all at once, each in the background (`SNAPSHOT_CHUNK_BYTES`)."""
        busy = {st.keeper for st in self.streams
                if (st.stage, st.index, st.generation) == (stage, index, self.generation)
                and st.through()}
        keepers = [k for k in self._keepers_for(stage)
                   if index not in self.kept[stage].get(k, frozenset()) and k is not skip
                   and k not in busy]
        if not keepers:
            return
        sc = self.sim.sc
        nbytes = sc.params_per_stage[stage] * sc.state_bytes_per_param
        self.sent_to.setdefault((stage, index, self.generation), set()).update(keepers)
        for keeper in keepers:
            self.sent += 1
            self.bytes += nbytes
            stream = Stream(stage, index, sender, sender.epoch, keeper, keeper.epoch,
                            self.generation, nbytes)
            self.streams.append(stream)
            self.sink.emit(self.sim.engine.now, Kind.ARRIVE, self._chunk, stream)

    @returns_events
    def _chunk(self, stream: Stream) -> None:
        """The stream's next chunk goes once the links carry nothing queued before it (the
        data plane goes first); the last one's arrival lands the copy."""
        if stream.generation != self.generation:
            self.streams.remove(stream)
            return  # of an iteration a rollback undid
        if not stream.through():
            self._ended(stream, False)
            return
        sim = self.sim
        now = sim.engine.now
        free = sim.network.idle_at(stream.sender.info, stream.keeper.info)
        if free > now:
            self.sink.emit(free, Kind.ARRIVE, self._chunk, stream)
            return
        chunk = min(stream.left, SNAPSHOT_CHUNK_BYTES)
        arrive = sim.transfer(stream.sender, stream.keeper, chunk)
        stream.left -= chunk
        if stream.left > 0:
            self.sink.emit(sim.network.idle_at(stream.sender.info, stream.keeper.info),
                           Kind.ARRIVE, self._chunk, stream)
        else:
            self.sink.emit(arrive, Kind.ARRIVE, self._on_arrive, stream)

    @returns_events
    def _on_arrive(self, stream: Stream) -> None:
        if stream.generation != self.generation:
            self.streams.remove(stream)
            return  # sent before a rollback: of an iteration undone since
        self._ended(stream, stream.through())

    def _ended(self, stream: Stream, through: bool) -> None:
        """A copy landed (`through`) or was cut off."""
        self.streams.remove(stream)
        stage, index, sender, keeper = stream.stage, stream.index, stream.sender, stream.keeper
        key = (stage, index, stream.generation)
        sent_to = self.sent_to.setdefault(key, {keeper})
        if not through:
            self.cut += 1  # the stream was cut off: nothing landed
            if sender.alive and sender.epoch == stream.sender_epoch and sender.stage == stage:
                # The keeper died: it is no keeper the snapshot must land at any more (the
                # node's rule names live keepers only); once more to the rule's choice, its
                # replacement (none while its death is not noticed: the node's second round
                # would fail there too).
                sent_to.discard(keeper)
                self._send(stage, index, sender, skip=keeper)
        else:
            self.landed += 1
            self.kept[stage][keeper] = keeper_keeps(
                self.policy, self.kept[stage].get(keeper, frozenset()), index)
        if not any((st.stage, st.index, st.generation) == key for st in self.streams):
            del self.sent_to[key]  # its last copy ended (a resend above is a copy on its way)
            kept = self.kept[stage]
            if self.policy.periodic(index) and snapshot_landed(
                    index, sent_to, lambda k: kept.get(k, frozenset())):
                self.landed_periodic[stage].add(index)

    def died(self, node: SimNode) -> None:
        """`node` is gone: the snapshots it kept are gone with it, and those it was sending
        are cut off. A periodic snapshot it was sending, or one of the iteration in progress,
        the stage's next sender sends again from its own state of that boundary (the node's
        rule). A stage whose other keeper still holds some waits for its next snapshot to reach
        the rule's new choice; one left with none sends the new keepers what its nodes hold at
        once (the state of the iteration's start if the stage is thin, else of its latest
        periodic boundary), as a death that makes a stage thin does."""
        it = self.sim.iteration
        sender = self._sender(node.stage, but=node)
        if it is not None and sender is not None and _rank(node) < _rank(sender):
            # It was its stage's sender: the stage's latest periodic snapshot, if it has not
            # landed, and one of the iteration in progress it was sending, go again.
            latest = self.policy.last_periodic(it.index)
            again = {it.index} if any(st.sender is node and st.index == it.index
                                      for st in self.streams) else set()
            if latest not in self.landed_periodic[node.stage] \
                    and (sender, sender.epoch) in self.holders[node.stage]:
                again.add(latest)
            for index in sorted(again - {self.policy.start}):
                self._send(node.stage, index, sender)
        for stage, kept in enumerate(self.kept):
            if kept.pop(node, None) is None or kept:
                continue
            sender = self._sender(stage, but=node)
            if it is None or sender is None:
                continue
            live = len([n for n in self._live(stage) if n is not node])
            index = it.index if self.policy.is_thin(live) else \
                self.policy.last_periodic(it.index)
            if index != self.policy.start:
                self._send(stage, index, sender)

    def carry(self, node: SimNode) -> dict[int, frozenset[int]]:
        """`node` moves to another stage in a new life (`Churn.relocate`): what it keeps, per
        stage, taken from it so that its leave does not drop it (`carried` gives it back)."""
        return {stage: held for stage, kept in enumerate(self.kept)
                if (held := kept.pop(node, None)) is not None}

    def carried(self, node: SimNode, kept: dict[int, frozenset[int]]) -> None:
        """The moved machine's new life keeps what its old one kept: the same memory."""
        for stage, held in kept.items():
            self.kept[stage][node] = held

    def source(self, stage: int) -> SimNode | None:
        """Where a joiner of `stage`, which has no live replica, downloads its state from: the
        live keeper holding its newest snapshot."""
        kept = {k: held for k, held in self.kept[stage].items() if k.alive and held}
        return max(kept, key=lambda k: (max(kept[k]), k.id), default=None)

    def held(self, current: int) -> frozenset[int]:
        """The periodic boundaries every node at `current` keeps its own state of: the latest,
        and the newest one whose snapshot landed at every stage (`own_kept`)."""
        floor = max(b for b in self.landed_periodic[0]
                    if all(b in landed for landed in self.landed_periodic) and b <= current)
        return own_kept(self.policy, current, floor=floor)

    def wiped(self, stage: int) -> None:
        """The last replica of `stage` is gone: restore, roll back or fail (module doc)."""
        sim = self.sim
        it = sim.iteration
        current = it.index if it is not None else sim.committed
        kept = self._held(stage)
        client = self.client
        if client is not None and client.pending:
            return  # the client's resume on its way restores every stage
        if client is not None and restore_point(self.policy, current, kept,
                                                self.held(current)) is None:
            # The node fails the job here; its client resumes it from its newest checkpoint.
            to = client.restores(current)
            if to is not None:
                self.rolled_back(to)
                client.resume(to, stage)
                return
        # The jobs simulated are fresh: every node can rebuild the initial state (module doc).
        point = restore_point(self.policy, current, kept, self.held(current), rebuilt=True)
        if point == current:
            return
        if point is not None:
            self.rolled_back(point)
            sim.rollback(point, stage)
            return
        sim.fail(stage_lost(stage, current, (
            f"its keepers hold snapshots of iterations {sorted(kept)} only, none the other "
            f"stages can go back to (they keep {sorted(self.held(current))})"
            if kept else "no node keeps a snapshot of it")))

    def rolled_back(self, to: int) -> None:
        """The swarm goes back to `to`: snapshots of later iterations are of undone work."""
        self.generation += 1
        self.sent_to.clear()
        self.kept = [{k: frozenset(i for i in held if i <= to) for k, held in kept.items()}
                     for kept in self.kept]
        self.landed_periodic = [{b for b in landed if b <= to} for landed in self.landed_periodic]
        self.policy = self.policy.undo(to)
        # Every node is back at `to`: each keeps its own state of it.
        self.holders = [{(n, n.epoch) for n in self._live(stage)} for stage in range(self.sim.S)]
        for stage, landed in enumerate(self.landed_periodic):
            if to in landed:
                continue
            sender = self._sender(stage)
            if sender is None:
                # The wiped stage, restored from `to`, which a live keeper holds.
                landed.add(to)
            else:
                # Its snapshot of `to` had not landed yet: its nodes are back at `to`, so its
                # sender sends it again, and the next periodic one is declared after it lands.
                self._send(stage, to, sender)

    def totals(self) -> dict[str, Any]:
        return {"sent": self.sent, "landed": self.landed, "cut": self.cut,
                "bytes": self.bytes, "declared": self.declared,
                **(self.client.totals() if self.client is not None else {})}
