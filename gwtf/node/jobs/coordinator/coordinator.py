"""JobCoordinator: the coordinator's side of a running job, with I/O (docs/design.md 1 and 4).

The bookkeeping is pure (`gwtf.job.iterations.IterationCoordinator`); this drives it with the
calls between nodes:

- holders report finished microbatches (`done`), replacements report replays (`replayed`);
- once the iteration may commit, phase one (`Commit`) to every live participant, their
  `prepared` reports, rule 6 (`gwtf.recovery.check_commit`), then phase two (`Step`);
- a participant's death (`member_down`): its recovery
(`gwtf.node.jobs.coordinator.recovery.CrashRecovery`):
  the live neighbours of the dead node are asked for their ledgers' evidence (`Report`), its
  stage peers for the running sum they keep of it, `gwtf.recovery.plan_crash` decides, the drops
  are recorded and each recovery goes to the node that holds the microbatch's input (`Recover`),
  a kept sum to its keeper (`Keep`); for a dead data holder, to a live holder, which rebuilds the
  token ids from its own copy of the data;
- a watchdog: an iteration that makes no progress for `stall_s` (a death whose evidence came late,
  a recovery whose source died too) is swept again, and if that does not help, started again from
  scratch as a new round (`Restart`): safe, since parameters only change at a step;
- joiners (`enter`): whom to fetch the stage's state from, and admission once they hold the
  state of the iteration in progress;
- bad peers (a job with a robust aggregation): the replicas a majority of their stage names out
  of bounds in phase one (`gwtf.job.iterations.Outliers`), and after a step those whose
  checksum a majority of their stage outvotes, are excluded (`exclude`): dropped from the job
  exactly as a dead node is, so that their work of the iteration in progress is replayed by
  their honest peers by the same rules (nothing is lost, and nothing they computed is kept at
  their own stage), and named in every later Commit and Step so no microbatch goes to them;
- a node that becomes coordinator because the previous one died (`take_over`) asks every
  participant where it is (`Sync`), finishes a step its predecessor ordered, and starts the
  iteration in progress again (its predecessor's bookkeeping died with it);
- split brain (`gwtf.job.quorum`, docs/design.md 4.5): no commit without a strict majority of
  the last commit's members that are not shown dead (a call to one is refused, or it holds
  nothing of the job); one that only went silent may be alive across a partition. While the
  quorum is missing the job is paused and the silent voters are asked where they are
  (gwtf.node.jobs.coordinator.quorum): one that answers from a job that went on without this side
  makes this side stale, and this node re-enters the job through that job's coordinator
  (`Manager.resync`), as every participant of its side does when that job's record reaches it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from gwtf.flow.topology import CAP_SCALE
from gwtf.job.iterations import (
    CommitOrder,
    CommittedReport,
    IterationCoordinator,
    IterationOutcome,
    Outliers,
    PreparedReport,
    ReportError,
    StepOrder,
)
from gwtf.node.control.membership import MemberInfo
from gwtf.node.jobs.coordinator.entrance import Entrance, participants_pb
from gwtf.node.jobs.coordinator.moves import MovePlanner
from gwtf.node.jobs.coordinator.quorum import QuorumProbe
from gwtf.node.jobs.coordinator.recovery import CrashRecovery
from gwtf.node.jobs.host import JobsHost
from gwtf.node.jobs.journals import record_journal
from gwtf.node.observe import job_event
from gwtf.node.rpc.codec import member_to_pb
from gwtf.node.rpc.transport import Stubs
from gwtf.v1 import job_pb2, node_pb2

__all__ = ["ActiveJob", "JobCoordinator", "Manager"]


class ActiveJob(Protocol):
    """The running job as the coordinator reads it (gwtf.node.jobs.book.CurrentJob)."""

    job: Any  # gwtf.train.JobConfig (torch is loaded lazily)
    job_id: str
    participants: dict[str, int]
    departed: set[str]
    base: set[str]
    worker: Any  # gwtf.node.worker.worker.StageWorker: its `declared()` boundaries at a takeover


class Manager(Protocol):
    """The node's job manager (gwtf.node.jobs.manager.JobManager) as its coordinator uses it: the
    calls to the other participants, the job's record, and this node's own part of each phase (the
    coordinator is a participant too). `active` is the manager's own record of the job."""

    host: JobsHost

    async def call(
        self, call: Callable[[Stubs, float], Awaitable[Any]], member: MemberInfo,
        timeout_s: float, *, attempts: int = 3,
    ) -> Any: ...

    def progress_record(self, job_id: str) -> job_pb2.JobProgress: ...

    def changed(self, active: Any) -> None: ...

    def completed(self, active: Any, outcome: IterationOutcome) -> None: ...

    def excluded(self, job_id: str) -> list[str]: ...

    def exclude(self, active: Any, node: str, stage: int, iteration: int, reason: str
                ) -> None: ...

    def fail(self, job_id: str, reason: str, *, spread: bool = True) -> None: ...

    def keepers_of(self, job_id: str, stage: int) -> list[str]: ...

    def snapshot_iterations(self, job_id: str, stage: int) -> set[int]: ...

    def commit(self, request: job_pb2.CommitRequest) -> job_pb2.CommitReply: ...

    def step(self, request: job_pb2.StepRequest) -> job_pb2.StepReply: ...

    async def report(self, request: job_pb2.ReportRequest) -> job_pb2.ReportReply: ...

    def recover(self, request: job_pb2.RecoverRequest) -> job_pb2.RecoverReply: ...

    async def keep(self, request: job_pb2.KeepRequest) -> job_pb2.KeepReply: ...

    def restart(self, request: job_pb2.RestartRequest) -> job_pb2.RestartReply: ...

    def sync(self, request: job_pb2.SyncRequest) -> job_pb2.SyncReply: ...

    def admit(self, request: job_pb2.AdmitRequest) -> job_pb2.AdmitReply: ...

    def resync(self, active: Any, coordinator: str, reason: str) -> None: ...

    def holds(self, active: Any) -> bool: ...


