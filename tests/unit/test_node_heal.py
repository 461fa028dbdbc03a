"""After a partition (docs/design.md 4.5): which side is stale and re-enters the job, decided by
gwtf.node.jobs.heal (a participant hearing the job's record) and gwtf.node.jobs.coordinator.quorum
(a paused coordinator hearing a silent voter), with the real rules and a host that knows who is
alive."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from gwtf.job.iterations import IterationCoordinator
from gwtf.node.jobs.book import CurrentJob, JobBook
from gwtf.node.jobs.coordinator.quorum import QuorumProbe
from gwtf.node.jobs.heal import Healer
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


# ---------------------------------------------------------------- the heal, replayed in order


class Calls:
    """The coordinator's calls to remote participants: (method, node), in the order sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def stubs(self, node: str) -> Any:
        sent = self.sent

        class Jobs:
            def __getattr__(self, method: str) -> Any:
                async def call(request: Any, timeout: float) -> Any:
                    sent.append((method, node))
                    return SimpleNamespace()

                return call

        return SimpleNamespace(jobs=Jobs())


class CoordHost(Host):
    """The west coordinator's host at the heal: membership still shows the stale side's old
    incarnations dead (their new ones reach it by gossip a second later)."""

    config = SimpleNamespace(recovery_stall_s=10.0, rpc_timeout_s=3.0, watchdog_s=1.0,
                             member_poll_s=0.25)

    def __init__(self, me: str, alive: set[str], calls: Calls) -> None:
        super().__init__(me, alive)
        self.calls = calls
        self.tasks: list[Any] = []

    def known_member(self, node_id: str) -> Any:
        return SimpleNamespace(id=node_id, alive=node_id in self.alive)

    def spawn(self, coro: Any, name: str) -> None:
        self.tasks.append(coro)


def test_a_restart_right_after_the_heal_reaches_the_joiners_membership_shows_dead() -> None:
    """The ordering behind the heal's stalls (docs/design.md 4.5, measured in 2 runs of 5 of
    tests/chaos/test_partition.py): the west's coordinator h0 admits h1, back from the cut-off
    side, before its membership has h1's new incarnation, then restarts its round (a west
    participant the east's stale verdicts declared dead came back). The restart must reach h1:
    skipped, h1 stayed in the older round, and the iteration stalled until the watchdog, for
    good when that restart was skipped too."""
    import asyncio

    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    calls = Calls()
    west = {"h0": 0, "a0": 1, "z0": 2}
    host = CoordHost("h0", set(west), calls)
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h0")
    local: list[str] = []

    class Manager:
        def __init__(self) -> None:
            self.host = host

        async def call(self, call: Any, member: Any, timeout_s: float, *,
                       attempts: int = 3) -> Any:
            return await call(calls.stubs(member.id), timeout_s)

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

        def excluded(self, job_id: str) -> list[str]:
            return []

        def changed(self, active: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Any:  # this node's own part of each call
            return lambda request: local.append(name) or SimpleNamespace()

    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, replay_bound=0,
                          aggregation=SimpleNamespace(robust=False))
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h0")
    plan = IterationCoordinator(iterations=16, microbatches=8, participants=west, num_stages=3,
                                holders=("h0",), iteration=8, base=west)  # fmt: skip
    coord = JobCoordinator(Manager(), active, plan)  # type: ignore[arg-type]
    reply = coord.enter(job_pb2.EnterRequest(sender="h1", job_id=JOB, stage=0, has_state=True,
                                             state_iteration=8))  # fmt: skip
    assert reply.admitted and "h1" in plan.participants and host.member("h1") is None
    # Counted alive (a donor of its stage, a neighbour asked for evidence), as it is called.
    assert "h1" in coord.live_participants()
    coord._restart("a0 was declared dead by nodes that lost sight of it")
    asyncio.run(_drain(host.tasks))
    assert ("Restart", "h1") in calls.sent, calls.sent
    assert {n for m, n in calls.sent if m == "Admit"} == {"a0", "z0"}
    assert local == ["admit", "restart"]
    # A participant membership declared dead, and the job has not heard from since, is not
    # called (its death is being confirmed), though its address is known; nor once dropped.
    host.alive.discard("z0")
    calls.sent.clear()
    coord._restart("z0 died")
    asyncio.run(_drain(host.tasks))
    assert sorted(n for m, n in calls.sent if m == "Restart") == ["a0", "h1"]
    coord._down("h1", "crashed")
    assert "h1" not in coord.live_participants()
    calls.sent.clear()
    coord._restart("h1 died")
    asyncio.run(_drain(host.tasks))
    assert sorted(n for m, n in calls.sent if m == "Restart") == ["a0"]


