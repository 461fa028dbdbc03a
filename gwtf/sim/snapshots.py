"""Stage snapshots in the simulation (docs/design.md 4.6), driven by the pure rules of
`gwtf.job.snapshots`:

- at every iteration boundary the rule makes due after the job's first (every
  `snapshot_every`-th, and every one of a stage with at most `snapshot_thin` live replicas) the
  stage's smallest live replica sends the stage's state (`params * state_bytes_per_param`) to each
  of the stage's two keepers (`snapshot_keepers`, as the node chooses them: the coordinator, the
  smallest live holder, and the node of another stage that shares the fewest failure domains
  with the stage and the first keeper, by location and start), one copy after the other on its
  uplink, over the simulated network, queued like any send; so does a
  stage that a death makes thin in the middle of an iteration (the state of the iteration's
  start);
- a copy counts once it has fully landed: one whose sender or keeper died on the way is cut
  off and counts for nothing. A keeper replaces what it holds of the stage only then
  (`keeper_keeps`: the newest and the newest periodic one). The snapshot counts as landed once
  every keeper it was sent to holds it (`snapshot_landed`): one copy through and the other cut
  off is not landed, and every node keeps its own state of the previous periodic boundary until
  every stage's snapshot of the newer one has landed (`own_kept`; the node reports its step once
  every copy is through). A keeper that
  dies takes its snapshots with it; the other keeps its copies, and the rule's next choice gets
  the stage's next snapshot. A stage left with no keeper holding anything sends its state to the
  new keepers at once (the node waits for the next due boundary instead: docs/design.md 4.6);
- when the last replica of a stage is gone (its death noticed), the stage is restored from the
  newest usable snapshot any live keeper holds (`restore_point` over their union): the snapshot
  of the iteration in progress loses nothing (the rules replay the stage's work on the joiners);
  an older one the other stages still keep rolls the swarm back to it (`Simulation.rollback`,
  reported in the result, the iterations undone counted as lost progress); none fails the job
  with its reason (`Simulation.fail`). A joiner of a wiped stage downloads the state from a
  keeper holding it;
- the state of the job's first iteration is the job's own: every node builds it from the job's
  model and seed (the simulated jobs are fresh, never resumed), so it is not sent, and it is
  always a restore point (`restore_point(rebuilt=True)`): a stage wiped together with both
  keepers of its snapshots sends the whole swarm back to the job's start, reported as a
  rollback, rather than failing the job. The node sends it all the same, as its joiners cannot
  rebuild a stage yet, and fails such a job (docs/design.md 4.6).

Only `RuleRecovery` (the policies that recover by the rules) keeps snapshots; the baselines'
joiners of an empty stage load a checkpoint stored near them, as before.
"""

from __future__ import annotations

from typing import Any

from gwtf.job.snapshots import (
    SnapshotPolicy,
    keeper_keeps,
    own_kept,
    restore_point,
    snapshot_keepers,
    snapshot_landed,
)
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.simulator import Simulation

__all__ = ["StageSnapshots"]

Sent = tuple[int, int, SimNode, int, SimNode, int, int]
"""(stage, iteration, sender, its epoch, keeper, its epoch, generation) of a snapshot on its way."""


