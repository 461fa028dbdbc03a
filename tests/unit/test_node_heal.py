"""After a partition (docs/design.md 4.5): which side is stale and re-enters the job, decided by
gwtf.node.jobheal (a participant hearing the job's record) and gwtf.node.jobquorum (a paused
coordinator hearing a silent voter), with the real rules and a host that knows who is alive."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from gwtf.job.iterations import IterationCoordinator
from gwtf.node.jobheal import Healer
from gwtf.node.jobquorum import QuorumProbe
from gwtf.node.jobstate import CurrentJob, JobBook
from gwtf.v1 import job_pb2

JOB = "job-heal"
PARTICIPANTS = {"h0": 0, "a0": 1, "z0": 2, "h1": 0, "a1": 1, "z1": 2}


class Host:
    log = logging.LoggerAdapter(logging.getLogger("test"), {})

    def __init__(self, me: str, alive: set[str]) -> None:
        self.node_id = me
        self.alive = alive

    def member(self, node_id: str) -> Any:
        return SimpleNamespace(id=node_id) if node_id in self.alive else None


def progress(sender: str, completed: int) -> job_pb2.JobProgress:
    return job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator=sender,
                               iterations_completed=completed)  # fmt: skip


def participant(me: str, follows: str, iteration: int) -> tuple[Healer, CurrentJob]:
    host = Host(me, set(PARTICIPANTS))
    active = CurrentJob(job=None, job_id=JOB, job_json="{}",
                        worker=SimpleNamespace(iteration=iteration),  # type: ignore[arg-type]
                        participants=dict(PARTICIPANTS), coordinator=follows)  # fmt: skip
    return Healer(host, JobBook(), None), active  # type: ignore[arg-type]


def test_a_participant_is_stale_when_a_coordinator_it_does_not_follow_completed_more() -> None:
    healer, east = participant("a1", follows="h1", iteration=3)
    assert healer.stale(east, "h0", progress("h0", 6))  # the west went on to 6
    assert not healer.stale(east, "h0", progress("h0", 3))  # nothing it has not stepped
    assert not healer.stale(east, "h1", progress("h1", 6))  # its own coordinator's record
    assert not healer.stale(east, "a0", progress("a0", 6))  # not a data holder of the job
    assert not healer.stale(east, "h0", progress("h1", 6))  # a record relayed, not h0's own
    over = progress("h0", 6)
    over.state = job_pb2.JOB_STATE_COMPLETED
    assert not healer.stale(east, "h0", over)
    healer.host.alive.discard("h0")  # type: ignore[attr-defined]
    assert not healer.stale(east, "h0", progress("h0", 6))  # not alive here: nowhere to go
    # The side that went on does not take the stale side's record for news.
    healer, west = participant("a0", follows="h0", iteration=6)
    assert not healer.stale(west, "h1", progress("h1", 3))


def probe(me: str, injecting: int) -> tuple[QuorumProbe, list[tuple[str, str]]]:
    plan = IterationCoordinator(iterations=10, microbatches=2, participants=PARTICIPANTS,
                                num_stages=3, holders=(me,), iteration=injecting)  # fmt: skip
    resyncs: list[tuple[str, str]] = []
    host = Host(me, set(PARTICIPANTS))
    return QuorumProbe(host, JOB, plan, lambda: None,  # type: ignore[arg-type]
                       lambda other, why: resyncs.append((other, why))), resyncs  # fmt: skip


def test_a_paused_coordinator_yields_to_a_job_that_went_on_or_to_the_smaller_id() -> None:
    east, resyncs = probe("h1", injecting=3)
    east._heard("a0", job_pb2.SyncReply(iteration=3, coordinator="h1"))  # follows this side
    east._heard("a0", job_pb2.SyncReply(iteration=5, coordinator=""))  # follows nobody
    assert resyncs == []
    east._heard("a0", job_pb2.SyncReply(iteration=5, coordinator="h0"))  # went on to 5
    assert resyncs[0][0] == "h0" and "stayed at 3" in resyncs[0][1]
    # Two sides that both lacked a quorum, at one iteration: the smaller id goes on.
    east, resyncs = probe("h1", injecting=3)
    east._heard("a0", job_pb2.SyncReply(iteration=3, coordinator="h0"))
    assert [r[0] for r in resyncs] == ["h0"]
    west, resyncs = probe("h0", injecting=3)
    west._heard("a1", job_pb2.SyncReply(iteration=3, coordinator="h1"))
    west._heard("a1", job_pb2.SyncReply(iteration=2, coordinator="h1"))
    assert resyncs == []