async def _drain(tasks: list[Any]) -> None:
    """Run the calls spawned (and what they spawn); a death's recovery is not watched here."""
    while tasks:
        batch = list(tasks)
        tasks.clear()
        for coro in batch:
            if coro.__qualname__.startswith("CrashRecovery."):
                coro.close()
            else:
                await coro


def test_a_coordinator_whose_round_stalls_yields_to_the_one_its_participants_follow() -> None:
    """h1, back from the cut-off side, took the job over again at iteration 9 (a death of h0
    that was not one); every participant still follows h0, so h1's rounds stall. Its watchdog
    asks them where they are, and h1 enters through h0 instead of restarting for good."""
    import asyncio

    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    calls = Calls()
    host = CoordHost("h1", set(PARTICIPANTS), calls)
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h1")
    resyncs: list[tuple[str, str]] = []

    class Manager:
        def __init__(self) -> None:
            self.host = host

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

        def changed(self, active: Any) -> None:
            pass

        def resync(self, active: Any, coordinator: str, reason: str) -> None:
            resyncs.append((coordinator, reason))

    async def sync(request: Any, timeout: float) -> job_pb2.SyncReply:
        return job_pb2.SyncReply(iteration=9, round=2, coordinator="h0")

    host.stubs = lambda info: SimpleNamespace(jobs=SimpleNamespace(Sync=sync))  # type: ignore
    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, replay_bound=0,
                          aggregation=SimpleNamespace(robust=False))
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h1")
    plan = IterationCoordinator(iterations=16, microbatches=8, participants=PARTICIPANTS,
                                num_stages=3, holders=("h0", "h1"), iteration=9)  # fmt: skip
    coord = JobCoordinator(Manager(), active, plan)  # type: ignore[arg-type]
    coord.stall_s = 0.0

    async def run() -> None:
        watch = asyncio.ensure_future(coord._watch())
        await asyncio.sleep(1.2)
        watch.cancel()
        probes = [t for t in host.tasks if t.__qualname__ == "QuorumProbe._probe"]
        for other in host.tasks:
            if other not in probes:
                other.close()  # its restart's calls: not what this test watches
        await _drain(probes)

    asyncio.run(run())
    assert resyncs and resyncs[0][0] == "h0", resyncs


def test_a_take_over_that_ends_after_a_resync_starts_no_coordinator() -> None:
    """h1 takes the job over on the cut-off side and asks its participants where they are;
    meanwhile its side is found stale and it drops its part to enter through h0. The take-over
    that ends then must not start a coordinator: one would restart rounds nobody follows, and
    its record would name h1 to the joiners of the job."""
    import asyncio

    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    east = {"h1": 0, "a1": 1, "z1": 2}
    calls = Calls()
    host = CoordHost("h1", set(east), calls)
    host.num_stages = lambda: 3  # type: ignore[attr-defined]
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h0")
    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, iterations=16, microbatches=8)
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h1", base=set(east))
    held = {"now": active}

    class Manager:
        def __init__(self) -> None:
            self.host = host

        async def call(self, call: Any, member: Any, timeout_s: float, *,
                       attempts: int = 3) -> Any:
            held["now"] = None  # the resync lands while the participants are asked
            return job_pb2.SyncReply(iteration=3)

        def sync(self, request: Any) -> job_pb2.SyncReply:
            return job_pb2.SyncReply(iteration=3)

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

        def holds(self, it: Any) -> bool:
            return held["now"] is it

    assert asyncio.run(JobCoordinator.take_over(Manager(), active)) is None  # type: ignore
    assert host.tasks == [] and record.coordinator == "h0"


