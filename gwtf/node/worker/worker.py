"""StageWorker: one node's part of a training job, the torch side of the node (docs/design.md 1,
3 and 4).

A microbatch's life, seen from the nodes it visits (`path`: the node ids so far, data holder
first, each hop appending itself):

- a data holder (stage 0) builds microbatch `m` of iteration `k` (`gwtf.train.job_microbatch`:
  the same bytes on every holder), runs its stage forward and sends the activation and the labels
  to a next-stage node picked by smooth weighted round-robin over its flows (`gwtf.job.nexthop`);
- a relay runs its stage forward and sends on the same way;
- the last stage computes the loss, runs its backward at once and sends the gradient w.r.t. its
  input back to the node before it on the path;
- each node runs its backward, accumulates, and sends the input gradient to its own predecessor;
  at the data holder the microbatch is done, and the holder tells the job's coordinator.

Memory slots. A node keeps the forward state of a microbatch until its backward (the last stage
keeps none); `slots` bounds how many. A holder injects a microbatch only when it has a free slot,
and a relay takes a forward only when it has one: until then the incoming stream stays open, which
holds the sender's call, so pressure propagates upstream to the holders. Backward never waits for
a slot (it frees one), and the last stage never holds one, so the pipeline cannot deadlock.

Compute runs on one thread (torch with one intra-op thread, the count the one-process reference
uses to give the same bits), one item at a time, from a priority queue: commit work first, then
backward (it frees memory and finishes microbatches), then forwards, then new microbatches. The
event loop stays free for gRPC and heartbeats meanwhile. With `emulate_compute_s`, each item is
padded with sleep to the node's declared compute time (a third for a forward, two thirds for a
backward, all of it on the last stage), as the emulated WAN pads messages.

Losing nothing (docs/design.md 4). Every node keeps, for the iteration in progress, a
`gwtf.recovery.Ledger` of what it sent where and what it accumulated, and the tensors of every send
(`kept`), until the iteration steps. A send is recorded before it leaves, so a receiver that dies
mid-call is still on the record. When a participant dies, the job's coordinator asks its live
neighbours for their ledgers' evidence (`report`), plans with `gwtf.recovery.plan_crash`, and sends
each recovery to the node that holds the microbatch's input (`recover`): that node resends its
kept activation to a replacement chosen by its own flows, marked as a plain forward (rule 1),
"recompute" (rule 2) or "replay" (rule 3). A replacement that recomputes or replays asks the
next-stage node to send the gradient to it instead (`redirect`); that node resends its kept
gradient if it sent it to the dead node already. Dropout is seeded by job, iteration, microbatch and
model part, so the replacement computes the dead node's very bits. A replay accumulates and sends
nothing on; the replacement tells the coordinator (`report_replayed`). A dead data holder's
microbatches that left it are recovered by another holder, which rebuilds the token ids from its
own copy of the data; the ones that never left it are dropped.

Commit of iteration `k`, in two phases ordered by the coordinator once every microbatch is
finished or dropped and every replay done: the node and the other members of its stage named in
the order add up their gradient sums, all to all where the exchange is latency-bound or the
aggregation robust, by reduce-scatter and all-gather otherwise (`gwtf.job.exchange` chooses,
`gwtf.node.worker.commit`), and report `prepared`; when every member is prepared and the
contributions cover each finished microbatch exactly once (`gwtf.recovery.check_commit`), the
coordinator orders the step: the node divides the sum as `gwtf.train.combine_contributions` does
(`combine_summed`, which checks the coverage again), steps AdamW, and reports its stage checksum.
A member that dies in phase one voids the attempt: its sums are replayed elsewhere and the commit
runs again, moving only what the last attempt did not deliver. Forwards of `k + 1` that arrive
before this node has stepped `k` are held until it has.

With a robust aggregation (the job's `aggregation`, `gwtf.train.robust`), each member screens the
sums it holds in phase one (`norm_outliers`) and names the out-of-bounds peers in its `prepared`
report; the coordinator excludes a replica a majority of its stage names
(`gwtf.node.jobs.coordinator.coordinator`), and the step combines the sums by the job's rule instead
of the exact mean. Every replica holds the same sums and runs the same deterministic rule, so they
still step to the same bits. A replica excluded from the job is `depart`ed like a dead one, and its
contributions are refused.

An iteration may also start again from scratch as a new `round` (`restart`): the node forgets the
iteration's work, with no step, and the holders inject it again. Messages of an older round are
refused.

The worker is split along the line between state, rules and I/O (docs/design.md 3.7):
`gwtf.job.microbatches` holds the iteration's microbatch table and the checks of an incoming tag
(pure); `gwtf.node.worker.stage` the state its parts share; `gwtf.node.worker.runtime` the compute
thread and its queue; `gwtf.node.worker.sender` the data plane's sends, with retries and backoff;
`gwtf.node.worker.commit` this replica's part in a commit; `gwtf.node.worker.recoveries` recoveries
and restarts; `gwtf.node.worker.pipeline` the microbatches' life on this node. `StageWorker` builds
and wires them, moves them from one iteration to the next, and is what the node
(gwtf.node.jobs.manager) calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from torch import Tensor

from gwtf.job.iterations import CommitOrder, StepOrder
from gwtf.node.dataplane.gradsync import ContributionHeader
from gwtf.node.dataplane.tensors import MicrobatchTag, TensorSpec
from gwtf.node.faults import Fault
from gwtf.node.jobs.journals import journaled_ledger
from gwtf.node.worker.commit import CommitParticipant
from gwtf.node.worker.pipeline import MicrobatchPipeline
from gwtf.node.worker.recoveries import RecoveryHandler
from gwtf.node.worker.runtime import COMMIT, ComputeRuntime
from gwtf.node.worker.sender import DataPlaneSender
from gwtf.node.worker.shipping import SumShipper
from gwtf.node.worker.stage import (
    Iteration,
    LastStep,
    StageContext,
    WorkerConfig,
    WorkerHost,
    WorkerStopped,
)
from gwtf.recovery import Ledger, NeighbourReport
from gwtf.train import Corpus, JobConfig, StageExecutor, job_corpus
from gwtf.train.device import Placement
from gwtf.train.partition import partition
from gwtf.v1 import job_pb2

__all__ = ["LastStep", "StageWorker", "WorkerConfig", "WorkerHost", "WorkerStopped"]


class StageWorker:
    """The job's stage on this node, around an executor from `StageWorker.build`: what the node
    calls, and the moves from one iteration to the next; the work is done by its parts (the
    module docstring)."""

    def __init__(
        self,
        host: WorkerHost,
        job: JobConfig,
        executor: StageExecutor,
        corpus: Corpus | None,
        *,
        slots: int,
        emulate_compute_s: float | None,
        config: WorkerConfig,
        fault: Fault | None = None,
    ) -> None:
        self.corpus = corpus
        self._ctx = ctx = StageContext(
            host, job, executor, slots=slots, config=config, fault=fault
        )
        ledger = journaled_ledger(host.node_id, ctx.stage, executor.iteration, ctx.job_id,
                                  host.log)
        if ledger is not None:
            ctx.ledger = ledger
        self._runtime = ComputeRuntime(ctx, emulate_compute_s)
        self._sender = DataPlaneSender(ctx)
        self.shipper = SumShipper(ctx, self._runtime)
        self._pipeline = MicrobatchPipeline(ctx, self._runtime, self._sender, corpus,
                                            self.shipper.accumulated)
        self._commit = CommitParticipant(ctx, self._runtime, self._advance)
        self._recovery = RecoveryHandler(
            ctx, self._runtime, self._sender, self._commit,
            begin=self._pipeline.begin, own_forward=self._pipeline.own_forward,
            adopted=self.shipper.accumulated,
        )
        self._since = time.monotonic()
        self._metrics = host.metrics
        self._metrics.start(self.job_id)
        self._metrics.set("gwtf_job_iteration", self.job_id, executor.iteration)
        self._runtime.start()

    # What the parts share lives in the context; these read it, so nothing is copied twice.
    host = property(lambda self: self._ctx.host)
    job = property(lambda self: self._ctx.job)
    job_id = property(lambda self: self._ctx.job_id)
    executor = property(lambda self: self._ctx.executor)
    stage = property(lambda self: self._ctx.stage)
    num_stages = property(lambda self: self._ctx.num_stages)
    is_first = property(lambda self: self._ctx.is_first)
    is_last = property(lambda self: self._ctx.is_last)

    # ------------------------------------------------------------------ building

    @staticmethod
    def build(
        job: JobConfig, stage: int, num_stages: int, slots: int, placement: Placement
    ) -> tuple[StageExecutor, Corpus | None]:
        """The executor on `placement` and, on a data holder, the corpus (blocking: run it in a
        thread). Raises PartitionError, DataError. The executor refuses a forward beyond `slots`
        too: the worker's own bound, checked a second time."""
        corpus = job_corpus(job) if stage == 0 else None
        executor = StageExecutor(job, stage, num_stages, capacity=slots, placement=placement)
        return executor, corpus

    @staticmethod
    def build_from_state(
        job: JobConfig, stage: int, num_stages: int, slots: int, state: bytes,
        placement: Placement,
    ) -> tuple[StageExecutor, Corpus | None]:
        """A joiner's executor from a peer's state (blocking). Raises StateError, DataError."""
        corpus = job_corpus(job) if stage == 0 else None
        executor = StageExecutor.from_state(
            job, stage, num_stages, state, capacity=slots, placement=placement
        )
        return executor, corpus

    # ------------------------------------------------------------------ what the node reads

    @property
    def iteration(self) -> int:
        return self._ctx.it.number

    @property
    def round(self) -> int:
        return self._ctx.it.round

    @property
    def corpus_digest(self) -> str:
        return self.corpus.digest if self.corpus is not None else ""

    @property
    def participants(self) -> dict[str, int]:
        return dict(self._ctx.participants)

    @property
    def ledger(self) -> Ledger:
        return self._ctx.ledger

    @property
    def last_step(self) -> LastStep | None:
        """The last step this node took."""
        return self._commit.last_step

    @property
    def route_sources(self) -> dict[str, int]:
        """How many next hops came from the flows and how many from capacities."""
        return self._sender.route_sources

    @property
    def rerouted(self) -> int:
        """Microbatches this node resent to a replacement (rules 1-3)."""
        return self._sender.rerouted

    @property
    def busy_s(self) -> float:
        """Seconds the compute thread was busy (with the emulated padding)."""
        return self._runtime.busy_s

    def compute_delta(self) -> tuple[float, float]:
        """(compute, wasted) seconds since the last call (ComputeRuntime.compute_delta)."""
        return self._runtime.compute_delta()

    # ------------------------------------------------------------------ lifecycle

    def start(
        self,
        participants: Mapping[str, int],
        holders: tuple[str, ...],
        weights: Mapping[str, int] | None = None,
        round_: int = 0,
    ) -> None:
        """The job starts here (or this joiner enters it): route among `participants`; holders
        inject the current iteration, with shares in the proportions of `weights` (None:
        equal)."""
        ctx = self._ctx
        self._since = time.monotonic()
        self.host.compress(self._codecs())
        ctx.participants.update(participants)
        ctx.it.round = round_
        ctx.started.set()
        ctx.spawn(self._commit.snapshot_start(), "snapshot of the start")
        self._pipeline.begin(holders, weights)

    def _codecs(self) -> tuple[str, ...] | None:
        """The plan's codec at each boundary between this swarm's stages (None: all none)."""
        spec = self.executor.spec
        ends = [s.end_layer for s in partition(self.job.model.layers, spec.num_stages)[:-1]]
        codecs = tuple(self.job.compression.codec_after(end) for end in ends)
        return codecs if any(c != "none" for c in codecs) else None

    def boundaries(self, declared: Sequence[int], floor: int, start: int) -> None:
        """The job's declared periodic boundaries, floor and first iteration (docs/design.md
        4.6), for a node entering a running job: before `start`."""
        self._ctx.boundaries(declared, floor, start)

    def declared(self) -> tuple[tuple[int, ...], int]:
        """(the periodic boundaries declared so far, the floor of the last step order)."""
        ctx = self._ctx
        return ctx.policy.declared or (), ctx.floor

    def admit(self, participants: Mapping[str, int]) -> None:
        """Who takes part now (a node joined the job)."""
        self._ctx.participants.update(participants)
        self._ctx.signal()

    def depart(self, node: str, *, crashed: bool = False) -> None:
        """`node` died or left: no microbatch goes to it (nor to a new process under its id,
        until the coordinator admits that one). `crashed`: a death, which the shipper's hazard
        counts (gwtf.node.worker.shipping)."""
        self._ctx.departed.add(node)
        if crashed:
            self.shipper.death()
        else:
            self.shipper.census()

    def exclude(self, node: str) -> None:
        """`node` was excluded from the job as a bad peer."""
        self._ctx.excluded.add(node)
        self._ctx.departed.add(node)

    def undepart(self, node: str) -> None:
        self._ctx.departed.discard(node)

    async def stop(self) -> None:
        """The job ended: stop computing and sending, free the model."""
        ctx = self._ctx
        if ctx.stopped:
            return
        ctx.stopped = True
        ctx.signal()
        self.host.compress(None)
        stats = self.executor.stats
        wall = time.monotonic() - self._since
        busy_s = self._runtime.busy_s
        self.host.log.info(
            "job %s stage %d: %d forwards, %d recomputes, %d backwards, torch %.2f s (replayed "
            "%.2f s), busy %.2f s (%.0f%% of %.1f s); next hops %s", self.job_id, self.stage,
            stats.forwards, stats.recomputes, stats.backwards, stats.compute_s,
            stats.replayed_s, busy_s, 100 * busy_s / max(wall, 1e-9), wall,
            ", ".join(f"{n} from {k}" for k, n in sorted(self.route_sources.items())) or "none",
        )
        tasks = [t for t in ctx.tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._runtime.close()

    def _advance(self, order: StepOrder) -> None:
        """This node stepped `order`'s iteration: on to the next (or to a restart of it that
        was ordered before this node got there)."""
        ctx = self._ctx
        number = order.iteration + 1
        self.shipper.stepped(order.iteration)
        self._runtime.round_began()
        ctx.it = Iteration(number, order.next_round)
        self._commit.forget(number)
        ctx.ledger.reset(number)
        ctx.signal()
        if order.final:
            return
        pending = self._recovery.pending_restart(number)
        if pending is not None:
            ctx.it.round = pending[0]
            self._pipeline.begin(pending[1], pending[2])
        else:
            self._pipeline.begin(order.next_holders, order.weights())

    # ------------------------------------------------------------------ microbatches

    def expect(self, tag: MicrobatchTag, name: str) -> TensorSpec | None:
        """What each tensor of an incoming microbatch must be (None: not expected at all)."""
        return self._pipeline.expect(tag, name)

    async def on_tensors(self, tag: MicrobatchTag, tensors: dict[str, Tensor]) -> None:
        """The data plane's handler: a microbatch arrived (already checked against `expect`).
        Returns once the microbatch is taken (a forward needs a free slot); raises TensorError
        (answered INVALID_ARGUMENT) for one this node must refuse. A repeated send of a
        microbatch already taken from the same sender is taken again, with no effect."""
        await self._pipeline.on_tensors(tag, tensors)

    # ------------------------------------------------------------------ recovery and restarts

    async def report(self, iteration: int, round_: int, dead: str
                     ) -> tuple[NeighbourReport, frozenset[int]]:
        """This node's ledger evidence about `dead` for the iteration in progress, and what the
        running sum it keeps for `dead` covers."""
        return await self._recovery.report(iteration, round_, dead)

    async def keep(self, request: job_pb2.KeepRequest) -> None:
        """The coordinator's order for a dead stage peer's kept running sum (rule KEEP)."""
        await self._recovery.keep(request)

    def recover(self, request: job_pb2.RecoverRequest) -> None:
        """The coordinator's order: carry out one recovery of a dead node's microbatch."""
        self._recovery.recover(request)

    def redirect(self, request: job_pb2.RedirectRequest) -> None:
        """A replacement of the stage above took over a microbatch: its gradient goes there."""
        self._recovery.redirect(request)

    def restart(self, iteration: int, round_: int, holders: tuple[str, ...],
                weights: Mapping[str, int] | None, participants: Mapping[str, int]) -> None:
        """Start `iteration` again from scratch as `round_` (see the module docstring)."""
        self._recovery.restart(iteration, round_, holders, weights, participants)

    def rollback(self, iteration: int, round_: int, holders: tuple[str, ...],
                 weights: Mapping[str, int] | None, participants: Mapping[str, int]) -> None:
        """Go back to `iteration` (older than this node's, or its own) from this stage's
        snapshot of it, and start it as `round_` (docs/design.md 4.6); Refusal if this node
        holds no state of that iteration."""
        self._recovery.rollback(iteration, round_, holders, weights, participants)

    # ------------------------------------------------------------------ commit

    def contribution_numel(self, header: ContributionHeader) -> int:
        """Checks a peer's contribution header; the number of values it must carry."""
        return self._commit.contribution_numel(header)

    def on_contribution(self, header: ContributionHeader, flat: Tensor) -> bool:
        """A stage peer's gradient sums for an attempt of this iteration's commit (or the
        next iteration's): whether this node holds all the stream declared."""
        return self._commit.on_contribution(header, flat)

    def order_commit(self, order: CommitOrder) -> None:
        """Phase one of an attempt of the coordinator's commit (a repeated one is ignored)."""
        self._commit.order_commit(order)

    def step(self, order: StepOrder) -> None:
        """Phase two: every member is prepared, step."""
        self._commit.step(order)

    # ------------------------------------------------------------------ state

    async def state_bytes(self) -> tuple[int, bytes]:
        """(iteration, this stage's weights and optimizer state at its start), for a joiner or
        a keeper. Both are read on the compute thread at once: a step queued ahead of the read
        moves the state on, and its iteration with it."""
        executor = self.executor
        return await self._runtime.compute(
            COMMIT, lambda: (executor.iteration, executor.state_bytes())
        )

    async def steps_bytes(self, iteration: int) -> tuple[int, bytes]:
        """(iteration, the stage's steps from `iteration` to it) for a joiner holding the state
        of `iteration` (StageExecutor.steps_bytes; StateError if they are not all kept here)."""
        executor = self.executor
        return await self._runtime.compute(
            COMMIT, lambda: (executor.iteration, executor.steps_bytes(iteration))
        )

    async def weights(self) -> tuple[int, bytes]:
        """(iterations trained into them, this stage's parameters as safetensors bytes), read on
        the compute thread between two of its steps."""
        return await self._runtime.compute(COMMIT, self.executor.weights)

    def sync(self) -> job_pb2.SyncReply:
        it = self._ctx.it
        reply = job_pb2.SyncReply(
            iteration=it.number,
            round=it.round,
            prepared=it.prepared is not None,
            attempt=it.prepared[0].attempt if it.prepared is not None else 0,
        )
        last = self.last_step
        if last is not None:
            reply.stepped = True
            reply.stepped_iteration = last.iteration
            reply.stepped_loss = last.loss
            reply.stepped_trained = last.trained
            reply.stepped_periodic = last.periodic
            if last.dropped:
                reply.stepped_dropped.append(job_pb2.IterationMicrobatches(
                    iteration=last.iteration, microbatches=last.dropped))
        declared, reply.floor = self.declared()
        reply.declared.extend(declared)
        return reply
