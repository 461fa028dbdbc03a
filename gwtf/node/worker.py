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
finished or dropped and every replay done: the node sends its gradient sums to the other members
of its stage named in the order (`gwtf.node.gradsync`), collects theirs and reports `prepared`;
when every member is prepared and the contributions cover each finished microbatch exactly once
(`gwtf.recovery.check_commit`), the coordinator orders the step: the node combines the sums in
node-id order (`gwtf.train.combine_contributions`, which checks the coverage again), steps AdamW,
and reports its stage checksum. A member that dies in phase one voids the attempt: its sums are
replayed elsewhere and the commit runs again. Forwards of `k + 1` that arrive before this node has
stepped `k` are held until it has.

With a robust aggregation (the job's `aggregation`, `gwtf.train.robust`), each member screens the
sums it holds in phase one (`norm_outliers`) and names the out-of-bounds peers in its `prepared`
report; the coordinator excludes a replica a majority of its stage names (`gwtf.node.jobcoord`),
and the step combines the sums by the job's rule instead of the exact mean. Every replica holds
the same sums and runs the same deterministic rule, so they still step to the same bits. A
replica excluded from the job is `depart`ed like a dead one, and its contributions are refused.

An iteration may also start again from scratch as a new `round` (`restart`): the node forgets the
iteration's work, with no step, and the holders inject it again. Messages of an older round are
refused.

The worker is split along the line between state, rules and I/O (docs/design.md 3.7):
`gwtf.job.microbatches` holds the iteration's microbatch table and the checks of an incoming tag
(pure); `gwtf.node.stage` the state its parts share; `gwtf.node.runtime` the compute thread and
its queue; `gwtf.node.sender` the data plane's sends, with retries and backoff;
`gwtf.node.commit` this replica's part in a commit; `gwtf.node.recoveries` recoveries and
restarts. `StageWorker` drives the microbatches through them, and is what the node
(gwtf.node.jobs) calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gwtf.job.iterations import CommitOrder, StepOrder, assign
from gwtf.job.microbatches import tag_problem
from gwtf.node.commit import CommitParticipant
from gwtf.node.faults import Fault
from gwtf.node.gradsync import ContributionHeader
from gwtf.node.observe import job_event
from gwtf.node.recoveries import RecoveryHandler
from gwtf.node.runtime import BACKWARD, COMMIT, FORWARD, INJECT, ComputeRuntime
from gwtf.node.sender import DataPlaneSender
from gwtf.node.stage import (
    FORWARD_SHARE,
    Iteration,
    LastStep,
    StageContext,
    Stale,
    WorkerConfig,
    WorkerHost,
    WorkerStopped,
    busy,
)
from gwtf.node.tensors import MicrobatchTag, TensorError, TensorSpec
from gwtf.recovery import Ledger, Mode, NeighbourReport
from gwtf.train import (
    Corpus,
    ExecutorError,
    JobConfig,
    MicrobatchKey,
    StageExecutor,
    job_corpus,
    job_microbatch,
)
from gwtf.train.device import Placement
from gwtf.v1 import job_pb2

__all__ = ["LastStep", "StageWorker", "WorkerConfig", "WorkerHost", "WorkerStopped"]


def _spec(dtype: torch.dtype, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype=dtype, shape=shape)


class StageWorker:
    """The job's stage on this node, around an executor from `StageWorker.build`: the life of
    the microbatches here (injecting, receiving, forward and backward), driving the parts that
    compute, send, commit and recover (see the module docstring)."""

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
        self.host = host
        self.job = job
        self.job_id = job.job_id
        self.executor = executor
        self.stage = executor.stage
        self.num_stages = executor.num_stages
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.num_stages - 1
        self.corpus = corpus
        self.slots = slots
        self.config = config
        self.fault = fault
        self._ctx = ctx = StageContext(
            host, job, executor, slots=slots, config=config, fault=fault
        )
        self._runtime = ComputeRuntime(ctx, emulate_compute_s)
        self._sender = DataPlaneSender(ctx)
        self._commit = CommitParticipant(ctx, self._runtime, self._advance)
        self._recovery = RecoveryHandler(
            ctx, self._runtime, self._sender, self._commit,
            begin=self._begin, own_forward=self._own_forward,
        )
        self._since = time.monotonic()
        batch = (job.microbatch_size, job.model.seq_len)
        self._activation = _spec(torch.float32, (*batch, job.model.width))
        self._labels = _spec(torch.int64, batch)
        self._vocab = job.model.vocab
        self._metrics = host.metrics
        self._metrics.start(self.job_id)
        self._metrics.set("gwtf_job_iteration", self.job_id, executor.iteration)
        self._runtime.start()

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
        ctx.participants.update(participants)
        ctx.it.round = round_
        ctx.started.set()
        self._begin(holders, weights)

    def admit(self, participants: Mapping[str, int]) -> None:
        """Who takes part now (a node joined the job)."""
        self._ctx.participants.update(participants)
        self._ctx.signal()

    def depart(self, node: str) -> None:
        """`node` died or left: no microbatch goes to it (nor to a new process under its id,
        until the coordinator admits that one)."""
        self._ctx.departed.add(node)

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
        self._runtime.round_began()
        ctx.it = Iteration(number)
        self._commit.forget(number)
        ctx.ledger.reset(number)
        ctx.signal()
        if order.final:
            return
        pending = self._recovery.pending_restart(number)
        if pending is not None:
            ctx.it.round = pending[0]
            self._begin(pending[1], pending[2])
        else:
            self._begin(order.next_holders, order.weights())

    # ------------------------------------------------------------------ injecting (holders)

    def _begin(self, holders: tuple[str, ...], weights: Mapping[str, int] | None = None) -> None:
        if not self.is_first or self.host.node_id not in holders:
            return
        it = self._ctx.it
        it.mine = assign(self.job.microbatches, holders, weights)[self.host.node_id]
        self._ctx.spawn(self._inject(it), f"inject {it.number}", it)

    async def _inject(self, it: Iteration) -> None:
        ctx = self._ctx
        for m in it.mine:
            free = ctx.free  # a restart replaces it: a slot goes back where it came from
            await free.acquire()
            if not ctx.current(it):
                free.release()
                return
            it.forwards[m] = ""
            it.paths[m] = (self.host.node_id,)
            it.modes[m] = Mode.FORWARD
            it.fwd_done[m] = asyncio.Event()
            ctx.spawn(self._own_forward(it, m), f"forward {it.number}/{m}", it)

    async def _own_forward(self, it: Iteration, m: int) -> None:
        ctx = self._ctx
        key = MicrobatchKey(self.job_id, it.number, m)
        corpus = self.corpus
        assert corpus is not None
        mode = it.modes[m]

        def work() -> tuple[Tensor, Tensor]:
            ctx.hit("forward", key.iteration, m)
            tokens, labels = job_microbatch(corpus, self.job, key.iteration, m)
            run = self.executor.forward if mode == Mode.FORWARD else self.executor.recompute
            result = run(key, tokens)
            assert result.output is not None
            return result.output, labels

        try:
            output, labels = await self._runtime.compute(
                INJECT if mode == Mode.FORWARD else FORWARD, work,
                self._runtime.emulated(FORWARD_SHARE), it,
            )
        except (WorkerStopped, Stale):
            return
        except ExecutorError as err:
            ctx.fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        it.fwd_done[m].set()
        self._forward_done(it, m, mode)
        tensors = {"activation": output, "labels": labels}
        if mode == Mode.FORWARD:
            await self._sender.send_forward(it, m, tensors)
        else:
            downstream = ctx.ledger.activation_receiver(m)
            assert downstream is not None
            it.kept[(m, "forward")] = (downstream, tensors)

    # ------------------------------------------------------------------ receiving

    def expect(self, tag: MicrobatchTag, name: str) -> TensorSpec | None:
        """What each tensor of an incoming microbatch must be (None: not expected at all)."""
        if tag.direction == "forward" and not self.is_first:
            return {"activation": self._activation, "labels": self._labels}.get(name)
        if tag.direction == "backward" and not self.is_last:
            return self._activation if name == "gradient" else None
        return None

    async def on_tensors(self, tag: MicrobatchTag, tensors: dict[str, Tensor]) -> None:
        """The data plane's handler: a microbatch arrived (already checked against `expect`).
        Returns once the microbatch is taken (a forward needs a free slot); raises TensorError
        (answered INVALID_ARGUMENT) for one this node must refuse. A repeated send of a
        microbatch already taken from the same sender is taken again, with no effect."""
        ctx = self._ctx
        deadline = time.monotonic() + self.config.data_timeout_s
        if not ctx.started.is_set():
            try:
                await asyncio.wait_for(ctx.started.wait(), self.config.data_timeout_s)
            except TimeoutError:
                raise TensorError(f"job {self.job_id} has not started here") from None
        problem = tag_problem(tag, ctx.role, ctx.participants, ctx.excluded)
        if problem is not None:
            raise TensorError(problem)
        await ctx.reach(tag.iteration, tag.round, deadline)
        it = ctx.it
        m = tag.microbatch
        if set(tensors) != ({"gradient"} if tag.direction == "backward" else
                            {"activation", "labels"}):
            raise TensorError(f"microbatch {m} lacks tensors: got {sorted(tensors)}")
        if tag.direction == "forward":
            await self._take_forward(it, tag, tensors, deadline)
        else:
            self._take_backward(it, tag, tensors["gradient"])
        self._sender.count_data("received", tag.direction, tensors)

    async def _take_forward(
        self, it: Iteration, tag: MicrobatchTag, tensors: dict[str, Tensor], deadline: float
    ) -> None:
        ctx = self._ctx
        m = tag.microbatch
        labels = tensors["labels"]
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self._vocab):
            raise TensorError(f"labels of microbatch {m} are outside 0..{self._vocab - 1}")
        prior = it.forwards.get(m)
        if prior is not None:
            if prior == tag.sender:
                return
            raise TensorError(f"microbatch {m} of iteration {it.number} already came here")
        it.forwards[m] = tag.sender
        if not self.is_last:
            acquired = False
            free = ctx.free  # a restart replaces it: a slot goes back where it came from
            try:
                await asyncio.wait_for(free.acquire(), deadline - time.monotonic())
                acquired = True
            except TimeoutError:
                raise busy(f"no memory slot freed up for microbatch {m}") from None
            finally:
                if not acquired and it.forwards.get(m) == tag.sender:
                    del it.forwards[m]
            if not ctx.current(it):
                free.release()
                raise TensorError(
                    f"iteration {tag.iteration} round {tag.round} is over here (it started "
                    f"again while microbatch {m} waited for a slot)"
                )
        mode = Mode(tag.mode)
        it.paths[m] = (*tag.path, self.host.node_id)
        it.modes[m] = mode
        if tag.recovered_from:
            it.recovered.add(m)
        it.fwd_done[m] = asyncio.Event()
        ctx.ledger.activation_received(m, tag.sender)
        if mode != Mode.FORWARD and not self.is_last:
            # The replacement keeps the input of the next-stage node that holds the microbatch
            # (ledger docs), and asks it for the gradient at once: the recompute runs meanwhile.
            ctx.ledger.activation_sent(m, tag.downstream)
            ctx.spawn(self._recovery.ask_redirect(it, m, tag.downstream, mode),
                      f"redirect {m}", it)
        ctx.spawn(self._forward(it, m, tensors), f"forward {it.number}/{m}", it)

    def _take_backward(self, it: Iteration, tag: MicrobatchTag, gradient: Tensor) -> None:
        ctx = self._ctx
        m = tag.microbatch
        prior = it.backwards.get(m)
        if prior is not None:
            if prior == tag.sender:
                return
            raise TensorError(f"the gradient of microbatch {m} came here already")
        if m not in it.forwards:
            raise TensorError(
                f"a gradient of microbatch {m} of iteration {it.number} was not expected here "
                "(no forward)"
            )
        receiver = ctx.ledger.activation_receiver(m)
        if receiver != tag.sender:
            raise TensorError(
                f"microbatch {m}'s activation went to {receiver}, not to {tag.sender}"
            )
        it.backwards[m] = tag.sender
        # This node's own prefix (a redirect may have rewritten the stage above), the rest from
        # the sender: where the microbatch went after this node.
        it.paths[m] = (*it.paths[m][: self.stage + 1], *tag.path[self.stage + 1 :])
        ctx.ledger.gradient_received(m, tag.sender)
        ctx.spawn(self._backward(it, m, gradient), f"backward {it.number}/{m}", it)

    # ------------------------------------------------------------------ forward and backward

    async def _forward(self, it: Iteration, m: int, tensors: dict[str, Tensor]) -> None:
        ctx = self._ctx
        key = MicrobatchKey(self.job_id, it.number, m)
        activation, labels = tensors["activation"], tensors["labels"]
        mode = it.modes[m]
        share = 1.0 if self.is_last else FORWARD_SHARE
        redo = mode != Mode.FORWARD or m in it.recovered
        run = self.executor.recompute if redo else self.executor.forward

        def work() -> Any:
            ctx.hit("forward", key.iteration, m)
            if self.is_last:  # forward and backward are one step here
                ctx.hit("backward", key.iteration, m)
            return run(key, activation, labels if self.is_last else None)

        try:
            result = await self._runtime.compute(FORWARD, work, self._runtime.emulated(share), it)
        except (WorkerStopped, Stale):
            return
        except ExecutorError as err:
            ctx.fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        self._forward_done(it, m, mode)
        if self.is_last:
            assert result.loss is not None and result.grad_input is not None
            it.losses[m] = result.loss
            path = it.paths[m]
            it.routes[path] = it.routes.get(path, 0) + 1
            ctx.ledger.accumulated(m)
            ctx.hit("after-backward", key.iteration, m)
            if mode == Mode.REPLAY:
                self._replayed(it, m)
                return
            await self._sender.send_backward(it, m, result.grad_input)
            return
        assert result.output is not None
        it.fwd_done[m].set()
        out = {"activation": result.output, "labels": labels}
        if mode == Mode.FORWARD:
            await self._sender.send_forward(it, m, out)
        else:
            downstream = ctx.ledger.activation_receiver(m)
            assert downstream is not None
            it.kept[(m, "forward")] = (downstream, out)

    async def _backward(self, it: Iteration, m: int, gradient: Tensor) -> None:
        ctx = self._ctx
        key = MicrobatchKey(self.job_id, it.number, m)
        await it.fwd_done[m].wait()
        if not ctx.current(it):
            return

        def work() -> Tensor | None:
            ctx.hit("backward", key.iteration, m)
            return self.executor.backward(key, gradient)

        try:
            grad_input = await self._runtime.compute(
                BACKWARD, work, self._runtime.emulated(1 - FORWARD_SHARE), it,
            )
        except (WorkerStopped, Stale):
            return
        except ExecutorError as err:
            ctx.fail(f"{self.host.node_id} could not run the backward of {key}: {err}")
            return
        finally:
            if ctx.current(it):
                ctx.free.release()
        ctx.ledger.accumulated(m)
        self.host.log.debug(
            "job %s it %d mb %d: backward done at stage %d", self.job_id, it.number, m,
            self.stage, extra=job_event(self.job_id, it.number, m),
        )
        ctx.hit("after-backward", key.iteration, m)
        if it.modes.get(m) == Mode.REPLAY:
            self._replayed(it, m)
            return
        if not self.is_first:
            assert grad_input is not None
            await self._sender.send_backward(it, m, grad_input)
            return
        it.finished.add(m)
        self.host.report_done(self.job_id, it.number, it.round, (m,))

    def _forward_done(self, it: Iteration, m: int, mode: Mode) -> None:
        self.host.log.debug(
            "job %s it %d mb %d: forward%s done at stage %d (%s)", self.job_id, it.number, m,
            " and backward" if self.is_last else "", self.stage, mode.name.lower(),
            extra=job_event(self.job_id, it.number, m),
        )
        if mode == Mode.RECOMPUTE:
            self._metrics.count("gwtf_job_replays", self.job_id, "recompute")

    def _replayed(self, it: Iteration, m: int) -> None:
        self._metrics.count("gwtf_job_replays", self.job_id, "replay")
        self.host.log.info(
            "job %s it %d mb %d: replayed stage %d here (rule 3)", self.job_id, it.number, m,
            self.stage, extra=job_event(self.job_id, it.number, m),
        )
        self.host.report_replayed(self.job_id, it.number, it.round, m, self.stage)

    # ------------------------------------------------------------------ recovery and restarts

    async def report(self, iteration: int, round_: int, dead: str) -> NeighbourReport:
        """This node's ledger evidence about `dead` for the iteration in progress."""
        return await self._recovery.report(iteration, round_, dead)

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

    # ------------------------------------------------------------------ commit

    def contribution_numel(self, header: ContributionHeader) -> int:
        """Checks a peer's contribution header; the number of values it must carry."""
        return self._commit.contribution_numel(header)

    def on_contribution(self, header: ContributionHeader, flat: Tensor) -> None:
        """A stage peer's gradient sums for an attempt of this iteration's commit (or the
        next iteration's)."""
        self._commit.on_contribution(header, flat)

    def order_commit(self, order: CommitOrder) -> None:
        """Phase one of an attempt of the coordinator's commit (a repeated one is ignored)."""
        self._commit.order_commit(order)

    def step(self, order: StepOrder) -> None:
        """Phase two: every member is prepared, step."""
        self._commit.step(order)

    # ------------------------------------------------------------------ state

    async def state_bytes(self) -> tuple[int, bytes]:
        """(iteration, this stage's weights and optimizer state at its start), for a joiner."""
        it = self._ctx.it
        data = await self._runtime.compute(COMMIT, self.executor.state_bytes)
        return it.number, data

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
            if last.dropped:
                reply.stepped_dropped.append(job_pb2.IterationMicrobatches(
                    iteration=last.iteration, microbatches=last.dropped))
        return reply