def test_a_stage_peer_admitted_before_its_new_incarnation_gets_the_gradient_sums() -> None:
    """The other half of the heal's stalls (docs/design.md 4.5, 2 runs of 4 of
    tests/chaos/test_partition.py): h0 admitted a1 and ordered the commit at once, while the
    west's membership still showed a1's old incarnation dead; a0, a1's stage peer, gave the
    commit's exchange up (a "dead" member) and reported nothing, and the round waited for the
    watchdog. The job counts a1 in (admitted: not departed), so its sums go to its address;
    once the job drops it (a death it confirmed), they do not."""
    import asyncio

    import torch

    from gwtf.node.dataplane.gradsync import PARTIAL, ContributionHeader
    from gwtf.node.worker.allreduce import contribute
    from gwtf.node.worker.stage import StageContext, WorkerConfig

    sent: list[str] = []

    class WestHost(Host):
        metrics = SimpleNamespace(count=lambda *args: None)

        def known_member(self, node_id: str) -> Any:
            return SimpleNamespace(id=node_id, alive=node_id in self.alive)

        def wan_delay(self, member: Any, nbytes: int) -> float:
            return 0.0

        def job_stub(self, member: Any) -> Any:
            async def contribute_call(request: Any, timeout: float) -> Any:
                sent.append(member.id)
                return job_pb2.ContributionAck()

            return SimpleNamespace(Contribute=contribute_call)

    host = WestHost("a0", {"h0", "a0", "z0"})  # a1's new incarnation has not reached a0
    job = SimpleNamespace(job_id=JOB, microbatches=8, iterations=16, snapshot_every=4,
                          snapshot_thin=2)
    executor = SimpleNamespace(stage=1, num_stages=3, iteration=8)
    ctx = StageContext(host, job, executor, slots=2, config=WorkerConfig(retry_s=0.0),  # type: ignore[arg-type]
                       fault=None)
    ctx.participants.update(PARTICIPANTS)
    ctx.departed.add("a1")  # the cut: the job took it for dead
    assert ctx.peer("a1") is None and ctx.peer("a9") is None

    header = ContributionHeader(sender="a0", job_id=JOB, iteration=8, stage=1,
                                microbatches=(0, 1), dtype="float32", numel=4, kind=PARTIAL,
                                slice_hi=4)  # fmt: skip
    flat = torch.zeros(4)
    ctx.it.attempt = 1

    def send() -> Any:
        return asyncio.run(contribute(ctx, "a1", header, flat, 1e12, ctx.it, 1))

    assert send() is None and sent == []  # dead as far as the job knows: a new attempt follows
    ctx.departed.discard("a1")  # admitted (gwtf.node.worker.worker.StageWorker.undepart)
    assert ctx.peer("a1") is not None and host.member("a1") is None
    assert send() is not None and sent == ["a1"]
    ctx.departed.add("a1")  # it died after all, and the job confirmed it
    sent.clear()
    assert send() is None and sent == []


