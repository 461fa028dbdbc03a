"""CrashRecovery: the coordinator's recovery of a dead participant's work (docs/design.md 4.2 to
4.4 and 4.9), with I/O; the rules are pure (`IterationCoordinator.plan_recovery`,
`gwtf.recovery.plan_crash`).

- The live neighbours of the dead node are asked for their ledgers' evidence (`Report`), and,
  where the job ships running sums (bounded replay, gwtf.node.worker.shipping), its live stage peers
  for what they keep of its sum; a neighbour that does not answer is asked again, and the round
  starts over if it stays silent (a plan without its evidence could redo what it holds).
- The plan's drops are recorded in the job's progress; each recovery goes to the node that
  holds the microbatch's input (`Recover`): for a dead data holder, to a live holder, which
  rebuilds the token ids from its own copy of the data.
- A kept sum (`Rule.KEEP`) goes as one `Keep` order to its keeper, which adopts it in the dead
  node's place, and to the dead node's live neighbours, which move their records of those
  microbatches to the keeper. The commit waits for it like a replay (the plan counts it until
  the keeper is done): a commit prepared before would lack the sum. A keeper that cannot adopt
  exactly the sum it reported starts the round again.
- A sweep plans the same death again once every node must have heard of it (`later`): what was
  sent to the dead node meanwhile is recovered too; what was planned before is left alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from gwtf.node.jobs.coordinator.entrance import Coordinating, CoordinatorManager
from gwtf.node.observe import job_event
from gwtf.recovery import Evidence, NeighbourReport, Recovery, Rule, replay_bound
from gwtf.v1 import job_pb2

__all__ = ["REPORT_TRIES", "CrashRecovery", "Recovering"]

REPORT_TRIES = 4
"""Times the live neighbours of a dead node are asked for their evidence before the iteration
starts over instead."""

Reply = tuple[NeighbourReport, frozenset[int]]


class RecoveryManager(CoordinatorManager, Protocol):
    """The job manager's own part of a recovery (this node is a participant too)."""

    async def report(self, request: job_pb2.ReportRequest) -> job_pb2.ReportReply: ...

    def recover(self, request: job_pb2.RecoverRequest) -> job_pb2.RecoverReply: ...

    async def keep(self, request: job_pb2.KeepRequest) -> job_pb2.KeepReply: ...


class Recovering(Coordinating, Protocol):
    """The job coordinator (gwtf.node.jobs.coordinator.coordinator.JobCoordinator) as its recovery
    uses it."""

    @property
    def manager(self) -> RecoveryManager: ...


