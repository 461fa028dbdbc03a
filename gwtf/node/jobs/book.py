"""The jobs a node knows, and the one it prepares or runs: state and progress, no calls
(docs/design.md 3.7).

    JobBook     every job's progress as this node last heard it (the coordinator spreads it),
                the job in hand (`CurrentJob`), and `watch`, which follows a record as it changes
    CurrentJob  the job this node prepares or runs: its worker, participants, coordinator, and
                what this node keeps of it

The job manager (gwtf.node.jobs.manager) and its collaborators share one JobBook: a call that
changes a record goes through `record`, which wakes the watchers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gwtf.job.iterations import IterationOutcome
from gwtf.node.errors import UnknownJob
from gwtf.node.jobs.coordinator.coordinator import JobCoordinator
from gwtf.node.jobs.host import JobsHost
from gwtf.v1 import job_pb2

if TYPE_CHECKING:
    from gwtf.node.worker.worker import StageWorker

__all__ = ["ENTERING", "OVER", "UNDER_WAY", "CurrentJob", "JobBook", "state_name", "stop_worker"]

UNDER_WAY = (job_pb2.JOB_STATE_PREPARING, job_pb2.JOB_STATE_RUNNING)
OVER = (job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED)
ENTERING = "is entering job"
"""How a node entering a running job (gwtf.node.jobs.joiner) says so when it refuses a call."""


def state_name(state: int) -> str:
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


@dataclass
class CurrentJob:
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
    keepers: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Stage -> the nodes that took its latest snapshot from this node (4.6)."""
    taking_over: bool = False
    base: set[str] = field(default_factory=set)
    """The members of the last commit this node took part in (at the start: the participants):
    the voters of its quorum should it take the job over (gwtf.job.quorum)."""
    moving: Any = None
    """The move (a job_pb2.Move) a step named this node for: it leaves for its new stage once
    it stepped (gwtf.node.jobs.coordinator.moves)."""


def stop_worker(host: JobsHost, active: CurrentJob) -> None:
    """This node's part of the job ends: its worker stops (in the background)."""
    worker, active.worker = active.worker, None
    if worker is not None:
        host.spawn(worker.stop(), "stop worker")


class JobBook:
    """The jobs this node knows and the one in hand: see the module docstring."""

    def __init__(self) -> None:
        self.records: dict[str, job_pb2.JobProgress] = {}
        self.active: CurrentJob | None = None
        self._changed = asyncio.Event()
        self.vouched: set[str] = set()
        """Participants whose death the coordinator named in a commit (it confirmed them): the
        job acts on them at once, with no confirmation of its own (gwtf.node.jobs.heal)."""

    def current(self, job_id: str) -> CurrentJob | None:
        """The job in hand if it is `job_id`."""
        active = self.active
        return active if active is not None and active.job_id == job_id else None

    def notify(self) -> None:
        """A record changed: every `watch` looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def record(self, progress: job_pb2.JobProgress) -> None:
        self.records[progress.job_id] = progress
        self.notify()

    def list_jobs(self) -> job_pb2.ListReply:
        return job_pb2.ListReply(jobs=list(self.records.values()))

    async def watch(self, job_id: str, node_id: str) -> AsyncIterator[job_pb2.JobProgress]:
        """The job's record now and at every change, until it is over (a copy each time: the
        record itself changes in place); NOT_FOUND if this node (`node_id`) knows no such job."""
        if job_id not in self.records:
            raise UnknownJob(
                f"no job {job_id[:40]!r} is known at {node_id}",
            )
        sent: job_pb2.JobProgress | None = None
        while True:
            changed = self._changed
            progress = self.records[job_id]
            if progress != sent:
                sent = job_pb2.JobProgress()
                sent.CopyFrom(progress)
                yield sent
            if progress.state in OVER:
                return
            await changed.wait()

    def tally(self, active: CurrentJob, outcome: IterationOutcome, now: float) -> None:
        """An iteration committed at `now` (the node's monotonic clock): its counts go into
        the job's record (the caller records it, so that watchers hear of it once)."""
        progress = self.records[active.job_id]
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
        if outcome.mismatched:
            progress.checksum_mismatches += 1