def test_a_node_entering_the_job_has_its_peers_retry_and_holds_nothing_for_sync() -> None:
    """Between its admission and its worker's start a re-entering node is sent gradient sums
    and microbatches: UNAVAILABLE, so they are sent again (refused for good, the sender gave
    the attempt up). Asked where it is (`Sync`), it still holds nothing of the job."""
    import asyncio

    import grpc
    import pytest
    from grpc import aio

    from gwtf.node.errors import Refusal
    from gwtf.node.jobs.calls import JobCalls
    from gwtf.node.rpc.edge import status

    async def confirmed(code: grpc.StatusCode, details: str) -> str:
        class Asked(Host):
            def known_member(self, node_id: str) -> Any:
                return None

            def stubs(self, member: Any) -> Any:
                async def sync(request: Any, timeout: float) -> Any:
                    raise aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)

                return SimpleNamespace(jobs=SimpleNamespace(Sync=sync))

        asked = Asked("h1", set(PARTICIPANTS))
        asked.config = SimpleNamespace(rpc_timeout_s=3.0)  # type: ignore[attr-defined]
        healer = Healer(asked, JobBook(), None)  # type: ignore[arg-type]
        return await healer.confirm(SimpleNamespace(id="a1"), JOB)  # type: ignore[arg-type]

    book = JobBook()
    book.records[JOB] = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING)
    book.active = CurrentJob(job=None, job_id=JOB, job_json="{}", worker=None, coordinator="h0")
    calls = JobCalls(Host("a1", set(PARTICIPANTS)), book, lambda active, outcome: None)  # type: ignore[arg-type]
    tag = SimpleNamespace(job_id=JOB)
    with pytest.raises(Refusal) as refused:
        calls.expect(tag, "activation")
    assert status(refused.value)[0] == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(Refusal) as refused:
        calls.contribution_expect(tag)
    assert status(refused.value)[0] == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(Refusal) as refused:
        calls.sync(job_pb2.SyncRequest(sender="h0", job_id=JOB))
    assert status(refused.value)[0] == grpc.StatusCode.FAILED_PRECONDITION
    # A participant that hears a stale verdict of the entering node's old incarnation asks it
    # (gwtf.node.jobs.heal): it is no dead member, which would keep its stage peers from it.
    entering = refused.value
    assert asyncio.run(confirmed(*status(entering))) == "alive"
    assert asyncio.run(confirmed(grpc.StatusCode.FAILED_PRECONDITION,
                                 "a1 does not take part in job 'job-heal'")) == "gone"
    assert asyncio.run(confirmed(grpc.StatusCode.DEADLINE_EXCEEDED, "")) == "silent"
    book.active = None  # no part of the job at all
    with pytest.raises(Refusal) as refused:
        calls.expect(tag, "activation")
    assert status(refused.value)[0] == grpc.StatusCode.FAILED_PRECONDITION


def test_a_joiner_waits_while_its_stages_replica_is_dead_only_by_a_stale_verdict() -> None:
    """At a heal z0 was declared dead by the east's stale verdict as z1 entered stage 2: with
    no live replica, z1 got z0's keeper's snapshot and the swarm rolled back without the
    replicas the coordinator could not see, which went on: the job hung. Until the death is
    confirmed (z0 is still a participant) the joiner gets no donor and asks again."""
    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    calls = Calls()
    west = {"h0": 0, "a0": 1, "z0": 2}
    host = CoordHost("h0", {"h0", "a0"}, calls)  # z0's death not confirmed yet
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h0")

    class Manager:
        def __init__(self) -> None:
            self.host = host

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

        def excluded(self, job_id: str) -> list[str]:
            return []

        def keepers_of(self, job_id: str, stage: int) -> list[str]:
            return ["a0"]

        def snapshot_iterations(self, job_id: str, stage: int) -> set[int]:
            return set()

        def changed(self, active: Any) -> None:
            pass

        def completed(self, active: Any, outcome: Any) -> None:
            pass

    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, replay_bound=0,
                          aggregation=SimpleNamespace(robust=False))
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h0")
    plan = IterationCoordinator(iterations=16, microbatches=8, participants=west, num_stages=3,
                                holders=("h0",), iteration=6, base=west)  # fmt: skip
    coord = JobCoordinator(Manager(), active, plan)  # type: ignore[arg-type]
    ask = job_pb2.EnterRequest(sender="z1", job_id=JOB, stage=2)
    reply = coord.enter(ask)
    assert list(reply.donors) == [] and not reply.rollback
    coord.came_back("z0")  # confirmed alive: it answers with its part of the job
    assert list(coord.enter(ask).donors) == ["z0"]
    coord._down("z0", "crashed")  # confirmed dead: its keeper's snapshot (rule 5)
    assert list(coord.enter(ask).donors) == ["a0"]
    for task in host.tasks:
        task.close()


