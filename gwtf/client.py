"""The client side of gwtf: submit and follow training jobs, ask a node about its swarm.

    client = GwtfClient("127.0.0.1:50051")
    job_id = client.submit("tiny-gpt")            # a preset, a TOML job file, or a JobConfig
    result = client.wait(job_id, on_progress=lambda r: print(r.iterations_completed, r.loss))
    result.to_json()    # {"job_id", "iterations_completed", "loss", "param_checksum", ...}
    client.jobs()       # every job the node knows, as JobResult
    client.cancel(job_id, "wrong learning rate")  # it fails on every node, with that reason

    async with AsyncGwtfClient("127.0.0.1:50051") as client:   # inside an event loop
        result = await client.wait(await client.submit("tiny-gpt"))

    reply = fetch_status("127.0.0.1:50051", timeout_s=5)   # StatusError if it cannot
    view = status_json(reply)   # {"members", "arcs", "flow_value", "jobs", ...}

Any node of a swarm takes a job and answers for it: the job is spread to every member, and the
progress (loss per iteration, throughput, the final parameter checksum) to every member too.
Errors are `ClientError`, one sentence with the exit code the CLI gives it: 2 for a job the user
must change, 1 for a swarm that cannot run it now or cannot be reached. The job is read and
checked here first (that imports torch, as `gwtf.train` does), so a wrong job file is reported
before any node is asked.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gwtf.flow.topology import CAP_SCALE
from gwtf.node.rpc.security import Credentials

__all__ = [
    "AsyncGwtfClient",
    "ClientError",
    "Excluded",
    "Moved",
    "RolledBack",
    "GwtfClient",
    "JobResult",
    "StatusError",
    "fetch_jobs",
    "fetch_status",
    "format_status",
    "job_result",
    "merge_runs",
    "run_cancel",
    "run_status",
    "run_submit",
    "status_json",
]

EXIT_FAILED = 1
EXIT_USAGE = 2
T = TypeVar("T")
WEIGHTS_CALL_S = 600.0
"""Deadline of one stage's weights download (a large stage over a slow link takes minutes)."""
WATCH_CALL_S = 60.0
WATCH_RETRIES = 4
"""Watch calls that fail to reach the node in a row before `wait` says it cannot: a node under
load may drop a stream (UNAVAILABLE) and answer the next call at once; a dead one fails all of
them, after 0.25 + 0.5 + 1 + 2 s."""
RESUME_WITHIN_S = 600.0
"""How long `wait_resuming` waits for every stage to have a live node again before it gives up
resuming a job that lost a stage's state (`gwtf submit --resume-within`)."""
RESUME_POLL_S = 1.0
MAX_RESUMES = 16
"""Resumes from the same checkpoint iteration `wait_resuming` tries before it gives up: a job
that fails again before its next checkpoint each time makes no progress."""
"""Deadline of one Watch call; `wait` makes another until the job ends."""


class StatusError(Exception):
    """The node could not be asked (one sentence)."""


async def _fetch(address: str, timeout_s: float, swarm: bool, creds: Credentials) -> Any:
    from gwtf.node.rpc.security import open_channel
    from gwtf.node.rpc.transport import channel_options
    from gwtf.v1 import node_pb2, node_pb2_grpc

    async with open_channel(address, creds, options=channel_options()) as channel:
        stub = node_pb2_grpc.StatusStub(channel)
        return await stub.Get(node_pb2.StatusRequest(swarm=swarm), timeout=timeout_s)


def fetch_status(
    address: str,
    *,
    timeout_s: float = 10.0,
    swarm: bool = True,
    credentials: Credentials | None = None,
) -> Any:
    """The StatusReply of the node at `address` (with every member's part when `swarm`);
    `credentials` for a swarm that requires a token or TLS."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc
    from grpc import aio

    try:
        return asyncio.run(_fetch(address, timeout_s, swarm, credentials or Credentials()))
    except aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise StatusError(f"{address} refused the call: {err.details()}") from None
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            raise StatusError(
                f"cannot reach {address}: nothing answers there, or it refused the TLS "
                "handshake; check the address, that a gwtf node runs there, and --tls-*"
            ) from None
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise StatusError(f"{address} did not answer within {timeout_s:g} s") from None
        raise StatusError(f"{address} answered with an error: {err.code().name}") from None


# ---------------------------------------------------------------------------- jobs


class ClientError(Exception):
    """A job that cannot be submitted or followed (one sentence), with the CLI's exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, *,
                 unreachable: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.unreachable = unreachable
        """The node did not answer at all (gone, or cut off): another member may."""


_STATES = {1: "preparing", 2: "running", 3: "completed", 4: "failed"}


@dataclass(frozen=True)
class RolledBack:
    """The swarm went back to an older iteration: `stage` lost every replica while iteration
    `from_iteration` was in progress, and its newest snapshot was of `to_iteration`; the
    iterations between were trained again (docs/design.md 4.6)."""

    stage: int
    from_iteration: int
    to_iteration: int
    reason: str


@dataclass(frozen=True)
class Moved:
    """The coordinator moved `node` from `from_stage` to `stage` at the step of `iteration`,
    the swarm's maximum flow `flow` microbatches/s before it and `gain` more after it
    (docs/design.md 2.11)."""

    node: str
    from_stage: int
    stage: int
    iteration: int
    flow: float
    gain: float


@dataclass(frozen=True)
class Excluded:
    """A replica the job excluded as a bad peer: where, when and why."""

    node: str
    stage: int
    iteration: int
    reason: str


