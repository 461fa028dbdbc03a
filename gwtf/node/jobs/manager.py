"""JobManager: training jobs on a node: submission, spreading, the commit coordinator, progress,
crash recovery and joins (docs/design.md 1, 3, 4).

    submit (any node)  -> check the job, the cut into the swarm's stages, a live node per stage
                       -> Prepare at every live member (each builds its stage, loads torch then)
                       -> Start at every member that prepared: participants, holders, coordinator
    holders inject, microbatches flow (gwtf.node.worker.worker), holders report each finished one
    coordinator        -> Commit(k) (phase one) to every live participant, Prepared back,
                          Step(k) (phase two), Committed back
                          (gwtf.node.jobs.coordinator.coordinator)
                       -> once all have, Progress (loss, checksums, recovery counts) to every
                          live member

Any node answers `Watch` and `List` from its own copy of the progress, which the coordinator
spreads after every iteration and on every crash, join or pause.

The coordinator of a job is the live data holder with the smallest id among the participants:
holders start iterations, so the commit order leaves from where the next iteration begins. When a
participant dies or leaves, the coordinator recovers its work by the rules of docs/design.md 4
(`gwtf.node.jobs.coordinator.coordinator`, with `gwtf.recovery`); when the coordinator itself dies,
the next holder takes over. A node that joins the swarm while a job runs fetches its stage's weights
and optimizer state from a live peer (`FetchState`, streamed; another donor if one dies
mid-transfer) and enters at an iteration boundary. Every stage keeps snapshots of its state at a
node of another stage, so that a stage that loses every node resumes when one joins it, the swarm
rolling back to the snapshot's iteration if it is older (docs/design.md 4.6). A node that leaves
gracefully first lets the iteration in progress step (`drain`).

One job runs at a time; a submission while one runs is refused (the same job again returns its
id, and so does the same job once it completed: a job is never trained twice; a failed or
cancelled one may be submitted again).

JobManager is the face the node and its servicers see (every call of the job service lands on
one of its methods) and the job's life: iterations completed, exclusions, progress heard from the
coordinator, failure, members going down, a coordinator taking over. The rest is its
collaborators', which share one `JobBook` (gwtf.node.jobs.book: the records and the job in hand):

    launcher     JobLauncher: torch loaded once, jobs read, submitted, prepared and started
    calls        JobCalls: the coordinator's and participants' calls, checked, to the coordinator
                 or the worker
    wire         JobWire: calls out: retried calls, progress and failures spread, reports to
                 the coordinator
    transfer     StateTransfer: stage states to joiners, stage snapshots (4.6), resumes,
                 final weights
    joiner       Joiner: entering a running job, and adopting one whose holders all died
    gwtf.job.roster  the rules on participants (succession, last replica), pure
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

from gwtf.flow.topology import LinkSpec
from gwtf.job.iterations import CommittedReport, IterationOutcome, PreparedReport
from gwtf.job.nexthop import next_hop_weights
from gwtf.job.roster import live_holders
from gwtf.job.snapshots import SnapshotPolicy, snapshot_sender
from gwtf.node.control.membership import MemberInfo
from gwtf.node.errors import UnknownJob
from gwtf.node.jobs.book import OVER, CurrentJob, JobBook, stop_worker
from gwtf.node.jobs.calls import JobCalls
from gwtf.node.jobs.coordinator.coordinator import JobCoordinator
from gwtf.node.jobs.coordinator.moves import leave_for
from gwtf.node.jobs.heal import Healer
from gwtf.node.jobs.host import JobsHost
from gwtf.node.jobs.joiner import Joiner
from gwtf.node.jobs.launcher import MAX_JOB_JSON, JobLauncher
from gwtf.node.jobs.transfer import MAX_STATE_BYTES, STATE_CHUNK_BYTES, StateTransfer
from gwtf.node.jobs.wire import JobWire
from gwtf.node.observe import JobMetrics, job_event
from gwtf.node.rpc.codec import InvalidMessage, check_name
from gwtf.node.rpc.transport import Stubs
from gwtf.v1 import job_pb2, job_pb2_grpc

__all__ = ["MAX_JOB_JSON", "MAX_STATE_BYTES", "STATE_CHUNK_BYTES", "JobManager", "JobsHost"]


class JobManager:
    """The jobs of one node: see the module docstring."""

    def __init__(self, host: JobsHost) -> None:
        self.host = host
        self.book = JobBook()
        self.metrics = JobMetrics()
        """The job runtime's Prometheus families (the node serves them with its own)."""
        self.wire = JobWire(host, self.book)
        self.transfer = StateTransfer(host, self.book)
        self.calls = JobCalls(host, self.book, self.completed)
        self.launcher = JobLauncher(host, self.book, self.wire, self.transfer, self,
                                    lambda job_id: _WorkerHost(self, job_id))
        self.joiner = Joiner(host, self.book, self.wire, self.launcher, self.transfer,
                             self.fail, self._take_over)
        self.healer = Healer(host, self.book, self.joiner)
        self._data_servicer: Any = None
        self._spread_pending = False

    # The job in hand and the records, as they were before the book held them (the unit tests
    # of the participants' calls set them directly).
    @property
    def _active(self) -> CurrentJob | None:
        return self.book.active

    @_active.setter
    def _active(self, active: CurrentJob | None) -> None:
        self.book.active = active

    @property
    def _records(self) -> dict[str, job_pb2.JobProgress]:
        return self.book.records

    # ================================================================== torch, the data plane

    async def preload(self, device: str, precision: str, threads: int | None) -> None:
        """Load torch and the worker before this node is in a swarm (gwtf.node.jobs.launcher)."""
        await self.launcher.preload(device, precision, threads)

    @property
    def placement(self) -> Any:
        """Where stages run (a gwtf.train.device.Placement), chosen at `preload`."""
        return self.launcher.placement

    @property
    def loaded(self) -> bool:
        """torch and the worker are loaded (a job arrived here once)."""
        return self.launcher.loaded

    def data_servicer(self) -> Any:
        """The data plane's servicer (gwtf.node.dataplane.tensors), once torch is loaded; None
        before."""
        if self._data_servicer is None and self.launcher.loaded:
            from gwtf.node.dataplane.tensors import DataPlaneServicer, TensorLimits

            self._data_servicer = DataPlaneServicer(
                self.calls.on_tensors, TensorLimits(), expect=self.calls.expect,
                pace=self.host.live_pace_s,
            )
        return self._data_servicer

    def screens(self, job_id: str) -> bool:
        return self.calls.screens(job_id)

    def contribution_expect(self, header: Any) -> int:
        return self.calls.contribution_expect(header)

    def on_contribution(self, header: Any, flat: Any) -> bool:
        return self.calls.on_contribution(header, flat)

    # ================================================================== the client's calls

    def progress(self, job_id: str) -> job_pb2.JobProgress | None:
        return self.book.records.get(job_id)

    def list_jobs(self) -> job_pb2.ListReply:
        return self.book.list_jobs()

    def watch(self, request: job_pb2.WatchRequest) -> AsyncIterator[job_pb2.JobProgress]:
        return self.book.watch(request.job_id, self.host.node_id)

    async def submit(self, request: job_pb2.SubmitRequest) -> job_pb2.SubmitReply:
        return await self.launcher.submit(request)

    def cancel(self, request: job_pb2.CancelRequest) -> job_pb2.CancelReply:
        """A user stops the job: it fails on every member, with the user's reason."""
        check_name("job id", request.job_id)
        progress = self.book.records.get(request.job_id)
        if progress is None:
            raise UnknownJob(f"{self.host.node_id} knows no job {request.job_id[:40]!r}")
        reason = request.reason[:500].strip() or "no reason given"
        self.fail(request.job_id, f"cancelled by the user: {reason}")
        return job_pb2.CancelReply(state=progress.state)

    def fetch_weights(self, request: job_pb2.WeightsRequest) -> AsyncIterator[job_pb2.StateChunk]:
        return self.transfer.fetch_weights(request)

    async def resume(self, chunks: AsyncIterator[job_pb2.StateChunk]) -> job_pb2.BackupAck:
        return await self.transfer.resume(chunks)

    # ================================================================== preparation, start

    async def prepare(self, request: job_pb2.PrepareRequest) -> job_pb2.PrepareReply:
        return await self.launcher.prepare(request)

    def start(self, request: job_pb2.StartRequest) -> job_pb2.StartReply:
        return self.launcher.start(request)

    # ================================================================== coordinator's calls

    def done(self, request: job_pb2.DoneRequest) -> job_pb2.DoneReply:
        return self.calls.done(request)

    def replayed(self, request: job_pb2.ReplayedRequest) -> job_pb2.ReplayedReply:
        return self.calls.replayed(request)

    def prepared(self, request: job_pb2.PreparedRequest) -> job_pb2.PreparedReply:
        return self.calls.prepared(request)

    def committed(self, request: job_pb2.CommittedRequest) -> job_pb2.CommittedReply:
        return self.calls.committed(request)

    def enter(self, request: job_pb2.EnterRequest) -> job_pb2.EnterReply:
        return self.calls.enter(request)

    # ================================================================== participants' calls

    def commit(self, request: job_pb2.CommitRequest) -> job_pb2.CommitReply:
        return self.calls.commit(request)

    def step(self, request: job_pb2.StepRequest) -> job_pb2.StepReply:
        return self.calls.step(request)

    async def report(self, request: job_pb2.ReportRequest) -> job_pb2.ReportReply:
        return await self.calls.report(request)

    def recover(self, request: job_pb2.RecoverRequest) -> job_pb2.RecoverReply:
        return self.calls.recover(request)

    async def keep(self, request: job_pb2.KeepRequest) -> job_pb2.KeepReply:
        return await self.calls.keep(request)

    def redirect(self, request: job_pb2.RedirectRequest) -> job_pb2.RedirectReply:
        return self.calls.redirect(request)

    def restart(self, request: job_pb2.RestartRequest) -> job_pb2.RestartReply:
        return self.calls.restart(request)

    def sync(self, request: job_pb2.SyncRequest) -> job_pb2.SyncReply:
        return self.calls.sync(request)

    def admit(self, request: job_pb2.AdmitRequest) -> job_pb2.AdmitReply:
        return self.calls.admit(request)

    # ================================================================== state transfer

    def fetch_state(self, request: job_pb2.StateRequest) -> AsyncIterator[job_pb2.StateChunk]:
        return self.transfer.fetch_state(request)

    def fetch_steps(self, request: job_pb2.StateRequest) -> AsyncIterator[job_pb2.StateChunk]:
        return self.transfer.fetch_steps(request)

    async def backup(self, chunks: AsyncIterator[job_pb2.StateChunk]) -> job_pb2.BackupAck:
        return await self.transfer.backup(chunks)

    def keepers_of(self, job_id: str, stage: int) -> list[str]:
        return self.transfer.keepers_of(job_id, stage)

    def snapshot_iterations(self, job_id: str, stage: int) -> set[int]:
        return self.transfer.snapshot_iterations(job_id, stage)

    async def keep_backup(self, job_id: str, stage: int, iteration: int, data: bytes,
                          periodic: bool = False) -> bool:
        return await self.transfer.keep_backup(job_id, stage, iteration, data, periodic)

    async def learn_jobs(self, address: str) -> None:
        """A joiner learns the jobs its bootstrap node knows, and enters a running one."""
        await self.joiner.learn_jobs(address)

    # ================================================================== the coordinator's use

    async def call(
        self,
        call: Callable[[Stubs, float], Awaitable[Any]],
        member: MemberInfo,
        timeout_s: float,
        *,
        attempts: int = 3,
    ) -> Any:
        """A call to a member, retried while it does not answer (gwtf.node.jobs.wire)."""
        return await self.wire.call(call, member, timeout_s, attempts=attempts)

    def progress_record(self, job_id: str) -> job_pb2.JobProgress:
        return self.book.records[job_id]

    def changed(self, active: CurrentJob) -> None:
        """The coordinator's record of the job changed (a crash, a pause, a join): every member
        hears of it, at most a few times a second."""
        progress = self.book.records[active.job_id]
        self.book.record(progress)
        if self._spread_pending:
            return
        self._spread_pending = True

        async def later() -> None:
            await asyncio.sleep(self.host.config.spread_gap_s)
            self._spread_pending = False
            self.wire.spread_progress(self.book.records[active.job_id])

        self.host.spawn(later(), "spread progress")

    def completed(self, active: CurrentJob, outcome: IterationOutcome) -> None:
        """The coordinator's iteration committed everywhere: the record counts it (a final one
        completes the job), every member hears of it, and outvoted replicas are excluded."""
        progress = self.book.records[active.job_id]
        if outcome.iteration < progress.iterations_completed:
            return
        self.book.tally(active, outcome, time.monotonic())
        log = self.host.log
        if outcome.mismatched:
            log.error(
                "job %s iteration %d: the parameters of %s differ from their stage peers'",
                active.job_id, outcome.iteration, ", ".join(outcome.mismatched),
            )
        outvoted = outcome.outvoted if active.job.aggregation.robust and not outcome.final else ()
        log.info(
            "job %s iteration %d/%d committed: loss %.4f, %d microbatches, %.2f s",
            active.job_id, outcome.iteration + 1, active.job.iterations, outcome.loss,
            outcome.microbatches, progress.iteration_s[-1],
            extra=job_event(active.job_id, outcome.iteration),
        )
        if outcome.final:
            from gwtf.train.state import checksum_of_digests

            if outcome.digests:
                progress.param_checksum = checksum_of_digests(outcome.digests)
            progress.state = job_pb2.JOB_STATE_COMPLETED
            if active.coord is not None:
                active.coord.stop()
            log.info(
                "job %s completed: %d iterations, %.2f microbatches/s, checksum %s; %d crashes, "
                "%d rerouted, %d replayed (%.2f s of %.2f s compute), %d dropped, %d lost, "
                "%d restarts", active.job_id, progress.iterations_completed,
                progress.throughput_mb_s, progress.param_checksum[:16], progress.crashes,
                progress.rerouted_microbatches, progress.replayed_microbatches,
                progress.replayed_s, progress.compute_s, progress.dropped_microbatches,
                progress.lost_microbatches, progress.restarts,
            )
        self.book.record(progress)
        self.wire.spread_progress(progress)
        for node in outvoted:
            stage = active.participants.get(node, 0)
            self.exclude(
                active, node, stage, outcome.iteration,
                f"its stage-{stage} parameters after the step of iteration {outcome.iteration} "
                "differ from those of the majority of its stage's replicas",
            )

    # ================================================================== bad peers

    def excluded(self, job_id: str) -> list[str]:
        """The replicas excluded from the job so far, in order."""
        return [e.node for e in self.book.records[job_id].excluded]

    def exclude(self, active: CurrentJob, node: str, stage: int, iteration: int, reason: str
                ) -> None:
        """The coordinator excludes `node` from the job (a bad peer, see
        gwtf.node.jobs.coordinator.coordinator)."""
        progress = self.book.records[active.job_id]
        if node in self.excluded(active.job_id) or progress.state != job_pb2.JOB_STATE_RUNNING:
            return
        if node == self.host.node_id:
            # The coordinator cannot hand itself over here; its peers' votes are logged.
            self.host.log.error("job %s: this coordinator was named a bad peer: %s",
                                active.job_id, reason)
            return
        progress.excluded.append(
            job_pb2.Exclusion(node=node, stage=stage, iteration=iteration, reason=reason)
        )
        self.host.log.warning("job %s iteration %d: %s (stage %d) is excluded from the job: %s",
                              active.job_id, iteration, node, stage, reason)
        self.calls.excluded_here(active, [node])
        if active.coord is not None:
            active.coord.exclude(node)
        self.book.record(progress)
        self.wire.spread_progress(progress)

    # ================================================================== the coordinator's progress

    def on_progress(self, request: job_pb2.ProgressRequest) -> job_pb2.ProgressReply:
        progress = request.progress
        check_name("job id", progress.job_id)
        known = self.book.records.get(progress.job_id)
        active = self.book.current(progress.job_id)
        if active is not None and active.coord is None and request.sender != active.coordinator:
            self.host.log.info(
                "job %s: the record of %s, which this node does not follow (it follows %s): "
                "%d iterations completed", progress.job_id, request.sender[:40],
                active.coordinator, progress.iterations_completed,
            )
        if active is not None and self.healer.stale(active, request.sender, progress):
            self.healer.resync(
                active, request.sender,
                f"{request.sender} completed iteration {progress.iterations_completed - 1} "
                "without it", progress,
            )
            return job_pb2.ProgressReply()
        if active is not None:
            if active.coord is not None:
                return job_pb2.ProgressReply()  # this node's own record is the job's
            if active.worker is not None and request.sender != active.coordinator and (
                active.participants.get(request.sender) != 0
            ):
                raise InvalidMessage(f"{request.sender[:40]!r} does not coordinate the job")
        if known is not None and (
            known.state in OVER or progress.iterations_completed < known.iterations_completed
        ):
            return job_pb2.ProgressReply()  # older news
        if active is not None and progress.excluded:
            self.calls.excluded_here(active, [e.node for e in progress.excluded])
        self.book.record(progress)
        if progress.state in OVER and active is not None:
            stop_worker(self.host, active)
        # A node that joined while the job was being prepared hears of it running here.
        self.joiner.hear_running(progress)
        return job_pb2.ProgressReply()

    # ================================================================== reports to the coordinator

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """From this node's worker: it stepped an iteration."""
        active = self.book.current(job_id)
        if active is None:
            return
        request = job_pb2.CommittedRequest(
            sender=report.sender,
            job_id=job_id,
            iteration=report.iteration,
            stage=report.stage,
            checksum=report.checksum,
            digests=[job_pb2.DigestEntry(name=n, digest=d) for n, d in sorted(
                report.digests.items())],
            snapshots_landed=report.snapshots_landed,
            snapshot_lacking=report.snapshot_lacking,
        )
        self.wire.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Committed(request, timeout=t),
            lambda: self.committed(request),
        )
        if report.iteration == active.job.iterations - 1 and active.worker is not None:
            worker, active.worker = active.worker, None
            self.transfer.keep_final_weights(job_id, worker)
        move = active.moving
        if move is not None and move.iteration == report.iteration:
            active.moving = None
            self.host.spawn(leave_for(self, active, move), "move")

    # ================================================================== failure

    def fail(self, job_id: str, reason: str, *, spread: bool = True) -> None:
        """The job cannot go on: record why, stop this node's part, tell every member."""
        progress = self.book.records.get(job_id)
        if progress is None or progress.state in OVER:
            return
        progress.state = job_pb2.JOB_STATE_FAILED
        progress.error = reason
        self.book.record(progress)
        self.host.log.error("job %s failed: %s", job_id, reason)
        active = self.book.active
        if active is not None and active.job_id == job_id:
            if active.coord is not None:
                active.coord.stop()
            stop_worker(self.host, active)
        if spread:
            self.host.spawn(
                self.wire.spread_fail(job_id, reason, self.wire.everyone(active), self._fail_here),
                "fail",
            )

    def _fail_here(self, job_id: str, reason: str) -> None:
        self.fail(job_id, reason, spread=False)

    def on_fail(self, request: job_pb2.FailRequest) -> job_pb2.FailReply:
        check_name("job id", request.job_id)
        reason = request.reason[:500] or "no reason given"
        self.fail(request.job_id, f"{reason} (reported by {request.sender[:40]})", spread=False)
        return job_pb2.FailReply()

    def holds(self, active: CurrentJob) -> bool:
        """Is `active` still this node's part of its job (not dropped by a resync)?"""
        return self.book.active is active

    def resync(self, active: CurrentJob, coordinator: str, reason: str) -> None:
        """This node's side of a partition fell behind: enter the job again through
        `coordinator` (gwtf.node.jobs.heal)."""
        self.healer.resync(active, coordinator, reason)

    def on_member_down(self, member: MemberInfo, verb: str) -> None:
        """A member died or left: if it took part in the running job, its work is recovered
        (docs/design.md 4), and if it coordinated the job, the next data holder takes over
        (4.5); a stage it left thin snapshots its state (4.6). A death is confirmed first
        (gwtf.node.jobs.heal): a participant that still answers with its part of the job was
        declared dead by nodes that lost sight of it, and stays."""
        active = self.book.active
        if active is None or member.id not in active.participants:
            return
        progress = self.book.records[active.job_id]
        if progress.state != job_pb2.JOB_STATE_RUNNING or member.id in active.departed:
            return
        if verb == "left" or member.id in self.book.vouched:
            self._member_down(active, member, verb)
            return

        async def confirm() -> None:
            seen = await self.healer.confirm(member, active.job_id)
            if self.book.active is not active or member.id in active.departed:
                return
            if seen == "alive":
                self.host.log.warning(
                    "job %s: %s was declared dead but answers with its part of the job (the "
                    "far side of a partition lost sight of it): it stays", active.job_id,
                    member.id,
                )
                if active.coord is not None:
                    active.coord.came_back(member.id)
                return
            self._member_down(active, member, verb, gone=seen == "gone")

        self.host.spawn(confirm(), f"confirm {member.id}")

    def on_member_up(self, member: MemberInfo) -> None:
        """A member is alive again (a new incarnation): if the running job had taken it for
        dead, ask it where it is; a job that went on without this node's side makes this node
        stale (gwtf.node.jobs.heal)."""
        active = self.book.active
        if active is None or member.id not in active.departed:
            return
        if self.book.records[active.job_id].state != job_pb2.JOB_STATE_RUNNING:
            return
        self.host.spawn(self.healer.returned(active, member), f"ask {member.id}")

    def _member_down(self, active: CurrentJob, member: MemberInfo, verb: str, *,
                     gone: bool = False) -> None:
        progress = self.book.records[active.job_id]
        if progress.state != job_pb2.JOB_STATE_RUNNING or member.id in active.departed:
            return
        me = self.host.node_id
        active.departed.add(member.id)
        worker = active.worker
        if worker is not None:
            worker.depart(member.id, crashed=verb != "left")
        stage = active.participants[member.id]
        how = "left" if verb == "left" else "crashed"
        self.metrics.count("gwtf_job_participants_down", active.job_id, how)
        iteration = worker.iteration if worker is not None else progress.iterations_completed
        self.host.log.info(
            "job %s it %d: participant %s (stage %d) %s; no microbatch goes to it", active.job_id,
            iteration, member.id, stage, how, extra=job_event(active.job_id, iteration),
        )
        if active.coord is not None:
            if verb == "left":
                progress.leaves += 1
            else:
                progress.crashes += 1
            active.coord.member_down(member, verb, gone=gone)
        if worker is not None and stage == worker.stage:
            sender, live = snapshot_sender(
                active.participants, active.departed, stage,
                lambda p: p == me or self.host.member(p) is not None,
            )
            policy = SnapshotPolicy(active.job.snapshot_every, active.job.snapshot_thin,
                                    start=progress.resumed_from)
            if sender == me and (policy.is_thin(live) or (
                    member.id < me and policy.periodic(worker.iteration))):
                # Its stage got thin, or its snapshot sender died in the iteration of a
                # periodic boundary, maybe with a copy of it on the way: send this node's
                # state of the iteration's start, so that it lands at every keeper (4.6).
                self.transfer.send_backup(active.job_id)
        if member.id == active.coordinator:
            holders = live_holders(active.participants, active.departed,
                                   lambda p: p == me or self.host.member(p) is not None)
            if not holders:
                # Rule 5 for stage 0: the job waits until a holder joins, which takes the
                # last holder's state from its backup and coordinates (gwtf.node.jobs.joiner).
                progress.paused = ("stage 0 has no live node: the job waits for a data holder "
                                   "to join")
                self.book.record(progress)
                self.host.log.warning("job %s paused: %s", active.job_id, progress.paused)
                return
            active.coordinator = holders[0]
            self.host.log.warning("job %s: its coordinator %s %s; %s takes over",
                                  active.job_id, member.id, verb, holders[0])
            if holders[0] == me and active.coord is None:
                self.host.spawn(self._take_over(active, verb), "take over")

    async def _take_over(self, active: CurrentJob, verb: str) -> None:
        active.taking_over = True
        try:
            coord = await JobCoordinator.take_over(self, active)
        finally:
            active.taking_over = False
        if coord is None:
            return
        progress = self.book.records[active.job_id]
        progress.coordinator = self.host.node_id
        progress.paused = ""
        # The job's clock goes on from its progress (this node may have entered it late).
        active.started = time.monotonic() - progress.elapsed_s
        if verb == "left":
            progress.leaves += 1
        elif verb:
            progress.crashes += 1
        active.coord = coord
        # The pause cleared above was the holder-less one; the coordinator, which may have set
        # its own while it took over (a stage emptied with the coordinator), says it again.
        coord.update_pause()
        self.changed(active)

    # ================================================================== leaving, closing

    async def drain(self) -> None:
        """A graceful leave: let the iteration in progress step here first, so that nothing
        this node accumulated must be replayed (bounded by `drain_timeout_s`)."""
        active = self.book.active
        if active is None or active.worker is None:
            return
        if self.book.records[active.job_id].state != job_pb2.JOB_STATE_RUNNING:
            return
        worker = active.worker
        start = worker.iteration
        deadline = time.monotonic() + self.host.config.drain_timeout_s
        self.host.log.info("job %s: draining iteration %d before leaving", active.job_id, start)
        while time.monotonic() < deadline and active.worker is worker:
            if worker.iteration > start:
                return
            await asyncio.sleep(self.host.config.step_poll_s)

    async def close(self) -> None:
        active = self.book.active
        if active is not None:
            if active.coord is not None:
                active.coord.stop()
            if active.worker is not None:
                await active.worker.stop()
                active.worker = None


