"""StageWorker: one node's part of a training job, the torch side of the node (DESIGN.md 1, 3).

A microbatch's life, seen from the nodes it visits (`path`: the node ids so far, data holder
first, each hop appending itself):

- a data holder (stage 0) builds microbatch `m` of iteration `k` (`gwtf.train.job_microbatch`:
  the same bytes on every holder), runs its stage forward and sends the activation and the labels
  to a next-stage node picked by smooth weighted round-robin over its flows (`gwtf.node.wrr`);
- a relay runs its stage forward and sends on the same way;
- the last stage computes the loss, runs its backward at once and sends the gradient w.r.t. its
  input back to the node before it on the path;
- each node runs its backward, accumulates, and sends the input gradient to its own predecessor;
  at the data holder the microbatch is done. When all of its microbatches are done, the holder
  tells the job's coordinator.

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
backward, all of it on the last stage), as the emulated WAN pads messages: on one shared machine
the swarm then runs at the speeds the flow was computed for.

Commit of iteration `k` (ordered by the coordinator once every microbatch is back): the node sends
its gradient sums to every other replica of its stage (`gwtf.node.gradsync`), waits for theirs,
combines them in node-id order (`gwtf.train.combine_contributions`, so every replica gets the
same bits), steps AdamW, and reports the stage checksum (and, on the last stage, the losses and
paths). Forwards of `k + 1` that arrive before the node has committed `k` are held until it has.

What each node sent and received in the iteration is kept until the commit, in a
`gwtf.recovery.Ledger` and with the tensors themselves (`kept`): what crash recovery (issue 6)
resends. With no crash, nothing is resent and nothing is lost or counted twice: every stage
accumulates each microbatch exactly once, which `combine_contributions` checks at every commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc
import torch
from grpc import aio
from torch import Tensor

from gwtf.node.gradsync import (
    ContributionError,
    ContributionHeader,
    encode,
    flatten,
    unflatten,
)
from gwtf.node.iterations import CommitOrder, CommittedReport, assign
from gwtf.node.membership import MemberInfo
from gwtf.node.server import Refusal
from gwtf.node.tensors import DataPlaneStub, MicrobatchTag, TensorError, TensorSpec, send
from gwtf.node.wrr import SmoothRoundRobin
from gwtf.recovery.ledger import Ledger
from gwtf.train import (
    ContributionError as CombineError,
)
from gwtf.train import (
    Corpus,
    ExecutorError,
    GradContribution,
    JobConfig,
    MicrobatchKey,
    StageExecutor,
    combine_contributions,
    job_microbatch,
    load_corpus,
)
from gwtf.v1 import job_pb2_grpc

__all__ = ["StageWorker", "WorkerConfig", "WorkerHost", "WorkerStopped"]

T = TypeVar("T")

FORWARD_SHARE = 1 / 3
"""Share of a microbatch's compute that is its forward (backward is about twice the forward)."""

# Compute priorities: lower runs first.
_COMMIT, _BACKWARD, _FORWARD, _INJECT = 0, 1, 2, 3
# gRPC codes of a peer that will refuse a resend too: a bug or a mismatch, never a transient.
_FINAL_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
)


class WorkerStopped(Exception):
    """The job ended (completed, failed or aborted) while something was waiting on it."""


@dataclass(frozen=True)
class WorkerConfig:
    """Timeouts of the data plane and the commit, seconds."""

    data_timeout_s: float = 60.0
    """Deadline of one microbatch's send: it covers the time the receiver holds the stream
    while it waits for a free slot or for its commit of the previous iteration."""
    commit_timeout_s: float = 120.0
    """How long a replica waits for its stage peers' gradient sums."""
    rpc_timeout_s: float = 3.0
    send_attempts: int = 5
    """Sends of a microbatch or contribution to a peer that does not answer (UNAVAILABLE)."""
    retry_s: float = 0.2
    """First wait before a resend; doubles each attempt."""


