"""Entrance: the coordinator's side of joiners (docs/design.md 3.8) and of a stage that lost every
replica (4.3 rule 5, 4.6).

A joiner asks whom to fetch its stage's state from (`enter`): the stage's live replicas, or, when
it has none, the nodes keeping its snapshots (the job's `snapshot_keepers`, 4 by default). Then
it asks again with the iteration of the state it holds, and is admitted when that is the
iteration in progress and no commit is under way.

A stage with no live replica is restored from its keepers' snapshots (`gwtf.job.snapshots`): the
snapshot of the iteration in progress if a keeper has one (nothing is lost), else the stage's
newest periodic one, and then the swarm rolls back to that iteration when the joiner enters with
it: the coordinator's bookkeeping goes back (`IterationCoordinator.rollback`), the job's progress
records the rollback and forgets the iterations undone, and every participant restores its own
stage's snapshot of that iteration (`Restart` with `rollback`). When no snapshot can restore the
stage, or a participant holds no state of the rollback's iteration, the job fails with that
reason at once: no joiner could help it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from grpc import aio

from gwtf.job.iterations import IterationCoordinator, ReportError
from gwtf.job.snapshots import RESUME_HINT, SnapshotPolicy, own_kept, restore_point, stage_lost
from gwtf.node.jobs.host import JobsHost
from gwtf.node.rpc.transport import Stubs
from gwtf.v1 import job_pb2

__all__ = ["Coordinating", "CoordinatorManager", "Entrance"]


class CoordinatorManager(Protocol):
    """The job manager as the coordinator's parts call it (gwtf.node.jobs.manager.JobManager)."""

    async def call(
        self, call: Callable[[Stubs, float], Awaitable[Any]], member: Any,
        timeout_s: float, *, attempts: int = 3,
    ) -> Any: ...

    def changed(self, active: Any) -> None: ...

    def excluded(self, job_id: str) -> list[str]: ...

    def fail(self, job_id: str, reason: str, *, spread: bool = True) -> None: ...

    def keepers_of(self, job_id: str, stage: int) -> list[str]: ...

    def snapshot_iterations(self, job_id: str, stage: int) -> set[int]: ...

    def admit(self, request: job_pb2.AdmitRequest) -> job_pb2.AdmitReply: ...

    def restart(self, request: job_pb2.RestartRequest) -> job_pb2.RestartReply: ...