class _WorkerHost:
    """The node as its StageWorker sees it."""

    def __init__(self, manager: JobManager, job_id: str) -> None:
        self._manager = manager
        self._host = manager.host
        self._job_id = job_id
        self._data_stubs: dict[str, Any] = {}
        self.node_id = manager.host.node_id
        self.log = manager.host.log
        self.metrics = manager.metrics

    def member(self, node_id: str) -> MemberInfo | None:
        return self._host.member(node_id)

    def known_member(self, node_id: str) -> MemberInfo | None:
        return self._host.known_member(node_id)

    def refused(self, member: MemberInfo) -> None:
        self._host.refused(member)

    def data_stub(self, member: MemberInfo) -> Any:
        """gwtf.node.dataplane.tensors' stub on the member's channel (it sends chunks as wire
        bytes)."""
        stub = self._data_stubs.get(member.address)
        if stub is None:
            from gwtf.node.dataplane.tensors import DataPlaneStub

            stub = DataPlaneStub(self._host.stubs(member).channel)
            self._data_stubs[member.address] = stub
        return stub

    def job_stub(self, member: MemberInfo) -> job_pb2_grpc.JobServiceStub:
        return self._host.stubs(member).jobs

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        return self._host.wan_delay(member, nbytes)

    def link(self, a: MemberInfo, b: MemberInfo) -> LinkSpec | None:
        return self._host.link(a, b)

    def next_hop_weights(self, capacities: Mapping[str, float]) -> tuple[dict[str, int], str]:
        return next_hop_weights(self._host.routes(), capacities, settled=self._host.settled())

    def routing(self) -> str:
        return self._host.routing()

    def compress(self, codecs: tuple[str, ...] | None) -> None:
        self._host.compress(codecs)

    def observe_compute(self, kind: str, started: float, ended: float,
                        device_s: float | None = None) -> None:
        self._host.observe_compute(kind, started, ended, device_s)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._host.spawn(coro, name)

    def report_done(self, job_id: str, iteration: int, round_: int,
                    microbatches: tuple[int, ...]) -> None:
        flow = self._manager.calls.holder_flow()
        request = job_pb2.DoneRequest(sender=self.node_id, job_id=job_id, iteration=iteration,
                                      round=round_, microbatches=microbatches,
                                      flow_units=flow or 0, flows_settled=flow is not None)
        self._manager.wire.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Done(request, timeout=t),
            lambda: self._manager.done(request),
        )

    def report_replayed(self, job_id: str, iteration: int, round_: int, mb: int,
                        stage: int) -> None:
        request = job_pb2.ReplayedRequest(sender=self.node_id, job_id=job_id,
                                          iteration=iteration, round=round_, microbatch=mb,
                                          stage=stage)
        self._manager.wire.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Replayed(request, timeout=t),
            lambda: self._manager.replayed(request),
        )

    def report_prepared(self, job_id: str, report: PreparedReport) -> None:
        request = job_pb2.PreparedRequest(
            sender=report.sender, job_id=job_id, iteration=report.iteration,
            round=report.round, attempt=report.attempt, stage=report.stage,
            contributed=sorted(report.contributed),
            losses=[job_pb2.LossEntry(microbatch=m, loss=v) for m, v in sorted(
                report.losses.items())],
            routes=[job_pb2.RouteCount(path=list(p), microbatches=c) for p, c in sorted(
                report.routes.items())],
            compute_s=report.compute_s, replayed_s=report.replayed_s,
            outliers=sorted(report.outliers),
        )
        self._manager.wire.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Prepared(request, timeout=t),
            lambda: self._manager.prepared(request),
        )

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        self._manager.report_committed(job_id, report)

    async def keep_backup(self, job_id: str, stage: int, iteration: int, state: bytes,
                          periodic: bool = False) -> bool:
        return await self._manager.keep_backup(job_id, stage, iteration, state, periodic)

    def fail(self, job_id: str, reason: str) -> None:
        self._manager.fail(job_id, reason)