class WorkerHost(Protocol):
    """What the worker needs from its node (gwtf.node.jobs implements it)."""

    node_id: str
    log: logging.LoggerAdapter[logging.Logger]

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member with this id (None: dead, left or unknown)."""
        ...

    def data_stub(self, member: MemberInfo) -> DataPlaneStub: ...

    def job_stub(self, member: MemberInfo) -> job_pb2_grpc.JobServiceStub: ...

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        """Seconds the emulated WAN holds `nbytes` to `member` (0 without emulation)."""
        ...

    def next_hop_weights(self, capacities: Mapping[str, float]) -> tuple[dict[str, int], str]:
        """Weights over these candidates, from the node's flows or their capacities."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    def report_done(self, job_id: str, iteration: int, microbatches: tuple[int, ...]) -> None:
        """This holder's microbatches of `iteration` are all back: tell the coordinator."""
        ...

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """This node committed an iteration: tell the coordinator."""
        ...

    def fail(self, job_id: str, reason: str) -> None:
        """The job cannot go on (one sentence): stop it everywhere."""
        ...


@dataclass
class _Iteration:
    """What this node holds of the iteration in progress (reset at each commit)."""

    number: int
    mine: tuple[int, ...] = ()
    """Holders: the microbatches this node injects."""
    finished: set[int] = field(default_factory=set)
    """Holders: microbatches whose gradient came back."""
    forwards: set[int] = field(default_factory=set)
    """Microbatches whose forward arrived here (a second one is refused)."""
    backwards: set[int] = field(default_factory=set)
    paths: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The path of each microbatch up to and including this node."""
    losses: dict[int, float] = field(default_factory=dict)
    routes: dict[tuple[str, ...], int] = field(default_factory=dict)
    kept: dict[tuple[int, str], tuple[str, dict[str, Tensor]]] = field(default_factory=dict)
    """(microbatch, direction) -> (receiver, tensors) of every send: what a recovery resends."""
    contributions: dict[str, GradContribution] = field(default_factory=dict)


def _busy(message: str) -> Refusal:
    """A microbatch this node cannot take now (the sender may try again, or another node)."""
    return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def _spec(dtype: torch.dtype, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype=dtype, shape=shape)


class StageWorker:
    """The job's stage on this node, around an executor from `StageWorker.build`."""

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
        self._emulate_s = emulate_compute_s
        self._free = asyncio.Semaphore(slots)
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gwtf-compute", initializer=torch.set_num_threads,
            initargs=(1,),
        )
        self._queue: asyncio.PriorityQueue[
            tuple[int, int, Callable[[], Any], float, asyncio.Future[Any]]
        ] = asyncio.PriorityQueue()
        self._seq = 0
        self._participants: dict[str, int] = {}
        self._started = asyncio.Event()
        self._changed = asyncio.Event()
        """Set (and replaced) whenever the iteration advances or contributions arrive."""
        self._orders: dict[int, CommitOrder] = {}
        self._committing = False
        self._it = _Iteration(0)
        self._early: dict[str, GradContribution] = {}
        """Contributions of stage peers for the next iteration, which came before its commit."""
        self.ledger = Ledger(host.node_id, self.stage, 0)
        self._rr = SmoothRoundRobin()
        self.route_sources: dict[str, int] = {}
        """How many next hops came from the flows and how many from capacities."""
        self._stopped = False
        self.busy_s = 0.0
        """Seconds the compute thread was busy (with the emulated padding)."""
        self._since = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        batch = (job.microbatch_size, job.model.seq_len)
        self._activation = _spec(torch.float32, (*batch, job.model.width))
        self._labels = _spec(torch.int64, batch)
        self._vocab = job.model.vocab
        self._shapes = {name: tuple(p.shape) for name, p in executor.parameters().items()}
        self._numel = sum(p.numel() for p in executor.parameters().values())
        self._grad_dtype = torch.float64 if job.grad_accum == "float64" else torch.float32
        self._tasks.add(asyncio.get_running_loop().create_task(self._compute_loop()))

    # ------------------------------------------------------------------ building

    @staticmethod
    def build(
        job: JobConfig, stage: int, num_stages: int, slots: int
    ) -> tuple[StageExecutor, Corpus | None]:
        """The executor and, on a data holder, the corpus (blocking: run it in a thread).
        Raises PartitionError, DataError. The executor refuses a forward beyond `slots` too: the
        worker's own bound, checked a second time."""
        torch.set_num_threads(1)
        corpus = load_corpus(job.data) if stage == 0 else None
        return StageExecutor(job, stage, num_stages, capacity=slots), corpus

    @property
    def iteration(self) -> int:
        return self._it.number

    @property
    def corpus_digest(self) -> str:
        return self.corpus.digest if self.corpus is not None else ""

    # ------------------------------------------------------------------ lifecycle

    def start(self, participants: Mapping[str, int], holders: tuple[str, ...]) -> None:
        """The job starts: route among `participants`; holders inject iteration 0."""
        self._since = time.monotonic()
        self._participants = dict(participants)
        self._started.set()
        self._begin(holders)

    async def stop(self) -> None:
        """The job ended: stop computing and sending, free the model."""
        if self._stopped:
            return
        self._stopped = True
        self._signal()
        stats = self.executor.stats
        wall = time.monotonic() - self._since
        self.host.log.info(
            "job %s stage %d: %d forwards, %d backwards, torch %.2f s, busy %.2f s (%.0f%% of "
            "%.1f s); next hops %s", self.job_id, self.stage, stats.forwards, stats.backwards,
            stats.compute_s, self.busy_s, 100 * self.busy_s / max(wall, 1e-9), wall,
            ", ".join(f"{n} from {k}" for k, n in sorted(self.route_sources.items())) or "none",
        )
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while not self._queue.empty():
            *_, future = self._queue.get_nowait()
            future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = self.host.spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), left)

    def _fail(self, reason: str) -> None:
        if not self._stopped:
            self.host.fail(self.job_id, reason)

    # ------------------------------------------------------------------ compute

    async def _compute(self, priority: int, work: Callable[[], T], emulate_s: float = 0.0) -> T:
        if self._stopped:
            raise WorkerStopped
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._seq += 1
        self._queue.put_nowait((priority, self._seq, work, emulate_s, future))
        return await future

    async def _compute_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, work, emulate_s, future = await self._queue.get()
            if future.cancelled():
                continue
            start = loop.time()
            try:
                result = await loop.run_in_executor(self._pool, work)
            except Exception as err:  # handed to the awaiting coroutine, which knows what it was
                if not future.cancelled():
                    future.set_exception(err)
                continue
            rest = emulate_s - (loop.time() - start)
            if rest > 0:
                await asyncio.sleep(rest)
            self.busy_s += loop.time() - start
            if not future.cancelled():
                future.set_result(result)

    def _emulated(self, share: float) -> float:
        return self._emulate_s * share if self._emulate_s is not None else 0.0

    # ------------------------------------------------------------------ injecting (holders)

    def _begin(self, holders: tuple[str, ...]) -> None:
        if not self.is_first or self.host.node_id not in holders:
            return
        it = self._it
        it.mine = assign(self.job.microbatches, holders)[self.host.node_id]
        self._spawn(self._inject(it), f"inject {it.number}")

    async def _inject(self, it: _Iteration) -> None:
        if not it.mine:
            self.host.report_done(self.job_id, it.number, ())
            return
        for m in it.mine:
            await self._free.acquire()
            if self._stopped or it is not self._it:
                self._free.release()
                return
            self._spawn(self._own_forward(it, m), f"forward {it.number}/{m}")

    async def _own_forward(self, it: _Iteration, m: int) -> None:
        key = MicrobatchKey(self.job_id, it.number, m)
        corpus = self.corpus
        assert corpus is not None

        def work() -> tuple[Tensor, Tensor]:
            tokens, labels = job_microbatch(corpus, self.job, key.iteration, m)
            result = self.executor.forward(key, tokens)
            assert result.output is not None
            return result.output, labels

        try:
            output, labels = await self._compute(_INJECT, work, self._emulated(FORWARD_SHARE))
        except WorkerStopped:
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        it.forwards.add(m)
        it.paths[m] = (self.host.node_id,)
        await self._send_forward(it, m, {"activation": output, "labels": labels})

    # ------------------------------------------------------------------ receiving

    def expect(self, tag: MicrobatchTag, name: str) -> TensorSpec | None:
        """What each tensor of an incoming microbatch must be (None: not expected at all)."""
        if tag.direction == "forward" and not self.is_first:
            return {"activation": self._activation, "labels": self._labels}.get(name)
        if tag.direction == "backward" and not self.is_last:
            return self._activation if name == "gradient" else None
        return None

    def _check_tag(self, tag: MicrobatchTag) -> None:
        me, stage = self.host.node_id, self.stage
        if not 0 <= tag.microbatch < self.job.microbatches:
            raise TensorError(
                f"microbatch {tag.microbatch} is outside 0..{self.job.microbatches - 1}"
            )
        if tag.iteration >= self.job.iterations:
            raise TensorError(f"iteration {tag.iteration} is past the job's last")
        path = tag.path
        if tag.direction == "forward":
            if len(path) != stage or not path or path[-1] != tag.sender:
                raise TensorError(
                    f"a forward to stage {stage} must come from stage {stage - 1} with a path of "
                    f"{stage} nodes ending at its sender"
                )
        else:
            if len(path) != self.num_stages or path[stage] != me or path[stage + 1] != tag.sender:
                raise TensorError(
                    f"a backward to {me} must carry the microbatch's whole path, with {me} at "
                    f"stage {stage} and the sender after it"
                )
        for index, hop in enumerate(path):
            if self._participants.get(hop) != index:
                raise TensorError(f"{hop} is not a stage-{index} node of job {self.job_id}")

    async def _reach(self, iteration: int, deadline: float) -> None:
        """Wait until this node works on `iteration` (it may still be committing the one
        before); TensorError for an iteration that is over or too far ahead."""
        while True:
            if self._stopped:
                raise TensorError(f"job {self.job_id} has ended here")
            if iteration < self._it.number:
                raise TensorError(
                    f"iteration {iteration} is committed here (now at {self._it.number})"
                )
            if iteration > self._it.number + 1:
                raise TensorError(
                    f"iteration {iteration} is ahead of this node's {self._it.number}"
                )
            if iteration == self._it.number:
                return
            try:
                await self._wait_change(deadline)
            except TimeoutError:
                raise _busy(f"iteration {iteration - 1} did not commit here in time") from None

    async def on_tensors(self, tag: MicrobatchTag, tensors: dict[str, Tensor]) -> None:
        """The data plane's handler: a microbatch arrived (already checked against `expect`).
        Returns once the microbatch is taken (a forward needs a free slot); raises TensorError
        (answered INVALID_ARGUMENT) for one this node must refuse."""
        deadline = time.monotonic() + self.config.data_timeout_s
        if not self._started.is_set():
            try:
                await asyncio.wait_for(self._started.wait(), self.config.data_timeout_s)
            except TimeoutError:
                raise TensorError(f"job {self.job_id} has not started here") from None
        self._check_tag(tag)
        await self._reach(tag.iteration, deadline)
        it = self._it
        m = tag.microbatch
        if set(tensors) != ({"gradient"} if tag.direction == "backward" else
                            {"activation", "labels"}):
            raise TensorError(f"microbatch {m} lacks tensors: got {sorted(tensors)}")
        if tag.direction == "forward":
            labels = tensors["labels"]
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self._vocab):
                raise TensorError(f"labels of microbatch {m} are outside 0..{self._vocab - 1}")
            if m in it.forwards:
                raise TensorError(f"microbatch {m} of iteration {it.number} already came here")
            it.forwards.add(m)
            if not self.is_last:
                acquired = False
                try:
                    await asyncio.wait_for(self._free.acquire(), deadline - time.monotonic())
                    acquired = True
                except TimeoutError:
                    raise _busy(f"no memory slot freed up for microbatch {m}") from None
                finally:
                    if not acquired:
                        it.forwards.discard(m)
                if it is not self._it:
                    self._free.release()
                    raise TensorError(f"iteration {tag.iteration} ended while microbatch waited")
            it.paths[m] = (*tag.path, self.host.node_id)
            self.ledger.activation_received(m, tag.sender)
            self._spawn(self._forward(it, tag, tensors), f"forward {it.number}/{m}")
        else:
            if m in it.backwards or m not in it.forwards:
                raise TensorError(
                    f"a gradient of microbatch {m} of iteration {it.number} was not expected "
                    "here (no forward, or its gradient came already)"
                )
            receiver = self.ledger.activation_receiver(m)
            if receiver != tag.sender:
                raise TensorError(
                    f"microbatch {m}'s activation went to {receiver}, not to {tag.sender}"
                )
            it.backwards.add(m)
            it.paths[m] = tag.path  # the whole path: where this node's gradient goes
            self.ledger.gradient_received(m, tag.sender)
            self._spawn(self._backward(it, tag, tensors["gradient"]), f"backward {it.number}/{m}")

    async def _forward(
        self, it: _Iteration, tag: MicrobatchTag, tensors: dict[str, Tensor]
    ) -> None:
        m = tag.microbatch
        key = MicrobatchKey(self.job_id, it.number, m)
        activation, labels = tensors["activation"], tensors["labels"]
        share = 1.0 if self.is_last else FORWARD_SHARE
        try:
            result = await self._compute(
                _FORWARD,
                lambda: self.executor.forward(key, activation, labels if self.is_last else None),
                self._emulated(share),
            )
        except WorkerStopped:
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        if self.is_last:
            assert result.loss is not None and result.grad_input is not None
            it.losses[m] = result.loss
            path = it.paths[m]
            it.routes[path] = it.routes.get(path, 0) + 1
            self.ledger.accumulated(m)
            await self._send_backward(it, m, result.grad_input)
        else:
            assert result.output is not None
            await self._send_forward(it, m, {"activation": result.output, "labels": labels})

    async def _backward(self, it: _Iteration, tag: MicrobatchTag, gradient: Tensor) -> None:
        m = tag.microbatch
        key = MicrobatchKey(self.job_id, it.number, m)
        try:
            grad_input = await self._compute(
                _BACKWARD,
                lambda: self.executor.backward(key, gradient),
                self._emulated(1 - FORWARD_SHARE),
            )
        except WorkerStopped:
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run the backward of {key}: {err}")
            return
        finally:
            if not self._stopped and it is self._it:
                self._free.release()
        self.ledger.accumulated(m)
        if not self.is_first:
            assert grad_input is not None
            await self._send_backward(it, m, grad_input)
            return
        it.finished.add(m)
        if it.finished == set(it.mine):
            self.host.report_done(self.job_id, it.number, tuple(sorted(it.finished)))

    # ------------------------------------------------------------------ sending

    def _candidates(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for peer, stage in self._participants.items():
            if stage != self.stage + 1:
                continue
            member = self.host.member(peer)
            if member is not None:
                out[peer] = member.capacity
        return out

    async def _send_forward(self, it: _Iteration, m: int, tensors: dict[str, Tensor]) -> None:
        excluded: set[str] = set()
        for attempt in range(self.config.send_attempts):
            weights, source = self.host.next_hop_weights(self._candidates())
            target = self._rr.pick(weights, excluded) or self._rr.pick(weights)
            if target is None:  # no live next-stage node right now: wait a little
                await asyncio.sleep(self.config.retry_s * 2**attempt)
                continue
            self.route_sources[source] = self.route_sources.get(source, 0) + 1
            if await self._send(it, m, "forward", target, tensors, attempt):
                if it is self._it:
                    self.ledger.activation_sent(m, target)
                return
            excluded.add(target)
        self._fail(
            f"{self.host.node_id} found no stage-{self.stage + 1} node to take microbatch {m} "
            f"of iteration {it.number}"
        )

    async def _send_backward(self, it: _Iteration, m: int, gradient: Tensor) -> None:
        path = it.paths[m]
        target = path[self.stage - 1]
        for attempt in range(self.config.send_attempts):
            if await self._send(it, m, "backward", target, {"gradient": gradient}, attempt):
                # The iteration may have committed while the call returned (the gradient's
                # arrival upstream is what finishes it): the record is then moot.
                if it is self._it:
                    self.ledger.gradient_sent(m, target)
                return
        self._fail(
            f"{self.host.node_id} could not send the gradient of microbatch {m} of iteration "
            f"{it.number} to {target}"
        )

    async def _send(
        self,
        it: _Iteration,
        m: int,
        direction: str,
        target: str,
        tensors: dict[str, Tensor],
        attempt: int,
    ) -> bool:
        """One attempt: True once `target` took the microbatch. A refusal fails the job."""
        if attempt:
            await asyncio.sleep(self.config.retry_s * 2 ** (attempt - 1))
        member = self.host.member(target)
        if member is None or self._stopped or it is not self._it:
            return False
        tag = MicrobatchTag(
            job_id=self.job_id,
            iteration=it.number,
            microbatch=m,
            direction=direction,
            sender=self.host.node_id,
            path=it.paths[m],
            attempt=attempt,
        )
        it.kept[(m, direction)] = (target, tensors)

        async def wan(nbytes: int) -> None:
            delay = self.host.wan_delay(member, nbytes)
            if delay > 0:
                await asyncio.sleep(delay)

        try:
            await send(
                self.host.data_stub(member), tag, tensors,
                timeout=self.config.data_timeout_s, delay=wan,
            )
        except aio.AioRpcError as err:
            if err.code() in _FINAL_CODES:
                self._fail(f"{target} refused microbatch {m} of iteration {it.number}: "
                           f"{err.details()}")
                return False
            self.host.log.warning(
                "job %s it %d mb %d: %s to %s failed (%s), attempt %d",
                self.job_id, it.number, m, direction, target, err.code().name, attempt + 1,
            )
            return False
        except TensorError as err:
            self._fail(f"microbatch {m} of iteration {it.number} could not be sent: {err}")
            return False
        return True

    # ------------------------------------------------------------------ commit

    def contribution_numel(self, header: ContributionHeader) -> int:
        """Checks a peer's contribution header; the number of values it must carry."""
        if not self._started.is_set():
            # The start and the first commit travel on different calls: the sender retries.
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"job {self.job_id} has not started here")
        if header.job_id != self.job_id:
            raise ContributionError(f"the contribution is for job {header.job_id[:40]!r}")
        if (
            self._participants.get(header.sender) != self.stage
            or header.stage != self.stage
            or header.sender == self.host.node_id
        ):
            raise ContributionError(
                f"{header.sender[:40]!r} is not a stage-{self.stage} replica of job {self.job_id}"
            )
        if header.dtype != self.job.grad_accum:
            raise ContributionError(
                f"gradient sums must be {self.job.grad_accum}, not {header.dtype}"
            )
        if not self._it.number <= header.iteration <= self._it.number + 1:
            raise ContributionError(
                f"a contribution for iteration {header.iteration} cannot be used at "
                f"iteration {self._it.number}"
            )
        if any(not 0 <= mb < self.job.microbatches for mb in header.microbatches):
            raise ContributionError("the contribution names microbatches outside the job's")
        return self._numel

    def on_contribution(self, header: ContributionHeader, flat: Tensor) -> None:
        """A stage peer's gradient sums for this iteration (or the next)."""
        self.contribution_numel(header)
        it = self._it if header.iteration == self._it.number else None
        store = it.contributions if it is not None else self._early
        if header.sender in store:
            raise ContributionError(
                f"{header.sender} sent two contributions for iteration {header.iteration}"
            )
        store[header.sender] = GradContribution(
            node_id=header.sender,
            stage=self.stage,
            iteration=header.iteration,
            microbatch_ids=header.microbatches,
            grad_sums=unflatten(flat, self._shapes) if header.microbatches else {},
        )
        self._signal()

    def order_commit(self, order: CommitOrder) -> None:
        """The coordinator's order to commit an iteration. Orders are carried out in iteration
        order, whatever order they arrive in; a repeated one is ignored."""
        if order.iteration < self._it.number or self._stopped:
            return
        self._orders[order.iteration] = order
        if not self._committing:
            self._committing = True
            self._spawn(self._commits(), "commits")

    async def _commits(self) -> None:
        try:
            try:
                await asyncio.wait_for(self._started.wait(), self.config.commit_timeout_s)
            except TimeoutError:
                self._fail(f"job {self.job_id} was ordered to commit but never started on "
                           f"{self.host.node_id}")
                return
            while self._it.number in self._orders and not self._stopped:
                order = self._orders.pop(self._it.number)
                try:
                    if not await self._commit(order):
                        return
                except WorkerStopped:
                    return
                except (CombineError, ExecutorError, ContributionError) as err:
                    self._fail(
                        f"stage {self.stage} could not commit iteration {order.iteration} on "
                        f"{self.host.node_id}: {err}"
                    )
                    return
                except TimeoutError:
                    missing = sorted(set(self._peers()) - set(self._it.contributions))
                    self._fail(
                        f"{self.host.node_id} waited {self.config.commit_timeout_s:g} s for the "
                        f"gradient sums of {', '.join(missing)} for iteration {order.iteration}"
                    )
                    return
        finally:
            self._committing = False

    def _peers(self) -> list[str]:
        me = self.host.node_id
        return sorted(p for p, s in self._participants.items() if s == self.stage and p != me)

    async def _commit(self, order: CommitOrder) -> bool:
        """False when the job failed meanwhile."""
        deadline = time.monotonic() + self.config.commit_timeout_s
        it = self._it
        me = self.host.node_id
        mine = await self._compute(_COMMIT, lambda: self.executor.contribution(me))
        names = sorted(self._shapes)
        flat = flatten(mine.grad_sums, names, self._grad_dtype)
        header = ContributionHeader(
            sender=me,
            job_id=self.job_id,
            iteration=it.number,
            stage=self.stage,
            microbatches=mine.microbatch_ids,
            dtype=self.job.grad_accum,
            numel=flat.numel(),
        )
        peers = self._peers()
        sends = [self._contribute(peer, header, flat, deadline) for peer in peers]
        results = await asyncio.gather(*sends)
        if not all(results):
            return False
        while set(it.contributions) != set(peers):
            await self._wait_change(deadline)
        contributions = [mine, *it.contributions.values()]
        expected = order.microbatches

        def step() -> tuple[str, dict[str, str]]:
            aggregated = combine_contributions(contributions, expected_ids=expected)
            checksum = self.executor.commit(aggregated)
            return checksum, self.executor.digests() if order.final else {}

        checksum, digests = await self._compute(_COMMIT, step)
        report = CommittedReport(
            sender=me,
            iteration=it.number,
            stage=self.stage,
            checksum=checksum,
            losses=dict(it.losses),
            routes=dict(it.routes),
            digests=digests,
        )
        self._advance(order)
        self.host.report_committed(self.job_id, report)
        return True

    def _advance(self, order: CommitOrder) -> None:
        number = order.iteration + 1
        self._it = _Iteration(number, contributions=self._early)
        self._early = {}
        self.ledger.reset(number)
        self._signal()
        if not order.final:
            self._begin(order.next_holders)

    async def _contribute(
        self, peer: str, header: ContributionHeader, flat: Tensor, deadline: float
    ) -> bool:
        for attempt in range(self.config.send_attempts):
            if attempt:
                await asyncio.sleep(self.config.retry_s * 2 ** (attempt - 1))
            member = self.host.member(peer)
            if member is None or self._stopped:
                break
            nbytes = flat.numel() * flat.element_size()
            delay = self.host.wan_delay(member, nbytes)
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.host.job_stub(member).Contribute(
                    encode(header, flat), timeout=max(0.001, deadline - time.monotonic())
                )
                return True
            except aio.AioRpcError as err:
                if err.code() in _FINAL_CODES:
                    self._fail(f"{peer} refused the gradient sums of {header.sender} for "
                               f"iteration {header.iteration}: {err.details()}")
                    return False
        self._fail(f"{peer} did not take the gradient sums of {header.sender} for iteration "
                   f"{header.iteration}")
        return False
