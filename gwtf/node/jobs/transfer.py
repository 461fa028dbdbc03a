"""StateTransfer: a stage's state between nodes (docs/design.md 3.8, 4.6, 10).

    fetch_state     streams this node's stage state (a live replica's, or a snapshot it keeps)
                    to a joiner; `fetch_from` is the joiner's side
    fetch_steps     streams a live replica's last steps to a joiner whose state they made stale
                    (3.8); `steps_from` is the joiner's side
    keep_backup     a stage's snapshot sender sends its state to its keepers (4.6);
                    `backup` is the keeper's side, `keepers_of` and `snapshot_iterations`
                    what the coordinator asks of it
    resume          a client's checkpoint of this node's stage (gwtf submit --resume), kept until
                    a Prepare builds the stage from it
    fetch_weights   a stage's weights for a client: the live ones of a running job, or the final
                    ones of the latest job this node completed (`keep_final_weights`)

States travel in chunks of STATE_CHUNK_BYTES, each stream at most MAX_STATE_BYTES.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from grpc import aio

from gwtf.job.snapshots import (
    SnapshotPolicy,
    keeper_keeps,
    snapshot_keepers,
    snapshot_landed,
)
from gwtf.node.errors import NotHeld, NotReady
from gwtf.node.jobs.book import CurrentJob, JobBook
from gwtf.node.jobs.host import JobsHost
from gwtf.node.rpc.chunks import Incoming, pieces
from gwtf.node.rpc.codec import InvalidMessage, check_name
from gwtf.v1 import job_pb2

if TYPE_CHECKING:
    from gwtf.node.worker.worker import StageWorker

__all__ = ["MAX_STATE_BYTES", "STATE_CHUNK_BYTES", "StateTransfer"]

STATE_CHUNK_BYTES = 2**20
"""A stage's state travels in chunks of 1 MiB (STYLE: 1-4 MiB, under the 4 MiB message limit)."""
MAX_STATE_BYTES = 8 * 2**30
"""Largest stage state a joiner or a backup keeper accepts."""
BACKUP_ROUNDS = 2
"""How often a snapshot is sent to the keepers that lack it: once, and once more to the rule's
choice for a keeper whose copy failed (docs/design.md 4.6)."""


def _chunks(
    data: bytes, stage: int, iteration: int, job_id: str = "", sender: str = "",
    periodic: bool = False,
) -> Iterator[job_pb2.StateChunk]:
    """`data` as a stream of chunks (one empty chunk for no data: the first carries the
    header)."""
    for seq, parts in enumerate(pieces([memoryview(data)], STATE_CHUNK_BYTES)):
        yield job_pb2.StateChunk(
            seq=seq, stage=stage, iteration=iteration, total_bytes=len(data),
            payload=parts[0].tobytes() if parts else b"", job_id=job_id, sender=sender,
            periodic=periodic,
        )


async def _read_state(
    chunks: AsyncIterator[job_pb2.StateChunk], what: str
) -> tuple[job_pb2.StateChunk, bytes]:
    """A streamed stage state: its first chunk (stage, iteration, job, sender) and its bytes;
    InvalidMessage if the chunks come out of order, too many, or short."""
    parts: list[bytes] = []
    first: job_pb2.StateChunk | None = None
    incoming = Incoming(InvalidMessage, stream=what, chunk="state chunk")
    async for chunk in chunks:
        if incoming.next(chunk.seq):
            first = chunk
            if chunk.total_bytes > MAX_STATE_BYTES:
                raise InvalidMessage(f"a stage state over {MAX_STATE_BYTES} bytes")
            incoming.total = chunk.total_bytes
        incoming.take(len(chunk.payload))
        parts.append(chunk.payload)
    if first is None:
        raise InvalidMessage(f"an empty {what}")
    incoming.finish()
    return first, b"".join(parts)