@dataclass(frozen=True)
class JobResult:
    """A job's progress as a node reports it (complete once `state` is completed or failed)."""

    job_id: str
    name: str
    state: str
    iterations: int
    iterations_completed: int
    loss: tuple[float, ...]
    param_checksum: str
    throughput_mb_s: float
    dropped_microbatches: int
    error: str
    microbatches_trained: int
    elapsed_s: float
    coordinator: str
    routes: tuple[tuple[tuple[str, ...], int], ...]
    """Each path the microbatches took (node ids, data holder first) and how many took it."""
    checksum_mismatches: int
    iteration_s: tuple[float, ...]
    crashes: int = 0
    """Participants that died while the job ran (docs/design.md 4)."""
    leaves: int = 0
    joins: int = 0
    rerouted_microbatches: int = 0
    """Microbatches sent to a replacement node after a death (rules 1-3)."""
    replayed_microbatches: int = 0
    """Of those, the ones whose stage work was done again (rules 2-3)..."""
    replayed_s: float = 0.0
    """...and that work's compute, seconds (the job's wasted compute)."""
    kept_microbatches: int = 0
    """A dead node's accumulated microbatches that a stage peer kept in its shipped running
    sum and adopted instead of a replay (bounded replay, docs/design.md 4.9)."""
    compute_s: float = 0.0
    """Stage compute of the whole job, every node summed, seconds."""
    lost_microbatches: int = 0
    """Neither trained nor recorded as dropped: 0 unless something is badly wrong."""
    dropped: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """(iteration, microbatch ids) a dead data holder took with it (rule 4)."""
    restarts: int = 0
    paused: str = ""
    paused_s: float = 0.0
    excluded: tuple[Excluded, ...] = ()
    """Replicas excluded from the job as bad peers (a robust aggregation only), in order."""
    resumed_from: int = 0
    """The iteration the job resumed at from a checkpoint (`loss` begins there); 0: none."""
    rollbacks: tuple[RolledBack, ...] = ()
    """Times the swarm went back to a stage's snapshot, in order."""
    moves: tuple[Moved, ...] = ()
    """Nodes the coordinator moved between stages, in order."""
    compression: tuple[tuple[int, str], ...] = ()
    """The boundaries that compressed, as (blocks before it, codec): the job's plan
    (docs/design.md 2.15)."""
    bytes_saved: int = 0
    """What the plan saved on the wire: float32 minus codec bytes of each trained microbatch's
    activation and gradient at each compressed boundary (computed from the plan and the count,
    not metered: the nodes' `gwtf_job_bytes_saved` metric meters it)."""

    @property
    def over(self) -> bool:
        return self.state in ("completed", "failed")

    def trained_ids(self, microbatches: int) -> Callable[[int], list[int]]:
        """Iteration -> the microbatch ids it trained (all but the dropped ones): what
        `gwtf.train.train_reference(microbatch_ids=...)` needs to train the same."""
        dropped = {k: set(ids) for k, ids in self.dropped}
        return lambda k: [m for m in range(microbatches) if m not in dropped.get(k, set())]

    def to_json(self) -> dict[str, Any]:
        """What `gwtf submit --json` prints: the keys of `gwtf reference --json`, and what
        the swarm did about nodes that died or joined."""
        return {
            "job_id": self.job_id,
            "iterations_completed": self.iterations_completed,
            "loss": list(self.loss),
            "param_checksum": self.param_checksum,
            "throughput_mb_s": self.throughput_mb_s,
            "dropped_microbatches": self.dropped_microbatches,
            "crashes": self.crashes,
            "leaves": self.leaves,
            "joins": self.joins,
            "rerouted_microbatches": self.rerouted_microbatches,
            "replayed_microbatches": self.replayed_microbatches,
            "replayed_s": self.replayed_s,
            "kept_microbatches": self.kept_microbatches,
            "compute_s": self.compute_s,
            "lost_microbatches": self.lost_microbatches,
            "restarts": self.restarts,
            "dropped": {str(k): list(ids) for k, ids in self.dropped},
            "excluded": [dataclasses.asdict(e) for e in self.excluded],
            "resumed_from": self.resumed_from,
            "rollbacks": [dataclasses.asdict(r) for r in self.rollbacks],
            "moves": [dataclasses.asdict(m) for m in self.moves],
            "compression": {"after": {str(b): c for b, c in self.compression},
                            "bytes_saved": self.bytes_saved},
        }


def job_result(pb: Any) -> JobResult:
    """A JobResult from the wire's JobProgress."""
    return JobResult(
        job_id=pb.job_id,
        name=pb.name,
        state=_STATES.get(pb.state, "unknown"),
        iterations=pb.iterations,
        iterations_completed=pb.iterations_completed,
        loss=tuple(pb.loss),
        param_checksum=pb.param_checksum,
        throughput_mb_s=pb.throughput_mb_s,
        dropped_microbatches=pb.dropped_microbatches,
        error=pb.error,
        microbatches_trained=pb.microbatches_trained,
        elapsed_s=pb.elapsed_s,
        coordinator=pb.coordinator,
        routes=tuple((tuple(r.path), r.microbatches) for r in pb.routes),
        checksum_mismatches=pb.checksum_mismatches,
        iteration_s=tuple(pb.iteration_s),
        crashes=pb.crashes,
        leaves=pb.leaves,
        joins=pb.joins,
        rerouted_microbatches=pb.rerouted_microbatches,
        replayed_microbatches=pb.replayed_microbatches,
        replayed_s=pb.replayed_s,
        kept_microbatches=pb.kept_microbatches,
        compute_s=pb.compute_s,
        lost_microbatches=pb.lost_microbatches,
        dropped=tuple((d.iteration, tuple(d.microbatches)) for d in pb.dropped),
        restarts=pb.restarts,
        paused=pb.paused,
        paused_s=pb.paused_s,
        excluded=tuple(Excluded(e.node, e.stage, e.iteration, e.reason) for e in pb.excluded),
        resumed_from=pb.resumed_from,
        rollbacks=tuple(RolledBack(r.stage, r.from_iteration, r.to_iteration, r.reason)
                        for r in pb.rollbacks),
        moves=tuple(Moved(m.node, m.from_stage, m.stage, m.iteration, m.flow, m.gain)
                    for m in pb.moves),
        **_compression(pb.job_json, pb.microbatches_trained),
    )


