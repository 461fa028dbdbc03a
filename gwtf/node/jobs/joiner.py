"""Joiner: a node that joins the swarm while a job runs enters the job (docs/design.md 3.8, 4.3
rule 5).

It learns the jobs its bootstrap node knows (`learn_jobs`), or hears of a running one from the
coordinator's progress (`hear_running`), then asks the coordinator for donors (`Enter`), fetches
its stage's state from one (another if one dies mid-transfer), builds its stage from it and asks
again with the iteration it holds. A state that a few steps made stale catches up with a
replica's own steps (`_catch_up`, gwtf.job.catchup); one further behind is fetched again. When
every data holder died, a stage-0 joiner takes stage 0's state from the node keeping its backup and
coordinates the job itself (`adopt`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

from grpc import aio

from gwtf.job.catchup import catches_up
from gwtf.job.snapshots import SnapshotPolicy, own_kept
from gwtf.node.jobs.book import CurrentJob, JobBook
from gwtf.node.jobs.host import JobsHost
from gwtf.node.jobs.launcher import JobLauncher
from gwtf.node.jobs.transfer import StateTransfer
from gwtf.node.jobs.wire import JobWire
from gwtf.node.rpc.transport import Stubs
from gwtf.v1 import job_pb2

__all__ = ["Joiner"]


def _enter_call(request: job_pb2.EnterRequest) -> Callable[[Stubs, float], Awaitable[Any]]:
    def call(stubs: Stubs, timeout: float) -> Awaitable[Any]:
        return stubs.jobs.Enter(request, timeout=timeout)

    return call


def _sync_call(request: job_pb2.SyncRequest) -> Callable[[Stubs, float], Awaitable[Any]]:
    def call(stubs: Stubs, timeout: float) -> Awaitable[Any]:
        return stubs.jobs.Sync(request, timeout=timeout)

    return call


class Joiner:
    """This node entering a running job: see the module docstring. `fail` fails the job
    everywhere; `take_over` makes this node the job's coordinator (the job manager's)."""

    def __init__(
        self,
        host: JobsHost,
        book: JobBook,
        wire: JobWire,
        launcher: JobLauncher,
        transfer: StateTransfer,
        fail: Callable[[str, str], None],
        take_over: Callable[[CurrentJob, str], Awaitable[None]],
    ) -> None:
        self.host = host
        self.book = book
        self.wire = wire
        self.launcher = launcher
        self.transfer = transfer
        self._fail = fail
        self._take_over = take_over
        self._joining = False

    async def learn_jobs(self, address: str) -> None:
        """A joiner learns the jobs its bootstrap node knows, and enters a running one."""
        try:
            reply = await self.host.stubs_at(address).jobs.List(
                job_pb2.ListRequest(), timeout=self.host.config.rpc_timeout_s
            )
        except aio.AioRpcError:
            return
        running: job_pb2.JobProgress | None = None
        records = self.book.records
        for progress in reply.jobs:
            if progress.job_id and progress.job_id not in records:
                records[progress.job_id] = progress
                if progress.state == job_pb2.JOB_STATE_RUNNING:
                    running = progress
        self.book.notify()
        if running is not None and self.host.trains and self.book.active is None and (
            not self._joining
        ):
            self._joining = True
            await self._join_running(running)

    def hear_running(self, progress: job_pb2.JobProgress) -> None:
        """The job of `progress` runs: a node that joined while it was being prepared, and so
        holds no part of it, enters it."""
        if (
            self.book.active is None
            and progress.state == job_pb2.JOB_STATE_RUNNING
            and self.host.trains
            and not self._joining
        ):
            self._joining = True
            self.host.spawn(self._join_running(progress), "join job")

    async def _join_running(self, progress: job_pb2.JobProgress) -> None:
        """This node joined the swarm while a job runs: fetch its stage's state from a live
        peer (another if the donor dies mid-transfer) and enter the job at an iteration
        boundary, catching up the steps taken meanwhile."""
        try:
            await self._enter_running(progress)
        finally:
            self._joining = False
            active = self.book.current(progress.job_id)
            if active is not None and active.worker is None:
                self.book.active = None  # it did not enter: a later progress may try again

    async def _enter_running(self, progress: job_pb2.JobProgress) -> None:
        host = self.host
        launcher = self.launcher
        job = await launcher.parse(progress.job_json)
        module = await launcher.load()
        from gwtf.train.data import DataError
        from gwtf.train.state import StateError

        stage = host.own_stage()
        deadline = time.monotonic() + host.config.prepare_timeout_s
        empty = False
        why = "no answer"
        self.book.active = CurrentJob(job, job.job_id, progress.job_json, None,
                                      coordinator=progress.coordinator)
        while time.monotonic() < deadline:
            record = self.book.records.get(job.job_id)
            if record is None or record.state != job_pb2.JOB_STATE_RUNNING:
                return
            coordinator = host.member(record.coordinator)
            if coordinator is None:
                # Its coordinator died: the next one's progress brings its name here, unless
                # every data holder died, and this node is a holder that can take over.
                if await self._adopt(job, module, stage):
                    return
                await asyncio.sleep(host.config.entry_retry_s)
                continue
            ask = job_pb2.EnterRequest(sender=host.node_id, job_id=job.job_id, stage=stage)
            try:
                reply = await self.wire.call(
                    _enter_call(ask), coordinator,
                    host.config.rpc_timeout_s,
                )
            except RuntimeError as err:
                host.log.warning("job %s: %s did not answer the entry: %s", job.job_id,
                                 record.coordinator, err)
                await asyncio.sleep(host.config.entry_retry_s)
                continue
            state: tuple[int, bytes] | None = None
            # A stage with no live replica is restored from its keeper's snapshot, of the
            # iteration the coordinator names when the swarm must roll back to it (4.6).
            exact = reply.snapshot_iteration if reply.rollback else None
            empty = not any(
                (m := host.member(d)) is not None and m.stage == stage for d in reply.donors
            )
            for donor in reply.donors:
                try:
                    state = await self.transfer.fetch_from(donor, job.job_id, stage, exact)
                    break
                except RuntimeError as err:
                    why = str(err)
                    host.log.warning("job %s: the state of stage %d from %s failed: %s; "
                                     "another donor", job.job_id, stage, donor, err)
            if state is None:
                await asyncio.sleep(host.config.entry_retry_s)
                continue
            data = state[1]
            reply = None
            try:
                executor, corpus = await asyncio.to_thread(
                    module.StageWorker.build_from_state, job, stage, host.num_stages(),
                    host.memory_slots, data, launcher.placement,
                )
            except (StateError, DataError) as err:
                self._fail(job.job_id, f"{host.node_id} could not use its stage's state: {err}")
                return
            # The iteration the state itself holds, not the stream's label: what it enters at.
            iteration = executor.iteration
            while True:
                ask = job_pb2.EnterRequest(sender=host.node_id, job_id=job.job_id, stage=stage,
                                           has_state=True, state_iteration=iteration)
                try:
                    reply = await self.wire.call(
                        _enter_call(ask), coordinator,
                        host.config.rpc_timeout_s,
                    )
                    while not reply.admitted and reply.iteration == iteration and (
                        time.monotonic() < deadline
                    ):
                        # Its state is of the iteration in progress, which is in its commit: ask
                        # again once that is over rather than fetch the same state again (a
                        # commit that takes longer than a fetch would keep this node out).
                        await asyncio.sleep(host.config.admit_poll_s)
                        reply = await self.wire.call(_enter_call(ask), coordinator,
                                                     host.config.rpc_timeout_s)
                except RuntimeError:
                    break
                if reply.admitted or time.monotonic() >= deadline or not catches_up(
                    iteration, reply.iteration, job.catch_up_steps
                ):
                    break
                # The stage stepped while its state travelled: the steps it missed, not the
                # whole state again (docs/design.md 3.8).
                caught = await self._catch_up(job.job_id, stage, executor, iteration,
                                              reply.donors)
                if caught is None:
                    break
                iteration = caught
            if reply is None:
                continue
            if not reply.admitted:
                why = f"its state of iteration {iteration} was not admitted at {reply.iteration}"
                host.log.info("job %s: the state of iteration %d is stale (now %d): again",
                              job.job_id, iteration, reply.iteration)
                await asyncio.sleep(host.config.admit_poll_s)
                continue
            worker = launcher.new_worker(module, job, executor, corpus)
            active = self.book.current(job.job_id)
            if active is None:
                await worker.stop()
                return
            worker.boundaries(reply.declared, reply.floor, record.resumed_from)
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
        if empty:
            # Its stage has no live replica and this node could not restore it: the job cannot
            # go on, and says so rather than wait for ever (docs/design.md 4.6).
            self._fail(job.job_id, f"stage {stage} has no live replica and {host.node_id} "
                       f"could not restore it from a snapshot within "
                       f"{host.config.prepare_timeout_s:.0f} s ({why})")

    async def _catch_up(
        self, job_id: str, stage: int, executor: Any, iteration: int, donors: Sequence[str]
    ) -> int | None:
        """Bring `executor`, a state of `iteration`, to a live replica's iteration with the
        replica's own steps (StageExecutor.catch_up: the same bits). The iteration reached, or
        None if no donor keeps the steps or they did not apply (the executor is then unusable:
        the caller fetches the whole state again)."""
        from gwtf.train.state import StateError

        log = self.host.log
        for donor in donors:
            try:
                _, data = await self.transfer.steps_from(donor, job_id, stage, iteration)
            except RuntimeError as err:
                log.info("job %s: no steps of stage %d from iteration %d at %s: %s", job_id,
                         stage, iteration, donor, err)
                continue
            try:
                reached: int = await asyncio.to_thread(executor.catch_up, data)
            except StateError as err:
                log.warning("job %s: the steps of stage %d from %s did not apply: %s; the "
                            "state again", job_id, stage, donor, err)
                return None
            log.info("job %s: caught up stage %d from iteration %d to %d with %s's steps "
                     "(%d bytes)", job_id, stage, iteration, reached, donor, len(data))
            return reached
        return None

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
                reply = await self.wire.call(_sync_call(request), member,
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
        record = self.book.records[job.job_id]
        # The boundaries declared so far, as the participant that knows the most of them says.
        known = max(replies.values(), key=lambda r: (len(r[1].declared), r[1].floor))[1]
        policy = SnapshotPolicy(job.snapshot_every, job.snapshot_thin, start=record.resumed_from,
                                declared=tuple(sorted(known.declared)))
        # Stage 0's snapshot of the iteration in progress, else the newest periodic one the
        # other stages hold too: the swarm then rolls back to it (docs/design.md 4.6).
        state: tuple[int, bytes] | None = None
        for at in (None, *sorted(own_kept(policy, top, floor=known.floor), reverse=True)):
            for member in sorted(live, key=lambda m: m.id):
                try:
                    state = await self.transfer.fetch_from(member.id, job.job_id, 0, at)
                except RuntimeError:
                    continue
                if state[0] in (top, at):
                    break  # stage 0 has several keepers: another may hold what this one lacks
                state = None
            if state is not None:
                break
        if state is None:
            self._fail(job.job_id, f"every data holder died at iteration {top} and no node "
                       "keeps a snapshot of stage 0 the swarm can go on from; resume the job "
                       "from a checkpoint or submit it again")
            return True
        try:
            executor, corpus = await asyncio.to_thread(
                module.StageWorker.build_from_state, job, 0, host.num_stages(),
                host.memory_slots, state[1], self.launcher.placement,
            )
        except (StateError, DataError) as err:
            self._fail(job.job_id, f"{me} could not use stage 0's state: {err}")
            return False
        active = self.book.current(job.job_id)
        if active is None:
            return False
        worker = self.launcher.new_worker(module, job, executor, corpus)
        participants = {node: s for node, (s, _) in replies.items()}
        participants[me] = 0
        round_ = max((r.round for _, r in replies.values() if r.iteration == top), default=0)
        worker.boundaries(known.declared, known.floor, record.resumed_from)
        active.worker = worker
        active.participants = participants
        active.coordinator = me
        active.last_iteration_end = time.monotonic()
        worker.start(participants, (), None, round_)
        host.log.warning("job %s: every data holder had died; %s takes stage 0 over from its "
                         "snapshot of iteration %d", job.job_id, me, state[0])
        self.book.records[job.job_id].joins += 1
        await self._take_over(active, "")
        if state[0] < top and active.coord is not None:
            active.coord.entrance.roll_back(0, state[0])
        return True
