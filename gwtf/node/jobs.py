"""JobManager: training jobs on a node: submission, spreading, the commit coordinator, progress.

    submit (any node)  -> check the job, the cut into the swarm's stages, a live node per stage
                       -> Prepare at every live member (each builds its stage, loads torch then)
                       -> Start at every member that prepared: participants, holders, coordinator
    holders inject, microbatches flow (gwtf.node.worker), holders report Done to the coordinator
    coordinator        -> Commit(k) to every participant; they combine, step, report Committed
                       -> once all have, Progress (loss, checksums...) to every live member

Any node answers `Watch` and `List` from its own copy of the progress, which the coordinator
spreads after every iteration; a node that joins later asks its bootstrap node for the jobs it
knows (it does not take part in a running job: joining one needs the stage's weights, issue 6).

The coordinator of a job is the data holder with the smallest id among the participants: holders
start iterations, so the commit order leaves from where the next iteration begins. A participant
that dies or leaves ends the job with a clear error for now (recovery is issue 6, which plugs into
the per-iteration ledger the workers keep).

One job runs at a time; a submission while one runs is refused (the same job again returns its
id). torch is imported only when a job arrives (`_load`), in a thread, so that a node that only
routes starts fast and its event loop keeps answering heartbeats meanwhile.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from grpc import aio

from gwtf.node.codec import InvalidMessage, check_name
from gwtf.node.config import NodeConfig
from gwtf.node.iterations import (
    CommitOrder,
    CommittedReport,
    IterationCoordinator,
    IterationOutcome,
    ReportError,
)
from gwtf.node.membership import MemberInfo
from gwtf.node.server import Refusal
from gwtf.node.transport import Stubs
from gwtf.node.wrr import next_hop_weights
from gwtf.v1 import job_pb2, job_pb2_grpc

if TYPE_CHECKING:
    from gwtf.node.worker import StageWorker

__all__ = ["JobManager", "JobsHost", "MAX_JOB_JSON"]

LOG = logging.getLogger("gwtf.node.jobs")

MAX_JOB_JSON = 64 * 1024
"""Largest job description accepted (a job file is a few hundred bytes)."""

UNDER_WAY = (job_pb2.JOB_STATE_PREPARING, job_pb2.JOB_STATE_RUNNING)
OVER = (job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED)


class JobsHost(Protocol):
    """What the job manager needs from its node (gwtf.node.node.Node)."""

    node_id: str
    config: NodeConfig
    log: logging.LoggerAdapter[logging.Logger]

    def own_stage(self) -> int: ...

    def num_stages(self) -> int: ...

    def live_members(self) -> list[MemberInfo]:
        """The live members other than this node."""
        ...

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member with this id, this node included."""
        ...

    def known_member(self, node_id: str) -> MemberInfo | None:
        """The latest incarnation of `node_id` this node knows, alive or not."""
        ...

    def stubs(self, member: MemberInfo) -> Stubs: ...

    def stubs_at(self, address: str) -> Stubs: ...

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float: ...

    def settled(self) -> bool: ...

    def routes(self) -> dict[str, int]: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    @property
    def memory_slots(self) -> int: ...

    @property
    def trains(self) -> bool: ...

    @property
    def emulate_compute_s(self) -> float | None: ...


@dataclass
class _Active:
    """The job this node is preparing or running."""

    job: Any  # gwtf.train.JobConfig (torch is loaded lazily)
    job_id: str
    job_json: str
    worker: StageWorker | None
    participants: dict[str, int] = field(default_factory=dict)
    coordinator: str = ""
    holders: tuple[str, ...] = ()
    plan: IterationCoordinator | None = None
    started: float = 0.0
    last_iteration_end: float = 0.0
    routes: dict[tuple[str, ...], int] = field(default_factory=dict)


def _state_name(state: int) -> str:
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