def _compression(job_json: str, trained: int) -> dict[str, Any]:
    """The plan's compressed boundaries and the bytes they saved, from the job's JSON."""
    from gwtf.flow.compression import wire_bytes

    try:
        table = json.loads(job_json) if job_json else {}
        after = {int(b): str(c) for b, c in table.get("compression", {}).get("after", {}).items()}
        model = table["model"] if after else {}
        numel = table["microbatch_size"] * model["seq_len"] * model["width"] if after else 0
        saved = sum(2 * trained * (4 * numel - wire_bytes(c, numel)) for c in after.values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {"compression": tuple(sorted(after.items())), "bytes_saved": saved}


READ_RETRY_S = 0.5
"""The pause before a read-only call is made again on a fresh connection (`_call`)."""


def _rpc_error(address: str, err: Any, timeout_s: float | None) -> ClientError:
    import grpc

    code = err.code()
    details = (err.details() or "").splitlines()
    said = details[0] if details else code.name
    if code == grpc.StatusCode.UNAVAILABLE:
        return ClientError(
            f"cannot reach {address}: nothing answers there; check the address and that a "
            "gwtf node runs there", unreachable=True,
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        waited = f" within {timeout_s:g} s" if timeout_s is not None else ""
        return ClientError(f"{address} did not answer{waited}", unreachable=True)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ClientError(f"{address} refused the job: {said}", EXIT_USAGE)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ClientError(f"{address} refused the call: {said}", EXIT_USAGE)
    return ClientError(f"{address} refused: {said}")


class _Node:
    """Where a client's calls go, how long each may take, and with which credentials."""

    def __init__(
        self, address: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.credentials = credentials or Credentials()
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")


class AsyncGwtfClient(_Node):
    """Submit jobs to, follow and cancel them at the node at `address` (HOST:PORT), from code
    that runs an event loop (an async service, a notebook):

        async with AsyncGwtfClient("127.0.0.1:50051") as client:
            job_id = await client.submit("tiny-gpt")
            result = await client.wait(job_id)

    One channel, opened at the first call and closed by `close()` (or the `async with`); every
    call has a deadline; errors are ClientError.
    """

    def __init__(
        self, address: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
    ) -> None:
        super().__init__(address, timeout_s=timeout_s, credentials=credentials)
        self._channel: Any = None
        self._known: list[str] = []
        """The swarm's members' addresses as last read (`_replicas`): whom `_fail_over` asks."""

    async def __aenter__(self) -> AsyncGwtfClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def _call(self, call: Callable[[Any], Any], timeout_s: float | None, *,
                    reads: bool = False) -> Any:  # fmt: skip
        """`call` on this node's JobService stub; ClientError (one sentence) if it fails. A call
        that only `reads` is made once more on a fresh connection when the first finds none
        (UNAVAILABLE): a connection reset under load, or one the node closed, is not a node
        that is gone, and a client watching a job should not end on it."""
        from grpc import StatusCode, aio

        from gwtf.node.rpc.security import open_channel
        from gwtf.node.rpc.transport import channel_options
        from gwtf.v1 import job_pb2_grpc

        for attempt in range(2 if reads else 1):
            if self._channel is None:
                self._channel = open_channel(self.address, self.credentials,
                                             options=channel_options())  # fmt: skip
            try:
                return await call(job_pb2_grpc.JobServiceStub(self._channel))
            except aio.AioRpcError as err:
                if attempt == 0 and reads and err.code() == StatusCode.UNAVAILABLE:
                    channel, self._channel = self._channel, None
                    await channel.close()
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                raise _rpc_error(self.address, err, timeout_s) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def submit(self, job: Any, *, timeout_s: float = 300.0) -> str:
        """Submit `job` (a JobConfig, a preset name or a TOML file path); its id once every
        member has prepared its stage and the job has started (this loads torch on every
        node, which takes a while on a busy machine: hence the long deadline). The same job
        again (its id is its content) is the same job: running or completed, it is not trained
        a second time."""
        from gwtf.train.job import JobConfig, JobError, resolve_job
        from gwtf.v1 import job_pb2

        try:
            if not isinstance(job, JobConfig):
                job = resolve_job(Path(job) if not isinstance(job, str) else job)
            # The digests of its files go with the job: its id, and what every node checks.
            job = await asyncio.to_thread(job.pinned)
        except JobError as err:
            raise ClientError(str(err), EXIT_USAGE) from None
        request = job_pb2.SubmitRequest(job_json=json.dumps(job.to_dict(), sort_keys=True))

        async def call(stub: Any) -> Any:
            return await stub.Submit(request, timeout=timeout_s)

        reply = await self._call(call, timeout_s)
        return str(reply.job_id)

    async def mismatches(self, job: Any) -> list[str]:
        """What this swarm derives for every job and that disagrees with `job`, one sentence
        each (empty: nothing): today its activation size, which its flows are computed for."""
        from gwtf.train.costs import activation_bytes
        from gwtf.v1 import node_pb2, node_pb2_grpc

        async def view(stub: Any) -> Any:
            status = node_pb2_grpc.StatusStub(self._channel)
            return await status.Get(node_pb2.StatusRequest(swarm=False), timeout=self.timeout_s)

        reply = await self._call(view, self.timeout_s)
        warning = activation_mismatch(activation_bytes(job), reply.swarm.activation_bytes)
        return [] if warning is None else [warning]

    async def jobs(self) -> list[JobResult]:
        """Every job the node knows."""
        from gwtf.v1 import job_pb2

        async def call(stub: Any) -> Any:
            return await stub.List(job_pb2.ListRequest(), timeout=self.timeout_s)

        return [job_result(p) for p in (await self._call(call, self.timeout_s, reads=True)).jobs]

    async def progress(self, job_id: str) -> JobResult:
        """The job's progress now."""
        for result in await self.jobs():
            if result.job_id == job_id:
                return result
        raise ClientError(f"{self.address} knows no job {job_id}")

    async def cancel(self, job_id: str, reason: str = "") -> str:
        """Stop the job on every node of its swarm (it fails, with `reason`); the state it is
        in after the call ("failed", or "completed" if it had ended already)."""
        from gwtf.v1 import job_pb2

        async def call(stub: Any) -> Any:
            return await stub.Cancel(job_pb2.CancelRequest(job_id=job_id, reason=reason),
                                     timeout=self.timeout_s)  # fmt: skip

        reply = await self._call(call, self.timeout_s)
        return job_pb2.JobState.Name(reply.state).removeprefix("JOB_STATE_").lower()

    async def download(self, job_id: str, directory: str | Path) -> Path:
        """Write the job's latest weights into `directory` (`_download`); the model file."""
        from gwtf.train.checkpoints.checkpoint import MODEL_FILE

        await self._download(job_id, directory)
        return Path(directory) / MODEL_FILE

    async def _download(self, job_id: str, directory: str | Path) -> int:
        """Write the job's latest weights into `directory` as one model: `model.safetensors`
        (the parameter names of the whole model, the same file `gwtf reference
        --checkpoint-dir` writes for the same training) and `job.toml`; for a running job also
        `optimizer.safetensors` (AdamW's state), so that the folder can be resumed from
        (`resume`). Each stage comes from one of its replicas (the next one if a replica cannot
        serve it), streamed in chunks, every stage at once (a replica reads its state when its
        stream starts, so the stages are read within moments of each other however long they
        stream); every stage must be at the same iteration (a running job's stages step
        together: a download that straddles a step is done again). Once the job completed, the
        weights must have the checksum the swarm reported. The iteration written."""
        from gwtf.train.checkpoints.checkpoint import CheckpointError, merge_stages, save_model
        from gwtf.train.checkpoints.resume import remove_optimizer, save_optimizer
        from gwtf.v1 import job_pb2

        record = await self._record(job_id)
        job = self._job_of(record)
        replicas = await self._replicas()
        running = record.state == job_pb2.JOB_STATE_RUNNING
        for _ in range(3):
            parts = await asyncio.gather(*(self._stage_part(job, s, replicas[s], full=running)
                                           for s in range(len(replicas))))  # fmt: skip
            iterations = {iteration for iteration, _, _ in parts}
            if len(iterations) == 1:
                break
        else:
            raise ClientError(f"the stages of job {job_id} kept stepping while they were "
                              f"read ({sorted(iterations)}); download it again")
        (iteration,) = iterations
        done = record.state == job_pb2.JOB_STATE_COMPLETED and iteration == job.iterations
        optimizers = [optimizer for _, _, optimizer in parts if optimizer is not None]
        try:
            if len(optimizers) == len(parts):
                save_optimizer(directory, {n: t for o in optimizers for n, t in o.items()},
                               job, iteration)  # fmt: skip
            else:  # the weights alone: an older optimizer file would no longer match them
                remove_optimizer(directory)
            save_model(directory, merge_stages([p for _, p, _ in parts]), job, iteration,
                       expect_checksum=record.param_checksum if done else None)
        except CheckpointError as err:
            raise ClientError(str(err)) from None
        return int(iteration)

    async def resume(self, directory: str | Path, *, timeout_s: float = 300.0) -> str:
        """Resume the job checkpointed in `directory` (written by `download` while it ran) on
        this swarm, at the checkpoint's iteration: every node of every stage is sent its stage's
        weights and optimizer state (cut for this swarm's number of stages, whatever the
        checkpointed swarm's was), then the job is submitted to start there. It ends equal to an
        uninterrupted run. The job's id (the same job: the same id)."""
        from gwtf.train.checkpoints.checkpoint import CheckpointError
        from gwtf.train.checkpoints.resume import load_resumable, stage_state
        from gwtf.v1 import job_pb2

        try:
            checkpoint = await asyncio.to_thread(load_resumable, directory)
        except (CheckpointError, ValueError) as err:  # a JobError is a ValueError
            raise ClientError(str(err), EXIT_USAGE) from None
        job = checkpoint.job
        if checkpoint.iteration >= job.iterations:
            raise ClientError(f"job {job.job_id} in {directory} trained all its "
                              f"{job.iterations} iterations already; nothing to resume",
                              EXIT_USAGE)  # fmt: skip
        replicas = await self._replicas()
        for stage, addresses in replicas.items():
            try:
                data = await asyncio.to_thread(stage_state, checkpoint, stage, len(replicas))
            except (CheckpointError, ValueError) as err:
                raise ClientError(f"cannot cut {directory} for this swarm: {err}",
                                  EXIT_USAGE) from None  # fmt: skip
            if not addresses:
                raise ClientError(f"stage {stage} of this swarm has no live node; start one "
                                  "and resume again")  # fmt: skip
            await asyncio.gather(*(self._send_state(a, job.job_id, stage, checkpoint.iteration,
                                                    data) for a in addresses))  # fmt: skip
        request = job_pb2.SubmitRequest(job_json=json.dumps(job.to_dict(), sort_keys=True),
                                        resume_iteration=checkpoint.iteration)  # fmt: skip

        async def call(stub: Any) -> Any:
            return await stub.Submit(request, timeout=timeout_s)

        reply = await self._call(call, timeout_s)
        return str(reply.job_id)

    async def _record(self, job_id: str) -> Any:
        from gwtf.v1 import job_pb2

        async def listing(stub: Any) -> Any:
            return await stub.List(job_pb2.ListRequest(), timeout=self.timeout_s)

        record = next((p for p in (await self._call(listing, self.timeout_s)).jobs
                       if p.job_id == job_id), None)  # fmt: skip
        if record is None:
            raise ClientError(f"{self.address} knows no job {job_id}")
        return record

    def _job_of(self, record: Any) -> Any:
        from gwtf.train.job import JobError, job_from_dict

        try:
            return job_from_dict(json.loads(record.job_json))
        except (JobError, ValueError, TypeError) as err:
            raise ClientError(
                f"{self.address} sent job {record.job_id} unreadable: {err}"
            ) from None

    async def _replicas(self) -> dict[int, list[str]]:
        """Stage -> the addresses of its live nodes, as this node sees them, in the order of
        its snapshot senders (`sender_rank`: the fastest declared uplink first, then by id), so
        that a download takes the uplink the stage's snapshots take."""
        from gwtf.job.snapshots import sender_rank
        from gwtf.v1 import node_pb2, node_pb2_grpc

        async def members(stub: Any) -> Any:
            status = node_pb2_grpc.StatusStub(self._channel)
            return await status.Get(node_pb2.StatusRequest(swarm=False), timeout=self.timeout_s)

        view = await self._call(members, self.timeout_s)
        stages = view.swarm.num_stages
        replicas: dict[int, list[str]] = {s: [] for s in range(stages)}
        for member in sorted(view.members, key=lambda m: sender_rank(m.id, m.uplink_gbps)):
            if member.state == node_pb2.MEMBER_STATE_ALIVE and member.stage < stages:
                replicas[member.stage].append(member.address)
        self._known = [self.address, *sorted(a for addresses in replicas.values()
                                             for a in addresses if a != self.address)]
        return replicas

    async def _fail_over(self) -> str:
        """The node this client talks to stopped answering: talk to the first other member of
        its swarm, as last read, that answers. Its address; "" if none does (the client stays
        where it was)."""
        old = self.address
        for address in [a for a in self._known if a != old]:
            await self.close()
            self.address = address
            try:
                await self._replicas()
                return address
            except ClientError:
                continue
        await self.close()
        self.address = old
        return ""

    async def _send_state(
        self, address: str, job_id: str, stage: int, iteration: int, data: bytes
    ) -> None:
        from grpc import aio

        from gwtf.node.jobs.manager import STATE_CHUNK_BYTES
        from gwtf.node.rpc.security import open_channel
        from gwtf.node.rpc.transport import channel_options
        from gwtf.v1 import job_pb2, job_pb2_grpc

        def chunks() -> Any:
            for seq, offset in enumerate(range(0, max(len(data), 1), STATE_CHUNK_BYTES)):
                yield job_pb2.StateChunk(
                    seq=seq, stage=stage, iteration=iteration, total_bytes=len(data),
                    job_id=job_id, sender="client", payload=data[offset:offset + STATE_CHUNK_BYTES],
                )

        try:
            async with open_channel(address, self.credentials,
                                    options=channel_options()) as channel:  # fmt: skip
                await job_pb2_grpc.JobServiceStub(channel).Resume(chunks(), timeout=WEIGHTS_CALL_S)
        except aio.AioRpcError as err:
            raise _rpc_error(address, err, WEIGHTS_CALL_S) from None

    async def _stage_part(
        self, job: Any, stage: int, addresses: list[str], *, full: bool
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        """(iteration, parameters, optimizer state by name or None) of one stage, from the first
        of its replicas that has them: the whole state (FetchState) when `full`, else, or when
        no replica has it (the job completed meanwhile: its nodes keep only the final weights),
        the weights (FetchWeights)."""
        if full:
            with contextlib.suppress(ClientError):
                return await self._stage_from(job, stage, addresses, full=True)
        return await self._stage_from(job, stage, addresses, full=False)

    async def _stage_from(
        self, job: Any, stage: int, addresses: list[str], *, full: bool
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        from grpc import aio

        from gwtf.node.rpc.security import open_channel
        from gwtf.node.rpc.transport import channel_options
        from gwtf.train.checkpoints.checkpoint import CheckpointError, weights_from_bytes
        from gwtf.train.checkpoints.resume import unpack_stage
        from gwtf.train.state import StateError
        from gwtf.v1 import job_pb2, job_pb2_grpc

        said: list[str] = []
        for address in addresses:
            try:
                async with open_channel(address, self.credentials,
                                        options=channel_options()) as channel:  # fmt: skip
                    stub = job_pb2_grpc.JobServiceStub(channel)
                    stream = (
                        stub.FetchState(job_pb2.StateRequest(sender="client", job_id=job.job_id,
                                                             stage=stage), timeout=WEIGHTS_CALL_S)
                        if full else
                        stub.FetchWeights(job_pb2.WeightsRequest(job_id=job.job_id, stage=stage),
                                          timeout=WEIGHTS_CALL_S)
                    )  # fmt: skip
                    chunks = [chunk async for chunk in stream]
            except aio.AioRpcError as err:
                said.append(f"{address}: {(err.details() or err.code().name).splitlines()[0]}")
                continue
            data = b"".join(c.payload for c in chunks)
            if not chunks or len(data) != chunks[0].total_bytes or any(
                c.seq != i for i, c in enumerate(chunks)
            ):
                said.append(f"{address}: the stream was cut short")
                continue
            try:
                if full:
                    iteration, params, optimizer = await asyncio.to_thread(unpack_stage, data, job)
                    return iteration, params, optimizer
                return int(chunks[0].iteration), weights_from_bytes(data), None
            except (CheckpointError, StateError) as err:
                said.append(f"{address}: {err}")
        raise ClientError(f"no replica of stage {stage} could send its weights of job "
                          f"{job.job_id}" + (f" ({'; '.join(said)})" if said
                                             else " (it has no live node)"))

    async def wait(
        self,
        job_id: str,
        *,
        on_progress: Callable[[JobResult], None] | None = None,
        timeout_s: float | None = None,
    ) -> JobResult:
        """Follow the job until it completes or fails (`timeout_s`: give up after that long);
        `on_progress` sees every change. The job's final JobResult (state "failed" included)."""
        import grpc
        from grpc import aio

        from gwtf.v1 import job_pb2

        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        async def call(stub: Any) -> JobResult:
            # One Watch call per WATCH_CALL_S at most, so that every call has a deadline; the
            # node answers each new call with the progress at once.
            last: JobResult | None = None
            failures = 0
            while True:
                left = WATCH_CALL_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ClientError(
                        f"job {job_id} did not end within {timeout_s:g} s at {self.address}"
                    )
                stream = stub.Watch(
                    job_pb2.WatchRequest(job_id=job_id), timeout=min(left, WATCH_CALL_S)
                )
                try:
                    async for pb in stream:
                        failures = 0
                        result = job_result(pb)
                        if on_progress is not None and result != last:
                            on_progress(result)
                        last = result
                        if result.over:
                            return result
                except aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.UNAVAILABLE and failures < WATCH_RETRIES:
                        await asyncio.sleep(0.25 * 2**failures)
                        failures += 1
                        continue
                    if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                    continue
                raise ClientError(
                    f"{self.address} stopped answering about job {job_id} before it ended",
                    unreachable=True,
                )

        result: JobResult = await self._call(call, timeout_s)
        return result

    async def wait_resuming(
        self,
        job_id: str,
        directory: str | Path,
        *,
        every: int,
        on_progress: Callable[[JobResult], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        within_s: float = RESUME_WITHIN_S,
        timeout_s: float | None = None,
    ) -> JobResult:
        """Follow the job as `wait` does, writing its weights and optimizer state into
        `directory` every `every` iterations while it trains (`download`): a copy of the job
        off the swarm, which no preemption of its nodes reaches. When the job fails for want of
        state no node holds any more (a stage lost every replica together with every keeper of
        its snapshots, docs/design.md 4.6), it is resumed from that copy (`resume`) as soon as
        every stage has a live node again (within `within_s`, else it stays failed, saying
        so), and followed on. The result covers the whole job: the loss of every iteration,
        the microbatches dropped in the iterations that count, and each resume as a rollback
        from the iteration in progress to the copy's. Should the node it talks to stop
        answering (the wave took it too), it follows the job at another member of the swarm.
        `on_event` hears of each checkpoint written or missed, each resume and each change of
        node, one line each."""
        from gwtf.job.snapshots import checkpoint_due, resumable, wiped_stage
        from gwtf.train.checkpoints.checkpoint import CheckpointError
        from gwtf.train.checkpoints.resume import load_resumable

        say = on_event or (lambda _: None)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        microbatches = self._job_of(await self._record(job_id)).microbatches
        await self._replicas()  # the members to turn to should this node stop answering
        runs: list[JobResult] = []
        back: list[RolledBack] = []
        tries: dict[int, int] = {}
        due: asyncio.Queue[int] = asyncio.Queue()
        saved: set[int] = set()
        while True:
            saved.clear()  # a resumed run trains those iterations again

            def seen(result: JobResult) -> None:
                if on_progress is not None:
                    on_progress(merge_runs([*runs, result], back, microbatches))
                k = checkpoint_due(result.iterations_completed, every, result.resumed_from)
                if k is not None and k not in saved and result.state == "running":
                    saved.add(k)
                    due.put_nowait(k)

            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            waiting = asyncio.ensure_future(self.wait(job_id, on_progress=seen, timeout_s=left))
            while not waiting.done():
                get = asyncio.ensure_future(due.get())
                await asyncio.wait({waiting, get}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    continue
                k = get.result()
                while not due.empty():  # fell due while the last one downloaded: the newest
                    k = due.get_nowait()
                try:
                    at = await self._download(job_id, directory)
                    say(f"checkpoint of iteration {at} written to {directory}")
                except ClientError as err:  # the next one may succeed: training goes on
                    say(f"checkpoint of iteration {k} missed: {err}")
            try:
                result = waiting.result()
            except ClientError as err:
                if not err.unreachable:
                    raise
                if not await self._turned_away(say):
                    raise await _with_checkpoint(err, directory) from None
                continue
            runs.append(result)
            if result.state != "failed" or not resumable(result.error):
                return merge_runs(runs, back, microbatches)
            try:
                checkpoint = await asyncio.to_thread(load_resumable, directory)
            except (CheckpointError, ValueError) as err:
                say(f"no checkpoint to resume from in {directory}: {err}")
                return merge_runs(runs, back, microbatches)
            at = checkpoint.iteration
            tries[at] = tries.get(at, 0) + 1
            if tries[at] > MAX_RESUMES:
                return merge_runs(runs, back, microbatches, also=(
                    f"resumed from the checkpoint of iteration {at} {MAX_RESUMES} times"))
            why = await self._resume_when_possible(directory, at, within_s, say)
            if why:
                return merge_runs(runs, back, microbatches, also=why)
            wiped = wiped_stage(result.error)
            back.append(RolledBack(-1 if wiped is None else wiped, result.iterations_completed,
                                   at, f"resumed from the client's checkpoint: {result.error}"))

    async def _turned_away(self, say: Callable[[str], None]) -> bool:
        """`_fail_over`, said: did another member answer?"""
        old = self.address
        new = await self._fail_over()
        if new:
            say(f"{old} stopped answering; following the job at {new}")
        return bool(new)

    async def _resume_when_possible(
        self, directory: str | Path, at: int, within_s: float, say: Callable[[str], None]
    ) -> str:
        """Resume the job from `directory` (its checkpoint of iteration `at`) once every stage
        has a live node, within `within_s`: "" once it did, else why not. A resume that fails
        on the way (a node that died a moment ago is not known dead yet, and its stage's state
        cannot reach it) is tried again until then."""
        deadline = time.monotonic() + within_s
        failed = ""
        while True:
            try:
                replicas = await self._replicas()
            except ClientError as err:
                if not err.unreachable or not await self._turned_away(say):
                    raise
                continue
            empty = [s for s, addresses in replicas.items() if not addresses]
            if not empty:
                say(f"resuming from the checkpoint of iteration {at} in {directory}")
                try:
                    await self.resume(directory)
                    return ""
                except ClientError as err:
                    if err.exit_code == EXIT_USAGE:  # the checkpoint itself: no use trying again
                        return f"could not resume from {directory}: {err}"
                    failed = str(err)
                    say(f"the resume failed ({failed}); trying again")
            if time.monotonic() >= deadline:
                return (f"stage {empty[0]} had no live node within {within_s:g} s to resume "
                        f"the job from the checkpoint of iteration {at}" if empty else
                        f"the job could not be resumed from the checkpoint of iteration {at} "
                        f"within {within_s:g} s: {failed}")
            await asyncio.sleep(RESUME_POLL_S)


async def _with_checkpoint(err: ClientError, directory: str | Path) -> ClientError:
    """`err` (no member of the swarm answers any more: every node died), saying where the
    checkpoint of the job is and how to resume it, if `directory` holds one."""
    from gwtf.train.checkpoints.checkpoint import CheckpointError
    from gwtf.train.checkpoints.resume import load_resumable

    try:
        checkpoint = await asyncio.to_thread(load_resumable, directory)
    except (CheckpointError, ValueError):
        return err
    return ClientError(
        f"{err}; {directory} holds the checkpoint of iteration {checkpoint.iteration} of job "
        f"{checkpoint.job.job_id}: once every stage has a node again, resume it with gwtf submit "
        f"--to HOST:PORT --resume {directory}", err.exit_code, unreachable=True,
    )


def merge_runs(
    runs: list[JobResult], back: list[RolledBack], microbatches: int, *, also: str = ""
) -> JobResult:
    """One job's result from its runs, each after the first resumed from a checkpoint
    (`AsyncGwtfClient.wait_resuming`; `back[i]` took run i to run i + 1): the last run's
    record, with the loss, iteration times and dropped microbatches of each earlier run's
    iterations before the next one's start, the counts summed, and the resumes added to its
    rollbacks. `also`: said after the last run's error (why it was not resumed)."""
    last = runs[-1]
    if len(runs) == 1 and not also:
        return last
    loss: list[float] = []
    seconds: list[float] = []
    dropped: list[tuple[int, tuple[int, ...]]] = []
    trained = 0
    for run, nxt in zip(runs, runs[1:], strict=False):
        cut = nxt.resumed_from - run.resumed_from
        loss += run.loss[:max(0, cut)]
        seconds += run.iteration_s[:max(0, cut)]
        kept = [(k, ids) for k, ids in run.dropped if k < nxt.resumed_from]
        dropped += kept
        trained += max(0, cut) * microbatches - sum(len(ids) for _, ids in kept)
    dropped += last.dropped
    count = ("crashes", "leaves", "joins", "rerouted_microbatches", "replayed_microbatches",
             "replayed_s", "kept_microbatches", "compute_s", "lost_microbatches", "restarts",
             "paused_s", "elapsed_s")
    summed = {name: sum(getattr(r, name) for r in runs) for name in count}
    return dataclasses.replace(
        last, loss=(*loss, *last.loss), iteration_s=(*seconds, *last.iteration_s),
        dropped=tuple(dropped), dropped_microbatches=sum(len(ids) for _, ids in dropped),
        microbatches_trained=trained + last.microbatches_trained,
        rollbacks=(*(r for run in runs[:-1] for r in run.rollbacks), *back, *last.rollbacks),
        resumed_from=runs[0].resumed_from,
        error="; ".join(e for e in (last.error, also) if e), **summed,
    )


class GwtfClient(_Node):
    """The same calls as `AsyncGwtfClient`, for code without an event loop of its own:

        with GwtfClient("127.0.0.1:50051") as client:
            result = client.wait(client.submit("tiny-gpt"))

    Every call opens a channel, has a deadline and closes the channel; errors are ClientError.
    Called where an event loop already runs (a notebook cell), a call runs on a thread of its
    own rather than failing: `AsyncGwtfClient` is the better fit there.
    """

    def __enter__(self) -> GwtfClient:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing stays open between calls."""

    def _run(self, use: Callable[[AsyncGwtfClient], Coroutine[Any, Any, T]]) -> T:
        async def main() -> T:
            async with AsyncGwtfClient(self.address, timeout_s=self.timeout_s,
                                       credentials=self.credentials) as client:  # fmt: skip
                return await use(client)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(main())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, main()).result()

    def submit(self, job: Any, *, timeout_s: float = 300.0) -> str:
        """See `AsyncGwtfClient.submit`."""
        return self._run(lambda c: c.submit(job, timeout_s=timeout_s))

    def mismatches(self, job: Any) -> list[str]:
        """See `AsyncGwtfClient.mismatches`."""
        return self._run(lambda c: c.mismatches(job))

    def jobs(self) -> list[JobResult]:
        """Every job the node knows."""
        return self._run(lambda c: c.jobs())

    def progress(self, job_id: str) -> JobResult:
        """The job's progress now."""
        return self._run(lambda c: c.progress(job_id))

    def cancel(self, job_id: str, reason: str = "") -> str:
        """See `AsyncGwtfClient.cancel`."""
        return self._run(lambda c: c.cancel(job_id, reason))

    def download(self, job_id: str, directory: str | Path) -> Path:
        """See `AsyncGwtfClient.download`."""
        return self._run(lambda c: c.download(job_id, directory))

    def wait_resuming(
        self,
        job_id: str,
        directory: str | Path,
        *,
        every: int,
        on_progress: Callable[[JobResult], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        within_s: float = RESUME_WITHIN_S,
        timeout_s: float | None = None,
    ) -> JobResult:
        """See `AsyncGwtfClient.wait_resuming`."""
        return self._run(lambda c: c.wait_resuming(
            job_id, directory, every=every, on_progress=on_progress, on_event=on_event,
            within_s=within_s, timeout_s=timeout_s))

    def resume(self, directory: str | Path, *, timeout_s: float = 300.0) -> str:
        """See `AsyncGwtfClient.resume`."""
        return self._run(lambda c: c.resume(directory, timeout_s=timeout_s))

    def wait(
        self,
        job_id: str,
        *,
        on_progress: Callable[[JobResult], None] | None = None,
        timeout_s: float | None = None,
    ) -> JobResult:
        """See `AsyncGwtfClient.wait`."""
        return self._run(lambda c: c.wait(job_id, on_progress=on_progress, timeout_s=timeout_s))


ACTIVATION_MISMATCH = 4.0
"""A job whose activations are this many times larger or smaller than the swarm's is warned
about: transfer times, and so the flows, scale with the bytes an activation takes."""


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"


def activation_mismatch(job_bytes: int, swarm_bytes: int) -> str | None:
    """One sentence if the swarm computes its flows for activations far from the job's."""
    if swarm_bytes < 1 or max(job_bytes, swarm_bytes) < ACTIVATION_MISMATCH * min(job_bytes,
                                                                                  swarm_bytes):
        return None
    return (
        f"this swarm computes its routes for activations of {_size(swarm_bytes)} (the "
        f"--activation-bytes its first node was started with) but this job's are "
        f"{_size(job_bytes)} (microbatch_size x seq_len x width x 4 bytes), so its flows are "
        f"those of other transfers; start the swarm with --activation-bytes {job_bytes} to route "
        "this job's"
    )


def fetch_jobs(
    address: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
) -> list[JobResult]:
    """The jobs the node at `address` knows (empty if it cannot say)."""
    try:
        return GwtfClient(address, timeout_s=timeout_s, credentials=credentials).jobs()
    except ClientError:
        return []


def _submitted_job(args: argparse.Namespace) -> Any:
    import dataclasses

    from gwtf.train.job import JobError, resolve_job

    try:
        job = resolve_job(args.job)
        if args.iterations is not None:
            job = dataclasses.replace(job, iterations=args.iterations)
        if args.aggregation is not None:
            job = dataclasses.replace(
                job, aggregation=dataclasses.replace(job.aggregation, rule=args.aggregation)
            )
    except JobError as err:
        raise ClientError(str(err), EXIT_USAGE) from None
    return job


def run_submit(args: argparse.Namespace) -> int:
    """`gwtf submit --to HOST:PORT (--job JOB [--iterations N] [--aggregation RULE] | --resume
    DIR) [--wait [--checkpoint-dir DIR [--checkpoint-every K]]] [--json]`."""
    from gwtf.node.rpc.security import SecurityError, credentials_from_args

    try:
        credentials = credentials_from_args(args)
    except SecurityError as err:
        print(f"gwtf submit: {err}", file=sys.stderr)
        return EXIT_USAGE
    client = GwtfClient(args.to, timeout_s=args.timeout, credentials=credentials)
    checkpoint = args.checkpoint_dir
    if (checkpoint is not None or args.checkpoint_every) and not args.wait:
        print("gwtf submit: --checkpoint-dir and --checkpoint-every need --wait",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.checkpoint_every and checkpoint is None:
        print("gwtf submit: --checkpoint-every needs --checkpoint-dir", file=sys.stderr)
        return EXIT_USAGE
    if checkpoint is not None:
        from gwtf.train.checkpoints.checkpoint import CheckpointError, check_writable

        try:  # before the job trains, not once it has
            check_writable(checkpoint)
        except CheckpointError as err:
            print(f"gwtf submit: --checkpoint-dir: {err}", file=sys.stderr)
            return EXIT_USAGE

    def follow(on_progress: Callable[[JobResult], None] | None) -> JobResult:
        """Wait for the job; with --checkpoint-every, keep a checkpoint of it in DIR and
        resume it from there should it lose a stage's state (`wait_resuming`)."""
        if not args.checkpoint_every:
            return client.wait(job_id, on_progress=on_progress)
        return client.wait_resuming(
            job_id, checkpoint, every=args.checkpoint_every, on_progress=on_progress,
            on_event=lambda line: print(f"gwtf submit: {line}", file=sys.stderr, flush=True),
            within_s=args.resume_within)

    try:
        if args.resume is not None:
            if args.iterations is not None or args.aggregation is not None:
                raise ClientError("--resume continues the checkpointed job as it is: leave out "
                                  "--iterations and --aggregation", EXIT_USAGE)  # fmt: skip
            job_id = client.resume(args.resume)
            iterations = client.progress(job_id).iterations
        else:
            job = _submitted_job(args)
            job_id = client.submit(job)
            for warning in client.mismatches(job):  # said once the job is in, not refused
                print(f"gwtf submit: warning: {warning}", file=sys.stderr, flush=True)
            iterations = job.iterations
        if not (args.wait or args.json):
            print(f"submitted {job_id} to {args.to}; follow it with gwtf submit --wait or "
                  f"gwtf status --to {args.to}", flush=True)
            return 0
        if not args.wait:
            result = client.progress(job_id)
        elif args.json:
            result = follow(None)
        else:
            result = _follow(job_id, iterations, follow)
        if checkpoint is not None and result.state == "completed":
            model = client.download(job_id, checkpoint)
            if not args.json:
                print(f"model written to {model}", file=sys.stderr, flush=True)
    except ClientError as err:
        print(f"gwtf submit: {err}", file=sys.stderr)
        return err.exit_code
    if args.json:
        print(json.dumps(result.to_json(), indent=2), flush=True)
    else:
        print(format_result(result), flush=True)
    return EXIT_FAILED if result.state == "failed" else 0


def run_cancel(args: argparse.Namespace) -> int:
    """`gwtf cancel JOB_ID --to HOST:PORT [--reason TEXT]`."""
    from gwtf.node.rpc.security import SecurityError, credentials_from_args

    try:
        credentials = credentials_from_args(args)
        state = GwtfClient(args.to, timeout_s=args.timeout,
                           credentials=credentials).cancel(args.job_id, args.reason)  # fmt: skip
    except (SecurityError, ClientError) as err:
        print(f"gwtf cancel: {err}", file=sys.stderr)
        return err.exit_code if isinstance(err, ClientError) else EXIT_USAGE
    print(f"job {args.job_id}: {state}", flush=True)
    return 0


def _follow(
    job_id: str, iterations: int,
    wait: Callable[[Callable[[JobResult], None]], JobResult],
) -> JobResult:
    """`wait(on_progress)` with a progress bar and a line per iteration, on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[loss]}"))
    shown = 0
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(job_id, total=iterations, loss="")

        def update(result: JobResult) -> None:
            nonlocal shown
            shown = min(shown, len(result.loss))  # a rollback cut the curve back
            for k in range(shown, len(result.loss)):
                bar.console.print(f"iteration {result.resumed_from + k + 1:>4}/"
                                  f"{result.iterations}  "
                                  f"loss {result.loss[k]:.4f}")
            shown = len(result.loss)
            loss = f"loss {result.loss[-1]:.4f}" if result.loss else result.state
            bar.update(task, completed=result.iterations_completed, loss=loss)

        return wait(update)


def format_result(result: JobResult) -> str:
    lines = [f"job {result.job_id} {result.state}: {result.iterations_completed}/"
             f"{result.iterations} iterations in {result.elapsed_s:.1f} s"]
    if result.error:
        lines.append(f"error           {result.error}")
    if result.resumed_from:
        lines.append(f"resumed         from a checkpoint of iteration {result.resumed_from}")
    for back in result.rollbacks:
        lines.append(f"rolled back     from iteration {back.from_iteration} to "
                     f"{back.to_iteration}: {back.reason}")
    for move in result.moves:
        lines.append(f"moved           {move.node}: stage {move.from_stage} -> {move.stage} at "
                     f"iteration {move.iteration} (flow {move.flow:.3f} -> "
                     f"{move.flow + move.gain:.3f} microbatches/s)")
    if result.loss:
        first, last = result.loss[0], result.loss[-1]
        lines.append(f"loss            {first:.4f} -> {last:.4f}")
    if result.param_checksum:
        lines.append(f"param checksum  {result.param_checksum}")
    lines.append(f"throughput      {result.throughput_mb_s:.2f} microbatches/s")
    lines.append(f"routes          {len(result.routes)} paths through the stages")
    if result.checksum_mismatches:
        lines.append(f"mismatches      {result.checksum_mismatches} commits after which stage "
                     "replicas differed")
    waste = 100 * result.replayed_s / result.compute_s if result.compute_s > 0 else 0.0
    lines.append(f"churn           {result.crashes} crashes, {result.leaves} leaves, "
                 f"{result.joins} joins")
    lines.append(f"recovery        {result.rerouted_microbatches} microbatches rerouted, "
                 f"{result.replayed_microbatches} replayed ({result.replayed_s:.2f} s of "
                 f"stage work, {waste:.2f}% of {result.compute_s:.1f} s), "
                 f"{result.kept_microbatches} kept at a stage peer, "
                 f"{result.restarts} iterations restarted")
    lines.append(f"microbatches    {result.dropped_microbatches} dropped (a data holder died "
                 f"with them), {result.lost_microbatches} lost")
    for e in result.excluded:
        lines.append(f"excluded        {e.node} (stage {e.stage}) at iteration {e.iteration}: "
                     f"{e.reason}")
    if result.paused:
        lines.append(f"paused          {result.paused}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- status


def status_json(reply: Any) -> dict[str, Any]:
    """The swarm as the asked node sees it: `{"members": [{"id", "address", "stage",
    "alive", "capacity", ...}], "arcs": [{"src", "dst", "flow", ...}], "flow_value", ...}`.
    Flows and capacities in microbatches/s (the `_units` fields: integer flow units)."""
    states = {1: "alive", 2: "dead", 3: "left"}
    members = [
        {
            "id": m.id,
            "address": m.address,
            "stage": m.stage,
            "location": m.location,
            "alive": m.state == 1,
            "state": states.get(m.state, "unknown"),
            "capacity": m.capacity,
            "compute_s": m.compute_s,
            "epoch": m.epoch,
            # What it measured where routing would otherwise be wrong (docs/design.md 2.12).
            "links": [
                {
                    "site": r.site,
                    "rtt_ms": 2 ** (r.rtt_level / 4) if r.HasField("rtt_level") else None,
                    "bandwidth_gbps": (
                        2 ** (r.bandwidth_level / 4) if r.HasField("bandwidth_level") else None
                    ),
                }
                for r in m.links
            ],
            "blocked": list(m.blocked),
            "revision": m.revision,
            # The member that relays calls to it (docs/design.md 3.11); "": dialled directly.
            "relay": m.relay,
        }
        for m in reply.members
    ]
    stage_of = {m.id: m.stage for m in reply.members}
    last = reply.swarm.num_stages - 1
    arcs = []
    flow_units = 0
    nodes = []
    for node in reply.nodes:
        for arc in node.arcs:
            if arc.ring:
                continue
            arcs.append(
                {
                    "src": arc.src,
                    "dst": arc.dst,
                    "flow": arc.flow / CAP_SCALE,
                    "flow_units": arc.flow,
                    "cap_units": arc.cap,
                    "cost_units": arc.cost,
                    "rtt_ms": arc.rtt_ms,
                    "bandwidth_gbps": arc.bandwidth_gbps,
                    "gen": arc.gen,
                    "measured_rtt_ms": arc.measured_rtt_ms,
                    "measured_bandwidth_gbps": arc.measured_bandwidth_gbps,
                    "rtt_probes": arc.rtt_probes,
                }
            )
            if stage_of.get(arc.dst) == last:
                flow_units += arc.flow
        nodes.append(
            {
                "id": node.member.id,
                "epoch": node.member.epoch,
                "round": node.round,
                "phase": node.tightens,
                "final": node.final,
                "quiet": node.quiet,
                "eps": node.eps,
                "throughput": node.throughput / CAP_SCALE,
                "flow_messages_sent": node.flow_messages_sent,
                "flow_batches_sent": node.flow_batches_sent,
                "gossip_bytes_sent": node.gossip_bytes_sent,
                "gossip_calls_sent": node.gossip_calls_sent,
                "uptime_s": node.uptime_s,
                "departed": list(node.departed),
                "wan_stack_rtt_ms": node.wan_stack_rtt_ms,
                "busy": list(node.busy),
                "flow_messages_received": node.flow_messages_received,
                "flow_messages_emitted": node.flow_messages_emitted,
                "routing": node.routing or "relax",
                "solves": node.solves,
                "view_changes": node.view_changes,
                "repairs": node.repairs,
                "last_solve_s": node.last_solve_s,
                "solve_waited_s": node.solve_waited_s,
                "message_delay_s": node.message_delay_s,
                "relayed_bytes": dict(node.relayed_bytes),
            }
        )
    arcs.sort(key=lambda a: (stage_of.get(a["src"], 0), a["src"], a["dst"]))
    nodes.sort(key=lambda n: n["id"])
    alive = sum(1 for m in members if m["alive"])
    converged = (
        bool(nodes)
        and not reply.unreachable
        and len(nodes) == alive
        and all(n["final"] and n["quiet"] for n in nodes)
    )
    return {
        "node": reply.node,
        "swarm": {
            "id": reply.swarm.swarm_id,
            "num_stages": reply.swarm.num_stages,
            "activation_bytes": reply.swarm.activation_bytes,
        },
        "members": members,
        "arcs": arcs,
        "flow_value": flow_units / CAP_SCALE,
        "flow_value_units": flow_units,
        "converged": converged,
        "nodes": nodes,
        "unreachable": list(reply.unreachable),
    }


def format_status(view: dict[str, Any]) -> str:
    members = view["members"]
    alive = sum(1 for m in members if m["alive"])
    state = "converged" if view["converged"] else "converging"
    lines = [
        f"swarm {view['swarm']['id']} as {view['node']} sees it: "
        f"{view['swarm']['num_stages']} stages, {alive} live members, "
        f"flow value {view['flow_value']:.4f} microbatches/s ({state})",
        "",
        f"{'id':<20} {'address':<22} {'stage':>5} {'location':<12} {'alive':<5} "
        f"{'capacity mb/s':>13}  relayed by",
    ]
    for m in sorted(members, key=lambda m: (not m["alive"], m["stage"], m["id"])):
        lines.append(
            f"{m['id']:<20} {m['address']:<22} {m['stage']:>5} {m['location'] or '-':<12} "
            f"{'yes' if m['alive'] else m['state']:<5} {m['capacity']:>13.4f}  "
            f"{m.get('relay') or '-'}"
        )
    relaying = [(node["id"], peer, n) for node in view.get("nodes", [])
                for peer, n in sorted(node.get("relayed_bytes", {}).items())]  # fmt: skip
    if relaying:
        lines += ["", f"{'relays':<43} {'MiB carried':>12}"]
        lines += [f"{relay + ' for ' + peer:<43} {n / 2**20:>12.1f}" for relay, peer, n in relaying]
    lines += ["", f"{'flows':<43} {'mb/s':>8} {'rtt ms':>8} {'Gbit/s':>8}"]
    for arc in view["arcs"]:
        lines.append(
            f"{arc['src'] + ' -> ' + arc['dst']:<43} {arc['flow']:>8.4f} "
            f"{arc['rtt_ms']:>8.2f} {arc['bandwidth_gbps']:>8.3f}"
        )
    if view["unreachable"]:
        lines += ["", f"no answer from: {', '.join(view['unreachable'])}"]
    jobs = view.get("jobs") or []
    if jobs:
        lines += ["", f"{'jobs':<22} {'state':<10} {'iterations':>10} {'loss':>8} {'mb/s':>8}"]
        for job in jobs:
            loss = f"{job['loss'][-1]:.4f}" if job["loss"] else "-"
            lines.append(
                f"{job['job_id']:<22} {job['state']:<10} "
                f"{str(job['iterations_completed']) + '/' + str(job['iterations']):>10} "
                f"{loss:>8} {job['throughput_mb_s']:>8.2f}"
                + (f"  {job['error']}" if job["error"] else "")
            )
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    from gwtf.node.rpc.security import SecurityError, credentials_from_args

    try:
        credentials = credentials_from_args(args)
    except SecurityError as err:
        print(f"gwtf status: {err}", file=sys.stderr)
        return 2
    if getattr(args, "watch", False):
        from gwtf.live import watch

        def fetch() -> dict[str, Any]:
            reply = fetch_status(args.to, timeout_s=args.timeout, swarm=not args.local,
                                 credentials=credentials)  # fmt: skip
            return status_json(reply)

        return watch(fetch, args.interval, errors=(StatusError,))
    try:
        reply = fetch_status(
            args.to,
            timeout_s=args.timeout,
            swarm=not args.local,
            credentials=credentials,
        )
    except StatusError as err:
        print(f"gwtf status: {err}", file=sys.stderr)
        return 1
    view = status_json(reply)
    view["jobs"] = [
        {
            **result.to_json(),
            "name": result.name,
            "state": result.state,
            "iterations": result.iterations,
            "error": result.error,
            "routes_used": len(result.routes),
        }
        for result in fetch_jobs(args.to, timeout_s=args.timeout, credentials=credentials)
    ]
    if not view["members"]:
        print(f"gwtf status: {args.to} is not in a swarm yet", file=sys.stderr)
        return 1
    try:
        print(json.dumps(view, indent=2) if args.json else format_status(view), flush=True)
    except BrokenPipeError:  # `gwtf status | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