def test_the_commit_waits_once_for_a_joiner_fetching_the_state_of_the_iteration() -> None:
    """Iterations as short as a state transfer (0.75 s) kept the cut side out: each joiner came
    back with the state of an iteration whose commit had begun, fetched again, and so on until
    the job ended without it. The commit now waits for a joiner given its donors, a bounded
    time and once."""
    import time

    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    calls = Calls()
    west = {"h0": 0, "a0": 1, "z0": 2}
    host = CoordHost("h0", set(west), calls)
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h0")

    class Manager:
        def __init__(self) -> None:
            self.host = host

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

        def excluded(self, job_id: str) -> list[str]:
            return []

        def changed(self, active: Any) -> None:
            pass

    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, replay_bound=0,
                          aggregation=SimpleNamespace(robust=False))
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h0")
    plan = IterationCoordinator(iterations=16, microbatches=8, participants=west, num_stages=3,
                                holders=("h0",), iteration=6, base=west)  # fmt: skip
    coord = JobCoordinator(Manager(), active, plan)  # type: ignore[arg-type]
    ask = job_pb2.EnterRequest(sender="z1", job_id=JOB, stage=2)
    assert list(coord.enter(ask).donors) == ["z0"]
    assert coord.entrance.holds_commit()
    coord._try_commit()  # nothing is finished anyway; held, it does not even ask the plan
    assert coord.entrance.holds_commit()
    back = job_pb2.EnterRequest(sender="z1", job_id=JOB, stage=2, has_state=True,
                                state_iteration=6)
    assert coord.enter(back).admitted and not coord.entrance.holds_commit()
    # Another joiner's wait ends by itself; a second ask of its gets no second wait.
    coord.enter(job_pb2.EnterRequest(sender="a1", job_id=JOB, stage=1))
    assert coord.entrance.holds_commit()
    node, (iteration, _) = next(iter(coord.entrance.fetching.items()))
    coord.entrance.fetching[node] = (iteration, time.monotonic() - 1)
    assert not coord.entrance.holds_commit()
    coord.enter(job_pb2.EnterRequest(sender="a1", job_id=JOB, stage=1))
    assert not coord.entrance.holds_commit()
    for task in host.tasks:
        task.close()


def test_a_late_sweep_of_a_death_leaves_the_node_alone_once_it_entered_again() -> None:
    """h1 died to the west at the cut; 3 s later its death was swept again (`CrashRecovery.later`),
    by then in a round where h1, admitted back, was a holder: its microbatches were dropped as
    a dead node's, its reports refused, and the commit stalled. An admitted node is a
    participant again: nothing of it is recovered."""
    import asyncio

    from gwtf.node.jobs.coordinator.coordinator import JobCoordinator

    calls = Calls()
    west = {"h0": 0, "a0": 1, "z0": 2, "h1": 0}
    host = CoordHost("h0", {"h0", "a0", "z0"}, calls)
    record = job_pb2.JobProgress(job_id=JOB, state=job_pb2.JOB_STATE_RUNNING, coordinator="h0")

    class Manager:
        def __init__(self) -> None:
            self.host = host

        def progress_record(self, job_id: str) -> job_pb2.JobProgress:
            return record

    job = SimpleNamespace(snapshot_every=4, snapshot_thin=2, replay_bound=0,
                          aggregation=SimpleNamespace(robust=False))
    active = CurrentJob(job=job, job_id=JOB, job_json="{}", worker=None,
                        participants=dict(PARTICIPANTS), coordinator="h0")
    plan = IterationCoordinator(iterations=16, microbatches=8, participants=west, num_stages=3,
                                holders=("h0", "h1"), iteration=2, base=west)  # fmt: skip
    coord = JobCoordinator(Manager(), active, plan)  # type: ignore[arg-type]
    asyncio.run(coord.recovery.recover("h1", 0))
    assert calls.sent == []  # no neighbour asked, nothing planned