class StageSnapshots:
    """Who keeps which stage's snapshots, what has landed, and what a wipe does."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink
        sc = sim.sc
        self.policy = SnapshotPolicy(sc.snapshot_every, sc.snapshot_thin)
        self.kept: list[dict[SimNode, frozenset[int]]] = [{} for _ in range(sim.S)]
        """Per stage, each live keeper's iterations of its snapshots (landed ones only)."""
        self.landed_periodic: list[int | None] = [None] * sim.S
        """Per stage, the newest periodic boundary whose snapshot landed at every keeper it was
        sent to (`snapshot_landed`)."""
        self.on_way: dict[tuple[int, int, int], tuple[list[int], set[SimNode]]] = {}
        """(stage, iteration, generation) -> ([copies still on their way], the keepers sent
        to)."""
        self.generation = 0
        """Bumped by a rollback: a snapshot sent before it is of an undone iteration."""
        self.sent = 0
        self.landed = 0
        self.cut = 0
        self.bytes = 0.0

    def _live(self, stage: int) -> list[SimNode]:
        return [n for n in self.sim.active_nodes(stage) if not n.detected]

    def _keepers_for(self, stage: int) -> list[SimNode]:
        """The stage's keepers by the node's rule, over the live nodes as the swarm sees them."""
        live = {n.id: n for n in self.sim.active_nodes() if not n.detected}
        coordinator = min((i for i, n in live.items() if n.stage == 0), default="")
        ids = snapshot_keepers({i: n.stage for i, n in live.items()}, (), stage, coordinator,
                               lambda _: True, lambda i: live[i].location,
                               lambda i: live[i].started)
        return [live[i] for i in ids]

    def _held(self, stage: int) -> frozenset[int]:
        """The iterations of `stage`'s snapshots any live keeper holds: one that died with the
        stage in one wave holds nothing even while its death is not noticed yet (the node could
        not fetch from it either)."""
        return frozenset().union(*(held for k, held in self.kept[stage].items() if k.alive))

    def boundary(self, index: int) -> None:
        """Iteration `index` starts: send the snapshots the rule makes due."""
        if index == self.policy.start:
            return  # the job's initial state (module doc)
        for stage in range(self.sim.S):
            live = self._live(stage)
            if live and self.policy.due(index, len(live)):
                self._send(stage, index, min(live, key=lambda n: n.id))

    def thinned(self, stage: int) -> None:
        """A death left `stage` with few replicas: send the state of the iteration's start."""
        it = self.sim.iteration
        live = self._live(stage)
        if it is not None and live and self.policy.is_thin(len(live)) \
                and it.index != self.policy.start:
            self._send(stage, it.index, min(live, key=lambda n: n.id))

    def _send(self, stage: int, index: int, sender: SimNode, skip: SimNode | None = None
              ) -> None:
        """One copy to each of the stage's keepers that lacks it (but `skip`), one after the
        other."""
        keepers = [k for k in self._keepers_for(stage)
                   if index not in self.kept[stage].get(k, frozenset()) and k is not skip]
        if not keepers:
            return
        sc = self.sim.sc
        nbytes = sc.params_per_stage[stage] * sc.state_bytes_per_param
        way, sent_to = self.on_way.setdefault((stage, index, self.generation), ([0], set()))
        way[0] += len(keepers)
        sent_to.update(keepers)
        for keeper in keepers:
            self.sent += 1
            self.bytes += nbytes
            arrive = self.sim.transfer(sender, keeper, nbytes)
            self.sink.emit(arrive, Kind.ARRIVE, self._on_arrive,
                           (stage, index, sender, sender.epoch, keeper, keeper.epoch,
                            self.generation))

    @returns_events
    def _on_arrive(self, payload: Sent) -> None:
        stage, index, sender, sender_epoch, keeper, keeper_epoch, generation = payload
        if generation != self.generation:
            return  # sent before a rollback: of an iteration undone since
        way, sent_to = self.on_way.setdefault((stage, index, generation), ([1], {keeper}))
        way[0] -= 1
        if not (sender.alive and sender.epoch == sender_epoch and keeper.alive
                and keeper.epoch == keeper_epoch and keeper.stage != stage):
            self.cut += 1  # the stream was cut off: nothing landed
            if sender.alive and sender.epoch == sender_epoch and sender.stage == stage:
                # The keeper died: once more to the rule's choice, its replacement (none while
                # its death is not noticed: the node's second round would fail there too).
                self._send(stage, index, sender, skip=keeper)
        else:
            self.landed += 1
            self.kept[stage][keeper] = keeper_keeps(
                self.policy, self.kept[stage].get(keeper, frozenset()), index)
        if way[0] <= 0:
            del self.on_way[(stage, index, generation)]
            kept = self.kept[stage]
            if self.policy.periodic(index) and snapshot_landed(
                    index, sent_to, lambda k: kept.get(k, frozenset())):
                newest = self.landed_periodic[stage]
                self.landed_periodic[stage] = index if newest is None else max(newest, index)

    def died(self, node: SimNode) -> None:
        """`node` is gone: the snapshots it kept are gone with it. A stage whose other keeper
        still holds some waits for its next snapshot to reach the rule's new choice; one left
        with none sends the new keepers what its nodes hold at once (the state of the
        iteration's start if the stage is thin, else of its latest periodic boundary), as a
        death that makes a stage thin does."""
        it = self.sim.iteration
        if it is not None and self.policy.periodic(it.index) and it.index != self.policy.start:
            # The stage's snapshot sender died in the iteration of a periodic boundary, maybe
            # with a copy of it on the way: the next sender sends its own (the node's rule).
            live = [n for n in self._live(node.stage) if n is not node]
            if live and node.id < min(n.id for n in live):
                self._send(node.stage, it.index, min(live, key=lambda n: n.id))
        for stage, kept in enumerate(self.kept):
            if kept.pop(node, None) is None or kept:
                continue
            live = [n for n in self._live(stage) if n is not node]
            if it is None or not live:
                continue
            index = it.index if self.policy.is_thin(len(live)) else \
                self.policy.last_periodic(it.index)
            if index != self.policy.start:
                self._send(stage, index, min(live, key=lambda n: n.id))

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
        """The periodic boundaries every node at `current` keeps its own state of."""
        latest = self.policy.last_periodic(current)
        landed = latest == self.policy.start or all(
            b is not None and b >= latest for b in self.landed_periodic)
        return own_kept(self.policy, current, landed=landed)

    def wiped(self, stage: int) -> None:
        """The last replica of `stage` is gone: restore, roll back or fail (module doc)."""
        sim = self.sim
        it = sim.iteration
        current = it.index if it is not None else sim.committed
        kept = self._held(stage)
        # The jobs simulated are fresh: every node can rebuild the initial state (module doc).
        point = restore_point(self.policy, current, kept, self.held(current), rebuilt=True)
        if point == current:
            return
        if point is not None:
            self.rolled_back(point)
            sim.rollback(point, stage)
            return
        sim.fail(f"stage {stage} lost every replica at iteration {current} and "
                 + (f"its keepers hold snapshots of iterations {sorted(kept)} only, none the "
                    f"other stages can go back to (they keep {sorted(self.held(current))})"
                    if kept else "no node keeps a snapshot of it"))

    def rolled_back(self, to: int) -> None:
        """The swarm goes back to `to`: snapshots of later iterations are of undone work."""
        self.generation += 1
        self.on_way.clear()
        self.kept = [{k: frozenset(i for i in held if i <= to) for k, held in kept.items()}
                     for kept in self.kept]
        self.landed_periodic = [b if b is None or b <= to else to for b in self.landed_periodic]

    def totals(self) -> dict[str, Any]:
        return {"sent": self.sent, "landed": self.landed, "cut": self.cut,
                "bytes": self.bytes}
