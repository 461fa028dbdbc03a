"""JobLauncher: a job from its submission to its start on every member (docs/design.md 3.7, 10).

    submit (any node)  -> check the job, the cut into the swarm's stages, a live node per stage
                       -> Prepare at every live member (each builds its stage, loads torch then)
                       -> Start at every member that prepared: participants, holders, coordinator

torch and the worker are imported once (`load`): by a node that trains, before it enters its
swarm (`preload`: importing torch holds the interpreter for seconds, in which a member would miss
its heartbeats and be declared dead; measured, six nodes loading it at once on two cores declared
each other dead), and otherwise only when a job description must be read (`parse`).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gwtf.flow.compression import swarm_plan
from gwtf.job.iterations import IterationCoordinator
from gwtf.job.roster import nodes_by_stage, start_fits
from gwtf.node.control.entry import member_links, swarm_view
from gwtf.node.control.membership import MemberInfo
from gwtf.node.errors import CannotRun, Mismatch, NotHeld, NotParticipant, Superseded, WrongState
from gwtf.node.jobs.book import CurrentJob, JobBook, state_name, stop_worker
from gwtf.node.jobs.coordinator.coordinator import JobCoordinator, Manager
from gwtf.node.jobs.host import JobsHost
from gwtf.node.jobs.transfer import StateTransfer
from gwtf.node.jobs.wire import JobWire
from gwtf.node.rpc.codec import InvalidMessage, check_name
from gwtf.v1 import job_pb2

__all__ = ["MAX_JOB_JSON", "MAX_MICROBATCHES", "JobLauncher"]

MAX_JOB_JSON = 64 * 1024
"""Largest job description accepted (a job file is a few hundred bytes)."""

MAX_MICROBATCHES = 2**16
"""Most microbatches per iteration a node accepts: each is dealt, tracked and reported."""


class JobLauncher:
    """Loading torch, reading jobs, and submitting, preparing and starting them: see the module
    docstring. `manager` is the node's job manager (the coordinator this node may start drives
    it); `worker_host(job_id)` is the node as a new StageWorker of that job sees it."""

    def __init__(
        self,
        host: JobsHost,
        book: JobBook,
        wire: JobWire,
        transfer: StateTransfer,
        manager: Manager,
        worker_host: Callable[[str], Any],
    ) -> None:
        self.host = host
        self.book = book
        self.wire = wire
        self.transfer = transfer
        self.manager = manager
        self._worker_host = worker_host
        self._module: ModuleType | None = None
        self._submitting = asyncio.Lock()
        self.placement: Any = None
        """Where stages run (a gwtf.train.device.Placement), chosen at `preload`."""

    # ================================================================== lazy torch

    async def load(self) -> ModuleType:
        """gwtf.node.worker.worker (torch, gwtf.train), imported once, in a thread."""
        if self._module is None:
            import os

            # One thread while torch loads; `preload` then sets the node's count (--threads).
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            self._module = await asyncio.to_thread(importlib.import_module,
            "gwtf.node.worker.worker")
        return self._module

    async def preload(self, device: str, precision: str, threads: int | None) -> None:
        """Load torch and the worker now, before this node is in a swarm, and choose where the
        stages will run (`gwtf.train.device`); DeviceError if this machine cannot run it."""
        await self.load()
        from gwtf.train.device import configure

        self.placement = await asyncio.to_thread(configure, device, precision, threads)

    @property
    def loaded(self) -> bool:
        """torch and the worker are loaded (a job arrived here once)."""
        return self._module is not None

    async def parse(self, text: str) -> Any:
        """A JobConfig from the wire's JSON; InvalidMessage (INVALID_ARGUMENT) if wrong."""
        if len(text) > MAX_JOB_JSON:
            raise InvalidMessage(f"the job description is over {MAX_JOB_JSON} bytes")
        await self.load()
        from gwtf.train.job import JobError, job_from_dict

        try:
            table = json.loads(text)
        except ValueError:
            raise InvalidMessage("the job description is not JSON") from None
        if not isinstance(table, dict):
            raise InvalidMessage("the job description is not a JSON object")
        try:
            job = job_from_dict(table)
            # A client pins the job's files; a job that comes without their digests is pinned
            # here, from this node's copies, so that the job its peers prepare names them.
            if not job.is_pinned:
                job = await asyncio.to_thread(job.pinned)
        except (JobError, TypeError) as err:
            raise InvalidMessage(f"invalid job: {err}") from None
        if job.microbatches > MAX_MICROBATCHES:
            raise InvalidMessage(
                f"a job of {job.microbatches} microbatches per iteration is more than a swarm "
                f"takes ({MAX_MICROBATCHES}); use fewer, larger microbatches"
            )
        from gwtf.node.dataplane.tensors import TensorLimits
        from gwtf.train.costs import activation_bytes

        limit = TensorLimits().max_tensor_bytes  # what the data plane takes of one tensor
        if activation_bytes(job) > limit:
            raise InvalidMessage(
                f"one activation of this job is {activation_bytes(job)} bytes, more than the "
                f"{limit} a node accepts; use smaller microbatches"
            )
        return job

    def new_worker(self, module: ModuleType, job: Any, executor: Any, corpus: Any) -> Any:
        """A StageWorker of `job` around a built executor (not started)."""
        host = self.host
        return module.StageWorker(
            self._worker_host(job.job_id),
            job,
            executor,
            corpus,
            slots=host.memory_slots,
            emulate_compute_s=host.emulate_compute_s,
            config=module.WorkerConfig(
                data_timeout_s=host.config.data_timeout_s,
                commit_timeout_s=host.config.commit_timeout_s,
                rpc_timeout_s=host.config.rpc_timeout_s,
                failure_timeout_s=host.config.failure_timeout_s,
            ),
            fault=host.fault,
        )

    # ================================================================== submission

    async def submit(self, request: job_pb2.SubmitRequest) -> job_pb2.SubmitReply:
        job = await self.parse(request.job_json)
        if request.resume_iteration >= job.iterations:
            raise InvalidMessage(
                f"cannot resume job {job.job_id} at iteration {request.resume_iteration}: it has "
                f"{job.iterations} iterations"
            )
        async with self._submitting:
            return await self._submit(job, request.resume_iteration)

    def _fail_here(self, job_id: str, reason: str) -> None:
        self.manager.fail(job_id, reason, spread=False)

    def _plan(self, job: Any, stages: int, members: list[MemberInfo]) -> Any:
        """`job` with its compression plan (docs/design.md 2.15): kept where the job states one
        (a resumed job, or one its author planned), else chosen from this node's view of the
        swarm, with the job's own activation size."""
        if job.is_planned:
            return job
        from gwtf.train.codecs import side_seconds
        from gwtf.train.costs import activation_bytes
        from gwtf.train.partition import partition

        ends = [spec.end_layer for spec in partition(job.model.layers, stages)[:-1]]
        view = swarm_view(members, stages, activation_bytes(job),
                          member_links(members, self.host.link))
        uplinks = {m.id: m.uplink_gbps for m in members}
        values = view.activation_bytes // 4
        # The codecs' compute is timed on this machine and charged to every member alike:
        # members' records state their training speed, not their codecs'.
        plan = swarm_plan(stages, view.activation_bytes,
                          [(n, uplinks.get(n.id, 0.0)) for n in view.nodes], view.links,
                          view.intra, job.compression.allow,
                          codec_seconds=lambda name: side_seconds(name, values))  # fmt: skip
        planned = job.planned({end: name for end, name in zip(ends, plan, strict=True)})
        if any(name != "none" for name in plan):
            self.host.log.info(
                "job %s: compresses %s, where the swarm's links bind (now job %s)", job.job_id,
                ", ".join(f"{name} after block {end}"
                          for end, name in zip(ends, plan, strict=True) if name != "none"),
                planned.job_id,
            )  # fmt: skip
        return planned

    async def _submit(self, job: Any, resume: int = 0) -> job_pb2.SubmitReply:
        from gwtf.train.partition import PartitionError, partition

        host = self.host
        records = self.book.records
        stages = host.num_stages()
        try:
            partition(job.model.layers, stages)
        except PartitionError as err:
            raise InvalidMessage(f"this swarm has {stages} stages: {err}") from None
        members = [m for m in host.live_members()]
        me = host.member(host.node_id)
        assert me is not None
        members.append(me)
        job = self._plan(job, stages, members)
        job_id: str = job.job_id
        done = records.get(job_id)
        if done is not None and done.state == job_pb2.JOB_STATE_COMPLETED:
            # The same job (its id is its content) trained already: it is not trained twice.
            # A failed one may be submitted again.
            host.log.info("job %s submitted again: it completed already; its result stands",
                          job_id)
            return job_pb2.SubmitReply(job_id=job_id)
        active = self.book.active
        if active is not None and records[active.job_id].state == job_pb2.JOB_STATE_RUNNING:
            if active.job_id == job_id:
                return job_pb2.SubmitReply(job_id=job_id)
            raise WrongState(
                f"job {active.job_id} is {state_name(records[active.job_id].state)} on "
                "this swarm; wait for it to end, then submit again",
            )
        by_stage = nodes_by_stage(((m.id, m.stage) for m in members), stages)
        empty = [s for s in range(stages) if not by_stage[s]]
        if empty:
            raise CannotRun(
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
            await self.wire.spread_fail(job_id, reason, members, self._fail_here)
            raise CannotRun(reason)
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
            await self.wire.spread_fail(job_id, reason, members, self._fail_here)
            raise CannotRun(reason)
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
                await self.wire.spread_fail(job_id, reason, members, self._fail_here)
                raise CannotRun(reason)
        return job_pb2.SubmitReply(job_id=job_id)

    async def _prepare_at(
        self, member: MemberInfo, request: job_pb2.PrepareRequest
    ) -> job_pb2.PrepareReply:
        if member.id == self.host.node_id:
            return await self.prepare(request)
        reply: job_pb2.PrepareReply = await self.wire.call(
            lambda stubs, t: stubs.jobs.Prepare(request, timeout=t),
            member,
            self.host.config.prepare_timeout_s,
        )
        return reply

    async def _start_at(self, member: MemberInfo, request: job_pb2.StartRequest) -> None:
        if member.id == self.host.node_id:
            self.start(request)
            return
        await self.wire.call(
            lambda stubs, t: stubs.jobs.Start(request, timeout=t),
            member,
            self.host.config.rpc_timeout_s,
        )

    # ================================================================== preparation, start

    async def prepare(self, request: job_pb2.PrepareRequest) -> job_pb2.PrepareReply:
        host = self.host
        if not host.trains:
            raise CannotRun(
                f"{host.node_id} runs with --no-train: it routes but takes no training work",
            )
        job = await self.parse(request.job_json)
        active = self.book.active
        if active is not None:
            state = self.book.records[active.job_id].state
            if state == job_pb2.JOB_STATE_RUNNING:
                raise WrongState(
                    f"{host.node_id} runs job {active.job_id}; one job at a time",
                )
            if active.job_id == job.job_id and state == job_pb2.JOB_STATE_PREPARING and (
                active.worker is not None
            ):
                return self._prepared(active)
            # A job prepared and never started (its submission failed), or one that is over.
            stop_worker(host, active)
        module = await self.load()
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
            kept = self.transfer.resumes.get(job.job_id)
            if kept is None or kept[0] != resume:
                raise NotHeld(
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
            raise CannotRun(str(err)) from None
        if executor.iteration != resume:
            raise Mismatch(
                f"the state sent to {host.node_id} is of iteration {executor.iteration}, "
                f"not {resume}",
            )
        self.transfer.resumes.pop(job.job_id, None)
        if self.book.active is not active:
            raise Superseded("another job arrived meanwhile")
        worker = self.new_worker(module, job, executor, corpus)
        job_json = json.dumps(job.to_dict(), sort_keys=True)
        self.book.active = active = CurrentJob(job, job.job_id, job_json, worker)
        self.book.record(
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

    def _prepared(self, active: CurrentJob) -> job_pb2.PrepareReply:
        assert active.worker is not None
        reply = job_pb2.PrepareReply(corpus_digest=active.worker.corpus_digest)
        if self.host.own_stage() == 0 and self.host.settled():
            # The participants are not known yet: every stage-1 peer counts.
            reply.flow_units = sum(self.host.routes().values())
            reply.flows_settled = True
        return reply

    def start(self, request: job_pb2.StartRequest) -> job_pb2.StartReply:
        host = self.host
        active = self.book.current(request.job_id)
        if active is None:
            raise NotParticipant(
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
        if not start_fits(participants, holders, weights, request.coordinator, stages):
            raise InvalidMessage("the start names holders or a coordinator that do not fit")
        active.participants = participants
        active.base = set(participants)
        active.coordinator = request.coordinator
        active.holders = holders
        now = time.monotonic()
        active.started = active.last_iteration_end = now
        job = active.job
        progress = self.book.records[active.job_id]
        progress.state = job_pb2.JOB_STATE_RUNNING
        progress.coordinator = request.coordinator
        self.book.record(progress)
        if request.coordinator == host.node_id:
            active.coord = JobCoordinator(self.manager, active, IterationCoordinator(
                iterations=job.iterations,
                microbatches=job.microbatches,
                participants=participants,
                num_stages=stages,
                holders=holders,
                weights=dict(zip(holders, weights, strict=True)) if weights else None,
                iteration=progress.resumed_from,
                snapshot_every=job.snapshot_every, snapshot_start=progress.resumed_from,
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