def _step_call(request: job_pb2.StepRequest) -> Callable[[Stubs, float], Awaitable[Any]]:
    def call(stubs: Stubs, timeout: float) -> Awaitable[Any]:
        return stubs.jobs.Step(request, timeout=timeout)

    return call


DEAD_MEMORY_S = 60.0
"""How long a death stays in the sweeps' list (far longer than every node takes to hear of it)."""


class JobCoordinator:
    """The coordinator of one running job on this node."""

    def __init__(self, manager: Manager, active: ActiveJob, plan: IterationCoordinator) -> None:
        self.manager = manager
        self.host = manager.host
        self.active = active
        self.plan = plan
        self.job = active.job
        self.job_id = active.job_id
        self.log = manager.host.log
        self.dead: dict[str, tuple[int, float]] = {}
        """Nodes that died lately, with their stage and when this node heard of it: a sweep
        plans them again, in whatever round is in progress then (a node that hears of a death
        later than this one may send microbatches to the dead node until it does)."""
        self._last_progress = time.monotonic()
        self._longest_wait = 0.0
        """The longest wait between two progress events while nothing was dead or paused."""
        self._swept = False
        self._paused_since: float | None = None
        self._stopped = False
        self.answering: set[str] = set()
        """Participants the job heard from since membership last declared them dead (admitted
        joiners, deaths found false) though membership may not show them alive yet."""
        self.stall_s = manager.host.config.recovery_stall_s
        self.entrance = Entrance(self)
        self.moves = MovePlanner(self)
        self.recovery = CrashRecovery(self, stopped=lambda: self._stopped,
                                      restart=self._restart, try_commit=self._try_commit)
        record_journal(plan, self.host.node_id, self.job_id, self.log)
        self.probe = QuorumProbe(
            manager.host, active.job_id, plan, self._quorum_changed,
            lambda other, why: manager.resync(active, other, why),
        )

    # ------------------------------------------------------------------ helpers

    def progress(self) -> job_pb2.JobProgress:
        return self.manager.progress_record(self.job_id)

    def moved(self) -> None:
        self._last_progress = time.monotonic()
        self._swept = False

    def progressed(self) -> None:
        """Work was done (a microbatch finished, a replay, a commit report): the longest wait
        for it in a calm spell (nothing dead, no pause) is what this swarm takes; `moved`."""
        if not self.dead and self._paused_since is None:
            self._longest_wait = max(self._longest_wait, time.monotonic() - self._last_progress)
        self.moved()

    def stall_limit(self) -> float:
        """How long an iteration may go without progress before the watchdog acts:
        `recovery_stall_s`, or longer on a swarm slower than that. On slow links (a kernel-shaped
        2 Mbit/s uplink, measured: `python -m benchmarks compress-real`) a microbatch's first
        round trip waits behind every activation queued on the slowest uplink, over 10 s, and
        a fixed limit started healthy iterations over and over until the job failed. So: three
        times the longest calm wait for progress seen in this job, and twice the time the
        flows give an iteration (its microbatches over the holders' flow), whichever is
        longest."""
        limit = max(self.stall_s, 3 * self._longest_wait)
        weights = self.plan.weights
        flow = sum(weights.values()) / CAP_SCALE if weights else 0.0
        if flow > 0:
            limit = max(limit, 2 * self.plan.microbatches / flow)
        return limit

    def live_participants(self) -> dict[str, int]:
        """The participants alive here: live members, and those the job heard from since
        membership last declared them dead (`answering`). Without the latter, a heal that
        declared a stage's west replica dead (a stale verdict, found false) as the east's
        replica entered left the stage with no donor: the swarm rolled back to a snapshot
        while the replicas it could not see went on, and the job hung."""
        me = self.host.node_id
        return {
            p: s for p, s in self.plan.participants.items()
            if p == me or p in self.answering or self.host.member(p) is not None
        }

    async def call_to(
        self,
        node: str,
        remote: Callable[[Stubs, float], Awaitable[Any]],
        local: Callable[[], Any],
        *,
        attempts: int = 5,
    ) -> Any:
        """A call to a participant (this node: `local`); None when it did not take it."""
        if node == self.host.node_id:
            try:
                result = local()
                if asyncio.iscoroutine(result):
                    result = await result
                return result if result is not None else True
            except Exception as err:  # the same refusals a remote caller would get
                self.log.warning("job %s: local call failed: %s", self.job_id, err)
                return None
        member = self.host.member(node)
        if member is None and node in self.answering and node in self.plan.participants:
            # The job counts it in (a joiner admitted, or a participant whose death was found
            # false, docs/design.md 4.5) before membership shows its new incarnation: a call
            # skipped here left it in an older round, and the iteration stalled until the
            # watchdog's restart, for good if that one was skipped too.
            member = self.host.known_member(node)
        if member is None:
            return None
        try:
            return await self.manager.call(remote, member, self.host.config.rpc_timeout_s,
                                           attempts=attempts)
        except RuntimeError as err:
            self.log.warning("job %s: %s did not take a call: %s", self.job_id, node, err)
            return None

    def spawn(self, coro: Any, name: str) -> None:
        self.host.spawn(coro, name)

    def start(self) -> None:
        self.spawn(self._watch(), "coordinator watchdog")
        self.update_pause()

    def stop(self) -> None:
        self._stopped = True

    # ------------------------------------------------------------------ reports

    def done(self, request: job_pb2.DoneRequest) -> None:
        flow = request.flow_units if request.flows_settled else None
        self.plan.done(request.sender, request.iteration, request.round,
                       tuple(request.microbatches), flow)
        self.progressed()
        self._try_commit()

    def replayed(self, request: job_pb2.ReplayedRequest) -> None:
        self.plan.replayed(request.sender, request.iteration, request.round,
                           request.microbatch, request.stage)
        self.progressed()
        self._try_commit()

    def prepared(self, request: job_pb2.PreparedRequest) -> None:
        losses: dict[int, float] = {}
        for entry in request.losses:
            if entry.microbatch in losses:
                raise ReportError(f"{request.sender} reports a loss twice")
            losses[entry.microbatch] = entry.loss
        routes: dict[tuple[str, ...], int] = {}
        for route in request.routes:
            path = tuple(route.path)
            if len(path) != self.plan.num_stages:
                raise ReportError(f"{request.sender} sent a route that is no path")
            routes[path] = routes.get(path, 0) + route.microbatches
        report = PreparedReport(
            sender=request.sender,
            iteration=request.iteration,
            round=request.round,
            attempt=request.attempt,
            stage=request.stage,
            contributed=frozenset(request.contributed),
            losses=losses,
            routes=routes,
            compute_s=request.compute_s,
            replayed_s=request.replayed_s,
            outliers=frozenset(request.outliers),
        )
        outcome = self.plan.prepared(report)
        self.progressed()
        if isinstance(outcome, Outliers):
            factor = self.job.aggregation.norm_factor
            for node, (stage, votes, voters) in sorted(outcome.nodes.items()):
                self.manager.exclude(
                    self.active, node, stage, outcome.iteration,
                    f"{votes} of the {voters} replicas of stage {stage} found its gradient "
                    f"out of bounds (not finite, or its norm above {factor:g} times the "
                    f"stage's median)",
                )
        elif isinstance(outcome, str):
            self.log.warning(
                "job %s iteration %d attempt %d cannot commit: %s; it starts again",
                self.job_id, request.iteration, request.attempt, outcome,
            )
            self._restart(f"the commit check failed: {outcome}")
        elif outcome is not None:
            self._step(self.moves.weigh(outcome))

    def committed(self, report: CommittedReport) -> list[IterationOutcome]:
        outcomes = self.plan.committed(report)
        self.progressed()
        return outcomes

    # ------------------------------------------------------------------ the commit

    def _try_commit(self) -> None:
        if self._stopped or self.entrance.holds_commit():
            return
        order = self.plan.commit_order()
        if order is None:
            return
        self.log.info(
            "job %s iteration %d round %d: commit attempt %d over %d microbatches (%d dropped)",
            self.job_id, order.iteration, order.round, order.attempt, len(order.microbatches),
            len(self.plan.dropped),
        )
        request = job_pb2.CommitRequest(
            sender=self.host.node_id, job_id=self.job_id, iteration=order.iteration,
            microbatches=order.microbatches, final=order.final,
            next_holders=order.next_holders, round=order.round, attempt=order.attempt,
            members=participants_pb(dict(order.members)),
            excluded=self.manager.excluded(self.job_id),
            departed=self._verdicts(order.members),
        )
        for node in sorted(order.members):
            self.spawn(self._send_commit(node, request, order), "commit")

    def _verdicts(self, members: Mapping[str, int]) -> list[node_pb2.Member]:
        """This node's membership entries of the participants an attempt leaves out because
        they died or left (excluded ones are named apart, and are alive)."""
        out = []
        for node in sorted(set(self.active.participants) - set(members)):
            info = self.host.known_member(node)
            if info is not None and not info.alive:
                out.append(member_to_pb(info))
        return out

    async def _send_commit(self, node: str, request: job_pb2.CommitRequest,
                           order: CommitOrder) -> None:
        await self.call_to(
            node,
            lambda stubs, t: stubs.jobs.Commit(request, timeout=t),
            lambda: self.manager.commit(request),
        )

    def _step(self, order: StepOrder) -> None:
        self.log.info(
            "job %s iteration %d: every member is prepared and every stage covers the %d "
            "finished microbatches once: step", self.job_id, order.iteration, order.trained,
        )
        request = job_pb2.StepRequest(
            sender=self.host.node_id, job_id=self.job_id, iteration=order.iteration,
            round=order.round, attempt=order.attempt, final=order.final,
            next_holders=order.next_holders,
            participants=participants_pb(dict(order.participants)),
            loss=order.loss, trained=order.trained, next_weights=order.next_weights,
            dropped=order.dropped, excluded=self.manager.excluded(self.job_id),
            next_round=order.next_round, move=self.moves.message(order),
            periodic=order.periodic, floor=order.floor or 0,
        )
        for node in sorted({*order.participants, *([order.mover] if order.mover else [])}):
            self.spawn(
                self.call_to(node, lambda stubs, t: stubs.jobs.Step(request, timeout=t),
                         lambda: self.manager.step(request)),
                "step",
            )

    # ------------------------------------------------------------------ deaths

    def member_down(self, member: MemberInfo, verb: str, *, gone: bool = False) -> None:
        """`gone`: its death is shown (a call to it was refused), so it no longer votes."""
        if gone:
            self.plan.shown_gone(member.id)
        self._down(member.id, verb)

    def came_back(self, node: str) -> None:
        """`node` was declared dead by nodes that lost sight of it (the far side of a healed
        partition) and answers with its part of the job: what went to or from it meanwhile
        (this iteration's commit calls among them) may be lost, so once it is a live member
        again the round starts over rather than wait for the watchdog."""
        if node not in self.plan.participants:
            return
        self.answering.add(node)

        async def later() -> None:
            for _ in range(20):
                if self._stopped or self.host.member(node) is not None:
                    break
                await asyncio.sleep(self.host.config.member_poll_s)
            self._restart(f"{node} was declared dead by nodes that lost sight of it")

        self.spawn(later(), f"{node} came back")

    def _quorum_changed(self) -> None:
        """A silent voter was shown dead: the quorum may hold now."""
        self.update_pause()
        self._try_commit()

    def exclude(self, node: str) -> None:
        """`node` is excluded as a bad peer: from now on it is as good as dead to the job, so
        the rules that recover a dead node's work redo its work of the iteration in progress
        at its honest peers (its microbatches are neither dropped nor kept as it computed
        them: replaying costs a little compute and keeps every microbatch in the step). What
        it sent to the other stages is kept: a replay reuses the activation its downstream peer
        got from it and the input gradient its upstream peer accumulated, which the screen and
        the checksums, watching one stage's own gradients and parameters, cannot judge."""
        self._down(node, "was excluded")

    def _down(self, node: str, verb: str) -> None:
        self.answering.discard(node)
        self.moves.swarm_changed()
        stage = self.plan.participants.get(node)
        if stage is None:
            return
        voided = self.plan.member_down(node)
        if voided:
            self.log.warning(
                "job %s: %s %s during the commit of iteration %d: the commit runs again once "
                "its work is replayed", self.job_id, node, verb, self.plan.injecting,
            )
        now = time.monotonic()
        self.dead = {n: d for n, d in self.dead.items() if now - d[1] < DEAD_MEMORY_S}
        self.dead[node] = (stage, now)
        for outcome in self.plan.completions():
            self.manager.completed(self.active, outcome)
        self.update_pause()
        self.moved()
        self.spawn(self.recovery.recover(node, stage), f"recover {node}")
        self.spawn(self.recovery.later(node, stage), f"sweep {node}")

    # ------------------------------------------------------------------ restarts, pauses

    def _restart(self, reason: str, *, stalled: bool = False) -> None:
        if self._stopped or self.plan.injecting >= self.plan.iterations:
            return
        try:
            iteration, round_, holders, weights = self.plan.restart(reason, stalled=stalled)
        except ValueError as err:
            self.manager.fail(self.job_id, str(err))
            return
        self.moved()
        progress = self.progress()
        progress.restarts += 1
        # This iteration's drops are undone: the new round injects every microbatch again.
        kept = [e for e in progress.dropped if e.iteration != iteration]
        undone = sum(len(e.microbatches) for e in progress.dropped if e.iteration == iteration)
        del progress.dropped[:]
        progress.dropped.extend(kept)
        progress.dropped_microbatches -= undone
        self.log.warning("job %s iteration %d starts again as round %d: %s", self.job_id,
                         iteration, round_, reason, extra=job_event(self.job_id, iteration))
        self.manager.changed(self.active)
        request = job_pb2.RestartRequest(
            sender=self.host.node_id, job_id=self.job_id, iteration=iteration, round=round_,
            holders=holders, participants=participants_pb(self.plan.participants),
            reason=reason[:300], weights=weights,
        )
        for node in sorted(self.plan.participants):
            self.spawn(
                self.call_to(node, lambda stubs, t: stubs.jobs.Restart(request, timeout=t),
                         lambda: self.manager.restart(request)),
                "restart",
            )

    def update_pause(self) -> None:
        if self._stopped:
            return  # no longer this node's job to coordinate (over, or handed to another side)
        empty = self.plan.empty_stages()
        progress = self.progress()
        now = time.monotonic()
        if not all(self.entrance.check_empty(stage) for stage in empty):
            self._stopped = True
            return
        why = ""
        if empty:
            why = f"stage {empty[0]} has no live node: the job waits for a node to join it"
        elif not (quorum := self.plan.quorum()).ok:
            why = f"no quorum: {quorum.reason()}"
            if not self._stopped:
                self.probe.silent()
        if why and (self._paused_since is None or why != progress.paused):
            self._paused_since = self._paused_since or now
            progress.paused = why
            self.log.warning("job %s paused: %s", self.job_id, progress.paused)
            self.manager.changed(self.active)
        elif not why and self._paused_since is not None:
            progress.paused_s += now - self._paused_since
            self._paused_since = None
            progress.paused = ""
            self.log.info("job %s resumes: every stage has a live node", self.job_id)
            self.manager.changed(self.active)

    async def _watch(self) -> None:
        while not self._stopped and self.plan.injecting < self.plan.iterations:
            await asyncio.sleep(self.host.config.watchdog_s)
            if not self.plan.empty_stages():
                self.update_pause()  # the quorum comes and goes with probes and heals
                if self._paused_since is None:
                    self._try_commit()  # it may have come back with all the work done
            if self._paused_since is not None:
                self.moved()
                continue
            limit = self.stall_limit()
            if time.monotonic() - self._last_progress < limit:
                continue
            # A stalled round asks its participants where they are: one that follows another
            # coordinator, which went on or has the smaller id (this node took the job over
            # while that one lived), makes this one yield and enter through it (4.5).
            self.probe.ask(sorted(self.live_participants()))
            if not self._swept and self.dead:
                self._swept = True
                self._last_progress = time.monotonic()
                self.log.warning(
                    "job %s iteration %d made no progress for %.0f s: the dead nodes' ledgers "
                    "are swept again", self.job_id, self.plan.injecting, limit,
                )
                for dead, (stage, _) in sorted(self.dead.items()):
                    self.spawn(self.recovery.recover(dead, stage), f"sweep {dead}")
                continue
            self._restart(f"no progress for {limit:.0f} s", stalled=True)

    # ------------------------------------------------------------------ joiners

    def enter(self, request: job_pb2.EnterRequest) -> job_pb2.EnterReply:
        """A joiner asks whom to fetch its stage's state from, or to take part with the state
        it holds (gwtf.node.jobs.coordinator.entrance)."""
        reply = self.entrance.enter(request)
        if reply.admitted:
            self.moves.entered(request.sender, request.stage)
        if request.has_state:
            self._try_commit()  # its wait may have held the commit
        return reply

    # ------------------------------------------------------------------ taking over

    @classmethod
    async def take_over(cls, manager: Manager, active: ActiveJob) -> JobCoordinator | None:
        """This node coordinates now (the previous coordinator died): see the module doc."""
        host = manager.host
        me = host.node_id
        live = {
            p: s for p, s in active.participants.items()
            if (p == me or host.member(p) is not None) and p not in active.departed
        }
        holders = sorted(p for p, s in live.items() if s == 0)
        if not holders or me not in holders:
            return None
        request = job_pb2.SyncRequest(sender=me, job_id=active.job_id)
        replies: dict[str, job_pb2.SyncReply] = {}

        async def ask(node: str) -> None:
            if node == me:
                reply = manager.sync(request)
            else:
                member = host.member(node)
                if member is None:
                    return
                try:
                    reply = await manager.call(
                        lambda stubs, t: stubs.jobs.Sync(request, timeout=t), member,
                        host.config.rpc_timeout_s, attempts=5,
                    )
                except RuntimeError:
                    return
            replies[node] = reply

        await asyncio.gather(*(ask(n) for n in sorted(live)))
        if not replies:
            return None
        # A death noticed while the participants were asked has no coordinator yet to hear of
        # it: leave the dead out now, or a stage they emptied looks held and the round restarts
        # for good (one in three fresh-clone CI runs, a stage wiped with its coordinator).
        live = {p: s for p, s in live.items() if p == me or host.member(p) is not None}
        holders = sorted(p for p, s in live.items() if s == 0)
        top = max(r.iteration for r in replies.values())
        job = active.job
        ahead = [r for r in replies.values() if r.iteration == top and r.stepped]
        progress = manager.progress_record(active.job_id)
        if ahead and ahead[0].stepped_iteration == top - 1:
            last = ahead[0]
            # The predecessor ordered the step of top - 1: finish it where it did not arrive.
            for node, reply in sorted(replies.items()):
                if reply.iteration == top - 1 and reply.prepared:
                    step = job_pb2.StepRequest(
                        sender=me, job_id=active.job_id, iteration=top - 1, round=reply.round,
                        attempt=reply.attempt, final=top >= job.iterations,
                        next_holders=holders, participants=participants_pb(live),
                        loss=last.stepped_loss, trained=last.stepped_trained,
                        periodic=last.stepped_periodic, floor=last.floor,
                    )
                    if node == me:
                        manager.step(step)
                    else:
                        member = host.member(node)
                        if member is not None:
                            try:
                                await manager.call(
                                    _step_call(step),
                                    member, host.config.rpc_timeout_s, attempts=3,
                                )
                            except RuntimeError:
                                pass
            if progress.iterations_completed == top - 1:  # the one it stepped and not told
                manager.completed(active, IterationOutcome(
                    iteration=progress.iterations_completed, loss=last.stepped_loss,
                    microbatches=last.stepped_trained,
                    final=progress.iterations_completed + 1 >= job.iterations,
                    mismatched=(), routes={}, digests={},
                    dropped=tuple(m for e in last.stepped_dropped for m in e.microbatches),
                ))
        if top >= job.iterations or not manager.holds(active):
            # Over, or this node dropped its part while it asked (its side was stale after a
            # heal, and it enters the job through the other side's coordinator): a coordinator
            # started now would restart rounds nobody follows, and its record would name it.
            return None
        round_ = max((r.round for r in replies.values() if r.iteration == top), default=0)
        # The periodic boundaries the job declared, as this node's stage knows them (every
        # participant has all of them, from the step orders and its entry).
        declared, floor = active.worker.declared() if active.worker is not None else ((), 0)
        plan = IterationCoordinator(
            iterations=job.iterations, microbatches=job.microbatches, participants=live,
            num_stages=host.num_stages(), holders=holders, iteration=top, round_=round_,
            base=active.base or active.participants, snapshot_every=job.snapshot_every,
            snapshot_start=progress.resumed_from, declared=declared, floor=floor,
        )
        coordinator = cls(manager, active, plan)
        host.log.warning("job %s: %s coordinates from iteration %d", active.job_id, me, top)
        coordinator.start()
        coordinator._restart("its coordinator died")
        return coordinator
