"""Deaths that are not, and sides that fell behind: a running job across a network partition
(docs/design.md 4.5).

A partition makes each side declare the other dead, and when it heals each side's verdicts
reach the other: every node hears it was declared dead and comes back as a new incarnation
(3.4), though its process, and its part of the job, never stopped. So the job does not take a
membership verdict on a participant as its death without asking:

- `confirm`: the dead member is asked where it is (`Sync`). Refused outright (nothing listens
  there) or it holds nothing of the job: it is *gone*, shown dead, and no longer votes on the
  commit quorum (gwtf.job.quorum). It answers with its part of the job: it is *alive*; the
  verdict came from nodes that lost sight of it, and the job keeps it. No answer in time:
  *silent*, dead as far as the job can tell, but it still votes (it may be alive across a
  partition).
- `stale`: a participant on the side that could not commit hears the job's record from a
  coordinator it does not follow, counting an iteration complete that it has not stepped: the
  job went on without it. Or (`returned`) a participant it had taken for dead comes back as a
  new incarnation and, asked, follows another coordinator at a later iteration. `resync` then
  drops this node's part (and its coordination, if it had taken the job over) and enters the
  job again through that coordinator as a joiner does (3.8), fetching its stage's state from a
  live replica of the side that went on: its replicas end identical to the others.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import grpc
from grpc import aio

from gwtf.node.control.membership import MemberInfo
from gwtf.node.jobs.book import ENTERING, CurrentJob, JobBook, stop_worker
from gwtf.node.jobs.host import JobsHost
from gwtf.node.jobs.joiner import Joiner
from gwtf.node.rpc.transport import is_refused
from gwtf.v1 import job_pb2

__all__ = ["Healer", "Seen"]

Seen = Literal["gone", "alive", "silent"]


class Healer:
    """The job manager's checks of deaths and of its own side's staleness."""

    def __init__(self, host: JobsHost, book: JobBook, joiner: Joiner) -> None:
        self.host = host
        self.book = book
        self.joiner = joiner

    async def confirm(self, member: MemberInfo, job_id: str) -> Seen:
        """Is `member`, declared dead by membership, gone, alive in the job, or silent?"""
        info = self.host.known_member(member.id) or member
        request = job_pb2.SyncRequest(sender=self.host.node_id, job_id=job_id)
        try:
            await self.host.stubs(info).jobs.Sync(request, timeout=self.host.config.rpc_timeout_s)
        except aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION and ENTERING in (
                err.details() or ""
            ):
                # It re-enters the job (the stale side of a healed partition), admitted by
                # now or about to be: a verdict of its old incarnation, not a death.
                return "alive"
            if is_refused(err) or err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return "gone"
            return "silent"
        return "alive"

    async def returned(self, active: CurrentJob, member: MemberInfo) -> None:
        """`member`, which the job took for dead, is alive again: if it follows another
        coordinator whose job went on past this node (or, both sides stuck at one iteration,
        one of smaller id than this node's), this node is stale and re-enters through it."""
        request = job_pb2.SyncRequest(sender=self.host.node_id, job_id=active.job_id)
        try:
            reply = await self.host.stubs(member).jobs.Sync(
                request, timeout=self.host.config.rpc_timeout_s
            )
        except aio.AioRpcError:
            return  # a restarted process that holds nothing of the job, or gone again
        other, here = reply.coordinator, self._iteration(active)
        if here is None or not other or other in (active.coordinator, self.host.node_id):
            return
        if not (reply.iteration > here or (reply.iteration == here and other < active.coordinator)):
            return
        for _ in range(20):  # its coordinator's own new incarnation may reach this node later
            if self.host.member(other) is not None:
                self.resync(active, other, f"{member.id} follows {other} at iteration "
                            f"{reply.iteration}, past this node's {here}")
                return
            await asyncio.sleep(self.host.config.member_poll_s)

    @staticmethod
    def _iteration(active: CurrentJob) -> int | None:
        """The iteration this node's part of the job is at (None: it has no part)."""
        if active.worker is not None:
            return int(active.worker.iteration)
        if active.coord is not None:
            return active.coord.plan.injecting
        return None

    def stale(self, active: CurrentJob, sender: str, progress: job_pb2.JobProgress) -> bool:
        """Does `progress`, from `sender`, say the job went on without this node?"""
        if (
            progress.state != job_pb2.JOB_STATE_RUNNING
            or progress.coordinator != sender
            or sender in (active.coordinator, self.host.node_id)
            or self.host.member(sender) is None
            or active.participants.get(sender) != 0
        ):
            return False
        here = self._iteration(active)
        return here is not None and progress.iterations_completed > here

    def resync(self, active: CurrentJob, coordinator: str, reason: str,
               record: job_pb2.JobProgress | None = None) -> None:
        """This node's part of the job is stale (`reason`): drop it and enter the job again
        through `coordinator`. `record`: that coordinator's record of the job, which replaces
        this node's (so that the stale side's records are older news from now on)."""
        if self.book.active is not active:
            return
        self.host.log.warning(
            "job %s: this node's part is stale (%s); it enters the job again through %s",
            active.job_id, reason, coordinator,
        )
        if active.coord is not None:
            active.coord.stop()
            active.coord = None
        stop_worker(self.host, active)
        self.book.active = None
        progress = self.book.records[active.job_id]
        if record is not None:
            progress.CopyFrom(record)
        progress.coordinator = coordinator
        progress.paused = ""
        self.book.record(progress)
        self.joiner.hear_running(progress)
