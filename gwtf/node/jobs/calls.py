"""JobCalls: the calls a running job's nodes make to this one, checked, and handed to the job's
coordinator or to this node's stage worker (docs/design.md 3.7, 4).

    coordinator's calls  done, replayed, prepared, committed, enter: what participants report to
                         the coordinator (`gwtf.node.jobs.coordinator.coordinator` acts on them)
    participants' calls  commit, step, report, recover, redirect, restart, sync, admit: what the
                         coordinator orders every participant (`gwtf.node.worker.worker` acts on
                         them)
    the data plane       microbatches and stage peers' contributions, for the worker

A call is refused (`Refusal`, `InvalidMessage`) when this node does not hold the role it is made
for, or when what it carries does not fit the job; a coordinator that took over is recognised
here once this node sees its predecessor dead (`_participating`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gwtf.job.iterations import (
    CommitOrder,
    CommittedReport,
    IterationOutcome,
    ReportError,
    StepOrder,
    weights_of,
)
from gwtf.job.roster import flow_to_stage, orphaned, weights_fit
from gwtf.node.errors import NotParticipant, NotReady, WrongState
from gwtf.node.jobs.book import ENTERING, OVER, CurrentJob, JobBook, state_name, stop_worker
from gwtf.node.jobs.coordinator.coordinator import JobCoordinator
from gwtf.node.jobs.host import JobsHost
from gwtf.node.rpc.codec import InvalidMessage, check_name, members_from_pb
from gwtf.v1 import job_pb2

if TYPE_CHECKING:
    from gwtf.node.worker.worker import StageWorker

__all__ = ["JobCalls"]


class JobCalls:
    """The running job's calls to this node: see the module docstring. `completed` records an
    iteration that committed (the job manager's, which spreads it)."""

    def __init__(
        self,
        host: JobsHost,
        book: JobBook,
        completed: Callable[[CurrentJob, IterationOutcome], None],
    ) -> None:
        self.host = host
        self.book = book
        self._completed = completed

    # ================================================================== this node's worker

    def _entering(self, job_id: str) -> bool:
        """Is this node entering the job (gwtf.node.jobs.joiner): admitted, or about to be, its
        worker starting as the admission's reply arrives?"""
        active = self.book.active
        return bool(
            active is not None and active.job_id == job_id and active.worker is None
            and not active.participants
            and self.book.records[job_id].state == job_pb2.JOB_STATE_RUNNING
        )

    def worker_for(self, job_id: str) -> StageWorker:
        """This node's worker of the job; FAILED_PRECONDITION if it has none or the job is
        over, UNAVAILABLE (retried) while this node enters the job: a stage peer's gradient
        sums or microbatches may come as the admission's reply is on its way (refused, the
        peer gave the commit attempt up and the round stalled, docs/design.md 4.5)."""
        if self._entering(job_id):
            raise NotReady(f"{self.host.node_id} {ENTERING} {job_id[:40]!r}")
        active = self.book.active
        if active is None or active.job_id != job_id or active.worker is None:
            raise NotParticipant(
                f"{self.host.node_id} does not take part in job {job_id[:40]!r}",
            )
        progress = self.book.records[job_id]
        if progress.state in OVER:
            raise WrongState(
                f"job {job_id} is {state_name(progress.state)} on {self.host.node_id}",
            )
        return active.worker

    def expect(self, tag: Any, name: str) -> Any:
        return self.worker_for(tag.job_id).expect(tag, name)

    async def on_tensors(self, tag: Any, tensors: Any) -> None:
        await self.worker_for(tag.job_id).on_tensors(tag, tensors)

    def screens(self, job_id: str) -> bool:
        """Does the job here screen its stage peers' sums (a robust aggregation)?"""
        active = self.book.current(job_id)
        return bool(active is not None and active.job.aggregation.robust)

    def contribution_expect(self, header: Any) -> int:
        return int(self.worker_for(header.job_id).contribution_numel(header))

    def on_contribution(self, header: Any, flat: Any) -> bool:
        return bool(self.worker_for(header.job_id).on_contribution(header, flat))

    def holder_flow(self) -> int | None:
        """The flow units out of this holder to the job's stage-1 nodes; None while the
        swarm's flows are not settled (the coordinator weights the holders' shares by them)."""
        active = self.book.active
        if active is None or not self.host.settled() or self.host.routing() == "swarm":
            return None  # SWARM has no flows: equal shares
        return flow_to_stage(self.host.routes(), active.participants, active.departed)

    def excluded_here(self, active: CurrentJob, nodes: Iterable[str]) -> None:
        """A participant hears of exclusions: nothing goes to those nodes any more; a node
        that hears of its own stops its part of the job."""
        me = self.host.node_id
        for node in nodes:
            if node not in active.participants or node in active.departed:
                continue
            active.departed.add(node)
            if node == me:
                self.host.log.warning(
                    "job %s: this node was excluded from the job by its coordinator; it takes "
                    "no further part", active.job_id,
                )
                stop_worker(self.host, active)
                continue
            if active.worker is not None:
                active.worker.exclude(node)
            if active.coord is None:
                self.host.log.info("job %s: %s is excluded from the job; nothing more goes to it",
                                   active.job_id, node)

    # ================================================================== coordinator's calls

    def _coordinating(self, job_id: str) -> tuple[CurrentJob, JobCoordinator]:
        active = self.book.active
        if (
            active is not None
            and active.job_id == job_id
            and not active.participants
            and self.book.records[job_id].state == job_pb2.JOB_STATE_PREPARING
        ):
            # Its start is still on the way here (it travels on another call): retried.
            raise NotReady(f"job {job_id} has not started here yet")
        if active is None or active.job_id != job_id or active.coord is None:
            if active is not None and active.job_id == job_id and active.taking_over:
                raise NotReady(f"{self.host.node_id} is taking over job {job_id}")
            raise NotParticipant(
                f"{self.host.node_id} does not coordinate job {job_id[:40]!r}",
            )
        if self.book.records[job_id].state != job_pb2.JOB_STATE_RUNNING:
            raise WrongState(f"job {job_id} is not running")
        return active, active.coord

    def done(self, request: job_pb2.DoneRequest) -> job_pb2.DoneReply:
        _, coord = self._coordinating(request.job_id)
        try:
            coord.done(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.DoneReply()

    def replayed(self, request: job_pb2.ReplayedRequest) -> job_pb2.ReplayedReply:
        _, coord = self._coordinating(request.job_id)
        try:
            coord.replayed(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.ReplayedReply()

    def prepared(self, request: job_pb2.PreparedRequest) -> job_pb2.PreparedReply:
        _, coord = self._coordinating(request.job_id)
        for entry in request.losses:
            if not math.isfinite(entry.loss):
                raise InvalidMessage(f"{request.sender[:40]!r} sent an invalid loss")
        try:
            coord.prepared(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        return job_pb2.PreparedReply()

    def committed(self, request: job_pb2.CommittedRequest) -> job_pb2.CommittedReply:
        active, coord = self._coordinating(request.job_id)
        report = CommittedReport(
            sender=request.sender,
            iteration=request.iteration,
            stage=request.stage,
            checksum=request.checksum,
            digests={d.name: d.digest for d in request.digests},
            snapshots_landed=tuple(request.snapshots_landed),
            snapshot_lacking=(request.snapshot_lacking if request.HasField("snapshot_lacking")
                              else None),
        )
        try:
            outcomes = coord.committed(report)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None
        for outcome in outcomes:
            self._completed(active, outcome)
        return job_pb2.CommittedReply()

    def enter(self, request: job_pb2.EnterRequest) -> job_pb2.EnterReply:
        check_name("sender", request.sender)
        _, coord = self._coordinating(request.job_id)
        try:
            return coord.enter(request)
        except ReportError as err:
            raise InvalidMessage(str(err)) from None

    # ================================================================== participants' calls

    def _participating(self, job_id: str, sender: str) -> tuple[CurrentJob, StageWorker]:
        """This node's worker for a call from the job's coordinator (a new coordinator that
        took over is recognised once this node sees its predecessor dead)."""
        if self._entering(job_id):
            # Entering the job (gwtf.node.jobs.joiner): admitted, its worker starts as the
            # admission's reply arrives. A restart ordered meanwhile (a heal's restarts come
            # with the stale side's entries) is retried rather than lost, which would leave this
            # node in an older round and the iteration stalled (docs/design.md 4.5).
            raise NotReady(f"{self.host.node_id} {ENTERING} {job_id[:40]!r}")
        worker = self.worker_for(job_id)
        active = self.book.active
        assert active is not None
        if sender != active.coordinator:
            if active.participants.get(sender) != 0:
                member = self.host.member(sender)
                orphan = orphaned(active.participants, active.departed,
                                  lambda p: self.host.member(p) is not None)
                if not (orphan and member is not None and member.stage == 0):
                    raise InvalidMessage(f"{sender[:40]!r} does not coordinate the job")
                # Every holder had died: a stage-0 joiner took the job over
                # (gwtf.node.jobs.joiner.Joiner._adopt).
                active.participants[sender] = 0
                active.departed.discard(sender)
                worker.undepart(sender)
                worker.admit({sender: 0})
            elif self.host.member(active.coordinator) is not None and (
                sender > active.coordinator
            ):
                raise NotReady(
                    f"{self.host.node_id} still sees {active.coordinator} coordinate the job",
                )
            active.coordinator = sender
        return active, worker

    def commit(self, request: job_pb2.CommitRequest) -> job_pb2.CommitReply:
        verdicts = members_from_pb(request.departed, self.host.num_stages())
        if any(info.alive for info in verdicts):
            raise InvalidMessage("the commit names a departed participant that is alive")
        _, worker = self._participating(request.job_id, request.sender)
        # The coordinator left these out of the attempt because they died or left: hear of
        # it before acting on the attempt, as the coordinator did
        # (gwtf.node.control.membercontrol.MembershipControl.on_events).
        self.book.vouched = {info.id for info in verdicts}
        try:
            self.host.hear_verdicts(verdicts)
        finally:
            self.book.vouched = set()
        job = self.book.active.job if self.book.active is not None else None
        assert job is not None
        ids = tuple(request.microbatches)
        if any(m >= job.microbatches for m in ids) or len(set(ids)) != len(ids):
            raise InvalidMessage("the commit names microbatches outside the job's, or twice")
        if request.iteration >= job.iterations:
            raise InvalidMessage(f"iteration {request.iteration} is past the job's last")
        members = {p.id: p.stage for p in request.members}
        active = self.book.active
        assert active is not None
        self.excluded_here(active, request.excluded)
        if self.book.active is None or self.book.active.worker is not worker:
            return job_pb2.CommitReply()  # this node was the one excluded
        worker.order_commit(CommitOrder(
            request.iteration, ids, request.final, tuple(request.next_holders), request.round,
            request.attempt, members,
        ))
        return job_pb2.CommitReply()

    def step(self, request: job_pb2.StepRequest) -> job_pb2.StepReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        if any(participants.get(h) != 0 for h in request.next_holders):
            raise InvalidMessage("the step names next holders that are not data holders")
        if not weights_fit(request.next_holders, request.next_weights):
            raise InvalidMessage("the step's weights do not match its holders")
        active.participants.update(participants)
        active.base = set(participants)  # the voters of the next commit (gwtf.job.quorum)
        self.excluded_here(active, request.excluded)
        if active.worker is not worker:
            return job_pb2.StepReply()  # this node was the one excluded
        move = request.move if request.HasField("move") else None
        if move is not None:
            self._moving(active, worker, request, move)
        worker.step(StepOrder(
            iteration=request.iteration, round=request.round, attempt=request.attempt,
            final=request.final, next_holders=tuple(request.next_holders),
            participants=participants, loss=request.loss, trained=request.trained,
            dropped=tuple(request.dropped), next_weights=tuple(request.next_weights),
            next_round=request.next_round,
            mover=move.node if move is not None else "",
            mover_from=move.from_stage if move is not None else -1,
            move_to=move.stage if move is not None else -1,
            periodic=request.periodic, floor=request.floor,
        ))
        return job_pb2.StepReply()

    def _moving(self, active: CurrentJob, worker: Any, request: job_pb2.StepRequest,
                move: job_pb2.Move) -> None:
        """The step moves `move.node` to another stage (docs/design.md 2.11,
        gwtf.node.jobs.coordinator.moves): it steps this iteration with the others and takes no part
        in the next one. Its peers count it departed now, so that no microbatch of the next
        iteration goes to it and its leave is no crash to recover; the mover itself leaves once it
        stepped."""
        check_name("mover", move.node)
        if move.node in {p.id for p in request.participants} or move.iteration != request.iteration:
            raise InvalidMessage("the step's move names a participant of the next iteration")
        if move.node == self.host.node_id:
            if move.from_stage != worker.stage or not 0 <= move.stage < self.host.num_stages():
                raise InvalidMessage(f"the step moves this node from stage {move.from_stage} "
                                     f"to {move.stage}, but it holds stage {worker.stage}")
            active.moving = move
            return
        active.departed.add(move.node)
        worker.depart(move.node)

    async def report(self, request: job_pb2.ReportRequest) -> job_pb2.ReportReply:
        _, worker = self._participating(request.job_id, request.sender)
        report, kept = await worker.report(request.iteration, request.round, request.dead)
        return job_pb2.ReportReply(
            node=report.node, stage=report.stage,
            evidence=[job_pb2.EvidenceEntry(microbatch=m, evidence=int(e))
                      for m, e in report.evidence],
            kept=sorted(kept),
        )

    async def keep(self, request: job_pb2.KeepRequest) -> job_pb2.KeepReply:
        _, worker = self._participating(request.job_id, request.sender)
        check_name("keeper", request.keeper)
        check_name("dead", request.dead)
        await worker.keep(request)
        return job_pb2.KeepReply()

    def recover(self, request: job_pb2.RecoverRequest) -> job_pb2.RecoverReply:
        _, worker = self._participating(request.job_id, request.sender)
        if request.rule not in (1, 2, 3):
            raise InvalidMessage(f"recovery rule {request.rule} is not 1, 2 or 3")
        worker.recover(request)
        return job_pb2.RecoverReply()

    def redirect(self, request: job_pb2.RedirectRequest) -> job_pb2.RedirectReply:
        self.worker_for(request.job_id).redirect(request)
        return job_pb2.RedirectReply()

    def restart(self, request: job_pb2.RestartRequest) -> job_pb2.RestartReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        active.participants.update(participants)
        weights = tuple(request.weights)
        if not weights_fit(request.holders, weights):
            raise InvalidMessage("the restart's weights do not match its holders")
        if request.rollback:
            # A stage lost every replica: back to its snapshot's iteration (docs/design.md 4.6).
            worker.rollback(request.iteration, request.round, tuple(request.holders),
                            weights_of(tuple(request.holders), weights), participants)
        else:
            worker.restart(request.iteration, request.round, tuple(request.holders),
                           weights_of(tuple(request.holders), weights), participants)
        return job_pb2.RestartReply()

    def sync(self, request: job_pb2.SyncRequest) -> job_pb2.SyncReply:
        if self._entering(request.job_id):
            # It holds nothing of the job yet (FAILED_PRECONDITION: the quorum reads it so),
            # but it is no dead participant (gwtf.node.jobs.heal.Healer.confirm).
            raise NotParticipant(f"{self.host.node_id} {ENTERING} {request.job_id[:40]!r}")
        worker = self.worker_for(request.job_id)
        reply = worker.sync()
        if self.book.active is not None:
            reply.coordinator = self.book.active.coordinator
        return reply

    def admit(self, request: job_pb2.AdmitRequest) -> job_pb2.AdmitReply:
        active, worker = self._participating(request.job_id, request.sender)
        participants = {p.id: p.stage for p in request.participants}
        for node in participants:
            check_name("participant id", node)
            active.departed.discard(node)
            worker.undepart(node)
        active.participants.update(participants)
        worker.admit(participants)
        return job_pb2.AdmitReply()
