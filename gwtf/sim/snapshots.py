"""Stage snapshots in the simulation (docs/design.md 4.6), driven by the pure rules of
`gwtf.job.snapshots`:

- at every iteration boundary the rule makes due after the job's first (every
  `snapshot_every`-th, and every one of a stage with at most `snapshot_thin` live replicas) the
  stage's smallest live replica sends the stage's state (`params * state_bytes_per_param`) to the
  stage's keeper, a live node of another stage (the one with the smallest id, kept while it
  lives), over the simulated network, queued like any send; so does a stage that a death makes
  thin in the middle of an iteration (the state of the iteration's start);
- a snapshot counts once it has fully landed: one whose sender or keeper died on the way is cut
  off and counts for nothing. The keeper replaces what it holds of the stage only then
  (`keeper_keeps`: the newest and the newest periodic one), and every node keeps its own state of
  the previous periodic boundary until every stage's snapshot of the newer one has landed
  (`own_kept`). A keeper that dies takes its snapshots with it, and the stages they were of send
  theirs to a new keeper at once (the node waits for their next due boundary instead:
  docs/design.md 4.6, limits);
- when the last replica of a stage is gone (its death noticed), the stage is restored from its
  keeper (`restore_point`): the snapshot of the iteration in progress loses nothing (the rules
  replay the stage's work on the joiners); an older one the other stages still keep rolls the
  swarm back to it (`Simulation.rollback`, reported in the result, the iterations undone counted
  as lost progress); none fails the job with its reason (`Simulation.fail`). A joiner of a
  wiped stage downloads the state from the keeper;
- the state of the job's first iteration is the job's own: every node builds it from the job's
  model and seed (the simulated jobs are fresh, never resumed), so it is not sent, and it is
  always a restore point (`restore_point(rebuilt=True)`): a stage wiped together with the
  keeper of its snapshots sends the whole swarm back to the job's start, reported as a
  rollback, rather than failing the job. The node sends it all the same, as its joiners cannot
  rebuild a stage yet, and fails such a job (docs/design.md 4.6).

Only `RuleRecovery` (the policies that recover by the rules) keeps snapshots; the baselines'
joiners of an empty stage load a checkpoint stored near them, as before.
"""

from __future__ import annotations

from typing import Any

from gwtf.job.snapshots import SnapshotPolicy, keeper_keeps, own_kept, restore_point
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
        self.keeper: list[SimNode | None] = [None] * sim.S
        self.kept: list[frozenset[int]] = [frozenset()] * sim.S
        """Per stage, the iterations of the snapshots its keeper holds (landed ones only)."""
        self.landed_periodic: list[int | None] = [None] * sim.S
        """Per stage, the newest periodic boundary whose snapshot landed at a keeper."""
        self.generation = 0
        """Bumped by a rollback: a snapshot sent before it is of an undone iteration."""
        self.sent = 0
        self.landed = 0
        self.cut = 0
        self.bytes = 0.0

    def _live(self, stage: int) -> list[SimNode]:
        return [n for n in self.sim.active_nodes(stage) if not n.detected]

    def _keeper_for(self, stage: int) -> SimNode | None:
        keeper = self.keeper[stage]
        if keeper is not None and keeper.alive and keeper.active and keeper.stage != stage:
            return keeper
        others = [n for n in self.sim.active_nodes() if n.stage != stage and not n.detected]
        return min(others, key=lambda n: n.id, default=None)

    def boundary(self, index: int) -> None:
        """Iteration `index` starts: send the snapshots the rule makes due."""
        if index == self.policy.start:
            return  # the job's initial state (module doc)
        for stage in range(self.sim.S):
            live = self._live(stage)
            if live and self.policy.due(index, len(live)) and index not in self.kept[stage]:
                self._send(stage, index, min(live, key=lambda n: n.id))

    def thinned(self, stage: int) -> None:
        """A death left `stage` with few replicas: send the state of the iteration's start."""
        it = self.sim.iteration
        live = self._live(stage)
        if it is not None and live and self.policy.is_thin(len(live)) \
                and it.index != self.policy.start and it.index not in self.kept[stage]:
            self._send(stage, it.index, min(live, key=lambda n: n.id))

    def _send(self, stage: int, index: int, sender: SimNode) -> None:
        keeper = self._keeper_for(stage)
        if keeper is None:
            return
        sc = self.sim.sc
        nbytes = sc.params_per_stage[stage] * sc.state_bytes_per_param
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
        if not (sender.alive and sender.epoch == sender_epoch and keeper.alive
                and keeper.epoch == keeper_epoch and keeper.stage != stage):
            self.cut += 1  # the stream was cut off: nothing landed
            return
        self.landed += 1
        if self.keeper[stage] is not keeper:
            self.keeper[stage] = keeper
            self.kept[stage] = frozenset()
        self.kept[stage] = keeper_keeps(self.policy, self.kept[stage], index)
        if self.policy.periodic(index):
            newest = self.landed_periodic[stage]
            self.landed_periodic[stage] = index if newest is None else max(newest, index)

    def died(self, node: SimNode) -> None:
        """`node` is gone: the snapshots it kept are gone with it, and each stage they were of
        sends a new keeper at once what its nodes hold (the state of the iteration's start if
        the stage is thin, else of its latest periodic boundary), as a death that makes a stage
        thin does: a stage whose snapshots died waits for no boundary to have one again."""
        it = self.sim.iteration
        for stage, keeper in enumerate(self.keeper):
            if keeper is not node:
                continue
            self.keeper[stage] = None
            self.kept[stage] = frozenset()
            live = [n for n in self._live(stage) if n is not node]
            if it is None or not live:
                continue
            index = it.index if self.policy.is_thin(len(live)) else \
                self.policy.last_periodic(it.index)
            if index != self.policy.start:
                self._send(stage, index, min(live, key=lambda n: n.id))

    def source(self, stage: int) -> SimNode | None:
        """Where a joiner of `stage`, which has no live replica, downloads its state from."""
        keeper = self.keeper[stage]
        return keeper if keeper is not None and keeper.alive and self.kept[stage] else None

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
        # The jobs simulated are fresh: every node can rebuild the initial state (module doc).
        point = restore_point(self.policy, current, self.kept[stage], self.held(current),
                              rebuilt=True)
        if point == current:
            return
        if point is not None:
            self.rolled_back(point)
            sim.rollback(point, stage)
            return
        held = sorted(self.kept[stage])
        sim.fail(f"stage {stage} lost every replica at iteration {current} and "
                 + (f"its keeper holds snapshots of iterations {held} only, none the other "
                    f"stages can go back to (they keep {sorted(self.held(current))})"
                    if held else "no node keeps a snapshot of it"))

    def rolled_back(self, to: int) -> None:
        """The swarm goes back to `to`: snapshots of later iterations are of undone work."""
        self.generation += 1
        self.kept = [frozenset(i for i in kept if i <= to) for kept in self.kept]
        self.landed_periodic = [b if b is None or b <= to else to for b in self.landed_periodic]

    def totals(self) -> dict[str, Any]:
        return {"sent": self.sent, "landed": self.landed, "cut": self.cut,
                "bytes": self.bytes}
