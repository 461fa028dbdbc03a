"""JobWire: the job runtime's calls to other nodes (docs/design.md 3.7).

    call            one call to a member, retried while it does not answer
    spread_progress the job's record to every live member (any node answers Watch and List)
    spread_fail     a failure to every member that should hear of it
    to_coordinator  a report to the job's coordinator, retried, and sent to a new coordinator if
                    the old one died meanwhile

What a call carries and what its answer means is decided by its caller; these only deliver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from grpc import aio

from gwtf.node.control.membership import MemberInfo
from gwtf.node.errors import Refusal
from gwtf.node.jobs.book import OVER, CurrentJob, JobBook
from gwtf.node.jobs.host import JobsHost
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.node.rpc.retry import Backoff, is_transient
from gwtf.node.rpc.transport import Stubs, is_refused
from gwtf.v1 import job_pb2

__all__ = ["CALL_BACKOFF", "REPORT_ATTEMPTS", "REPORT_BACKOFF", "JobWire"]

CALL_BACKOFF = Backoff(0.4)
"""The waits between the tries of `call`: 0.4, 0.8, 1.6 ... s, retried on transient failures
only (gwtf.node.rpc.retry.TRANSIENT); its callers bound the tries (3 by default)."""
REPORT_BACKOFF = Backoff(0.2, 1.0)
"""The waits between the tries of a report to the coordinator: 0.2, 0.4, 0.8, then 1 s."""
REPORT_ATTEMPTS = 12
"""Tries of a report, about 9 s of waits: longer than a coordinator's take-over."""


class JobWire:
    """The job runtime's outgoing calls: see the module docstring."""

    def __init__(self, host: JobsHost, book: JobBook) -> None:
        self.host = host
        self.book = book

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
                await asyncio.sleep(CALL_BACKOFF.delay(attempt - 1))
            try:
                return await call(self.host.stubs(member), timeout_s)
            except aio.AioRpcError as err:
                last = err.details() or err.code().name
                if is_refused(err):
                    self.host.refused(member)
                if not is_transient(err):
                    break
        raise RuntimeError(last.splitlines()[0] if last else "no answer")

    def spread_progress(self, progress: job_pb2.JobProgress) -> None:
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

    def everyone(self, active: CurrentJob | None) -> list[MemberInfo]:
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

    async def spread_fail(
        self,
        job_id: str,
        reason: str,
        members: list[MemberInfo],
        fail_here: Callable[[str, str], None],
    ) -> None:
        """Tell `members` the job failed; this node, if among them, hears it by `fail_here`."""
        request = job_pb2.FailRequest(sender=self.host.node_id, job_id=job_id, reason=reason)
        calls = []
        for member in members:
            if member.id == self.host.node_id:
                fail_here(job_id, reason)
                continue
            calls.append(self.call(
                lambda stubs, t: stubs.jobs.Fail(request, timeout=t), member,
                self.host.config.rpc_timeout_s, attempts=1,
            ))
        await asyncio.gather(*calls, return_exceptions=True)

    def to_coordinator(
        self,
        job_id: str,
        remote: Callable[[Stubs, float], Awaitable[Any]],
        local: Callable[[], Any],
    ) -> None:
        """A report to the job's coordinator, retried while it does not answer, and sent to a
        new coordinator if the old one died meanwhile (which starts the iteration again, so a
        report that is lost with it is moot). `local` is the report as this node takes it when
        it coordinates."""
        active = self.book.current(job_id)
        if active is None:
            return
        book = self.book
        host = self.host

        async def send() -> None:
            for attempt in range(REPORT_ATTEMPTS):
                if book.active is not active or book.records[job_id].state in OVER:
                    return
                if attempt:
                    await asyncio.sleep(REPORT_BACKOFF.delay(attempt - 1))
                if active.coordinator == host.node_id:
                    try:
                        local()
                        return
                    except (Refusal, InvalidMessage) as err:
                        if not is_transient(err):
                            host.log.warning("job %s: a report was refused: %s", job_id, err)
                            return
                        continue
                member = host.member(active.coordinator)
                if member is None:
                    continue
                try:
                    await remote(host.stubs(member), host.config.rpc_timeout_s)
                    return
                except aio.AioRpcError as err:
                    if not is_transient(err):
                        host.log.warning("job %s: %s refused a report: %s", job_id,
                                         active.coordinator, err.details())
                        return

        host.spawn(send(), "report")