class JobManager:
    """The jobs of one node: see the module docstring."""

    def __init__(self, host: JobsHost) -> None:
        self.host = host
        self._records: dict[str, job_pb2.JobProgress] = {}
        self._active: _Active | None = None
        self._changed = asyncio.Event()
        self._module: ModuleType | None = None
        self._data_servicer: Any = None
        self._submitting = asyncio.Lock()

    # ================================================================== lazy torch

    async def _load(self) -> ModuleType:
        """gwtf.node.worker (torch, gwtf.train), imported once, in a thread."""
        if self._module is None:
            import os

            # One intra-op thread, as the reference runs to give the same bits (and the machine
            # is shared by every node of a local swarm).
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            self._module = await asyncio.to_thread(importlib.import_module, "gwtf.node.worker")
        return self._module

    async def preload(self) -> None:
        """Load torch and the worker now, before this node is in a swarm."""
        await self._load()

    async def _parse(self, text: str) -> Any:
        """A JobConfig from the wire's JSON; InvalidMessage (INVALID_ARGUMENT) if wrong."""
        if len(text) > MAX_JOB_JSON:
            raise InvalidMessage(f"the job description is over {MAX_JOB_JSON} bytes")
        await self._load()
        from gwtf.train.job import JobError, job_from_dict

        try:
            table = json.loads(text)
        except ValueError:
            raise InvalidMessage("the job description is not JSON") from None
        if not isinstance(table, dict):
            raise InvalidMessage("the job description is not a JSON object")
        try:
            return job_from_dict(table)
        except (JobError, TypeError) as err:
            raise InvalidMessage(f"invalid job: {err}") from None

    @property
    def loaded(self) -> bool:
        """torch and the worker are loaded (a job arrived here once)."""
        return self._module is not None

    def data_servicer(self) -> Any:
        """The data plane's servicer (gwtf.node.tensors), once torch is loaded; None before."""
        if self._data_servicer is None and self._module is not None:
            from gwtf.node.tensors import DataPlaneServicer, TensorLimits

            self._data_servicer = DataPlaneServicer(
                self._on_tensors, TensorLimits(), expect=self._expect
            )
        return self._data_servicer

    def _worker_for(self, job_id: str) -> StageWorker:
        active = self._active
        if active is None or active.job_id != job_id or active.worker is None:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.host.node_id} does not take part in job {job_id[:40]!r}",
            )
        progress = self._records[job_id]
        if progress.state in OVER:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job_id} is {_state_name(progress.state)} on {self.host.node_id}",
            )
        return active.worker

    def _expect(self, tag: Any, name: str) -> Any:
        return self._worker_for(tag.job_id).expect(tag, name)

    async def _on_tensors(self, tag: Any, tensors: Any) -> None:
        await self._worker_for(tag.job_id).on_tensors(tag, tensors)

    # ================================================================== progress

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _record(self, progress: job_pb2.JobProgress) -> None:
        self._records[progress.job_id] = progress
        self._notify()

    def progress(self, job_id: str) -> job_pb2.JobProgress | None:
        return self._records.get(job_id)

    def list_jobs(self) -> job_pb2.ListReply:
        return job_pb2.ListReply(jobs=list(self._records.values()))

    async def watch(self, request: job_pb2.WatchRequest) -> AsyncIterator[job_pb2.JobProgress]:
        if request.job_id not in self._records:
            raise Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"no job {request.job_id[:40]!r} is known at {self.host.node_id}",
            )
        sent: job_pb2.JobProgress | None = None
        while True:
            changed = self._changed
            progress = self._records[request.job_id]
            if progress != sent:
                sent = job_pb2.JobProgress()
                sent.CopyFrom(progress)
                yield sent
            if progress.state in OVER:
                return
            await changed.wait()

    # ================================================================== submission

    async def submit(self, request: job_pb2.SubmitRequest) -> job_pb2.SubmitReply:
        job = await self._parse(request.job_json)
        async with self._submitting:
            return await self._submit(job)

    async def _submit(self, job: Any) -> job_pb2.SubmitReply:
        from gwtf.train.partition import PartitionError, partition

        host = self.host
        job_id: str = job.job_id
        active = self._active
        if active is not None and self._records[active.job_id].state == job_pb2.JOB_STATE_RUNNING:
            if active.job_id == job_id:
                return job_pb2.SubmitReply(job_id=job_id)
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {active.job_id} is {_state_name(self._records[active.job_id].state)} on "
                "this swarm; wait for it to end, then submit again",
            )
        stages = host.num_stages()
        try:
            partition(job.model.layers, stages)
        except PartitionError as err:
            raise InvalidMessage(f"this swarm has {stages} stages: {err}") from None
        members = [m for m in host.live_members()]
        me = host.member(host.node_id)
        assert me is not None
        members.append(me)
        by_stage: dict[int, list[str]] = {s: [] for s in range(stages)}
        for m in members:
            by_stage.setdefault(m.stage, []).append(m.id)
        empty = [s for s in range(stages) if not by_stage[s]]
        if empty:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"stage {empty[0]} of this swarm has no live node, so no microbatch can pass it; "
                f"start a node with --stage {empty[0]} and submit again",
            )
        job_json = json.dumps(job.to_dict(), sort_keys=True)
        host.log.info(
            "job %s submitted: %d iterations of %d microbatches; preparing %d members",
            job_id, job.iterations, job.microbatches, len(members),
        )
        prepare = job_pb2.PrepareRequest(sender=host.node_id, job_json=job_json)
        replies = await asyncio.gather(
            *(self._prepare_at(m, prepare) for m in members), return_exceptions=True
        )
        failures = [
            f"{m.id}: {reply}" for m, reply in zip(members, replies, strict=True)
            if isinstance(reply, BaseException)
        ]
        if failures:
            reason = f"the job could not be prepared on {failures[0]}"
            await self._spread_fail(job_id, reason, members)
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, reason)
        digests = {
            m.id: r.corpus_digest for m, r in zip(members, replies, strict=True)
            if m.stage == 0 and isinstance(r, job_pb2.PrepareReply)
        }
        if len(set(digests.values())) > 1:
            reason = (
                "the data holders read different training data ("
                + ", ".join(f"{n}: {d[:12]}" for n, d in sorted(digests.items()))
                + "); give every holder the same data file"
            )
            await self._spread_fail(job_id, reason, members)
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, reason)
        holders = sorted(by_stage[0])
        start = job_pb2.StartRequest(
            sender=host.node_id,
            job_id=job_id,
            coordinator=holders[0],
            participants=[job_pb2.Participant(id=m.id, stage=m.stage) for m in members],
            holders=holders,
        )
        started = await asyncio.gather(
            *(self._start_at(m, start) for m in members), return_exceptions=True
        )
        for m, reply in zip(members, started, strict=True):
            if isinstance(reply, BaseException):
                reason = f"the job could not start on {m.id}: {reply}"
                await self._spread_fail(job_id, reason, members)
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, reason)
        return job_pb2.SubmitReply(job_id=job_id)

    async def _prepare_at(
        self, member: MemberInfo, request: job_pb2.PrepareRequest
    ) -> job_pb2.PrepareReply:
        if member.id == self.host.node_id:
            return await self.prepare(request)
        return await self._call(
            lambda stubs, t: stubs.jobs.Prepare(request, timeout=t),
            member,
            self.host.config.prepare_timeout_s,
        )

    async def _start_at(self, member: MemberInfo, request: job_pb2.StartRequest) -> None:
        if member.id == self.host.node_id:
            self.start(request)
            return
        await self._call(
            lambda stubs, t: stubs.jobs.Start(request, timeout=t),
            member,
            self.host.config.rpc_timeout_s,
        )

    async def _call(
        self,
        call: Callable[[Stubs, float], Awaitable[Any]],
        member: MemberInfo,
        timeout_s: float,
        *,
        attempts: int = 3,
    ) -> Any:
        """A call to a member, retried while it does not answer; RuntimeError with the
        member's own message when it refuses."""
        last = ""
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(0.2 * 2**attempt)
            try:
                return await call(self.host.stubs(member), timeout_s)
            except aio.AioRpcError as err:
                last = err.details() or err.code().name
                if err.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    break
        raise RuntimeError(last.splitlines()[0] if last else "no answer")

    async def prepare(self, request: job_pb2.PrepareRequest) -> job_pb2.PrepareReply:
        host = self.host
        if not host.trains:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{host.node_id} runs with --no-train: it routes but takes no training work",
            )
        job = await self._parse(request.job_json)
        active = self._active
        if active is not None:
            state = self._records[active.job_id].state
            if state == job_pb2.JOB_STATE_RUNNING:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{host.node_id} runs job {active.job_id}; one job at a time",
                )
            if active.job_id == job.job_id and state == job_pb2.JOB_STATE_PREPARING and (
                active.worker is not None
            ):
                return job_pb2.PrepareReply(corpus_digest=active.worker.corpus_digest)
            # A job prepared and never started (its submission failed), or one that is over.
            self._stop_worker(active)
        module = await self._load()
        from gwtf.train.data import DataError
        from gwtf.train.partition import PartitionError

        host.log.info("job %s: building stage %d", job.job_id, host.own_stage())
        try:
            executor, corpus = await asyncio.to_thread(
                module.StageWorker.build,
                job,
                host.own_stage(),
                host.num_stages(),
                host.memory_slots,
            )
        except (PartitionError, DataError) as err:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        if self._active is not active:
            raise Refusal(grpc.StatusCode.ABORTED, "another job arrived meanwhile")
        worker = module.StageWorker(
            _WorkerHost(self, job.job_id),
            job,
            executor,
            corpus,
            slots=host.memory_slots,
            emulate_compute_s=host.emulate_compute_s,
            config=module.WorkerConfig(
                data_timeout_s=host.config.data_timeout_s,
                commit_timeout_s=host.config.commit_timeout_s,
                rpc_timeout_s=host.config.rpc_timeout_s,
            ),
        )
        job_json = json.dumps(job.to_dict(), sort_keys=True)
        self._active = _Active(job, job.job_id, job_json, worker)
        self._record(
            job_pb2.JobProgress(
                job_id=job.job_id,
                name=job.name,
                state=job_pb2.JOB_STATE_PREPARING,
                iterations=job.iterations,
                job_json=job_json,
            )
        )
        return job_pb2.PrepareReply(corpus_digest=worker.corpus_digest)

    def start(self, request: job_pb2.StartRequest) -> job_pb2.StartReply:
        host = self.host
        active = self._active
        if active is None or active.job_id != request.job_id:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{host.node_id} has not prepared job {request.job_id[:40]!r}",
            )
        if active.participants:
            return job_pb2.StartReply()  # a repeated start
        participants: dict[str, int] = {}
        stages = host.num_stages()
        for p in request.participants:
            check_name("participant id", p.id)
            if p.stage >= stages:
                raise InvalidMessage(f"participant {p.id} has stage {p.stage}, outside the swarm")
            participants[p.id] = p.stage
        holders = tuple(request.holders)
        if (
            not holders
            or any(participants.get(h) != 0 for h in holders)
            or request.coordinator not in holders
            or set(participants.values()) != set(range(stages))
        ):
            raise InvalidMessage("the start names holders or a coordinator that do not fit")
        active.participants = participants
        active.coordinator = request.coordinator
        active.holders = holders
        now = time.monotonic()
        active.started = active.last_iteration_end = now
        job = active.job
        if request.coordinator == host.node_id:
            active.plan = IterationCoordinator(
                iterations=job.iterations,
                microbatches=job.microbatches,
                participants=participants,
                num_stages=stages,
                holders=holders,
            )
        progress = self._records[active.job_id]
        progress.state = job_pb2.JOB_STATE_RUNNING
        progress.coordinator = request.coordinator
        self._record(progress)
        worker = active.worker
        if host.node_id not in participants:
            active.worker = None
            if worker is not None:
                host.spawn(worker.stop(), "stop worker")
        elif worker is not None:
            worker.start(participants, holders)
        host.log.info(
            "job %s started: coordinator %s, %d participants", active.job_id,
            request.coordinator, len(participants),
        )
        return job_pb2.StartReply()

    # ================================================================== the iterations

    def _coordinating(self, job_id: str) -> tuple[_Active, IterationCoordinator]:
        active = self._active
        if (
            active is not None
            and active.job_id == job_id
            and not active.participants
            and self._records[job_id].state == job_pb2.JOB_STATE_PREPARING
        ):
            # Its start is still on the way here (it travels on another call): retried.
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"job {job_id} has not started here yet")
        if active is None or active.job_id != job_id or active.plan is None:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.host.node_id} does not coordinate job {job_id[:40]!r}",
            )
        if self._records[job_id].state != job_pb2.JOB_STATE_RUNNING:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} is not running")
        return active, active.plan

    def report_done(self, job_id: str, iteration: int, microbatches: tuple[int, ...]) -> None:
        """From this node's worker: a holder's microbatches are back."""
        active = self._active
        if active is None or active.job_id != job_id:
            return
        request = job_pb2.DoneRequest(
            sender=self.host.node_id, job_id=job_id, iteration=iteration,
            microbatches=microbatches,
        )
        self._to_coordinator(
            active, request, lambda stubs, t: stubs.jobs.Done(request, timeout=t), self.done
        )

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """From this node's worker: it committed an iteration."""
        active = self._active
        if active is None or active.job_id != job_id:
            return
        request = job_pb2.CommittedRequest(
            sender=report.sender,
            job_id=job_id,
            iteration=report.iteration,
            stage=report.stage,
            checksum=report.checksum,
            losses=[job_pb2.LossEntry(microbatch=m, loss=v) for m, v in sorted(
                report.losses.items())],
            routes=[job_pb2.RouteCount(path=list(p), microbatches=c) for p, c in sorted(
                report.routes.items())],
            digests=[job_pb2.DigestEntry(name=n, digest=d) for n, d in sorted(
                report.digests.items())],
        )
        self._to_coordinator(
            active, request, lambda stubs, t: stubs.jobs.Committed(request, timeout=t),
            self.committed,
        )
        if report.iteration == active.job.iterations - 1 and active.worker is not None:
            worker, active.worker = active.worker, None
            self.host.spawn(worker.stop(), "stop worker")

    def _to_coordinator(
        self,
        active: _Active,
        request: Any,
        call: Callable[[Stubs, float], Awaitable[Any]],
        local: Callable[[Any], Any],
    ) -> None:
        if active.coordinator == self.host.node_id:
            try:
                local(request)
            except (Refusal, InvalidMessage) as err:
                self.fail(active.job_id, f"the coordinator refused its own report: {err}")
            return

        async def send() -> None:
            member = self.host.member(active.coordinator)
            if member is None:
                return  # its death fails the job (on_member_down)
            try:
                await self._call(call, member, self.host.config.rpc_timeout_s, attempts=5)
            except RuntimeError as err:
                self.fail(active.job_id, f"the coordinator {active.coordinator} did not take "
                          f"a report of {self.host.node_id}: {err}")

        self.host.spawn(send(), "report")

    def done(self, request: job_pb2.DoneRequest) -> job_pb2.DoneReply:
        active, plan = self._coordinating(request.job_id)
        if active.participants.get(request.sender) != 0:
            raise InvalidMessage(f"{request.sender[:40]!r} is not a data holder of the job")
        try:
            order = plan.done(request.sender, request.iteration, tuple(request.microbatches))
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        if order is not None:
            self._order(active, order)
        return job_pb2.DoneReply()

    def _order(self, active: _Active, order: CommitOrder) -> None:
        request = job_pb2.CommitRequest(
            sender=self.host.node_id,
            job_id=active.job_id,
            iteration=order.iteration,
            microbatches=order.microbatches,
            final=order.final,
            next_holders=order.next_holders,
        )
        for peer in sorted(active.participants):
            if peer == self.host.node_id:
                self.commit(request)
                continue
            member = self.host.member(peer)
            if member is None:
                continue

            async def send(member: MemberInfo = member) -> None:
                try:
                    await self._call(
                        lambda stubs, t: stubs.jobs.Commit(request, timeout=t),
                        member,
                        self.host.config.rpc_timeout_s,
                        attempts=5,
                    )
                except RuntimeError as err:
                    self.fail(active.job_id, f"{member.id} did not take the commit of iteration "
                              f"{order.iteration}: {err}")

            self.host.spawn(send(), "commit")

    def commit(self, request: job_pb2.CommitRequest) -> job_pb2.CommitReply:
        worker = self._worker_for(request.job_id)
        active = self._active
        assert active is not None
        if request.sender != active.coordinator:
            raise InvalidMessage(f"{request.sender[:40]!r} does not coordinate the job")
        job = active.job
        ids = tuple(request.microbatches)
        if any(m >= job.microbatches for m in ids) or len(set(ids)) != len(ids):
            raise InvalidMessage("the commit names microbatches outside the job's, or twice")
        if request.iteration >= job.iterations:
            raise InvalidMessage(f"iteration {request.iteration} is past the job's last")
        if any(active.participants.get(h) != 0 for h in request.next_holders):
            raise InvalidMessage("the commit names next holders that are not data holders")
        worker.order_commit(
            CommitOrder(request.iteration, ids, request.final, tuple(request.next_holders))
        )
        return job_pb2.CommitReply()

    def committed(self, request: job_pb2.CommittedRequest) -> job_pb2.CommittedReply:
        active, plan = self._coordinating(request.job_id)
        losses: dict[int, float] = {}
        for entry in request.losses:
            if not math.isfinite(entry.loss) or entry.microbatch in losses:
                raise InvalidMessage(f"{request.sender[:40]!r} sent an invalid loss")
            losses[entry.microbatch] = entry.loss
        routes: dict[tuple[str, ...], int] = {}
        for route in request.routes:
            path = tuple(route.path)
            if len(path) != self.host.num_stages() or any(
                active.participants.get(hop) != i for i, hop in enumerate(path)
            ):
                raise InvalidMessage(f"{request.sender[:40]!r} sent a route that is no path")
            routes[path] = routes.get(path, 0) + route.microbatches
        report = CommittedReport(
            sender=request.sender,
            iteration=request.iteration,
            stage=request.stage,
            checksum=request.checksum,
            losses=losses,
            routes=routes,
            digests={d.name: d.digest for d in request.digests},
        )
        try:
            outcomes = plan.committed(report)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        for outcome in outcomes:
            self._completed(active, outcome)
        return job_pb2.CommittedReply()

    def _completed(self, active: _Active, outcome: IterationOutcome) -> None:
        progress = self._records[active.job_id]
        now = time.monotonic()
        progress.iterations_completed += 1
        progress.loss.append(outcome.loss)
        progress.iteration_s.append(now - active.last_iteration_end)
        active.last_iteration_end = now
        progress.microbatches_trained += outcome.microbatches
        progress.elapsed_s = now - active.started
        progress.throughput_mb_s = progress.microbatches_trained / max(progress.elapsed_s, 1e-9)
        for path, count in outcome.routes.items():
            active.routes[path] = active.routes.get(path, 0) + count
        del progress.routes[:]
        progress.routes.extend(
            job_pb2.RouteCount(path=list(p), microbatches=c) for p, c in sorted(
                active.routes.items())
        )
        log = self.host.log
        if outcome.mismatched:
            progress.checksum_mismatches += 1
            log.error(
                "job %s iteration %d: the parameters of %s differ from their stage peers'",
                active.job_id, outcome.iteration, ", ".join(outcome.mismatched),
            )
        log.info(
            "job %s iteration %d/%d committed: loss %.4f, %d microbatches, %.2f s",
            active.job_id, outcome.iteration + 1, active.job.iterations, outcome.loss,
            outcome.microbatches, progress.iteration_s[-1],
        )
        if outcome.final:
            from gwtf.train.state import checksum_of_digests

            progress.param_checksum = checksum_of_digests(outcome.digests)
            progress.state = job_pb2.JOB_STATE_COMPLETED
            active.plan = None
            log.info(
                "job %s completed: %d iterations, %.2f microbatches/s, checksum %s",
                active.job_id, progress.iterations_completed, progress.throughput_mb_s,
                progress.param_checksum[:16],
            )
        self._record(progress)
        self._spread_progress(progress)

    def _spread_progress(self, progress: job_pb2.JobProgress) -> None:
        request = job_pb2.ProgressRequest(sender=self.host.node_id, progress=progress)
        for member in self.host.live_members():

            async def send(member: MemberInfo = member) -> None:
                try:
                    await self._call(
                        lambda stubs, t: stubs.jobs.Progress(request, timeout=t),
                        member,
                        self.host.config.rpc_timeout_s,
                        attempts=2,
                    )
                except RuntimeError:
                    pass  # a member that misses one update gets the next

            self.host.spawn(send(), "progress")

    def on_progress(self, request: job_pb2.ProgressRequest) -> job_pb2.ProgressReply:
        progress = request.progress
        check_name("job id", progress.job_id)
        known = self._records.get(progress.job_id)
        active = self._active
        if active is not None and active.job_id == progress.job_id:
            if request.sender != active.coordinator:
                raise InvalidMessage(f"{request.sender[:40]!r} does not coordinate the job")
        if known is not None and (
            known.state in OVER or progress.iterations_completed < known.iterations_completed
        ):
            return job_pb2.ProgressReply()  # older news
        self._record(progress)
        if progress.state in OVER and active is not None and active.job_id == progress.job_id:
            self._stop_worker(active)
        return job_pb2.ProgressReply()

    # ================================================================== failure

    def fail(self, job_id: str, reason: str, *, spread: bool = True) -> None:
        """The job cannot go on: record why, stop this node's part, tell every member."""
        progress = self._records.get(job_id)
        if progress is None or progress.state in OVER:
            return
        progress.state = job_pb2.JOB_STATE_FAILED
        progress.error = reason
        self._record(progress)
        self.host.log.error("job %s failed: %s", job_id, reason)
        active = self._active
        if active is not None and active.job_id == job_id:
            active.plan = None
            self._stop_worker(active)
        if spread:
            self.host.spawn(self._spread_fail(job_id, reason, self._everyone(active)), "fail")

    def _everyone(self, active: _Active | None) -> list[MemberInfo]:
        """The live members and the job's participants (even one this node thinks dead: news
        of a failure is worth a call that may fail)."""
        found = {m.id: m for m in self.host.live_members()}
        if active is not None:
            for peer in active.participants:
                if peer not in found and peer != self.host.node_id:
                    member = self.host.known_member(peer)
                    if member is not None:
                        found[peer] = member
        return list(found.values())

    def _stop_worker(self, active: _Active) -> None:
        worker, active.worker = active.worker, None
        if worker is not None:
            self.host.spawn(worker.stop(), "stop worker")

    async def _spread_fail(self, job_id: str, reason: str, members: list[MemberInfo]) -> None:
        request = job_pb2.FailRequest(sender=self.host.node_id, job_id=job_id, reason=reason)
        calls = []
        for member in members:
            if member.id == self.host.node_id:
                self.fail(job_id, reason, spread=False)
                continue
            calls.append(self._call(
                lambda stubs, t: stubs.jobs.Fail(request, timeout=t), member,
                self.host.config.rpc_timeout_s, attempts=1,
            ))
        await asyncio.gather(*calls, return_exceptions=True)

    def on_fail(self, request: job_pb2.FailRequest) -> job_pb2.FailReply:
        check_name("job id", request.job_id)
        reason = request.reason[:500] or "no reason given"
        self.fail(request.job_id, f"{reason} (reported by {request.sender[:40]})", spread=False)
        return job_pb2.FailReply()

    def on_member_down(self, member: MemberInfo, verb: str) -> None:
        """A member died or left: without crash recovery (issue 6), a job it took part in
        cannot go on."""
        active = self._active
        if active is None or member.id not in active.participants:
            return
        progress = self._records[active.job_id]
        if progress.state not in UNDER_WAY:
            return
        self.fail(
            active.job_id,
            f"{member.id} (stage {member.stage}) {verb} during iteration "
            f"{progress.iterations_completed}; this version cannot recover a job from the loss "
            "of a node: submit it again",
            spread=False,
        )

    # ================================================================== contributions

    def contribution_expect(self, header: Any) -> int:
        return int(self._worker_for(header.job_id).contribution_numel(header))

    def on_contribution(self, header: Any, flat: Any) -> None:
        self._worker_for(header.job_id).on_contribution(header, flat)

    # ================================================================== joining, closing

    async def catch_up(self, address: str) -> None:
        """A joiner learns the jobs its bootstrap node knows (it does not take part)."""
        try:
            reply = await self.host.stubs_at(address).jobs.List(
                job_pb2.ListRequest(), timeout=self.host.config.rpc_timeout_s
            )
        except aio.AioRpcError:
            return
        for progress in reply.jobs:
            if progress.job_id and progress.job_id not in self._records:
                self._records[progress.job_id] = progress
        self._notify()

    async def close(self) -> None:
        active = self._active
        if active is not None and active.worker is not None:
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

    def member(self, node_id: str) -> MemberInfo | None:
        return self._host.member(node_id)

    def data_stub(self, member: MemberInfo) -> Any:
        """gwtf.node.tensors' stub on the member's channel (it sends chunks as wire bytes)."""
        stub = self._data_stubs.get(member.address)
        if stub is None:
            from gwtf.node.tensors import DataPlaneStub

            stub = DataPlaneStub(self._host.stubs(member).channel)
            self._data_stubs[member.address] = stub
        return stub

    def job_stub(self, member: MemberInfo) -> job_pb2_grpc.JobServiceStub:
        return self._host.stubs(member).jobs

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        return self._host.wan_delay(member, nbytes)

    def next_hop_weights(self, capacities: Mapping[str, float]) -> tuple[dict[str, int], str]:
        return next_hop_weights(self._host.routes(), capacities, settled=self._host.settled())

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._host.spawn(coro, name)

    def report_done(self, job_id: str, iteration: int, microbatches: tuple[int, ...]) -> None:
        self._manager.report_done(job_id, iteration, microbatches)

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        self._manager.report_committed(job_id, report)

    def fail(self, job_id: str, reason: str) -> None:
        self._manager.fail(job_id, reason)
