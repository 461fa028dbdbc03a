"""The recovery handler of a stage worker: this node's part when another node dies, and restarts of
a round (docs/design.md 4.2 to 4.4).

The job's coordinator asks the dead node's live neighbours for their ledgers' evidence (`report`),
plans with gwtf.recovery.plan_crash, and sends each recovery to the node that holds the
microbatch's input (`recover`): that node resends its kept activation to a replacement chosen by
its own flows, marked as a plain forward (rule 1), "recompute" (rule 2) or "replay" (rule 3); a
dead data holder's microbatch is taken up by another holder, from its own copy of the data. A
replacement that recomputes or replays asks the next-stage node to send the gradient to it instead
(`DataPlaneSender.ask_redirect`, answered by that node's `redirect`), which resends its kept
gradient if it went to the dead node already. A `restart` starts the iteration again from scratch
as a new round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from gwtf.node.dataplane.tensors import TensorError
from gwtf.node.errors import InvalidOrder, NotHeld, StaleIteration
from gwtf.node.observe import job_event
from gwtf.node.worker.commit import CommitParticipant
from gwtf.node.worker.runtime import COMMIT, ComputeRuntime
from gwtf.node.worker.sender import DataPlaneSender
from gwtf.node.worker.stage import Iteration, StageContext, Stale, WorkerStopped
from gwtf.recovery import Mode, NeighbourReport, Rule
from gwtf.train import ExecutorError
from gwtf.train.state import StateError
from gwtf.v1 import job_pb2

__all__ = ["RecoveryHandler"]


class RecoveryHandler:
    """Recoveries of dead nodes' microbatches at this node, and restarts of the iteration."""

    def __init__(
        self,
        ctx: StageContext,
        runtime: ComputeRuntime,
        sender: DataPlaneSender,
        commit: CommitParticipant,
        *,
        begin: Callable[[tuple[str, ...], Mapping[str, int] | None], None],
        own_forward: Callable[[Iteration, int], Coroutine[Any, Any, None]],
        adopted: Callable[[Iteration], None],
    ) -> None:
        """`begin`: the worker's start of the iteration's injection (holders); `own_forward`:
        its forward of a microbatch this holder builds from its data; `adopted`: this node
        adopted a dead peer's kept sum (its shipper's cue)."""
        self._ctx = ctx
        self._runtime = runtime
        self._sender = sender
        self._commit = commit
        self._begin = begin
        self._own_forward = own_forward
        self._adopted = adopted
        self._restarts: dict[
            int, tuple[int, tuple[str, ...], Mapping[str, int] | None]
        ] = {}
        self._floor = 0
        """The round of the latest rollback: every round from before it is below."""
        """Restarts ordered for an iteration this node has not reached yet."""

    # ------------------------------------------------------------------ recovery

    async def report(self, iteration: int, round_: int, dead: str
                     ) -> tuple[NeighbourReport, frozenset[int]]:
        """This node's ledger evidence about `dead` for the iteration in progress, and the
        microbatches of the running sum it keeps for `dead` (sealed from now on: the plan
        adopts this one or none, gwtf.node.worker.shipping)."""
        ctx = self._ctx
        deadline = time.monotonic() + ctx.config.rpc_timeout_s
        try:
            await ctx.reach(iteration, round_, deadline)
        except TensorError as err:
            raise StaleIteration(str(err)) from None
        ctx.it.sealed.add(dead)
        return ctx.ledger.report_about(dead), ctx.ledger.held_for(dead)

    async def keep(self, request: job_pb2.KeepRequest) -> None:
        """The coordinator's `Rule.KEEP` for a dead stage peer's running sum (docs/design.md
        4.9): the keeper adopts it in the dead node's place; a neighbour of the dead node moves
        its records of those microbatches to the keeper. Returns once done (NotHeld: this
        keeper does not hold exactly that sum, and the coordinator starts the round again)."""
        ctx = self._ctx
        it = self._check_recovery(request.iteration, request.round, 0)
        if it is None:
            return  # the iteration moved on: moot
        hops = {hop.microbatch: hop for hop in request.hops}
        if any(not 0 <= m < ctx.job.microbatches for m in hops):
            raise InvalidOrder("a keep order names a microbatch outside the job")
        me = ctx.host.node_id
        if request.keeper != me:
            for m, hop in hops.items():
                if me in (hop.upstream, hop.downstream):
                    ctx.ledger.contribution_moved(m, request.stage, request.keeper)
                if me == hop.downstream and len(it.paths.get(m, ())) > request.stage:
                    path = list(it.paths[m])
                    path[request.stage] = request.keeper
                    it.paths[m] = tuple(path)
            return
        adopting = it.adopting.get(request.dead)
        if adopting is not None:
            # The order again (a retry of the call): done once, answered as the first was.
            if set(hops) != adopting[0]:
                raise NotHeld(f"{me} adopted another sum of {request.dead}")
            await asyncio.shield(adopting[1])
            return
        held = ctx.ledger.held_for(request.dead)
        kept = it.kept_sums.get(request.dead)
        if request.stage != ctx.stage or kept is None or held != set(hops):
            raise NotHeld(f"{me} keeps no sum of {request.dead} covering exactly the "
                          f"{len(hops)} microbatches of the order")
        contribution, carried = kept
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        it.adopting[request.dead] = (frozenset(hops), done)
        del it.kept_sums[request.dead]
        try:
            await self._runtime.compute(COMMIT, lambda: ctx.executor.adopt(contribution), 0.0, it)
        except (WorkerStopped, Stale):
            done.set_result(None)  # moot: the iteration moved on
            return
        except ExecutorError as err:
            refusal = NotHeld(f"{me} cannot adopt {request.dead}'s sum: {err}")
            done.set_exception(refusal)
            done.exception()  # retrieved: a repeated order, if any, raises it again
            raise refusal from None
        if not ctx.current(it):
            done.set_result(None)
            return
        ctx.ledger.adopt(request.dead,
                         {m: hop.upstream for m, hop in hops.items() if hop.upstream},
                         {m: hop.downstream for m, hop in hops.items() if hop.downstream})
        if ctx.is_last:
            for carry in carried:
                it.losses[carry.microbatch] = carry.loss
                it.routes[carry.path] = it.routes.get(carry.path, 0) + 1
        done.set_result(None)
        ctx.metrics.count("gwtf_job_kept_sums", ctx.job_id, "adopted")
        ctx.host.log.info(
            "job %s it %d: adopted %s's running gradient sum of %d microbatches (kept here)",
            ctx.job_id, it.number, request.dead, len(hops), extra=job_event(ctx.job_id, it.number),
        )
        self._adopted(it)

    def _check_recovery(self, iteration: int, round_: int, m: int) -> Iteration | None:
        ctx = self._ctx
        it = ctx.it
        if ctx.stopped or (iteration, round_) != (it.number, it.round):
            return None
        if not 0 <= m < ctx.job.microbatches:
            raise InvalidOrder(f"no microbatch {m} in the job")
        return it

    def recover(self, request: job_pb2.RecoverRequest) -> None:
        """The coordinator's order: carry out one recovery of a dead node's microbatch."""
        ctx = self._ctx
        it = self._check_recovery(request.iteration, request.round, request.microbatch)
        if it is None:
            return  # the iteration moved on: moot
        m = request.microbatch
        rule = Rule(request.rule)
        mode = rule.mode
        if request.stage == ctx.stage == 0:
            if m in it.forwards:
                return  # recovered here already
            if not request.gradient_from:
                raise InvalidOrder("a stage-0 recovery names no downstream node")
            ctx.spawn(self._recover_holder(it, m, mode, request.gradient_from, request.dead),
                      f"recover {m}", it)
            return
        if request.stage != ctx.stage + 1:
            raise InvalidOrder(f"stage {ctx.stage} cannot recover stage {request.stage}")
        if ctx.ledger.activation_receiver(m) != request.dead:
            return  # already moved on from the dead node (a repeated order)
        kept = it.kept.get((m, "forward"))
        if kept is None:
            raise NotHeld(f"{ctx.host.node_id} keeps no activation of microbatch {m}")
        downstream = request.gradient_from if mode != Mode.FORWARD else ""
        last = request.stage == ctx.num_stages - 1
        if mode != Mode.FORWARD and not downstream and not last:
            raise InvalidOrder("a recompute or replay names no downstream node")
        if last and (downstream or mode == Mode.RECOMPUTE):
            raise InvalidOrder("the last stage is replayed whole, with no downstream node")
        ctx.spawn(
            self._sender.send_forward(it, m, kept[1], mode=mode, dead=request.dead,
                                      downstream=downstream),
            f"resend {m}", it,
        )

    async def _recover_holder(
        self, it: Iteration, m: int, mode: Mode, downstream: str, dead: str
    ) -> None:
        """Stage 0 of a dead holder's microbatch, again, here: the token ids from this holder's
        copy of the data, forward recomputed, the gradient asked from `downstream`."""
        ctx = self._ctx
        free = ctx.free  # a restart replaces it: a slot goes back where it came from
        await free.acquire()
        if not ctx.current(it) or m in it.forwards:
            free.release()
            return
        it.forwards[m] = ""
        it.paths[m] = (ctx.host.node_id,)
        it.modes[m] = mode
        it.fwd_done[m] = asyncio.Event()
        ctx.ledger.activation_sent(m, downstream)
        self._sender.rerouted += 1
        ctx.metrics.count("gwtf_job_reroutes", ctx.job_id, Rule(int(mode) + 1).name.lower())
        ctx.host.log.info(
            "job %s it %d mb %d: stage 0 of dead %s's microbatch is recovered here (%s)",
            ctx.job_id, it.number, m, dead, mode.name.lower(),
            extra=job_event(ctx.job_id, it.number, m),
        )
        ctx.spawn(self._sender.ask_redirect(it, m, downstream, mode), f"redirect {m}", it)
        await self._own_forward(it, m)

    def redirect(self, request: job_pb2.RedirectRequest) -> None:
        """A replacement of the stage above took over microbatch `m`: its gradient goes there
        (resent now if it went to the dead node already)."""
        ctx = self._ctx
        it = self._check_recovery(request.iteration, request.round, request.microbatch)
        if it is None:
            return
        m = request.microbatch
        new = request.sender
        if request.stage != ctx.stage - 1 or ctx.participants.get(new) != request.stage:
            raise InvalidOrder(f"{new[:40]!r} is not a stage-{ctx.stage - 1} node of the job")
        if request.mode not in (Mode.RECOMPUTE, Mode.REPLAY):
            raise InvalidOrder("a redirect is for a recompute or a replay")
        if m not in it.forwards or m not in it.paths:
            raise NotHeld(f"microbatch {m} never came to {ctx.host.node_id}")
        ctx.ledger.gradient_target(m, new, Mode(request.mode))
        path = list(it.paths[m])
        path[ctx.stage - 1] = new
        it.paths[m] = tuple(path)
        kept = it.kept.get((m, "backward"))
        if kept is not None:
            ctx.spawn(self._sender.send_backward(it, m, kept[1]["gradient"]), f"regrad {m}", it)

    # ------------------------------------------------------------------ restarts

    def restart(self, iteration: int, round_: int, holders: tuple[str, ...],
                weights: Mapping[str, int] | None, participants: Mapping[str, int]) -> None:
        """Start `iteration` again from scratch as `round_` (see gwtf.node.worker.worker's
        docstring)."""
        ctx = self._ctx
        ctx.participants.update(participants)
        it = ctx.it
        if (iteration, round_) <= (it.number, it.round) or round_ < self._floor:
            return  # an older order, or one from before a rollback
        if iteration > it.number:
            self._restarts[iteration] = (round_, holders, weights)
            return
        self._abandon(it, round_, holders, weights)

    def rollback(self, iteration: int, round_: int, holders: tuple[str, ...],
                 weights: Mapping[str, int] | None, participants: Mapping[str, int]) -> None:
        """Back to `iteration` as `round_`: a stage lost every replica and the swarm goes on
        from its snapshot of `iteration` (docs/design.md 4.6). This node restores its own
        snapshot of it; at that iteration already, it starts it again; one iteration behind
        (its step is on its way), it does so once it stepped. Refusal when it holds no state
        of `iteration`: the job cannot go on from there."""
        ctx = self._ctx
        ctx.participants.update(participants)
        it = ctx.it
        if round_ < self._floor:
            return  # an older rollback's order
        self._floor = round_
        if iteration == it.number + 1:
            self._restarts = {iteration: (round_, holders, weights)}
            return
        if iteration == it.number:
            self._restarts = {}
            if round_ > it.round:
                self._abandon(it, round_, holders, weights)
            return
        state = ctx.snapshots.get(iteration)
        if iteration > it.number or state is None:
            held = f"of iterations {sorted(ctx.snapshots)}" if ctx.snapshots else "none"
            raise NotHeld(
                f"{ctx.host.node_id} holds no stage-{ctx.stage} state of iteration {iteration} "
                f"(it is at {it.number}, its snapshots are {held})",
            )
        snapshot = (iteration, state)
        self._restarts = {}
        ctx.host.log.warning(
            "job %s: rollback from iteration %d to %d: stage %d restores its snapshot",
            ctx.job_id, it.number, iteration, ctx.stage, extra=job_event(ctx.job_id, iteration),
        )
        self._abandon(it, round_, holders, weights, restore=snapshot)

    async def _restore(self, state: bytes) -> None:
        """The snapshot goes back into the executor on the compute thread, at commit priority:
        before any work of the iteration it restores (queued after it) runs."""
        ctx = self._ctx
        try:
            await self._runtime.compute(COMMIT, lambda: ctx.executor.restore(state))
        except WorkerStopped:
            return
        except StateError as err:
            ctx.fail(f"{ctx.host.node_id} could not restore its stage's snapshot: {err}")

    def pending_restart(
        self, iteration: int
    ) -> tuple[int, tuple[str, ...], Mapping[str, int] | None] | None:
        """(round, holders, weights) of a restart ordered for `iteration` before this node
        reached it, taken off the list (None: none was)."""
        return self._restarts.pop(iteration, None)

    def _abandon(self, old: Iteration, round_: int, holders: tuple[str, ...],
                 weights: Mapping[str, int] | None,
                 restore: tuple[int, bytes] | None = None) -> None:
        """Forget the iteration's work and start `round_`; with `restore`, of its iteration,
        from that state of this stage (a rollback)."""
        ctx = self._ctx
        number = old.number if restore is None else restore[0]
        ctx.host.log.warning(
            "job %s iteration %d starts again as round %d", ctx.job_id, number, round_,
            extra=job_event(ctx.job_id, number),
        )
        ctx.metrics.count("gwtf_job_restarts", ctx.job_id)
        self._runtime.round_abandoned()
        for task in list(old.tasks):
            task.cancel()
        ctx.it = Iteration(number, round_)
        if restore is None:
            self._commit.forget(number + 1)
        else:
            self._commit.forget_all()
            ctx.rolled_back(number)
        ctx.ledger.reset(number)
        stale, ctx.free = ctx.free, asyncio.Semaphore(ctx.slots)
        for _ in range(ctx.slots):
            stale.release()  # wake whoever waited for a slot of the old round: it gives up
        if restore is None:
            ctx.spawn(self._runtime.compute(COMMIT, ctx.executor.abandon), "abandon")
        else:
            ctx.spawn(self._restore(restore[1]), "restore the snapshot")
        ctx.signal()
        self._begin(holders, weights)