class StateTransfer:
    """Stage states in and out of this node: see the module docstring."""

    def __init__(self, host: JobsHost, book: JobBook) -> None:
        self.host = host
        self.book = book
        self.backups: dict[tuple[str, int], tuple[int, bytes]] = {}
        """(job, stage) -> (iteration, state): the newest snapshot of another stage, kept for
        a node joining it once it has no live replica (docs/design.md 4.6)."""
        self.periodic: dict[tuple[str, int], tuple[int, bytes]] = {}
        """(job, stage) -> its newest periodic snapshot: what the swarm rolls back to when the
        newest is older than the iteration in progress."""
        self.declared: dict[tuple[str, int], set[int]] = {}
        """(job, stage) -> the iterations of the snapshots held that are of periodic boundaries."""
        self.resumes: dict[str, tuple[int, bytes]] = {}
        """job id -> (iteration, this stage's state) a client sent to resume from (Resume)."""
        self._final_weights: tuple[str, int, asyncio.Future[tuple[int, bytes]]] | None = None
        """(job, stage, its final weights): what this node serves of the latest job it
        completed, once the worker that trained them is gone."""

    # ================================================================== to joiners

    async def fetch_state(
        self, request: job_pb2.StateRequest
    ) -> AsyncIterator[job_pb2.StateChunk]:
        """Stream this stage's state (a live replica) or the backup this node keeps."""
        active = self.book.current(request.job_id)
        if active is None:
            raise NotHeld(f"{self.host.node_id} holds no state of job {request.job_id[:40]!r}")
        worker = active.worker
        key = (request.job_id, request.stage)
        kept = [k for k in (self.backups.get(key), self.periodic.get(key)) if k is not None]
        if request.exact:
            exact = [k for k in kept if k[0] == request.iteration]
            if not exact:
                raise NotHeld(f"{self.host.node_id} keeps no snapshot of stage {request.stage} "
                              f"of iteration {request.iteration}")
            iteration, data = exact[0]
        elif worker is not None and worker.stage == request.stage:
            iteration, data = await worker.state_bytes()
        elif kept:
            iteration, data = kept[0]
        else:
            raise NotHeld(f"{self.host.node_id} holds no state of stage {request.stage}")
        fault = self.host.fault
        for chunk in _chunks(data, request.stage, iteration):
            yield chunk
            if chunk.seq == 0 and fault is not None:
                fault.hit("state-transfer", iteration)  # the first chunk is on its way
                if delay := fault.delay_s("state-transfer"):
                    await asyncio.sleep(delay)

    async def fetch_steps(
        self, request: job_pb2.StateRequest
    ) -> AsyncIterator[job_pb2.StateChunk]:
        """Stream this live replica's steps from `request.iteration` on (docs/design.md 3.8)."""
        from gwtf.train.state import StateError

        active = self.book.current(request.job_id)
        worker = active.worker if active is not None else None
        if worker is None or worker.stage != request.stage:
            raise NotHeld(f"{self.host.node_id} runs no replica of stage {request.stage} of job "
                          f"{request.job_id[:40]!r}")
        try:
            iteration, data = await worker.steps_bytes(request.iteration)
        except StateError as err:
            raise NotHeld(f"{self.host.node_id}: {err}") from None
        for chunk in _chunks(data, request.stage, iteration):
            yield chunk

    async def fetch_from(
        self, donor: str, job_id: str, stage: int, at: int | None = None
    ) -> tuple[int, bytes]:
        """The state of `stage` streamed from `donor`: (its iteration, its bytes); with `at`, a
        keeper's snapshot of exactly that iteration. RuntimeError if the donor is
        gone, has no such state, or its stream breaks off."""
        request = job_pb2.StateRequest(sender=self.host.node_id, job_id=job_id, stage=stage,
                                       exact=at is not None, iteration=at or 0)
        return await self._pull(donor, request, steps=False)

    async def steps_from(
        self, donor: str, job_id: str, stage: int, iteration: int
    ) -> tuple[int, bytes]:
        """The steps of `stage` from `iteration` on, streamed from the live replica `donor`:
        (the iteration they reach, their bytes). RuntimeError as `fetch_from`."""
        request = job_pb2.StateRequest(sender=self.host.node_id, job_id=job_id, stage=stage,
                                       iteration=iteration)
        return await self._pull(donor, request, steps=True)

    async def _pull(
        self, donor: str, request: job_pb2.StateRequest, *, steps: bool
    ) -> tuple[int, bytes]:
        member = self.host.member(donor)
        if member is None:
            raise RuntimeError(f"{donor} is not alive")
        parts: list[bytes] = []
        iteration = -1
        incoming = Incoming(lambda problem: RuntimeError(f"{donor}: {problem}"),
                            stream="state stream", chunk="state chunk")
        jobs = self.host.stubs(member).jobs
        call = jobs.FetchSteps if steps else jobs.FetchState
        try:
            async for chunk in call(request, timeout=self.host.config.prepare_timeout_s):
                if incoming.next(chunk.seq):
                    iteration = chunk.iteration
                    if chunk.total_bytes > MAX_STATE_BYTES:
                        raise RuntimeError(f"{donor} offers a state of {chunk.total_bytes} bytes")
                    incoming.total = chunk.total_bytes
                incoming.take(len(chunk.payload))
                parts.append(chunk.payload)
        except aio.AioRpcError as err:
            raise RuntimeError(err.details() or err.code().name) from None
        incoming.finish()
        return iteration, b"".join(parts)

    # ================================================================== backups (4.6)

    def keepers_of(self, job_id: str, stage: int) -> list[str]:
        """Who keeps snapshots of `stage` as this node knows: itself first if it holds one,
        then the live keepers the rule names now (docs/design.md 4.6)."""
        active = self.book.active
        if active is None:
            return []
        found = [self.host.node_id] if (job_id, stage) in self.backups else []
        for keeper in self._keepers(active, stage):
            if keeper not in found and keeper != self.host.node_id:
                found.append(keeper)
        return found

    def _keepers(self, active: CurrentJob, stage: int) -> tuple[str, ...]:
        """The keepers of `stage`'s snapshots by the rule (`snapshot_keepers`)."""
        host = self.host

        def location(node: str) -> str:
            member = host.member(node)
            return member.location if member is not None else ""

        def started(node: str) -> float:
            """When the member's incarnation started: its epoch is its start's time_ns."""
            member = host.member(node)
            return member.epoch / 1e9 if member is not None else 0.0

        return snapshot_keepers(
            active.participants, active.departed, stage, active.coordinator,
            lambda p: p == host.node_id or host.member(p) is not None, location, started,
            count=active.job.snapshot_keepers,
        )

    def snapshot_iterations(self, job_id: str, stage: int) -> set[int]:
        """The iterations of the snapshots of `stage` this node keeps (none: empty)."""
        key = (job_id, stage)
        return {k[0] for k in (self.backups.get(key), self.periodic.get(key)) if k is not None}

    async def backup(self, chunks: AsyncIterator[job_pb2.StateChunk]) -> job_pb2.BackupAck:
        """A stage's snapshot, kept here so that a node joining the stage once it has no live
        replica finds it: the newest, and the newest periodic one (docs/design.md 4.6)."""
        first, data = await _read_state(chunks, "backup")
        active = self.book.active
        if active is None or active.job_id != first.job_id or active.participants.get(
            first.sender
        ) != first.stage:
            raise InvalidMessage(f"{first.sender[:40]!r} is no stage-{first.stage} participant")
        key = (first.job_id, first.stage)
        # Which snapshots are of periodic boundaries, as their senders said (the step order
        # that declared one may reach this node after the snapshot does).
        declared = self.declared.setdefault(key, set())
        if first.periodic:
            declared.add(first.iteration)
        policy = SnapshotPolicy(active.job.snapshot_every, active.job.snapshot_thin,
                                start=self.book.records[first.job_id].resumed_from,
                                declared=tuple(sorted(declared)))
        # Only a snapshot read to its end replaces anything (`keeper_keeps`).
        held = dict(k for k in (self.backups.get(key), self.periodic.get(key)) if k is not None)
        held[first.iteration] = data
        keep = keeper_keeps(policy, held, first.iteration)
        newest = max(keep)
        self.backups[key] = (newest, held[newest])
        periodic = max((i for i in keep if policy.periodic(i)), default=newest)
        self.periodic[key] = (periodic, held[periodic])
        declared &= keep
        self.host.log.info("job %s: keeping stage %d's state of iteration %d (from %s)",
                           first.job_id, first.stage, first.iteration, first.sender)
        return job_pb2.BackupAck(received_bytes=len(data))

    def send_backup(self, job_id: str) -> None:
        """This node became its stage's snapshot sender as the stage got thin mid-iteration:
        keep its state (of the iteration's start: parameters only change at a step) at another
        node now (docs/design.md 4.6)."""
        active = self.book.current(job_id)
        if active is None or active.worker is None:
            return
        worker = active.worker

        async def send() -> None:
            iteration, data = await worker.state_bytes()
            await self.keep_backup(job_id, worker.stage, iteration, data,
                                   iteration in worker.declared()[0])

        self.host.spawn(send(), "backup")

    async def keep_backup(self, job_id: str, stage: int, iteration: int, data: bytes,
                          periodic: bool = False) -> bool:
        """Send a stage's snapshot to all its keepers (`snapshot_keepers`) at once and return
        whether it landed at every keeper the rule names (`snapshot_landed`), once it has or
        no more can be tried. It streams in the background (docs/design.md 4.6): the sender
        reports a periodic one that landed with its next step, and the coordinator declares
        the next periodic boundary only once every stage's landed. A copy that failed (its
        keeper died on the way) goes once more to the rule's choice then, which is the dead
        keeper's replacement."""
        active = self.book.current(job_id)
        if active is None or iteration >= active.job.iterations:
            return False
        held: set[str] = set()
        landed = False
        for _ in range(BACKUP_ROUNDS):
            keepers = [k for k in self._keepers(active, stage) if k != self.host.node_id]
            landed = bool(keepers) and snapshot_landed(
                iteration, keepers, lambda k: (iteration,) if k in held else ())
            if not keepers or landed:
                break
            held.update(await self._send_backup(job_id, stage, iteration, data,
                                                [k for k in keepers if k not in held],
                                                periodic))
        active.keepers[stage] = tuple(sorted(held))
        return landed

    async def _send_backup(self, job_id: str, stage: int, iteration: int, data: bytes,
                           keepers: list[str], periodic: bool) -> list[str]:
        """Stream the snapshot to `keepers` at once; those it landed at."""

        async def send(keeper: str) -> bool:
            member = self.host.member(keeper)
            if member is None:
                return False
            # The emulated WAN (docs/design.md 3.6): the copy's bytes and the link's latency.
            await asyncio.sleep(self.host.wan_delay(member, len(data), bulk=True))
            try:
                await self.host.stubs(member).jobs.Backup(
                    _chunks(data, stage, iteration, job_id, self.host.node_id, periodic),
                    timeout=self.host.config.prepare_timeout_s,
                )
            except aio.AioRpcError as err:
                self.host.log.warning("job %s: the backup of stage %d at %s failed: %s",
                                      job_id, stage, keeper, err.details())
                return False
            return True

        landed = await asyncio.gather(*(send(k) for k in keepers))
        return [k for k, ok in zip(keepers, landed, strict=True) if ok]

    # ================================================================== resuming (10)

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
        self.resumes = {first.job_id: (first.iteration, data)}
        self.host.log.info("job %s: keeping a checkpoint of stage %d at iteration %d to resume "
                           "from (%d bytes)", first.job_id, own, first.iteration, len(data))
        return job_pb2.BackupAck(received_bytes=len(data))

    # ================================================================== weights for a client

    def keep_final_weights(self, job_id: str, worker: StageWorker) -> None:
        """The job's last iteration stepped here: keep the worker's weights to serve, then
        stop it."""
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

    async def fetch_weights(
        self, request: job_pb2.WeightsRequest
    ) -> AsyncIterator[job_pb2.StateChunk]:
        """Stream this node's weights of the job's stage: the live ones of a running job, or the
        final ones of the latest job it completed."""
        check_name("job id", request.job_id)
        active = self.book.active
        final = self._final_weights
        if (active is not None and active.job_id == request.job_id and active.worker is not None
                and active.worker.stage == request.stage):
            iteration, data = await active.worker.weights()
        elif final is not None and final[:2] == (request.job_id, request.stage):
            try:
                iteration, data = await final[2]
            except Exception as err:  # the worker failed to read them
                raise NotReady(f"{self.host.node_id} could not keep its weights: {err}") from None
        else:
            raise NotHeld(
                f"{self.host.node_id} holds no weights of stage {request.stage} of job "
                f"{request.job_id[:40]!r}",
            )
        for chunk in _chunks(data, request.stage, iteration):
            yield chunk