class CrashRecovery:
    """The coordinator's side of crash recovery (module doc)."""

    def __init__(
        self,
        coord: Recovering,
        *,
        stopped: Callable[[], bool],
        restart: Callable[[str], None],
        try_commit: Callable[[], None],
    ) -> None:
        """`stopped`: the coordinator stopped; `restart(reason)`: start the round again;
        `try_commit`: order the commit if the iteration may commit now."""
        self.coord = coord
        self._stopped = stopped
        self._restart = restart
        self._try_commit = try_commit

    async def later(self, dead: str, stage: int) -> None:
        """Plan `dead` again once every node must have heard of its death (the failure
        timeout): what they sent it meanwhile (in this round or the next one) is recovered
        too."""
        await asyncio.sleep(self.coord.host.config.failure_timeout_s)
        await self.recover(dead, stage)

    async def _report_from(self, node: str, iteration: int, round_: int, dead: str
                           ) -> Reply | None:
        coord = self.coord
        request = job_pb2.ReportRequest(
            sender=coord.host.node_id, job_id=coord.job_id, iteration=iteration, round=round_,
            dead=dead,
        )
        reply = await coord.call_to(
            node,
            lambda stubs, t: stubs.jobs.Report(request, timeout=t),
            lambda: coord.manager.report(request),
            attempts=3,
        )
        if not isinstance(reply, job_pb2.ReportReply):
            return None
        return NeighbourReport(
            reply.node, reply.stage,
            tuple((e.microbatch, Evidence(min(e.evidence, 2))) for e in reply.evidence),
        ), frozenset(reply.kept)

    def _ships(self) -> bool:
        job = self.coord.job
        return replay_bound(job.replay_bound, job.aggregation.robust) != 0

    async def recover(self, dead: str, stage: int, tries: int = REPORT_TRIES) -> None:
        """Plan the recovery of `dead`'s microbatches of the round in progress and carry it out
        (again for a sweep: what was planned already is left alone)."""
        coord = self.coord
        plan = coord.plan
        iteration, round_ = plan.injecting, plan.round
        if iteration >= plan.iterations or self._stopped():
            return
        if dead in plan.participants:
            # It entered the job again (the stale side of a healed partition, admitted): its
            # work of this round is its own, not a dead node's (a later sweep of its death
            # dropped the microbatches it held as a holder of the new round, and it stalled).
            return
        stages = (stage - 1, stage, stage + 1) if self._ships() else (stage - 1, stage + 1)
        asked = sorted(p for p, s in coord.live_participants().items()
                       if s in stages and p != dead)
        replies = await asyncio.gather(
            *(self._report_from(n, iteration, round_, dead) for n in asked)
        )
        if (plan.injecting, plan.round) != (iteration, round_) or self._stopped() or (
            dead in plan.participants
        ):
            return  # the iteration moved on meanwhile (or it entered again): nothing to recover
        silent = [n for n, r in zip(asked, replies, strict=True)
                  if r is None and n in coord.live_participants()
                  and coord.plan.participants.get(n) != stage]
        if silent:
            # A plan without a live neighbour's evidence could redo what it holds (a resend
            # where a recompute is due): ask again, and start over if it stays silent.
            if tries > 1:
                await asyncio.sleep(coord.host.config.evidence_retry_s)
                await self.recover(dead, stage, tries - 1)
            else:
                self._restart(f"{silent[0]} did not report what it holds of {dead}'s work")
            return
        answered = [r for r in replies if r is not None]
        reports = [report for report, _ in answered if report.stage != stage]
        kept = {report.node: ids for report, ids in answered if report.stage == stage and ids}
        orders = plan.plan_recovery(dead, stage, reports, kept)
        fresh = orders.plan
        if not fresh.recoveries and not fresh.dropped:
            return
        progress = coord.progress()
        keeps = [r for r in fresh.recoveries if r.rule == Rule.KEEP]
        progress.rerouted_microbatches += len(fresh.recoveries) - len(keeps)
        progress.replayed_microbatches += fresh.count(Rule.RECOMPUTE) + fresh.count(Rule.REPLAY)
        if fresh.dropped:
            self._record_drops(iteration, fresh.dropped)
        coord.host.log.warning(
            "job %s iteration %d: recovery of %s (stage %d): %d resent, %d recomputed, "
            "%d replayed, %d kept at a stage peer, %d dropped (from %d neighbour reports)",
            coord.job_id, iteration, dead, stage, fresh.count(Rule.RESEND),
            fresh.count(Rule.RECOMPUTE), fresh.count(Rule.REPLAY), len(keeps),
            len(fresh.dropped), len(reports), extra=job_event(coord.job_id, iteration),
        )
        coord.manager.changed(coord.active)
        if keeps:
            coord.spawn(self._keep(keeps, dead, stage, iteration, round_), f"keep {dead}")
        for recovery, source in zip(fresh.recoveries, orders.sources, strict=False):
            if recovery.rule != Rule.KEEP:
                coord.spawn(self._dispatch(recovery, dead, source, iteration, round_),
                            f"dispatch {recovery.mb}")
        if orders.restart:
            self._restart(orders.restart)
            return
        self._try_commit()

    def _record_drops(self, iteration: int, dropped: frozenset[int]) -> None:
        progress = self.coord.progress()
        for entry in progress.dropped:
            if entry.iteration == iteration:
                entry.microbatches.extend(sorted(dropped))
                break
        else:
            progress.dropped.append(
                job_pb2.IterationMicrobatches(iteration=iteration, microbatches=sorted(dropped))
            )
        progress.dropped_microbatches += len(dropped)

    async def _dispatch(self, recovery: Recovery, dead: str, source: str, iteration: int,
                        round_: int) -> None:
        coord = self.coord
        request = job_pb2.RecoverRequest(
            sender=coord.host.node_id, job_id=coord.job_id, iteration=iteration, round=round_,
            microbatch=recovery.mb, stage=recovery.stage, rule=int(recovery.rule), dead=dead,
            gradient_from=recovery.gradient_from or "",
        )
        took = await coord.call_to(
            source,
            lambda stubs, t: stubs.jobs.Recover(request, timeout=t),
            lambda: coord.manager.recover(request),
        )
        if took is None and (coord.plan.injecting, coord.plan.round) == (iteration, round_):
            self._restart(f"{source} could not recover microbatch {recovery.mb} of {dead}")

    async def _keep(self, keeps: Sequence[Recovery], dead: str, stage: int, iteration: int,
                    round_: int) -> None:
        """One `Keep` order to the keeper and to each live neighbour it names (module doc)."""
        coord = self.coord
        keeper = keeps[0].keeper
        assert keeper is not None
        request = job_pb2.KeepRequest(
            sender=coord.host.node_id, job_id=coord.job_id, iteration=iteration, round=round_,
            dead=dead, stage=stage, keeper=keeper,
            hops=[job_pb2.KeptHop(
                microbatch=r.mb, upstream=(r.activation_from or "") if stage else "",
                downstream=r.gradient_from or "",
            ) for r in keeps],
        )
        named = {n for r in keeps for n in (r.activation_from, r.gradient_from) if n}
        targets = sorted(named - {dead, keeper}) + [keeper]
        took = await asyncio.gather(*(coord.call_to(
            node,
            lambda stubs, t: stubs.jobs.Keep(request, timeout=t),
            lambda: coord.manager.keep(request),
        ) for node in targets))
        plan = coord.plan
        if (plan.injecting, plan.round) != (iteration, round_) or self._stopped():
            return
        live = coord.live_participants()
        failed = [n for n, ok in zip(targets, took, strict=True) if ok is None and n in live]
        if failed:
            self._restart(f"{failed[0]} could not take the keep order of {dead}'s gradient sum "
                          f"kept at {keeper}")
            return
        if keeper not in live:
            return  # it died too: its own recovery replays what it had adopted
        for r in keeps:
            plan.replayed(keeper, iteration, round_, r.mb, stage)
        coord.progress().kept_microbatches += len(keeps)
        coord.manager.changed(coord.active)
        self._try_commit()