class Coordinating(Protocol):
    """The job coordinator (gwtf.node.jobs.coordinator.coordinator.JobCoordinator) as its entrance
    uses it."""

    plan: IterationCoordinator
    job: Any
    job_id: str
    active: Any
    answering: set[str]

    @property
    def manager(self) -> CoordinatorManager: ...

    @property
    def host(self) -> JobsHost: ...

    def live_participants(self) -> dict[str, int]: ...

    def progress(self) -> job_pb2.JobProgress: ...

    def moved(self) -> None: ...

    def update_pause(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None: ...

    async def call_to(
        self, node: str, remote: Callable[[Stubs, float], Awaitable[Any]],
        local: Callable[[], Any], *, attempts: int = 5,
    ) -> Any: ...


ENTRY_HOLD_S = 5.0
"""How long the commit of the iteration in progress waits for a joiner that was given its
donors (it fetches the stage's state of that iteration and builds its stage). Without the wait
a joiner whose fetch took longer than the iteration's work came back after the commit had
begun, its state one step old, and fetched again: when iterations are as short as a fetch
(0.75 s, the partition case on an idle machine) it never got in. Once per joiner."""


def participants_pb(participants: dict[str, int]) -> list[job_pb2.Participant]:
    return [job_pb2.Participant(id=p, stage=s) for p, s in sorted(participants.items())]


class Entrance:
    """Joiners and rollbacks of one coordinated job: see the module docstring."""

    def __init__(self, coord: Coordinating) -> None:
        self.coord = coord
        job = coord.job
        self._policy = SnapshotPolicy(job.snapshot_every, job.snapshot_thin,
                                      start=coord.progress().resumed_from)
        self.fetching: dict[str, tuple[int, float]] = {}
        """Joiners given donors that the commit waits for: the iteration, and until when."""
        self._held: set[str] = set()
        """Joiners the commit waited for already (a joiner gets one wait)."""
        self.probed: dict[int, tuple[int, frozenset[int]]] = {}
        """Stage -> (the iteration in progress when asked, the snapshots of it that could
        restore it the other keepers hold)."""
        self._probing: set[tuple[int, int]] = set()
        self.wanted: dict[int, int] = {}
        """Stage -> the snapshot iteration its joiners fetch from another keeper once the
        newest one proved unusable."""

    @property
    def policy(self) -> SnapshotPolicy:
        """The job's snapshot policy with the periodic boundaries declared so far."""
        boundaries = self.coord.plan.boundaries
        return self._policy if boundaries is None else boundaries.policy

    def _kept(self, injecting: int) -> frozenset[int]:
        """The periodic boundaries every node keeps its own state of (`own_kept`)."""
        boundaries = self.coord.plan.boundaries
        return own_kept(self._policy, injecting) if boundaries is None else \
            boundaries.kept(injecting)

    def holds_commit(self) -> bool:
        """Does a joiner fetching the state of the iteration in progress hold its commit?"""
        now = time.monotonic()
        injecting = self.coord.plan.injecting
        self.fetching = {n: (i, t) for n, (i, t) in self.fetching.items()
                         if t > now and i == injecting}
        return bool(self.fetching)

    def _restore_point(
        self, stage: int, reported: int | None = None
    ) -> tuple[list[str], int | None]:
        """(the live keepers of `stage`'s snapshots, this node first when it keeps some; the
        iteration the stage is restored at, None when no snapshot this coordinator knows of
        can restore it). What another keeper holds is known by asking it (`_probe`) and by
        what a joiner fetched from it (`reported`)."""
        coord = self.coord
        keepers = coord.manager.keepers_of(coord.job_id, stage)
        kept = set(coord.manager.snapshot_iterations(coord.job_id, stage))
        probed = self.probed.get(stage)
        if probed is not None and probed[0] == coord.plan.injecting:
            kept |= probed[1]
        if reported is not None:
            kept.add(reported)
        injecting = coord.plan.injecting
        return keepers, restore_point(self.policy, injecting, kept, self._kept(injecting))

    def _others(self, keepers: list[str]) -> list[str]:
        return [k for k in keepers if k != self.coord.host.node_id]

    def check_empty(self, stage: int) -> bool:
        """`stage` has no live replica: False (and the job failed, with the reason) when no
        snapshot can restore it, so that the job does not wait for a joiner in vain. Another
        live keeper's snapshots are asked for first (`_probe`)."""
        coord = self.coord
        injecting = coord.plan.injecting
        keepers, point = self._restore_point(stage)
        if point is not None:
            return True
        others = self._others(keepers)
        probed = self.probed.get(stage)
        if others and (probed is None or probed[0] != injecting):
            if (stage, injecting) not in self._probing:
                self._probing.add((stage, injecting))
                coord.spawn(self._probe(stage, injecting, others), "probe snapshot keepers")
            return True
        if self._known(stage):
            why = (f"the snapshots of it kept at {', '.join(keepers)} are of iterations "
                   f"{sorted(self._known(stage))}, and neither iteration {injecting} nor a "
                   "periodic one the other stages keep "
                   f"({sorted(self._kept(injecting))}) is among them")
        else:
            why = "no live node keeps a snapshot of it"
        coord.manager.fail(coord.job_id, stage_lost(stage, injecting, why))
        return False

    def _known(self, stage: int) -> set[int]:
        coord = self.coord
        probed = self.probed.get(stage)
        return set(coord.manager.snapshot_iterations(coord.job_id, stage)) | (
            set(probed[1]) if probed is not None else set())

    async def _probe(self, stage: int, injecting: int, keepers: list[str]) -> None:
        """Ask the other keepers of `stage` which snapshots of it that could restore it they
        hold (the first chunk of each, then the stream is cancelled), then decide again."""
        coord = self.coord
        host = coord.host
        found: set[int] = set()
        for keeper in keepers:
            member = host.member(keeper)
            if member is None:
                continue
            for at in sorted({injecting, *self._kept(injecting)}, reverse=True):
                request = job_pb2.StateRequest(sender=host.node_id, job_id=coord.job_id,
                                               stage=stage, exact=True, iteration=at)
                call = host.stubs(member).jobs.FetchState(
                    request, timeout=host.config.rpc_timeout_s)
                try:
                    chunk = await call.read()
                except aio.AioRpcError:
                    continue
                finally:
                    call.cancel()
                if isinstance(chunk, job_pb2.StateChunk) and chunk.iteration == at:
                    found.add(at)
        self._probing.discard((stage, injecting))
        self.probed[stage] = (injecting, frozenset(found))
        if coord.plan.injecting == injecting:
            coord.update_pause()

    # ------------------------------------------------------------------ joiners

    def enter(self, request: job_pb2.EnterRequest) -> job_pb2.EnterReply:
        coord = self.coord
        plan = coord.plan
        stage = request.stage
        if request.sender in coord.manager.excluded(coord.job_id):
            raise ReportError(f"{request.sender} was excluded from the job as a bad peer")
        if not 0 <= stage < plan.num_stages:
            raise ReportError(f"stage {stage} is outside the job's 0..{plan.num_stages - 1}")
        live = coord.live_participants()
        reply = job_pb2.EnterReply(
            iteration=plan.injecting, round=plan.round, coordinator=coord.host.node_id,
        )
        if plan.boundaries is not None:
            reply.declared.extend(plan.boundaries.policy.declared or ())
            reply.floor = plan.boundaries.ordered or plan.boundaries.policy.start
        donors = sorted(p for p, s in live.items() if s == stage and p != request.sender)
        point: int | None = plan.injecting
        if donors:
            reply.donors.extend(donors)
        elif any(s == stage and p != request.sender for p, s in plan.participants.items()):
            # A replica membership declared dead, its death not confirmed yet (a stale verdict
            # at a heal is found false a moment later): no donor now, the joiner asks again,
            # rather than roll the swarm back past a replica that went on.
            return reply
        else:
            reported = request.state_iteration if request.has_state else None
            keepers, point = self._restore_point(stage, reported)
            if point is None and not self._others(keepers):
                self.check_empty(stage)
                return reply
            if point is None:
                # Only another keeper may hold a snapshot that restores the stage: the joiner
                # fetches its newest, or, once one proved unusable, the periodic one every
                # other node keeps its own state of, and says which it got.
                keepers = self._others(keepers)
                want = self.wanted.get(stage)
                if reported is not None:
                    want = self.wanted[stage] = max(self._kept(plan.injecting))
                if want is not None:
                    reply.rollback = want < plan.injecting
                    reply.snapshot_iteration = want
                reply.donors.extend(keepers)
                return reply
            reply.donors.extend(keepers)
            reply.rollback = point < plan.injecting
            reply.snapshot_iteration = point
        if not request.has_state:
            if donors and request.sender not in self._held and not plan.in_commit:
                self._held.add(request.sender)
                self.fetching[request.sender] = (plan.injecting, time.monotonic() + ENTRY_HOLD_S)
            return reply
        self.fetching.pop(request.sender, None)
        if plan.injecting >= plan.iterations or plan.in_commit:
            return reply
        if request.state_iteration == plan.injecting:
            self._admit(request.sender, stage, reply)
        elif not donors and request.state_iteration == point:
            self._rollback(request.sender, stage, point, reply)
        return reply

    def _admit(self, node: str, stage: int, reply: job_pb2.EnterReply) -> None:
        coord = self.coord
        plan = coord.plan
        plan.admit(node, stage)
        self._held.discard(node)  # a later entry (after a resync) waits again
        self.wanted.pop(stage, None)
        coord.answering.add(node)  # its calls go out though membership may not show it yet
        reply.admitted = True
        reply.round = plan.round
        reply.iteration = plan.injecting
        reply.participants.extend(participants_pb(plan.participants))
        reply.holders.extend(plan.holders)
        coord.progress().joins += 1
        coord.host.log.info("job %s: %s enters stage %d at iteration %d", coord.job_id, node,
                            stage, plan.injecting)
        coord.update_pause()
        coord.moved()
        admit = job_pb2.AdmitRequest(
            sender=coord.host.node_id, job_id=coord.job_id,
            participants=participants_pb(plan.participants),
        )
        for other in sorted(plan.participants):
            if other == node:
                continue
            coord.spawn(
                coord.call_to(other, lambda stubs, t: stubs.jobs.Admit(admit, timeout=t),
                              lambda: coord.manager.admit(admit)),
                "admit",
            )
        coord.manager.changed(coord.active)

    # ------------------------------------------------------------------ rollbacks

    def _rollback(self, node: str, stage: int, to: int, reply: job_pb2.EnterReply) -> None:
        """`node` holds the snapshot of `stage` (which has no live replica) of iteration `to`,
        older than the one in progress: the swarm goes back to `to` and `node` enters there."""
        if self.roll_back(stage, to, {node: stage}):
            self._admit(node, stage, reply)

    def roll_back(self, stage: int, to: int, joining: dict[str, int] | None = None) -> bool:
        """`stage` lost every replica and is restored (by `joining`, or by this coordinator, a
        holder that adopted the job) from its snapshot of iteration `to`, older than the one in
        progress: every participant goes back to `to`. False if the job failed instead."""
        coord = self.coord
        plan = coord.plan
        before = plan.injecting
        try:
            round_, holders, weights = plan.rollback(to)
        except ValueError as err:
            coord.manager.fail(coord.job_id, str(err))
            return False
        reason = (f"stage {stage} lost every replica at iteration {before}; its newest snapshot "
                  f"is of iteration {to}")
        self._record(stage, before, to, reason)
        coord.host.log.warning("job %s rolls back from iteration %d to %d as round %d: %s",
                               coord.job_id, before, to, round_, reason)
        request = job_pb2.RestartRequest(
            sender=coord.host.node_id, job_id=coord.job_id, iteration=to, round=round_,
            holders=holders, participants=participants_pb({**plan.participants, **(joining or {})}),
            reason=reason[:300], weights=weights, rollback=True,
        )
        for other in sorted(plan.participants):
            coord.spawn(self._order_rollback(other, request), "rollback")
        coord.manager.changed(coord.active)
        return True

    def _record(self, stage: int, before: int, to: int, reason: str) -> None:
        """The job's progress goes back to iteration `to`: the iterations undone are no longer
        counted (they are trained again), and the rollback is on the record."""
        coord = self.coord
        progress = coord.progress()
        progress.rollbacks.append(job_pb2.Rollback(
            stage=stage, from_iteration=before, to_iteration=to, reason=reason[:300],
        ))
        done = progress.iterations_completed
        undone = range(to, max(done, to))
        dropped = {e.iteration: len(e.microbatches) for e in progress.dropped}
        progress.microbatches_trained -= sum(
            coord.job.microbatches - dropped.get(k, 0) for k in undone
        )
        kept = [e for e in progress.dropped if e.iteration < to]
        progress.dropped_microbatches = sum(len(e.microbatches) for e in kept)
        del progress.dropped[:]
        progress.dropped.extend(kept)
        progress.iterations_completed = min(done, to)
        cut = max(0, to - progress.resumed_from)
        del progress.loss[cut:]
        del progress.iteration_s[cut:]

    async def _order_rollback(self, node: str, request: job_pb2.RestartRequest) -> None:
        """Tell `node` to roll back; one that is alive and holds no state of the iteration
        leaves the job no way on: it fails, with the node's reason."""
        coord = self.coord
        host = coord.host
        if node == host.node_id:
            try:
                coord.manager.restart(request)
            except Exception as err:  # the refusal a remote participant would send
                coord.manager.fail(coord.job_id, f"the rollback to iteration "
                                   f"{request.iteration} failed: {err}; {RESUME_HINT}")
            return
        member = host.member(node)
        if member is None and node in coord.answering:
            member = host.known_member(node)  # as JobCoordinator.call_to does
        if member is None:
            return
        try:
            await coord.manager.call(
                lambda stubs, t: stubs.jobs.Restart(request, timeout=t), member,
                host.config.rpc_timeout_s, attempts=5,
            )
        except RuntimeError as err:
            if host.member(node) is not None and (coord.plan.injecting, coord.plan.round) == (
                request.iteration, request.round
            ):
                coord.manager.fail(coord.job_id, f"the rollback to iteration "
                                   f"{request.iteration} failed: {err}; {RESUME_HINT}")
