"""QuorumProbe: while a job's coordinator lacks the quorum of its commits (gwtf.job.quorum,
docs/design.md 4.5), it asks the silent voters where they are.

Each silent voter is asked (`Sync`) at most every `PROBE_S`:

- refused outright, or it holds nothing of the job: it is shown dead, and no longer votes
  (`on_gone`): a crash costs the quorum one call;
- it answers and follows another coordinator whose job went on without this side (a later
  iteration), or the same iteration under a coordinator of smaller id (two sides that both
  lacked a quorum: the smaller id's goes on): this side is stale, and re-enters the job through
  that coordinator (`resync`);
- no answer: still silent (alive across a partition, or dead without proof).

A round that stalls (the coordinator's watchdog) asks its live participants the same way
(`ask`): a coordinator that took the job over while the one it replaced still ran (a death
that was not one, confirmed too late) finds the participants following that one, and yields.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc
from grpc import aio

from gwtf.job.iterations import IterationCoordinator
from gwtf.node.jobs.host import JobsHost
from gwtf.node.rpc.transport import is_refused
from gwtf.v1 import job_pb2

__all__ = ["PROBE_S", "QuorumProbe"]

PROBE_S = 2.0
"""How often the silent voters are asked where they are while the quorum is missing."""


class QuorumProbe:
    """The silent voters of one coordinator's quorum: see the module docstring."""

    def __init__(
        self,
        host: JobsHost,
        job_id: str,
        plan: IterationCoordinator,
        on_gone: Callable[[], None],
        resync: Callable[[str, str], None],
    ) -> None:
        self.host = host
        self.job_id = job_id
        self.plan = plan
        self._on_gone = on_gone
        self._resync = resync
        self._probing: set[str] = set()
        self._probed_at = -PROBE_S

    def silent(self) -> None:
        """Ask the silent voters where they are (at most every `PROBE_S`)."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_S:
            return
        self._probed_at = now
        self.ask(self.plan.quorum().silent)

    def ask(self, nodes: Iterable[str]) -> None:
        """Ask `nodes` where they are: a stalled round asks its participants, for one that
        follows another coordinator (two took the job over at once) makes this one yield."""
        for node in nodes:
            if node not in self._probing and node != self.host.node_id:
                self._probing.add(node)
                self.host.spawn(self._probe(node), f"probe {node}")

    async def _probe(self, node: str) -> None:
        try:
            info = self.host.known_member(node)
            if info is None:
                return
            request = job_pb2.SyncRequest(sender=self.host.node_id, job_id=self.job_id)
            try:
                reply = await self.host.stubs(info).jobs.Sync(
                    request, timeout=self.host.config.rpc_timeout_s
                )
            except aio.AioRpcError as err:
                if is_refused(err) or err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self.host.log.info("job %s: %s is shown dead (%s): it no longer votes",
                                       self.job_id, node, err.code().name)
                    self.plan.shown_gone(node)
                    self._on_gone()
                return
            self._heard(node, reply)
        finally:
            self._probing.discard(node)

    def _heard(self, node: str, reply: job_pb2.SyncReply) -> None:
        me = self.host.node_id
        other = reply.coordinator
        if not other or other == me or self.host.member(other) is None:
            return
        here = self.plan.injecting
        if reply.iteration > here or (reply.iteration == here and other < me):
            self._resync(other, f"{node} follows {other} at iteration {reply.iteration} while "
                         f"this side, without a quorum, stayed at {here}")
