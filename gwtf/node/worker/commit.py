"""The commit participant of a stage worker: the two phases of an iteration's commit at one replica
(docs/design.md 3.7, 4.3 and 4.7).

Phase one (`order_commit`): the node and the other members of its stage named in the order add
up their gradient sums, each member then holding the stage's whole sum, and it reports
`prepared`. The exchange is the one gwtf.job.exchange chooses from the sum's size, the members
and the link matrix, alike at every member: all to all (each sends its whole sum to every peer,
gwtf.node.dataplane.gradsync; one leg, for sums small enough that latency dominates), or
reduce-scatter and all-gather (gwtf.node.worker.allreduce, gwtf.node.worker.slices; two legs, fewer
bytes). With a robust aggregation always all to all: the node screens the sums and names the
out-of-bounds peers. Phase two (`step`): once every member is prepared, the node divides the sum
exactly as `combine_contributions` would (or combines by the job's robust rule), steps AdamW, and
reports its stage checksum at once. The step order declares whether the boundary after it is a
periodic snapshot and names the floor (docs/design.md 4.6); the stage's snapshot sender streams the
new state to its keepers in the background and reports the periodic ones that landed with its next
step. A member that dies in phase one voids the attempt and the coordinator orders another; a
reduce-scatter and all-gather then moves only what this one did not deliver.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from gwtf.job.exchange import WHOLE as ALL_TO_ALL
from gwtf.job.exchange import Link, choose
from gwtf.job.iterations import CommitOrder, CommittedReport, PreparedReport, StepOrder
from gwtf.job.snapshots import snapshot_sender
from gwtf.node.dataplane.gradsync import (
    KEPT,
    PARTIAL,
    REDUCED,
    WHOLE,
    ContributionError,
    ContributionHeader,
    flatten,
    unflatten,
)
from gwtf.node.dataplane.tensors import TensorError
from gwtf.node.errors import NotReady, Refusal, StaleIteration
from gwtf.node.worker.allreduce import SliceExchange, contribute, poisoned
from gwtf.node.worker.runtime import COMMIT, ComputeRuntime
from gwtf.node.worker.slices import Summed
from gwtf.node.worker.stage import (
    Iteration,
    LastStep,
    StageContext,
    Stale,
    WorkerStopped,
)
from gwtf.train import ContributionError as CombineError
from gwtf.train import ExecutorError, GradContribution, combine_contributions, combine_summed
from gwtf.train.robust import aggregate, norm_outliers

__all__ = ["CommitParticipant"]


class CommitParticipant:
    """This replica's part in its stage's commits: the peers' sums, preparing and stepping."""

    def __init__(
        self, ctx: StageContext, runtime: ComputeRuntime, advance: Callable[[StepOrder], None]
    ) -> None:
        """`advance`: the worker's move to the next iteration once this node stepped."""
        self._ctx = ctx
        self._runtime = runtime
        self._advance = advance
        executor = ctx.executor
        self._shapes = {name: tuple(p.shape) for name, p in executor.parameters().items()}
        self._numel = sum(p.numel() for p in executor.parameters().values())
        self._grad_dtype = torch.float64 if ctx.job.grad_accum == "float64" else torch.float32
        self._sums: dict[tuple[int, int, int], dict[str, GradContribution]] = {}
        """(iteration, round, attempt) -> the stage peers' whole gradient sums for that attempt
        (the all-to-all exchange)."""
        self._exchange = SliceExchange(ctx, runtime, self._shapes, self._grad_dtype)
        """The reduce-scatter and all-gather."""
        self.last_step: LastStep | None = None

    def forget(self, before: int) -> None:
        """Drop the peers' sums of iterations before `before` (stepped, or started over)."""
        self._sums = {k: v for k, v in self._sums.items() if k[0] >= before}
        self._exchange.forget(before)

    def forget_all(self) -> None:
        """Drop every peer's sums (a rollback: they are of iterations that are undone)."""
        self._sums = {}
        self._exchange.forget_all()

    # ------------------------------------------------------------------ the peers' sums

    def contribution_numel(self, header: ContributionHeader) -> int:
        """Checks a peer's contribution header; the number of values it must carry."""
        ctx = self._ctx
        if not ctx.started.is_set():
            # The start and the first commit travel on different calls: the sender retries.
            raise NotReady(f"job {ctx.job_id} has not started here")
        if header.job_id != ctx.job_id:
            raise ContributionError(f"the contribution is for job {header.job_id[:40]!r}")
        if (
            ctx.participants.get(header.sender) != ctx.stage
            or header.stage != ctx.stage
            or header.sender == ctx.host.node_id
            or header.sender in ctx.excluded
        ):
            raise ContributionError(
                f"{header.sender[:40]!r} is not a stage-{ctx.stage} replica of job {ctx.job_id}"
            )
        if header.dtype != ctx.job.grad_accum:
            raise ContributionError(
                f"gradient sums must be {ctx.job.grad_accum}, not {header.dtype}"
            )
        if not ctx.it.number <= header.iteration <= ctx.it.number + 1:
            raise ContributionError(
                f"a contribution for iteration {header.iteration} cannot be used at "
                f"iteration {ctx.it.number}"
            )
        if any(not 0 <= mb < ctx.job.microbatches for mb in header.microbatches):
            raise ContributionError("the contribution names microbatches outside the job's")
        # Whole vectors for a robust rule (its screen needs them); either kind for every other
        # (gwtf.job.exchange chooses per attempt).
        if ctx.job.aggregation.robust and header.kind != WHOLE:
            raise ContributionError(
                f"job {ctx.job_id} exchanges whole vectors, not a {header.kind} contribution"
            )
        if header.kind == KEPT:
            at, sent = (ctx.it.number, ctx.it.round), (header.iteration, header.round)
            if sent != at:
                # Ahead: this node has not stepped (or restarted) yet, the sender retries.
                refusal = NotReady if sent > at else StaleIteration
                raise refusal(
                    f"a kept sum of iteration {header.iteration} round {header.round} came at "
                    f"iteration {ctx.it.number} round {ctx.it.round}"
                )
            if header.sender in ctx.it.sealed:
                raise ContributionError(
                    f"{header.sender[:40]!r} was reported dead here; its kept sum is sealed"
                )
        if header.kind in (WHOLE, KEPT):
            return self._numel
        lo, hi, start, end = header.slice_lo, header.slice_hi, header.offset, header.offset
        end += header.numel
        if not 0 <= lo <= hi <= self._numel:
            raise ContributionError(f"slice [{lo}, {hi}) is outside the {self._numel} values")
        if header.kind == PARTIAL and not lo <= start <= end <= hi:
            raise ContributionError(f"values [{start}, {end}) are outside slice [{lo}, {hi})")
        if header.kind == REDUCED and (start != lo or header.numel not in (0, hi - lo)):
            raise ContributionError(f"a reduced slice [{lo}, {hi}) carries [{start}, {end})")
        return header.numel

    def on_contribution(self, header: ContributionHeader, flat: Tensor) -> bool:
        """A stage peer's gradient sums for an attempt of this iteration's commit (or the
        next iteration's): whether this node now holds all the stream declared (the ack's
        `complete`, gwtf.node.worker.slices)."""
        ctx = self._ctx
        self.contribution_numel(header)
        if header.kind == KEPT:
            ctx.metrics.count("gwtf_job_kept_sums", ctx.job_id, "kept")
            ctx.metrics.count("gwtf_job_bytes_received", ctx.job_id, "kept_sums",
                              flat.numel() * flat.element_size())
            ctx.it.kept_sums[header.sender] = (GradContribution(
                node_id=header.sender, stage=ctx.stage, iteration=header.iteration,
                microbatch_ids=header.microbatches, grad_sums=unflatten(flat, self._shapes),
            ), header.hops)
            ctx.ledger.kept(header.sender, header.microbatches, {
                hop.microbatch: (hop.upstream or None, hop.downstream or None)
                for hop in header.hops
            })
            return True
        if header.kind != WHOLE:
            ctx.metrics.count("gwtf_job_bytes_received", ctx.job_id, "gradient_sums",
                              flat.numel() * flat.element_size())
            complete = self._exchange.on_slice(header, flat)
            ctx.signal()
            return complete
        store = self._sums.setdefault((header.iteration, header.round, header.attempt), {})
        if header.sender in store:
            raise ContributionError(
                f"{header.sender} sent two contributions for iteration {header.iteration} "
                f"attempt {header.attempt}"
            )
        ctx.metrics.count("gwtf_job_bytes_received", ctx.job_id, "gradient_sums",
                          flat.numel() * flat.element_size())
        store[header.sender] = GradContribution(
            node_id=header.sender,
            stage=ctx.stage,
            iteration=header.iteration,
            microbatch_ids=header.microbatches,
            grad_sums=unflatten(flat, self._shapes) if header.microbatches else {},
        )
        ctx.signal()
        return True

    # ------------------------------------------------------------------ phase one

    def order_commit(self, order: CommitOrder) -> None:
        """Phase one of an attempt of the coordinator's commit (a repeated one is ignored)."""
        if self._ctx.stopped:
            return
        self._ctx.spawn(self._prepare(order), f"prepare {order.iteration}/{order.attempt}")

    async def _prepare(self, order: CommitOrder) -> None:
        ctx = self._ctx
        began = time.monotonic()
        deadline = began + ctx.config.commit_timeout_s
        try:
            await asyncio.wait_for(ctx.started.wait(), ctx.config.commit_timeout_s)
            await ctx.reach(order.iteration, order.round, deadline)
        except (TimeoutError, TensorError, Refusal):
            return  # over, or never reached: the coordinator orders another attempt
        it = ctx.it
        if order.attempt <= it.attempt:
            return
        it.attempt = order.attempt
        it.prepared = None
        me = ctx.host.node_id
        try:
            mine = await self._runtime.compute(
                COMMIT, lambda: ctx.executor.contribution(me), 0.0, it
            )
        except (WorkerStopped, Stale):
            return
        if set(mine.microbatch_ids) != set(ctx.ledger.contributions()):
            ctx.fail(
                f"{me}'s gradient sums hold microbatches {sorted(mine.microbatch_ids)[:8]} but its "
                f"ledger says {sorted(ctx.ledger.contributions())[:8]}"
            )
            return
        names = sorted(self._shapes)
        flat = flatten(mine.grad_sums, names, self._grad_dtype)
        header = ContributionHeader(
            sender=me,
            job_id=ctx.job_id,
            iteration=it.number,
            stage=ctx.stage,
            microbatches=mine.microbatch_ids,
            dtype=ctx.job.grad_accum,
            numel=flat.numel(),
            round=it.round,
            attempt=order.attempt,
        )
        rule = ctx.job.aggregation
        outliers: tuple[str, ...] = ()
        held: list[GradContribution] | Summed | None
        members = sorted(p for p, s in order.members.items() if s == ctx.stage)
        if self.exchange_kind(members, flat.numel() * flat.element_size()) == ALL_TO_ALL:
            held = await self._exchange_whole(order, it, mine, header, flat, deadline)
            if held is None:
                return
        else:
            held = await self._exchange.run(order, it, header, flat, deadline)
            if held is None:
                return
        if rule.robust:
            # The screen (4.7) and the robust rules need every replica's whole vector.
            assert isinstance(held, list)
            screened = held
            try:
                outliers = tuple(await self._runtime.compute(
                    COMMIT, lambda: norm_outliers(screened, rule.norm_factor), 0.0, it))
            except (WorkerStopped, Stale):
                return
            if outliers:
                ctx.host.log.warning(
                    "job %s iteration %d attempt %d: stage %d screen names %s out of bounds "
                    "(gradient norm above %g times the median, or not finite)", ctx.job_id,
                    it.number, order.attempt, ctx.stage, ", ".join(outliers), rule.norm_factor,
                )
        it.prepared = (order, held)
        compute_s, replayed_s = self._runtime.compute_delta()
        ctx.metrics.observe("gwtf_job_commit_seconds", ctx.job_id, time.monotonic() - began,
                            "prepare")
        ctx.host.report_prepared(ctx.job_id, PreparedReport(
            sender=me,
            iteration=it.number,
            round=it.round,
            attempt=order.attempt,
            stage=ctx.stage,
            contributed=ctx.ledger.contributions(),
            losses=dict(it.losses),
            routes=dict(it.routes),
            compute_s=compute_s,
            replayed_s=replayed_s,
            outliers=frozenset(outliers),
        ))

    def exchange_kind(self, members: list[str], sum_bytes: int) -> str:
        """The exchange the stage's `members` of an attempt use (gwtf.job.exchange), from what
        each of them knows alike: the sum's size, the members, the link matrix and the uplinks
        the members declared in their records (`--uplink-mbps`)."""
        host = self._ctx.host
        infos = {m: host.member(m) for m in members}

        def link(a: str, b: str) -> Link | None:
            ia, ib = infos[a], infos[b]
            spec = host.link(ia, ib) if ia is not None and ib is not None else None
            return None if spec is None else (spec.rtt_ms / 2000, spec.bandwidth_gbps)

        uplinks = {m: info.uplink_gbps for m, info in infos.items()
                   if info is not None and info.uplink_gbps > 0}
        return choose(sum_bytes, members, link, uplinks,
                      robust=self._ctx.job.aggregation.robust)

    async def _exchange_whole(
        self, order: CommitOrder, it: Iteration, mine: GradContribution,
        header: ContributionHeader, flat: Tensor, deadline: float,
    ) -> list[GradContribution] | None:
        """All to all: this node's whole vector to every stage peer, theirs here; the sums of
        the attempt's members, this node's first (None: the attempt is over here)."""
        ctx = self._ctx
        me = ctx.host.node_id
        peers = sorted(p for p, s in order.members.items() if s == ctx.stage and p != me)
        sent = poisoned(ctx, flat, it.number) if peers else flat
        for index, peer in enumerate(peers):
            if index == 1:
                ctx.hit("aggregation", it.number)
            ack = await contribute(ctx, peer, header, sent, deadline, it, order.attempt)
            if ack is None:
                return None
        if len(peers) == 1:
            ctx.hit("aggregation", it.number)
        key = (it.number, it.round, order.attempt)
        while not set(peers) <= set(self._sums.get(key, {})):
            if not ctx.current(it) or it.attempt != order.attempt:
                return None
            if any(ctx.peer(p) is None for p in peers):
                return None  # a member died: the coordinator voids the attempt, orders another
            try:
                await ctx.wait_change(deadline)
            except TimeoutError:
                return None
        got = self._sums.get(key, {})
        return [mine, *(got[p] for p in peers)]

    # ------------------------------------------------------------------ phase two

    def step(self, order: StepOrder) -> None:
        """Phase two: every member is prepared, step."""
        ctx = self._ctx
        it = ctx.it
        if (order.iteration, order.round) != (it.number, it.round) or ctx.stopped:
            return  # a repeated order
        prepared = it.prepared
        if prepared is None or prepared[0].attempt != order.attempt:
            raise StaleIteration(
                f"{ctx.host.node_id} is not prepared for attempt {order.attempt} of iteration "
                f"{order.iteration}",
            )
        ctx.spawn(self._step(it, order, prepared[0], prepared[1]), f"step {order.iteration}")

    async def _step(
        self, it: Iteration, order: StepOrder, commit: CommitOrder,
        contributions: list[GradContribution] | Summed,
    ) -> None:
        ctx = self._ctx
        executor = ctx.executor
        began = time.monotonic()
        expected = commit.microbatches
        me = ctx.host.node_id
        boundary = order.iteration + 1
        ctx.declare(boundary if order.periodic else None, order.floor)
        keep, send = self._snapshot_plan(order.participants, boundary, order.final)

        rule = ctx.job.aggregation
        noise = ctx.fault.weight_noise(order.iteration) if ctx.fault is not None else None

        def step() -> tuple[str, dict[str, str], bytes | None]:
            if isinstance(contributions, Summed):
                aggregated = combine_summed(
                    ctx.stage, commit.iteration, contributions.parts, contributions.sums,
                    expected_ids=expected,
                )
            elif rule.robust:
                aggregated = aggregate(
                    contributions, rule.rule, expected_ids=expected, trim=rule.trim,
                    clip_iterations=rule.clip_iterations,
                )
            else:
                aggregated = combine_contributions(contributions, expected_ids=expected)
            checksum = executor.commit(aggregated)
            if noise is not None:
                checksum = self._corrupt(noise, order.iteration)
            digests = executor.digests() if order.final else {}
            # A snapshot of the new state (docs/design.md 4.6) is taken before anything of the
            # next iteration runs; one that goes to the keepers streams in the background.
            state = executor.state_bytes() if keep or send else None
            return checksum, digests, state

        try:
            checksum, digests, state = await self._runtime.compute(COMMIT, step, 0.0, it)
        except (WorkerStopped, Stale):
            return
        except (CombineError, ExecutorError) as err:
            ctx.fail(
                f"stage {ctx.stage} could not commit iteration {order.iteration} on "
                f"{me}: {err}"
            )
            return
        self.last_step = LastStep(order.iteration, order.loss, order.trained, order.dropped,
                                  order.periodic)
        ctx.host.log.info(
            "job %s iteration %d stepped at stage %d (round %d): checksum %s",
            ctx.job_id, order.iteration, ctx.stage, order.round, checksum,
        )
        self._observe_step(order, time.monotonic() - began)
        ctx.participants.update(order.participants)
        ctx.keep_snapshot(boundary, state if keep else None)
        self._advance(order)
        if send and state is not None:
            self._stream(boundary, state)
        # The latest periodic snapshot, if its copies were cut off, goes again (a thin stage
        # sends its state every step, but only the periodic one lets the next be declared).
        lacking = None if order.final else self._send_latest(order.participants, boundary)
        ctx.host.report_committed(ctx.job_id, CommittedReport(
            sender=me,
            iteration=it.number,
            stage=ctx.stage,
            checksum=checksum,
            digests=digests,
            snapshots_landed=tuple(sorted(b for b in ctx.landed if b >= ctx.floor)),
            snapshot_lacking=lacking,
        ))

    # ------------------------------------------------------------------ snapshots (4.6)

    def _snapshot_plan(
        self, participants: Mapping[str, int], iteration: int, final: bool
    ) -> tuple[bool, bool]:
        """(this node keeps its state at the start of `iteration` as its own snapshot, it sends
        that state to the stage's keeper): every node keeps the periodic ones; the stage's
        snapshot sender (`snapshot_sender`: the fastest declared uplink) sends the periodic
        ones, and every one while the stage is thin."""
        if final:
            return False, False
        ctx = self._ctx
        sender, live = self._sender(participants)
        return ctx.policy.periodic(iteration), sender and ctx.policy.due(iteration, live)

    def _sender(self, participants: Mapping[str, int]) -> tuple[bool, int]:
        """(this node sends its stage's snapshots, how many live replicas the stage has)."""
        ctx = self._ctx
        me = ctx.host.node_id
        def uplink(p: str) -> float:
            member = ctx.host.member(p)
            return member.uplink_gbps if member is not None else 0.0

        sender, live = snapshot_sender(
            participants, ctx.departed, ctx.stage,
            lambda p: p == me or ctx.host.member(p) is not None, uplink,
        )
        return sender == me, live

    def _stream(self, boundary: int, state: bytes) -> None:
        """Stream this stage's state at `boundary` to its keepers in the background (docs/design.md
        4.6: the iterations go on meanwhile); a periodic one that lands at every keeper is
        reported with the next step. A thin stage's snapshot waits for the one on its way."""
        ctx = self._ctx
        periodic = ctx.policy.periodic(boundary)
        if not periodic and ctx.sending:
            return
        ctx.sending.add(boundary)

        async def stream() -> None:
            try:
                landed = await ctx.host.keep_backup(ctx.job_id, ctx.stage, boundary, state,
                                                    periodic)
            finally:
                ctx.sending.discard(boundary)
            if landed and periodic and ctx.policy.periodic(boundary):
                ctx.landed.add(boundary)

        ctx.spawn(stream(), f"snapshot {boundary}")

    def _send_latest(self, participants: Mapping[str, int], boundary: int) -> int | None:
        """As the stage's sender at `boundary`: the latest periodic
        boundary if its snapshot of this stage has not landed everywhere (its copies were cut
        off, or its sender died) is sent again from this node's own state of it; the boundary
        it holds no state of, which it then cannot send (`Boundaries.lacking`), else None."""
        ctx = self._ctx
        latest = ctx.policy.last_periodic(boundary)
        if latest >= boundary or ctx.floor >= latest or latest in ctx.landed:
            return None
        if not self._sender(participants)[0] or latest in ctx.sending:
            return None
        state = ctx.snapshots.get(latest)
        if state is None:
            return latest
        self._stream(latest, state)
        return None

    async def snapshot_start(self) -> None:
        """The stage starts here (the job's start, or this node entering it): its state now is
        this node's snapshot, sent to the keepers by the stage's snapshot sender."""
        ctx = self._ctx
        number = ctx.it.number
        send = self._sender(ctx.participants)[0] and number < ctx.job.iterations
        try:
            state = await self._runtime.compute(COMMIT, ctx.executor.state_bytes)
        except WorkerStopped:
            return
        if ctx.executor.iteration != number:
            return  # it stepped meanwhile: that step took the snapshot its turn called for
        ctx.keep_snapshot(number, state)
        if send:
            self._stream(number, state)

    def _observe_step(self, order: StepOrder, seconds: float) -> None:
        job, metrics = self._ctx.job_id, self._ctx.metrics
        metrics.observe("gwtf_job_commit_seconds", job, seconds, "step")
        metrics.count("gwtf_job_iterations_committed", job)
        metrics.count("gwtf_job_microbatches_trained", job, by=order.trained)
        metrics.count("gwtf_job_dropped_microbatches", job, by=len(order.dropped))
        metrics.set("gwtf_job_loss", job, order.loss)
        metrics.set("gwtf_job_iteration", job, order.iteration + 1)

    def _corrupt(self, scale: float, iteration: int) -> str:
        """The `poison:weights` fault: noise on this replica's parameters (compute thread)."""
        executor = self._ctx.executor
        self._ctx.host.log.warning(
            "fault injected: stage parameters corrupted after iteration %d", iteration
        )
        generator = torch.Generator().manual_seed(iteration)
        with torch.no_grad():
            for _, param in sorted(executor.parameters().items()):
                noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
                noise = noise.to(param.device)
                param.add_(noise * scale * float(param.abs().mean()))
        return executor.checksum()
