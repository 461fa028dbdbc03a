"""JobManager: training jobs on a node: submission, spreading, the commit coordinator, progress,
crash recovery and joins (docs/design.md 1, 3, 4).

    submit (any node)  -> check the job, the cut into the swarm's stages, a live node per stage
                       -> Prepare at every live member (each builds its stage, loads torch then)
                       -> Start at every member that prepared: participants, holders, coordinator
    holders inject, microbatches flow (gwtf.node.worker), holders report each finished one
    coordinator        -> Commit(k) (phase one) to every live participant, Prepared back,
                          Step(k) (phase two), Committed back (gwtf.node.jobcoord)
                       -> once all have, Progress (loss, checksums, recovery counts) to every
                          live member

Any node answers `Watch` and `List` from its own copy of the progress, which the coordinator
spreads after every iteration and on every crash, join or pause.

The coordinator of a job is the live data holder with the smallest id among the participants:
holders start iterations, so the commit order leaves from where the next iteration begins. When a
participant dies or leaves, the coordinator recovers its work by the rules of docs/design.md 4
(`gwtf.node.jobcoord`, with `gwtf.recovery`); when the coordinator itself dies, the next holder
takes over. A node that joins the swarm while a job runs fetches its stage's weights and
optimizer state from a live peer (`FetchState`, streamed; another donor if one dies mid-transfer)
and enters at an iteration boundary. The last live replica of a stage keeps a backup of its state
at another node, so that a stage that loses every node resumes when one joins it. A node that
leaves gracefully first lets the iteration in progress step (`drain`).

One job runs at a time; a submission while one runs is refused (the same job again returns its
id, and so does the same job once it completed: a job is never trained twice; a failed or
cancelled one may be submitted again). torch and the worker are imported once (`_load`): by a
node that trains, before it enters its swarm (`preload`: importing torch holds the interpreter
for seconds, in which a member would miss its heartbeats and be declared dead; measured, six
nodes loading it at once on two cores declared each other dead), and otherwise only when a job
description must be read.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

from gwtf.job.iterations import (
    CommitOrder,
    CommittedReport,
    IterationCoordinator,
    IterationOutcome,
    PreparedReport,
    ReportError,
    StepOrder,
    weights_of,
)
from gwtf.job.nexthop import next_hop_weights
from gwtf.node.codec import InvalidMessage, check_name, members_from_pb
from gwtf.node.errors import Refusal
from gwtf.node.jobcoord import JobCoordinator
from gwtf.node.jobhost import JobsHost
from gwtf.node.membership import MemberInfo
from gwtf.node.observe import JobMetrics, job_event
from gwtf.node.transport import Stubs, is_refused
from gwtf.v1 import job_pb2, job_pb2_grpc

if TYPE_CHECKING:
    from gwtf.node.worker import StageWorker

__all__ = ["MAX_JOB_JSON", "MAX_STATE_BYTES", "STATE_CHUNK_BYTES", "JobManager", "JobsHost"]

LOG = logging.getLogger("gwtf.node.jobs")

MAX_JOB_JSON = 64 * 1024
"""Largest job description accepted (a job file is a few hundred bytes)."""
STATE_CHUNK_BYTES = 2**20
"""A stage's state travels in chunks of 1 MiB (STYLE: 1-4 MiB, under the 4 MiB message limit)."""
MAX_STATE_BYTES = 8 * 2**30
"""Largest stage state a joiner or a backup keeper accepts."""

MAX_MICROBATCHES = 2**16
"""Most microbatches per iteration a node accepts: each is dealt, tracked and reported."""

MAX_WEIGHT = 2**40
"""Largest holder weight accepted in a commit (flow units; far above any real flow)."""

UNDER_WAY = (job_pb2.JOB_STATE_PREPARING, job_pb2.JOB_STATE_RUNNING)
OVER = (job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED)


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
    coord: JobCoordinator | None = None
    """This node coordinates the job."""
    started: float = 0.0
    last_iteration_end: float = 0.0
    routes: dict[tuple[str, ...], int] = field(default_factory=dict)
    departed: set[str] = field(default_factory=set)
    """Participants that died or left (a node that comes back under the same id takes part
    again only once admitted)."""
    keepers: dict[int, str] = field(default_factory=dict)
    """Stage -> the node that keeps the backup of its last replica's state."""
    taking_over: bool = False


def _enter_call(request: job_pb2.EnterRequest) -> Callable[[Stubs, float], Awaitable[Any]]:
    def call(stubs: Stubs, timeout: float) -> Awaitable[Any]:
        return stubs.jobs.Enter(request, timeout=timeout)

    return call


def _sync_call(request: job_pb2.SyncRequest) -> Callable[[Stubs, float], Awaitable[Any]]:
    def call(stubs: Stubs, timeout: float) -> Awaitable[Any]:
        return stubs.jobs.Sync(request, timeout=timeout)

    return call


def _state_name(state: int) -> str:
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


