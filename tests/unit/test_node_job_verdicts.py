"""A participant hears of a death from the coordinator's commit before it acts on the attempt.

The coordinator leaves a dead participant out of a commit attempt; the attempt carries the
coordinator's membership verdict on it. A participant whose own failure detector (or gossip) has
not yet declared that member dead merges the verdict first, so its membership, its metrics and its
job agree with the coordinator's before it commits. These tests drive the real JobManager and a
real Membership, with a host that routes membership events to the manager as the node does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gwtf.job.iterations import CommitOrder
from gwtf.node.config import NodeConfig
from gwtf.node.control.membership import MemberInfo, Membership, State
from gwtf.node.jobs.book import CurrentJob as _Active
from gwtf.node.jobs.manager import JobManager
from gwtf.node.rpc.codec import InvalidMessage, member_to_pb
from gwtf.v1 import job_pb2

JOB = "job-verdicts"


def info(node: str, stage: int, state: State = State.ALIVE) -> MemberInfo:
    return MemberInfo(node, f"127.0.0.1:{1000 + len(node)}", stage, "", 0.05, 20.0, epoch=7,
                      state=state)  # fmt: skip


@dataclass
class FakeWorker:
    """Records what the manager tells the stage worker, in order."""

    stage: int = 1
    iteration: int = 1
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def depart(self, node: str, *, crashed: bool = False) -> None:
        self.calls.append(("depart", node))

    def exclude(self, node: str) -> None:
        self.calls.append(("exclude", node))

    def order_commit(self, order: CommitOrder) -> None:
        self.calls.append(("commit", order))


class Host:
    """The node as the manager sees it: a real member table whose events reach the manager."""

    node_id = "z0"
    config = NodeConfig()
    log = logging.LoggerAdapter(logging.getLogger("test"), {})

    def __init__(self) -> None:
        self.members = Membership(
            info("z0", 1), lambda: 0.0, failure_timeout_s=3.0, ping_interval_s=0.25,
            tombstone_s=60.0, rng=np.random.default_rng(0),
        )  # fmt: skip
        # z2 keeps z0's stage from getting thin (z0 would then snapshot its state): the job's
        # snapshot_thin is 1.
        self.members.merge([info("h0", 0), info("z1", 1), info("z2", 1)])
        self.manager: JobManager | None = None
        self.deaths = 0

    def num_stages(self) -> int:
        return 2

    def member(self, node_id: str) -> MemberInfo | None:
        found = self.members.get(node_id)
        return found if found is not None and found.alive else None

    def hear_verdicts(self, infos: list[MemberInfo]) -> None:
        assert self.manager is not None
        for event in self.members.merge(infos):
            self.deaths += event.kind == "dead"
            self.manager.on_member_down(event.member, "left" if event.kind == "left" else "died")


def participant() -> tuple[Host, JobManager, FakeWorker]:
    host = Host()
    manager = JobManager(host)  # type: ignore[arg-type]
    host.manager = manager
    worker = FakeWorker()
    manager._active = _Active(
        job=SimpleNamespace(microbatches=8, iterations=3, snapshot_every=4, snapshot_thin=1),
        job_id=JOB, job_json="{}",
        worker=worker, participants={"h0": 0, "z0": 1, "z1": 1, "z2": 1}, coordinator="h0",  # type: ignore[arg-type]
    )  # fmt: skip
    manager._records[JOB] = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING)
    return host, manager, worker


def commit(*departed: MemberInfo) -> job_pb2.CommitRequest:
    return job_pb2.CommitRequest(
        sender="h0", job_id=JOB, iteration=1, microbatches=range(8), round=0, attempt=1,
        members=[job_pb2.Participant(id=p, stage=s) for p, s in (("h0", 0), ("z0", 1), ("z2", 1))],
        departed=[member_to_pb(m) for m in departed],
    )  # fmt: skip


def down(manager: JobManager, how: str) -> float:
    return manager.metrics._values.get(("gwtf_job_participants_down", JOB, how), 0.0)


def test_a_death_named_by_the_commit_is_heard_before_the_attempt() -> None:
    host, manager, worker = participant()
    assert host.member("z1") is not None  # this node's own detector has not fired yet
    manager.commit(commit(replace(info("z1", 1), state=State.DEAD)))
    assert host.member("z1") is None and host.deaths == 1
    assert down(manager, "crashed") == 1
    kinds = [kind for kind, _ in worker.calls]
    assert kinds == ["depart", "commit"] and worker.calls[0][1] == "z1"
    # The same verdict again (a resent commit, then gossip) changes nothing.
    manager.commit(commit(replace(info("z1", 1), state=State.DEAD)))
    assert host.deaths == 1 and down(manager, "crashed") == 1


def test_a_leave_named_by_the_commit_counts_as_a_leave() -> None:
    host, manager, _ = participant()
    manager.commit(commit(replace(info("z1", 1), state=State.LEFT)))
    assert host.member("z1") is None and host.deaths == 0
    assert down(manager, "left") == 1 and down(manager, "crashed") == 0


def test_a_verdict_on_an_older_incarnation_does_not_touch_the_new_one() -> None:
    host, manager, worker = participant()
    manager.commit(commit(replace(info("z1", 1), epoch=3, state=State.DEAD)))
    assert host.member("z1") is not None and host.deaths == 0
    assert [kind for kind, _ in worker.calls] == ["commit"]


def test_a_commit_that_calls_a_live_member_departed_is_refused() -> None:
    host, manager, worker = participant()
    with pytest.raises(InvalidMessage, match="alive"):
        manager.commit(commit(info("z1", 1)))
    assert host.member("z1") is not None and worker.calls == []