async def _read_state(
    chunks: AsyncIterator[job_pb2.StateChunk], what: str
) -> tuple[job_pb2.StateChunk, bytes]:
    """A streamed stage state: its first chunk (stage, iteration, job, sender) and its bytes;
    InvalidMessage if the chunks come out of order, too many, or short."""
    parts: list[bytes] = []
    first: job_pb2.StateChunk | None = None
    size = 0
    async for chunk in chunks:
        if chunk.seq != len(parts):
            raise InvalidMessage(f"state chunk {chunk.seq} came where {len(parts)} was due")
        if first is None:
            first = chunk
            if chunk.total_bytes > MAX_STATE_BYTES:
                raise InvalidMessage(f"a stage state over {MAX_STATE_BYTES} bytes")
        size += len(chunk.payload)
        if size > first.total_bytes:
            raise InvalidMessage(f"the {what} runs past its {first.total_bytes} bytes")
        parts.append(chunk.payload)
    if first is None:
        raise InvalidMessage(f"an empty {what}")
    data = b"".join(parts)
    if len(data) != first.total_bytes:
        raise InvalidMessage(f"the {what} holds {len(data)} of {first.total_bytes} bytes")
    return first, data


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
        self._backups: dict[tuple[str, int], tuple[int, bytes]] = {}
        self._resumes: dict[str, tuple[int, bytes]] = {}
        """job id -> (iteration, this stage's state) a client sent to resume from (Resume)."""
        """(job, stage) -> (iteration, state) of a lone replica, kept for a joiner."""
        self._final_weights: tuple[str, int, asyncio.Future[tuple[int, bytes]]] | None = None
        """(job, stage, its final weights): what this node serves of the latest job it
        completed, once the worker that trained them is gone."""
        self._spread_pending = False
        self._joining = False
        self.metrics = JobMetrics()
        """The job runtime's Prometheus families (the node serves them with its own)."""
        self.placement: Any = None
        """Where stages run (a gwtf.train.device.Placement), chosen at `preload`."""

    # ================================================================== lazy torch

    async def _load(self) -> ModuleType:
        """gwtf.node.worker (torch, gwtf.train), imported once, in a thread."""
        if self._module is None:
            import os

            # One thread while torch loads; `preload` then sets the node's count (--threads).
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            self._module = await asyncio.to_thread(importlib.import_module, "gwtf.node.worker")
        return self._module

    async def preload(self, device: str, precision: str, threads: int | None) -> None:
        """Load torch and the worker now, before this node is in a swarm, and choose where the
        stages will run (`gwtf.train.device`); DeviceError if this machine cannot run it."""
        await self._load()
        from gwtf.train.device import configure

        self.placement = await asyncio.to_thread(configure, device, precision, threads)

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
            job = job_from_dict(table)
        except (JobError, TypeError) as err:
            raise InvalidMessage(f"invalid job: {err}") from None
        if job.microbatches > MAX_MICROBATCHES:
            raise InvalidMessage(
                f"a job of {job.microbatches} microbatches per iteration is more than a swarm "
                f"takes ({MAX_MICROBATCHES}); use fewer, larger microbatches"
            )
        from gwtf.node.tensors import TensorLimits
        from gwtf.train.costs import activation_bytes

        limit = TensorLimits().max_tensor_bytes  # what the data plane takes of one tensor
        if activation_bytes(job) > limit:
            raise InvalidMessage(
                f"one activation of this job is {activation_bytes(job)} bytes, more than the "
                f"{limit} a node accepts; use smaller microbatches"
            )
        return job

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
        if request.resume_iteration >= job.iterations:
            raise InvalidMessage(
                f"cannot resume job {job.job_id} at iteration {request.resume_iteration}: it has "
                f"{job.iterations} iterations"
            )
        async with self._submitting:
            return await self._submit(job, request.resume_iteration)

    async def _submit(self, job: Any, resume: int = 0) -> job_pb2.SubmitReply:
        from gwtf.train.partition import PartitionError, partition

        host = self.host
        job_id: str = job.job_id
        done = self._records.get(job_id)
        if done is not None and done.state == job_pb2.JOB_STATE_COMPLETED:
            # The same job (its id is its content) trained already: it is not trained twice.
            # A failed one may be submitted again.
            host.log.info("job %s submitted again: it completed already; its result stands",
                          job_id)
            return job_pb2.SubmitReply(job_id=job_id)
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
        prepare = job_pb2.PrepareRequest(
            sender=host.node_id, job_json=job_json, resume_iteration=resume
        )
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
        flows = {
            m.id: r.flow_units for m, r in zip(members, replies, strict=True)
            if m.stage == 0 and isinstance(r, job_pb2.PrepareReply) and r.flows_settled
        }
        weights = [flows[h] for h in holders] if len(flows) == len(holders) else []
        start = job_pb2.StartRequest(
            sender=host.node_id,
            job_id=job_id,
            coordinator=holders[0],
            participants=[job_pb2.Participant(id=m.id, stage=m.stage) for m in members],
            holders=holders,
            weights=weights if any(weights) else [],
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
        return await self.call(
            lambda stubs, t: stubs.jobs.Prepare(request, timeout=t),
            member,
            self.host.config.prepare_timeout_s,
        )

    async def _start_at(self, member: MemberInfo, request: job_pb2.StartRequest) -> None:
        if member.id == self.host.node_id:
            self.start(request)
            return
        await self.call(
            lambda stubs, t: stubs.jobs.Start(request, timeout=t),
            member,
            self.host.config.rpc_timeout_s,
        )

    async def call(
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
                if is_refused(err):
                    self.host.refused(member)
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
                return self._prepared(active)
            # A job prepared and never started (its submission failed), or one that is over.
            self._stop_worker(active)
        module = await self._load()
        from gwtf.train.data import DataError
        from gwtf.train.partition import PartitionError
        from gwtf.train.state import StateError

        stage = host.own_stage()
        resume = request.resume_iteration
        build: tuple[Any, ...] = (
            module.StageWorker.build, job, stage, host.num_stages(), host.memory_slots,
            self.placement,
        )
        if resume:
            kept = self._resumes.get(job.job_id)
            if kept is None or kept[0] != resume:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{host.node_id} was sent no state of stage {stage} at iteration {resume} "
                    f"to resume job {job.job_id} from; submit --resume again",
                )
            build = (
                module.StageWorker.build_from_state, job, stage, host.num_stages(),
                host.memory_slots, kept[1], self.placement,
            )
        host.log.info("job %s: building stage %d%s", job.job_id, stage,
                      f" from its checkpoint of iteration {resume}" if resume else "")
        try:
            executor, corpus = await asyncio.to_thread(*build)
        except (PartitionError, DataError, StateError) as err:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        if executor.iteration != resume:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the state sent to {host.node_id} is of iteration {executor.iteration}, "
                f"not {resume}",
            )
        self._resumes.pop(job.job_id, None)
        if self._active is not active:
            raise Refusal(grpc.StatusCode.ABORTED, "another job arrived meanwhile")
        worker = self._new_worker(module, job, executor, corpus)
        job_json = json.dumps(job.to_dict(), sort_keys=True)
        self._active = active = _Active(job, job.job_id, job_json, worker)
        self._record(
            job_pb2.JobProgress(
                job_id=job.job_id,
                name=job.name,
                state=job_pb2.JOB_STATE_PREPARING,
                iterations=job.iterations,
                job_json=job_json,
                iterations_completed=resume,
                resumed_from=resume,
            )
        )
        return self._prepared(active)

    def _prepared(self, active: _Active) -> job_pb2.PrepareReply:
        assert active.worker is not None
        reply = job_pb2.PrepareReply(corpus_digest=active.worker.corpus_digest)
        if self.host.own_stage() == 0 and self.host.settled():
            # The participants are not known yet: every stage-1 peer counts.
            reply.flow_units = sum(self.host.routes().values())
            reply.flows_settled = True
        return reply

    def _new_worker(self, module: ModuleType, job: Any, executor: Any, corpus: Any) -> Any:
        host = self.host
        return module.StageWorker(
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
            fault=host.fault,
        )

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
        weights = tuple(request.weights)
        if (
            not holders
            or (weights and len(weights) != len(holders))
            or any(w > MAX_WEIGHT for w in weights)
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
        progress = self._records[active.job_id]
        progress.state = job_pb2.JOB_STATE_RUNNING
        progress.coordinator = request.coordinator
        self._record(progress)
        if request.coordinator == host.node_id:
            active.coord = JobCoordinator(self, active, IterationCoordinator(
                iterations=job.iterations,
                microbatches=job.microbatches,
                participants=participants,
                num_stages=stages,
                holders=holders,
                weights=dict(zip(holders, weights, strict=True)) if weights else None,
                iteration=progress.resumed_from,
            ))
            active.coord.start()
        worker = active.worker
        if host.node_id not in participants:
            active.worker = None
            if worker is not None:
                host.spawn(worker.stop(), "stop worker")
        elif worker is not None:
            worker.start(
                participants, holders, dict(zip(holders, weights, strict=True)) if weights else None
            )
        host.log.info(
            "job %s started: coordinator %s, %d participants", active.job_id,
            request.coordinator, len(participants),
        )
        return job_pb2.StartReply()

    # ================================================================== coordinator's calls

    def _coordinating(self, job_id: str) -> tuple[_Active, JobCoordinator]:
        active = self._active
        if (
            active is not None
            and active.job_id == job_id
            and not active.participants
            and self._records[job_id].state == job_pb2.JOB_STATE_PREPARING
        ):
            # Its start is still on the way here (it travels on another call): retried.
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"job {job_id} has not started here yet")
        if active is None or active.job_id != job_id or active.coord is None:
            if active is not None and active.job_id == job_id and active.taking_over:
                raise Refusal(grpc.StatusCode.UNAVAILABLE,
                              f"{self.host.node_id} is taking over job {job_id}")
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.host.node_id} does not coordinate job {job_id[:40]!r}",
            )
        if self._records[job_id].state != job_pb2.JOB_STATE_RUNNING:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} is not running")
        return active, active.coord

    def done(self, request: job_pb2.DoneRequest) -> job_pb2.DoneReply:
        _, coord = self._coordinating(request.job_id)
        try:
            coord.done(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.DoneReply()

    def replayed(self, request: job_pb2.ReplayedRequest) -> job_pb2.ReplayedReply:
        _, coord = self._coordinating(request.job_id)
        try:
            coord.replayed(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.ReplayedReply()

    def prepared(self, request: job_pb2.PreparedRequest) -> job_pb2.PreparedReply:
        _, coord = self._coordinating(request.job_id)
        for entry in request.losses:
            if not math.isfinite(entry.loss):
                raise InvalidMessage(f"{request.sender[:40]!r} sent an invalid loss")
        try:
            coord.prepared(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.PreparedReply()

    def committed(self, request: job_pb2.CommittedRequest) -> job_pb2.CommittedReply:
        active, coord = self._coordinating(request.job_id)
        report = CommittedReport(
            sender=request.sender,
            iteration=request.iteration,
            stage=request.stage,
            checksum=request.checksum,
            digests={d.name: d.digest for d in request.digests},
        )
        try:
            outcomes = coord.committed(report)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        for outcome in outcomes:
            self.completed(active, outcome)
        return job_pb2.CommittedReply()

    def enter(self, request: job_pb2.EnterRequest) -> job_pb2.EnterReply:
        check_name("sender", request.sender)
        _, coord = self._coordinating(request.job_id)
        try:
            return coord.enter(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None

    def progress_record(self, job_id: str) -> job_pb2.JobProgress:
        return self._records[job_id]

    def changed(self, active: _Active) -> None:
        """The coordinator's record of the job changed (a crash, a pause, a join): every member
        hears of it, at most a few times a second."""
        progress = self._records[active.job_id]
        self._record(progress)
        if self._spread_pending:
            return
        self._spread_pending = True

        async def later() -> None:
            await asyncio.sleep(0.2)
            self._spread_pending = False
            self._spread_progress(self._records[active.job_id])

        self.host.spawn(later(), "spread progress")

    def completed(self, active: _Active, outcome: IterationOutcome) -> None:
        progress = self._records[active.job_id]
        if outcome.iteration < progress.iterations_completed:
            return
        now = time.monotonic()
        progress.iterations_completed += 1
        progress.loss.append(outcome.loss)
        progress.iteration_s.append(now - active.last_iteration_end)
        active.last_iteration_end = now
        progress.microbatches_trained += outcome.microbatches
        dropped = len(outcome.dropped)
        progress.lost_microbatches += max(0, active.job.microbatches - outcome.microbatches
                                          - dropped)
        progress.elapsed_s = now - active.started
        progress.throughput_mb_s = progress.microbatches_trained / max(progress.elapsed_s, 1e-9)
        progress.compute_s += outcome.compute_s
        progress.replayed_s += outcome.replayed_s
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
        self._record(progress)
        self._spread_progress(progress)
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
        return [e.node for e in self._records[job_id].excluded]

    def exclude(self, active: _Active, node: str, stage: int, iteration: int, reason: str
                ) -> None:
        """The coordinator excludes `node` from the job (a bad peer, see gwtf.node.jobcoord)."""
        progress = self._records[active.job_id]
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
        self._excluded_here(active, [node])
        if active.coord is not None:
            active.coord.exclude(node)
        self._record(progress)
        self._spread_progress(progress)

    def _excluded_here(self, active: _Active, nodes: Iterable[str]) -> None:
        """A participant hears of exclusions: nothing goes to those nodes any more; a node
        that hears of its own stops its part of the job."""
        me = self.host.node_id
        for node in nodes:
            if node not in active.participants or node in active.departed:
                continue
            active.departed.add(node)
            if node == me:
                self.host.log.warning(
                    "job %s: this node was excluded from the job by its coordinator; it takes "
                    "no further part", active.job_id,
                )
                self._stop_worker(active)
                continue
            if active.worker is not None:
                active.worker.exclude(node)
            if active.coord is None:
                self.host.log.info("job %s: %s is excluded from the job; nothing more goes to it",
                                   active.job_id, node)

    def _spread_progress(self, progress: job_pb2.JobProgress) -> None:
        request = job_pb2.ProgressRequest(sender=self.host.node_id, progress=progress)
        for member in self.host.live_members():

            async def send(member: MemberInfo = member) -> None:
                try:
                    await self.call(
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
        if active is not None and active.job_id == progress.job_id and progress.excluded:
            self._excluded_here(active, [e.node for e in progress.excluded])
        self._record(progress)
        if progress.state in OVER and active is not None and active.job_id == progress.job_id:
            self._stop_worker(active)
        if (
            active is None
            and progress.state == job_pb2.JOB_STATE_RUNNING
            and self.host.trains
            and not self._joining
        ):
            # A node that joined while the job was being prepared hears of it running here.
            self._joining = True
            self.host.spawn(self._join_running(progress), "join job")
        return job_pb2.ProgressReply()

    # ================================================================== participants' calls

    def _participating(self, job_id: str, sender: str) -> tuple[_Active, StageWorker]:
        """This node's worker for a call from the job's coordinator (a new coordinator that
        took over is recognised once this node sees its predecessor dead)."""
        worker = self._worker_for(job_id)
        active = self._active
        assert active is not None
        if sender != active.coordinator:
            if active.participants.get(sender) != 0:
                member = self.host.member(sender)
                orphan = not any(
                    s == 0 and p not in active.departed and self.host.member(p) is not None
                    for p, s in active.participants.items()
                )
                if not (orphan and member is not None and member.stage == 0):
                    raise InvalidMessage(f"{sender[:40]!r} does not coordinate the job")
                # Every holder had died: a stage-0 joiner took the job over (`_adopt`).
                active.participants[sender] = 0
                active.departed.discard(sender)
                worker.undepart(sender)
                worker.admit({sender: 0})
            elif self.host.member(active.coordinator) is not None and (
                sender > active.coordinator
            ):
                raise Refusal(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{self.host.node_id} still sees {active.coordinator} coordinate the job",
                )
            active.coordinator = sender
        return active, worker

    def commit(self, request: job_pb2.CommitRequest) -> job_pb2.CommitReply:
        verdicts = members_from_pb(request.departed, self.host.num_stages())
        if any(info.alive for info in verdicts):
            raise InvalidMessage("the commit names a departed participant that is alive")
        _, worker = self._participating(request.job_id, request.sender)
        # The coordinator left these out of the attempt because they died or left: hear of
        # it before acting on the attempt, as the coordinator did (node.Node._on_events).
        self.host.hear_verdicts(verdicts)
        job = self._active.job if self._active is not None else None
        assert job is not None
        ids = tuple(request.microbatches)
        if any(m >= job.microbatches for m in ids) or len(set(ids)) != len(ids):
            raise InvalidMessage("the commit names microbatches outside the job's, or twice")
        if request.iteration >= job.iterations:
            raise InvalidMessage(f"iteration {request.iteration} is past the job's last")
        members = {p.id: p.stage for p in request.members}
        active = self._active
        assert active is not None
        self._excluded_here(active, request.excluded)
        if self._active is None or self._active.worker is not worker:
            return job_pb2.CommitReply()  # this node was the one excluded
        worker.order_commit(CommitOrder(
            request.iteration, ids, request.final, tuple(request.next_holders), request.round,
            request.attempt, members,
        ))
        return job_pb2.CommitReply()

    def step(self, request: job_pb2.StepRequest) -> job_pb2.StepReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        if any(participants.get(h) != 0 for h in request.next_holders):
            raise InvalidMessage("the step names next holders that are not data holders")
        if request.next_weights and len(request.next_weights) != len(request.next_holders) or any(
            w > MAX_WEIGHT for w in request.next_weights
        ):
            raise InvalidMessage("the step's weights do not match its holders")
        active.participants.update(participants)
        self._excluded_here(active, request.excluded)
        if active.worker is not worker:
            return job_pb2.StepReply()  # this node was the one excluded
        worker.step(StepOrder(
            iteration=request.iteration, round=request.round, attempt=request.attempt,
            final=request.final, next_holders=tuple(request.next_holders),
            participants=participants, loss=request.loss, trained=request.trained,
            dropped=tuple(request.dropped), next_weights=tuple(request.next_weights),
        ))
        return job_pb2.StepReply()

    async def report(self, request: job_pb2.ReportRequest) -> job_pb2.ReportReply:
        _, worker = self._participating(request.job_id, request.sender)
        report = await worker.report(request.iteration, request.round, request.dead)
        return job_pb2.ReportReply(
            node=report.node, stage=report.stage,
            evidence=[job_pb2.EvidenceEntry(microbatch=m, evidence=int(e))
                      for m, e in report.evidence],
        )

    def recover(self, request: job_pb2.RecoverRequest) -> job_pb2.RecoverReply:
        _, worker = self._participating(request.job_id, request.sender)
        if request.rule not in (1, 2, 3):
            raise InvalidMessage(f"recovery rule {request.rule} is not 1, 2 or 3")
        worker.recover(request)
        return job_pb2.RecoverReply()

    def redirect(self, request: job_pb2.RedirectRequest) -> job_pb2.RedirectReply:
        self._worker_for(request.job_id).redirect(request)
        return job_pb2.RedirectReply()

    def restart(self, request: job_pb2.RestartRequest) -> job_pb2.RestartReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        active.participants.update(participants)
        weights = tuple(request.weights)
        if weights and len(weights) != len(request.holders) or any(w > MAX_WEIGHT for w in weights):
            raise InvalidMessage("the restart's weights do not match its holders")
        worker.restart(request.iteration, request.round, tuple(request.holders),
                       weights_of(tuple(request.holders), weights), participants)
        return job_pb2.RestartReply()

    def sync(self, request: job_pb2.SyncRequest) -> job_pb2.SyncReply:
        worker = self._worker_for(request.job_id)
        reply = worker.sync()
        if self._active is not None:
            reply.coordinator = self._active.coordinator
        return reply

    def admit(self, request: job_pb2.AdmitRequest) -> job_pb2.AdmitReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        for node in participants:
            check_name("participant id", node)
            active.departed.discard(node)
            worker.undepart(node)
        active.participants.update(participants)
        worker.admit(participants)
        return job_pb2.AdmitReply()

    # ================================================================== state transfer

    def keeper_of(self, job_id: str, stage: int) -> str:
        """Who keeps the backup of `stage`'s state for this coordinator ("" if nobody)."""
        active = self._active
        if active is None:
            return ""
        if (job_id, stage) in self._backups:
            return self.host.node_id
        return active.keepers.get(stage, "")

    async def fetch_state(
        self, request: job_pb2.StateRequest
    ) -> AsyncIterator[job_pb2.StateChunk]:
        """Stream this stage's state (a live replica) or the backup this node keeps."""
        active = self._active
        if active is None or active.job_id != request.job_id:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.host.node_id} holds no state of job {request.job_id[:40]!r}")
        worker = active.worker
        if worker is not None and worker.stage == request.stage:
            iteration, data = await worker.state_bytes()
        elif (request.job_id, request.stage) in self._backups:
            iteration, data = self._backups[(request.job_id, request.stage)]
        else:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.host.node_id} holds no state of stage {request.stage}")
        fault = self.host.fault
        for seq, offset in enumerate(range(0, max(len(data), 1), STATE_CHUNK_BYTES)):
            yield job_pb2.StateChunk(
                seq=seq, stage=request.stage, iteration=iteration, total_bytes=len(data),
                payload=data[offset: offset + STATE_CHUNK_BYTES],
            )
            if seq == 0 and fault is not None:
                fault.hit("state-transfer", iteration)  # the first chunk is on its way

    async def fetch_weights(
        self, request: job_pb2.WeightsRequest
    ) -> AsyncIterator[job_pb2.StateChunk]:
        """Stream this node's weights of the job's stage: the live ones of a running job, or the
        final ones of the latest job it completed."""
        check_name("job id", request.job_id)
        active = self._active
        final = self._final_weights
        if (active is not None and active.job_id == request.job_id and active.worker is not None
                and active.worker.stage == request.stage):
            iteration, data = await active.worker.weights()
        elif final is not None and final[:2] == (request.job_id, request.stage):
            try:
                iteration, data = await final[2]
            except Exception as err:  # the worker failed to read them
                raise Refusal(grpc.StatusCode.UNAVAILABLE,
                              f"{self.host.node_id} could not keep its weights: {err}") from None
        else:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.host.node_id} holds no weights of stage {request.stage} of job "
                f"{request.job_id[:40]!r}",
            )
        for seq, offset in enumerate(range(0, max(len(data), 1), STATE_CHUNK_BYTES)):
            yield job_pb2.StateChunk(
                seq=seq, stage=request.stage, iteration=iteration, total_bytes=len(data),
                payload=data[offset: offset + STATE_CHUNK_BYTES],
            )

    async def backup(self, chunks: AsyncIterator[job_pb2.StateChunk]) -> job_pb2.BackupAck:
        """A lone replica's state, kept here so that a node joining its empty stage finds it."""
        first, data = await _read_state(chunks, "backup")
        active = self._active
        if active is None or active.job_id != first.job_id or active.participants.get(
            first.sender
        ) != first.stage:
            raise InvalidMessage(f"{first.sender[:40]!r} is no stage-{first.stage} participant")
        self._backups[(first.job_id, first.stage)] = (first.iteration, data)
        self.host.log.info("job %s: keeping stage %d's state of iteration %d (from %s)",
                           first.job_id, first.stage, first.iteration, first.sender)
        return job_pb2.BackupAck(received_bytes=len(data))

    async def resume(self, chunks: AsyncIterator[job_pb2.StateChunk]) -> job_pb2.BackupAck:
        """A client's checkpoint of this node's stage (gwtf submit --resume), kept until a
        Prepare with `resume_iteration` builds the stage from it. One per job: the latest."""
        first, data = await _read_state(chunks, "resume state")
        check_name("job id", first.job_id)
        own = self.host.own_stage()
        if first.stage != own:
            raise InvalidMessage(
                f"{self.host.node_id} holds stage {own}, not stage {first.stage}; send each node "
                "its own stage's state"
            )
        self._resumes = {first.job_id: (first.iteration, data)}
        self.host.log.info("job %s: keeping a checkpoint of stage %d at iteration %d to resume "
                           "from (%d bytes)", first.job_id, own, first.iteration, len(data))
        return job_pb2.BackupAck(received_bytes=len(data))

    def _send_backup(self, job_id: str) -> None:
        """This node became the last live replica of its stage mid-iteration: keep its state
        (of the iteration's start: parameters only change at a step) at another node now."""
        active = self._active
        if active is None or active.job_id != job_id or active.worker is None:
            return
        worker = active.worker

        async def send() -> None:
            iteration, data = await worker.state_bytes()
            await self.keep_backup(job_id, worker.stage, iteration, data)

        self.host.spawn(send(), "backup")

    async def keep_backup(self, job_id: str, stage: int, iteration: int, data: bytes) -> None:
        """Send a lone replica's state to the job's coordinator (or, for the coordinator's own
        stage, to the first live participant of another stage) and remember who keeps it."""
        active = self._active
        if active is None or active.job_id != job_id or iteration >= active.job.iterations:
            return
        me = self.host.node_id
        live = [p for p, s in sorted(active.participants.items())
                if s != stage and p not in active.departed and self.host.member(p) is not None]
        keeper = active.coordinator if active.coordinator in live else (live[0] if live else "")
        member = self.host.member(keeper) if keeper else None
        if member is None:
            return

        def chunks() -> Iterator[job_pb2.StateChunk]:
            for seq, offset in enumerate(range(0, max(len(data), 1), STATE_CHUNK_BYTES)):
                yield job_pb2.StateChunk(
                    seq=seq, stage=stage, iteration=iteration, total_bytes=len(data),
                    payload=data[offset: offset + STATE_CHUNK_BYTES], job_id=job_id, sender=me,
                )

        try:
            await self.host.stubs(member).jobs.Backup(
                chunks(), timeout=self.host.config.prepare_timeout_s
            )
        except aio.AioRpcError as err:
            self.host.log.warning("job %s: the backup of stage %d at %s failed: %s", job_id,
                                  stage, keeper, err.details())
            return
        active.keepers[stage] = keeper

    def backup_iteration(self, job_id: str, stage: int) -> int | None:
        """The iteration of the backup of `stage` this node keeps, if any."""
        kept = self._backups.get((job_id, stage))
        return kept[0] if kept is not None else None

    async def _fetch_from(self, donor: str, job_id: str, stage: int) -> tuple[int, bytes]:
        member = self.host.member(donor)
        if member is None:
            raise RuntimeError(f"{donor} is not alive")
        parts: list[bytes] = []
        iteration = -1
        total = 0
        request = job_pb2.StateRequest(sender=self.host.node_id, job_id=job_id, stage=stage)
        try:
            async for chunk in self.host.stubs(member).jobs.FetchState(
                request, timeout=self.host.config.prepare_timeout_s
            ):
                if chunk.seq != len(parts):
                    raise RuntimeError(f"{donor} sent state chunk {chunk.seq} out of order")
                if chunk.seq == 0:
                    iteration, total = chunk.iteration, chunk.total_bytes
                    if total > MAX_STATE_BYTES:
                        raise RuntimeError(f"{donor} offers a state of {total} bytes")
                parts.append(chunk.payload)
        except aio.AioRpcError as err:
            raise RuntimeError(err.details() or err.code().name) from None
        data = b"".join(parts)
        if iteration < 0 or len(data) != total:
            raise RuntimeError(f"{donor}'s state stream ended after {len(data)} of {total} bytes")
        return iteration, data

    # ================================================================== joining a running job

    async def _join_running(self, progress: job_pb2.JobProgress) -> None:
        """This node joined the swarm while a job runs: fetch its stage's state from a live
        peer (another if the donor dies mid-transfer) and enter the job at an iteration
        boundary; a state that a step made stale is fetched again."""
        try:
            await self._enter_running(progress)
        finally:
            self._joining = False
            active = self._active
            if active is not None and active.job_id == progress.job_id and active.worker is None:
                self._active = None  # it did not enter: a later progress may try again

    async def _enter_running(self, progress: job_pb2.JobProgress) -> None:
        host = self.host
        job = await self._parse(progress.job_json)
        module = await self._load()
        from gwtf.train.data import DataError
        from gwtf.train.state import StateError

        stage = host.own_stage()
        deadline = time.monotonic() + host.config.prepare_timeout_s
        self._active = _Active(job, job.job_id, progress.job_json, None,
                               coordinator=progress.coordinator)
        while time.monotonic() < deadline:
            record = self._records.get(job.job_id)
            if record is None or record.state != job_pb2.JOB_STATE_RUNNING:
                return
            coordinator = host.member(record.coordinator)
            if coordinator is None:
                # Its coordinator died: the next one's progress brings its name here, unless
                # every data holder died, and this node is a holder that can take over.
                if await self._adopt(job, module, stage):
                    return
                await asyncio.sleep(0.5)
                continue
            ask = job_pb2.EnterRequest(sender=host.node_id, job_id=job.job_id, stage=stage)
            try:
                reply = await self.call(
                    _enter_call(ask), coordinator,
                    host.config.rpc_timeout_s,
                )
            except RuntimeError as err:
                host.log.warning("job %s: %s did not answer the entry: %s", job.job_id,
                                 record.coordinator, err)
                await asyncio.sleep(0.5)
                continue
            state: tuple[int, bytes] | None = None
            for donor in reply.donors:
                try:
                    state = await self._fetch_from(donor, job.job_id, stage)
                    break
                except RuntimeError as err:
                    host.log.warning("job %s: the state of stage %d from %s failed: %s; "
                                     "another donor", job.job_id, stage, donor, err)
            if state is None:
                await asyncio.sleep(0.5)
                continue
            iteration, data = state
            try:
                executor, corpus = await asyncio.to_thread(
                    module.StageWorker.build_from_state, job, stage, host.num_stages(),
                    host.memory_slots, data, self.placement,
                )
            except (StateError, DataError) as err:
                self.fail(job.job_id, f"{host.node_id} could not use its stage's state: {err}")
                return
            ask = job_pb2.EnterRequest(sender=host.node_id, job_id=job.job_id, stage=stage,
                                       has_state=True, state_iteration=iteration)
            try:
                reply = await self.call(
                    _enter_call(ask), coordinator,
                    host.config.rpc_timeout_s,
                )
            except RuntimeError:
                continue
            if not reply.admitted:
                host.log.info("job %s: the state of iteration %d is stale (now %d): again",
                              job.job_id, iteration, reply.iteration)
                await asyncio.sleep(0.2)
                continue
            worker = self._new_worker(module, job, executor, corpus)
            active = self._active
            if active is None or active.job_id != job.job_id:
                await worker.stop()
                return
            active.worker = worker
            active.participants = {p.id: p.stage for p in reply.participants}
            active.coordinator = reply.coordinator
            active.holders = tuple(reply.holders)
            active.started = active.last_iteration_end = time.monotonic()
            worker.start(active.participants, active.holders, None, reply.round)
            host.log.info("job %s: entered stage %d at iteration %d round %d", job.job_id,
                          stage, iteration, reply.round)
            return
        host.log.warning("job %s: could not enter within %.0f s", job.job_id,
                         host.config.prepare_timeout_s)

    async def _adopt(self, job: Any, module: ModuleType, stage: int) -> bool:
        """Every data holder of the running job died (the job waits, rule 5) and this joiner
        is the first live stage-0 node: take stage 0's state from whichever node keeps the
        last holder's backup, and coordinate the job from the iteration it is at."""
        from gwtf.train.data import DataError
        from gwtf.train.state import StateError

        host = self.host
        me = host.node_id
        if stage != 0:
            return False
        # Two holders joining at once must not both take over: wait for gossip to show each
        # other, leave it to the smallest id, and to one the participants follow already.
        await asyncio.sleep(4 * host.config.heartbeat_s)
        live = host.live_members()
        if any(m.stage == 0 and m.id < me for m in live):
            return False
        request = job_pb2.SyncRequest(sender=me, job_id=job.job_id)
        replies: dict[str, tuple[int, job_pb2.SyncReply]] = {}
        for member in live:
            try:
                reply = await self.call(_sync_call(request), member,
                                        host.config.rpc_timeout_s, attempts=1)
            except RuntimeError:
                continue
            replies[member.id] = (member.stage, reply)
        if not replies or any(s == 0 for s, _ in replies.values()):
            return False  # nobody runs it here, or a holder still does
        followed = {r.coordinator for _, r in replies.values()}
        if any(c != me and host.member(c) is not None for c in followed):
            return False  # another holder took it over: enter through it
        top = max(r.iteration for _, r in replies.values())
        state: tuple[int, bytes] | None = None
        for member in sorted(live, key=lambda m: m.id):
            try:
                state = await self._fetch_from(member.id, job.job_id, 0)
                break
            except RuntimeError:
                continue
        if state is None or state[0] != top:
            host.log.warning(
                "job %s: every data holder died and no node keeps stage 0's state of iteration "
                "%d; the job waits", job.job_id, top,
            )
            return False
        try:
            executor, corpus = await asyncio.to_thread(
                module.StageWorker.build_from_state, job, 0, host.num_stages(),
                host.memory_slots, state[1], self.placement,
            )
        except (StateError, DataError) as err:
            self.fail(job.job_id, f"{me} could not use stage 0's state: {err}")
            return False
        active = self._active
        if active is None or active.job_id != job.job_id:
            return False
        worker = self._new_worker(module, job, executor, corpus)
        participants = {node: s for node, (s, _) in replies.items()}
        participants[me] = 0
        round_ = max((r.round for _, r in replies.values() if r.iteration == top), default=0)
        active.worker = worker
        active.participants = participants
        active.coordinator = me
        active.last_iteration_end = time.monotonic()
        worker.start(participants, (), None, round_)
        host.log.warning("job %s: every data holder had died; %s takes stage 0 over from its "
                         "backup of iteration %d", job.job_id, me, top)
        self._records[job.job_id].joins += 1
        await self._take_over(active, "")
        return True

    async def drain(self) -> None:
        """A graceful leave: let the iteration in progress step here first, so that nothing
        this node accumulated must be replayed (bounded by `drain_timeout_s`)."""
        active = self._active
        if active is None or active.worker is None:
            return
        if self._records[active.job_id].state != job_pb2.JOB_STATE_RUNNING:
            return
        worker = active.worker
        start = worker.iteration
        deadline = time.monotonic() + self.host.config.drain_timeout_s
        self.host.log.info("job %s: draining iteration %d before leaving", active.job_id, start)
        while time.monotonic() < deadline and active.worker is worker:
            if worker.iteration > start:
                return
            await asyncio.sleep(0.05)

    # ================================================================== reports to the coordinator

    def holder_flow(self) -> int | None:
        """The flow units out of this holder to the job's stage-1 nodes; None while the
        swarm's flows are not settled (the coordinator weights the holders' shares by them)."""
        active = self._active
        if active is None or not self.host.settled():
            return None
        return sum(
            units for peer, units in self.host.routes().items()
            if active.participants.get(peer) == 1 and peer not in active.departed
        )

    def to_coordinator(
        self,
        job_id: str,
        remote: Callable[[Stubs, float], Awaitable[Any]],
        local: Callable[[], Any],
    ) -> None:
        """A report to the job's coordinator, retried while it does not answer, and sent to a
        new coordinator if the old one died meanwhile (which starts the iteration again, so a
        report that is lost with it is moot)."""
        active = self._active
        if active is None or active.job_id != job_id:
            return

        async def send() -> None:
            for attempt in range(12):
                if self._active is not active or self._records[job_id].state in OVER:
                    return
                if attempt:
                    await asyncio.sleep(min(1.0, 0.1 * 2**attempt))
                if active.coordinator == self.host.node_id:
                    try:
                        local()
                        return
                    except Refusal as err:
                        if err.code != grpc.StatusCode.UNAVAILABLE:
                            self.host.log.warning("job %s: a report was refused: %s", job_id,
                                                  err)
                            return
                        continue
                    except InvalidMessage as err:
                        self.host.log.warning("job %s: a report was refused: %s", job_id, err)
                        return
                member = self.host.member(active.coordinator)
                if member is None:
                    continue
                try:
                    await remote(self.host.stubs(member), self.host.config.rpc_timeout_s)
                    return
                except aio.AioRpcError as err:
                    if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.DEADLINE_EXCEEDED):
                        self.host.log.warning("job %s: %s refused a report: %s", job_id,
                                              active.coordinator, err.details())
                        return

        self.host.spawn(send(), "report")

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """From this node's worker: it stepped an iteration."""
        active = self._active
        if active is None or active.job_id != job_id:
            return
        request = job_pb2.CommittedRequest(
            sender=report.sender,
            job_id=job_id,
            iteration=report.iteration,
            stage=report.stage,
            checksum=report.checksum,
            digests=[job_pb2.DigestEntry(name=n, digest=d) for n, d in sorted(
                report.digests.items())],
        )
        self.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Committed(request, timeout=t),
            lambda: self.committed(request),
        )
        if report.iteration == active.job.iterations - 1 and active.worker is not None:
            worker, active.worker = active.worker, None
            final: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
            self._final_weights = (job_id, worker.stage, final)

            async def finish() -> None:
                try:
                    final.set_result(await worker.weights())
                except Exception as err:  # a download then says why it cannot
                    final.set_exception(err)
                finally:
                    await worker.stop()

            self.host.spawn(finish(), "keep the final weights, stop the worker")

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
            if active.coord is not None:
                active.coord.stop()
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
            calls.append(self.call(
                lambda stubs, t: stubs.jobs.Fail(request, timeout=t), member,
                self.host.config.rpc_timeout_s, attempts=1,
            ))
        await asyncio.gather(*calls, return_exceptions=True)

    def cancel(self, request: job_pb2.CancelRequest) -> job_pb2.CancelReply:
        """A user stops the job: it fails on every member, with the user's reason."""
        check_name("job id", request.job_id)
        progress = self._records.get(request.job_id)
        if progress is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND,
                          f"{self.host.node_id} knows no job {request.job_id[:40]!r}")
        reason = request.reason[:500].strip() or "no reason given"
        self.fail(request.job_id, f"cancelled by the user: {reason}")
        return job_pb2.CancelReply(state=progress.state)

    def on_fail(self, request: job_pb2.FailRequest) -> job_pb2.FailReply:
        check_name("job id", request.job_id)
        reason = request.reason[:500] or "no reason given"
        self.fail(request.job_id, f"{reason} (reported by {request.sender[:40]})", spread=False)
        return job_pb2.FailReply()

    def on_member_down(self, member: MemberInfo, verb: str) -> None:
        """A member died or left: if it took part in the running job, its work is recovered
        (docs/design.md 4), and if it coordinated the job, the next data holder takes over."""
        active = self._active
        if active is None or member.id not in active.participants:
            return
        progress = self._records[active.job_id]
        if progress.state != job_pb2.JOB_STATE_RUNNING or member.id in active.departed:
            return
        me = self.host.node_id
        active.departed.add(member.id)
        worker = active.worker
        if worker is not None:
            worker.depart(member.id)
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
            active.coord.member_down(member, verb)
        if worker is not None and stage == worker.stage and not any(
            s == stage and p != me and p not in active.departed
            and self.host.member(p) is not None
            for p, s in active.participants.items()
        ):
            self._send_backup(active.job_id)  # the last replica of its stage now
        if member.id == active.coordinator:
            holders = sorted(
                p for p, s in active.participants.items()
                if s == 0 and p not in active.departed
                and (p == me or self.host.member(p) is not None)
            )
            if not holders:
                # Rule 5 for stage 0: the job waits until a holder joins, which takes the
                # last holder's state from its backup and coordinates (`_adopt`).
                progress.paused = ("stage 0 has no live node: the job waits for a data holder "
                                   "to join")
                self._record(progress)
                self.host.log.warning("job %s paused: %s", active.job_id, progress.paused)
                return
            active.coordinator = holders[0]
            self.host.log.warning("job %s: its coordinator %s %s; %s takes over",
                                  active.job_id, member.id, verb, holders[0])
            if holders[0] == me and active.coord is None:
                self.host.spawn(self._take_over(active, verb), "take over")

    async def _take_over(self, active: _Active, verb: str) -> None:
        active.taking_over = True
        try:
            coord = await JobCoordinator.take_over(self, active)
        finally:
            active.taking_over = False
        if coord is None:
            return
        progress = self._records[active.job_id]
        progress.coordinator = self.host.node_id
        progress.paused = ""
        # The job's clock goes on from its progress (this node may have entered it late).
        active.started = time.monotonic() - progress.elapsed_s
        if verb == "left":
            progress.leaves += 1
        elif verb:
            progress.crashes += 1
        active.coord = coord
        self.changed(active)

    # ================================================================== contributions

    def screens(self, job_id: str) -> bool:
        """Does the job here screen its stage peers' sums (a robust aggregation)?"""
        active = self._active
        return bool(active is not None and active.job_id == job_id
                    and active.job.aggregation.robust)

    def contribution_expect(self, header: Any) -> int:
        return int(self._worker_for(header.job_id).contribution_numel(header))

    def on_contribution(self, header: Any, flat: Any) -> None:
        self._worker_for(header.job_id).on_contribution(header, flat)

    # ================================================================== joining, closing

    async def catch_up(self, address: str) -> None:
        """A joiner learns the jobs its bootstrap node knows, and enters a running one."""
        try:
            reply = await self.host.stubs_at(address).jobs.List(
                job_pb2.ListRequest(), timeout=self.host.config.rpc_timeout_s
            )
        except aio.AioRpcError:
            return
        running: job_pb2.JobProgress | None = None
        for progress in reply.jobs:
            if progress.job_id and progress.job_id not in self._records:
                self._records[progress.job_id] = progress
                if progress.state == job_pb2.JOB_STATE_RUNNING:
                    running = progress
        self._notify()
        if running is not None and self.host.trains and self._active is None and (
            not self._joining
        ):
            self._joining = True
            await self._join_running(running)

    async def close(self) -> None:
        active = self._active
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

    def refused(self, member: MemberInfo) -> None:
        self._host.refused(member)

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

    def report_done(self, job_id: str, iteration: int, round_: int,
                    microbatches: tuple[int, ...]) -> None:
        flow = self._manager.holder_flow()
        request = job_pb2.DoneRequest(sender=self.node_id, job_id=job_id, iteration=iteration,
                                      round=round_, microbatches=microbatches,
                                      flow_units=flow or 0, flows_settled=flow is not None)
        self._manager.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Done(request, timeout=t),
            lambda: self._manager.done(request),
        )

    def report_replayed(self, job_id: str, iteration: int, round_: int, mb: int,
                        stage: int) -> None:
        request = job_pb2.ReplayedRequest(sender=self.node_id, job_id=job_id,
                                          iteration=iteration, round=round_, microbatch=mb,
                                          stage=stage)
        self._manager.to_coordinator(
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
        self._manager.to_coordinator(
            job_id, lambda stubs, t: stubs.jobs.Prepared(request, timeout=t),
            lambda: self._manager.prepared(request),
        )

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        self._manager.report_committed(job_id, report)

    async def keep_backup(self, job_id: str, stage: int, iteration: int, state: bytes) -> None:
        await self._manager.keep_backup(job_id, stage, iteration, state)

    def fail(self, job_id: str, reason: str) -> None:
        self._manager.fail(job_id, reason)
