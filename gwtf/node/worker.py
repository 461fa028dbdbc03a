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

from gwtf.job.iterations import (
    CommitOrder,
    CommittedReport,
    PreparedReport,
    StepOrder,
    assign,
)
from gwtf.job.nexthop import SmoothRoundRobin
from gwtf.node.errors import Refusal
from gwtf.node.faults import Fault
from gwtf.node.gradsync import (
    ContributionError,
    ContributionHeader,
    encode,
    flatten,
    unflatten,
)
from gwtf.node.membership import MemberInfo
from gwtf.node.observe import JobMetrics, job_event
from gwtf.node.tensors import DataPlaneStub, MicrobatchTag, TensorError, TensorSpec, send
from gwtf.node.transport import is_refused
from gwtf.recovery import Ledger, Mode, NeighbourReport, Rule
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
    job_corpus,
    job_microbatch,
)
from gwtf.train.device import Placement
from gwtf.train.robust import aggregate, norm_outliers
from gwtf.v1 import job_pb2, job_pb2_grpc

__all__ = ["LastStep", "StageWorker", "WorkerConfig", "WorkerHost", "WorkerStopped"]

T = TypeVar("T")

FORWARD_SHARE = 1 / 3
"""Share of a microbatch's compute that is its forward (backward is about twice the forward)."""

# Compute priorities: lower runs first.
_COMMIT, _BACKWARD, _FORWARD, _INJECT = 0, 1, 2, 3
_KIND = {_COMMIT: "commit", _BACKWARD: "backward", _FORWARD: "forward", _INJECT: "forward"}
"""The `kind` label of gwtf_job_compute_seconds per priority (the last stage's forward: loss)."""
# gRPC codes of a peer that will refuse a resend too: a bug or a mismatch, never a transient.
_FINAL_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
)
# Outcomes of one send attempt.
_SENT, _BUSY, _RETRY, _GIVE_UP = range(4)
# Sends refused by a node that no longer takes part in the job, before this node has heard that
# it left or was excluded: with the backoff, several seconds for the news to arrive.
_UNHEARD_ATTEMPTS = 8


class WorkerStopped(Exception):
    """The job ended (completed, failed or aborted) while something was waiting on it."""


class _Stale(Exception):
    """The iteration (or its round) moved on while this work waited: its result is moot."""


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
    """Sends of a contribution to a peer that does not answer (UNAVAILABLE)."""
    retry_s: float = 0.2
    """First wait before a resend; doubles each attempt, up to `retry_max_s`."""
    retry_max_s: float = 1.0


@dataclass(frozen=True)
class LastStep:
    """The last step this node took (a coordinator that takes over asks for it)."""

    iteration: int
    loss: float
    trained: int
    dropped: tuple[int, ...]


class WorkerHost(Protocol):
    """What the worker needs from its node (gwtf.node.jobs implements it)."""

    node_id: str
    log: logging.LoggerAdapter[logging.Logger]
    metrics: JobMetrics

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member with this id (None: dead, left or unknown)."""
        ...

    def refused(self, member: MemberInfo) -> None:
        """A call to `member` was refused: evidence for the node's failure detector."""
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

    def report_done(self, job_id: str, iteration: int, round_: int, microbatches: tuple[int, ...]
                    ) -> None:
        """These microbatches finished at this holder: tell the coordinator."""
        ...

    def report_replayed(self, job_id: str, iteration: int, round_: int, mb: int, stage: int
                        ) -> None:
        """This node replayed a dead node's microbatch (rule 3): tell the coordinator."""
        ...

    def report_prepared(self, job_id: str, report: PreparedReport) -> None:
        """Phase one of a commit is done here: tell the coordinator."""
        ...

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """This node committed an iteration: tell the coordinator."""
        ...

    async def keep_backup(self, job_id: str, stage: int, iteration: int, state: bytes) -> None:
        """Keep this lone replica's state (of the start of `iteration`) at another node, so
        that a node joining the stage finds it if this one dies; returns once it is kept (or
        could not be)."""
        ...

    def fail(self, job_id: str, reason: str) -> None:
        """The job cannot go on (one sentence): stop it everywhere."""
        ...


@dataclass
class _Iteration:
    """What this node holds of the iteration in progress (reset at each step and restart)."""

    number: int
    round: int = 0
    mine: tuple[int, ...] = ()
    """Holders: the microbatches this node injects."""
    finished: set[int] = field(default_factory=set)
    """Holders: microbatches whose gradient came back here."""
    forwards: dict[int, str] = field(default_factory=dict)
    """Microbatches whose forward is here, and who sent it ("" for one this holder built)."""
    backwards: dict[int, str] = field(default_factory=dict)
    """Microbatches whose gradient came here, and who sent it."""
    modes: dict[int, Mode] = field(default_factory=dict)
    recovered: set[int] = field(default_factory=set)
    """Microbatches that came here to redo a dead node's work (any rule)."""
    fwd_done: dict[int, asyncio.Event] = field(default_factory=dict)
    """Set when the microbatch's forward is done here: its backward waits for it (a recovered
    microbatch's gradient may come before the replacement recomputed its forward)."""
    paths: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The path of each microbatch up to and including this node (the whole path once its
    gradient came; this node's own prefix is kept, a redirect rewrites the stage above)."""
    losses: dict[int, float] = field(default_factory=dict)
    routes: dict[tuple[str, ...], int] = field(default_factory=dict)
    kept: dict[tuple[int, str], tuple[str, dict[str, Tensor]]] = field(default_factory=dict)
    """(microbatch, direction) -> (receiver, tensors) of every send: what a recovery resends."""
    sending: set[tuple[int, str]] = field(default_factory=set)
    """Sends with a loop running (a redirect only changes its target)."""
    attempt: int = 0
    """The latest commit attempt ordered here."""
    prepared: tuple[CommitOrder, list[GradContribution]] | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


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
        self._emulate_s = emulate_compute_s
        self._free = asyncio.Semaphore(slots)
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gwtf-compute", initializer=torch.set_num_threads,
            initargs=(1,),
        )
        self._queue: asyncio.PriorityQueue[
            tuple[int, int, Callable[[], Any], float, asyncio.Future[Any], _Iteration | None]
        ] = asyncio.PriorityQueue()
        self._seq = 0
        self._participants: dict[str, int] = {}
        """Every node that took part in the job (a dead one too: paths still name it)."""
        self._departed: set[str] = set()
        self._excluded: set[str] = set()
        """Bad peers excluded from the job: departed for good, and nothing they send is taken."""
        self._started = asyncio.Event()
        self._changed = asyncio.Event()
        """Set (and replaced) whenever the iteration advances or contributions arrive."""
        self._it = _Iteration(executor.iteration)
        self._sums: dict[tuple[int, int, int], dict[str, GradContribution]] = {}
        """(iteration, round, attempt) -> the stage peers' gradient sums for that attempt."""
        self._restarts: dict[
            int, tuple[int, tuple[str, ...], Mapping[str, int] | None]
        ] = {}
        """Restarts ordered for an iteration this node has not reached yet."""
        self.ledger = Ledger(host.node_id, self.stage, executor.iteration)
        self._rr = SmoothRoundRobin()
        self.route_sources: dict[str, int] = {}
        """How many next hops came from the flows and how many from capacities."""
        self.last_step: LastStep | None = None
        self.rerouted = 0
        """Microbatches this node resent to a replacement (rules 1-3)."""
        self._stopped = False
        self.busy_s = 0.0
        """Seconds the compute thread was busy (with the emulated padding)."""
        self._reported = (0.0, 0.0)
        """(compute, replayed) seconds already reported to the coordinator."""
        self._abandoned_s = 0.0
        """Compute of rounds that started over, not reported yet."""
        self._round_start_s = 0.0
        """The executor's compute seconds when the round in progress began."""
        self._since = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        batch = (job.microbatch_size, job.model.seq_len)
        self._activation = _spec(torch.float32, (*batch, job.model.width))
        self._labels = _spec(torch.int64, batch)
        self._vocab = job.model.vocab
        self._shapes = {name: tuple(p.shape) for name, p in executor.parameters().items()}
        self._numel = sum(p.numel() for p in executor.parameters().values())
        self._grad_dtype = torch.float64 if job.grad_accum == "float64" else torch.float32
        self._metrics = host.metrics
        self._metrics.start(self.job_id)
        self._metrics.set("gwtf_job_iteration", self.job_id, executor.iteration)
        self._tasks.add(asyncio.get_running_loop().create_task(self._compute_loop()))

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

    @property
    def iteration(self) -> int:
        return self._it.number

    @property
    def round(self) -> int:
        return self._it.round

    @property
    def corpus_digest(self) -> str:
        return self.corpus.digest if self.corpus is not None else ""

    @property
    def participants(self) -> dict[str, int]:
        return dict(self._participants)

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
        self._since = time.monotonic()
        self._participants.update(participants)
        self._it.round = round_
        self._started.set()
        self._begin(holders, weights)

    def admit(self, participants: Mapping[str, int]) -> None:
        """Who takes part now (a node joined the job)."""
        self._participants.update(participants)
        self._signal()

    def depart(self, node: str) -> None:
        """`node` died or left: no microbatch goes to it (nor to a new process under its id,
        until the coordinator admits that one)."""
        self._departed.add(node)

    def exclude(self, node: str) -> None:
        """`node` was excluded from the job as a bad peer."""
        self._excluded.add(node)
        self._departed.add(node)

    def undepart(self, node: str) -> None:
        self._departed.discard(node)

    async def stop(self) -> None:
        """The job ended: stop computing and sending, free the model."""
        if self._stopped:
            return
        self._stopped = True
        self._signal()
        stats = self.executor.stats
        wall = time.monotonic() - self._since
        self.host.log.info(
            "job %s stage %d: %d forwards, %d recomputes, %d backwards, torch %.2f s (replayed "
            "%.2f s), busy %.2f s (%.0f%% of %.1f s); next hops %s", self.job_id, self.stage,
            stats.forwards, stats.recomputes, stats.backwards, stats.compute_s,
            stats.replayed_s, self.busy_s, 100 * self.busy_s / max(wall, 1e-9), wall,
            ", ".join(f"{n} from {k}" for k, n in sorted(self.route_sources.items())) or "none",
        )
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while not self._queue.empty():
            *_, future, _ = self._queue.get_nowait()
            future.cancel()
        self._metrics.set("gwtf_job_queue_depth", self.job_id, 0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str, it: _Iteration | None = None
               ) -> None:
        task = self.host.spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if it is not None:
            it.tasks.add(task)
            task.add_done_callback(it.tasks.discard)

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

    def _current(self, it: _Iteration) -> bool:
        return it is self._it and not self._stopped

    def _hit(self, point: str, iteration: int, microbatch: int | None = None) -> None:
        if self.fault is not None:
            self.fault.hit(point, iteration, microbatch)

    # ------------------------------------------------------------------ compute

    async def _compute(
        self,
        priority: int,
        work: Callable[[], T],
        emulate_s: float = 0.0,
        it: _Iteration | None = None,
    ) -> T:
        """Run `work` on the compute thread. With `it`: _Stale if that iteration (round) is over
        before the work starts or when it ends (its result is then moot)."""
        if self._stopped:
            raise WorkerStopped
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._seq += 1
        self._queue.put_nowait((priority, self._seq, work, emulate_s, future, it))
        self._metrics.set("gwtf_job_queue_depth", self.job_id, self._queue.qsize())
        result = await future
        if it is not None and not self._current(it):
            raise _Stale
        return result

    async def _compute_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            priority, _, work, emulate_s, future, it = await self._queue.get()
            self._metrics.set("gwtf_job_queue_depth", self.job_id, self._queue.qsize())
            if future.cancelled():
                continue
            if it is not None and it is not self._it:
                future.set_exception(_Stale())
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
            took = loop.time() - start
            self.busy_s += took
            kind = "loss" if self.is_last and priority == _FORWARD else _KIND[priority]
            self._metrics.observe("gwtf_job_compute_seconds", self.job_id, took, kind)
            if not future.cancelled():
                future.set_result(result)

    def _emulated(self, share: float) -> float:
        return self._emulate_s * share if self._emulate_s is not None else 0.0

    def compute_delta(self) -> tuple[float, float]:
        """(compute, wasted) seconds since the last call: what the next report carries. Wasted
        is the work done again for a dead node (recompute, replay, resend) and the work of
        rounds that started over."""
        stats = self.executor.stats
        compute, replayed = self._reported
        self._reported = (stats.compute_s, stats.replayed_s)
        abandoned, self._abandoned_s = self._abandoned_s, 0.0
        return stats.compute_s - compute, stats.replayed_s - replayed + abandoned

    # ------------------------------------------------------------------ injecting (holders)

    def _begin(self, holders: tuple[str, ...], weights: Mapping[str, int] | None = None) -> None:
        if not self.is_first or self.host.node_id not in holders:
            return
        it = self._it
        it.mine = assign(self.job.microbatches, holders, weights)[self.host.node_id]
        self._spawn(self._inject(it), f"inject {it.number}", it)

    async def _inject(self, it: _Iteration) -> None:
        for m in it.mine:
            free = self._free  # a restart replaces it: a slot goes back where it came from
            await free.acquire()
            if not self._current(it):
                free.release()
                return
            it.forwards[m] = ""
            it.paths[m] = (self.host.node_id,)
            it.modes[m] = Mode.FORWARD
            it.fwd_done[m] = asyncio.Event()
            self._spawn(self._own_forward(it, m), f"forward {it.number}/{m}", it)

    async def _own_forward(self, it: _Iteration, m: int) -> None:
        key = MicrobatchKey(self.job_id, it.number, m)
        corpus = self.corpus
        assert corpus is not None
        mode = it.modes[m]

        def work() -> tuple[Tensor, Tensor]:
            self._hit("forward", key.iteration, m)
            tokens, labels = job_microbatch(corpus, self.job, key.iteration, m)
            run = self.executor.forward if mode == Mode.FORWARD else self.executor.recompute
            result = run(key, tokens)
            assert result.output is not None
            return result.output, labels

        try:
            output, labels = await self._compute(
                _INJECT if mode == Mode.FORWARD else _FORWARD, work,
                self._emulated(FORWARD_SHARE), it,
            )
        except (WorkerStopped, _Stale):
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        it.fwd_done[m].set()
        self._forward_done(it, m, mode)
        tensors = {"activation": output, "labels": labels}
        if mode == Mode.FORWARD:
            await self._send_forward(it, m, tensors)
        else:
            downstream = self.ledger.activation_receiver(m)
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

    def _check_tag(self, tag: MicrobatchTag) -> None:
        me, stage = self.host.node_id, self.stage
        if not 0 <= tag.microbatch < self.job.microbatches:
            raise TensorError(
                f"microbatch {tag.microbatch} is outside 0..{self.job.microbatches - 1}"
            )
        if tag.iteration >= self.job.iterations:
            raise TensorError(f"iteration {tag.iteration} is past the job's last")
        if tag.sender in self._excluded:
            raise TensorError(f"{tag.sender} was excluded from job {self.job_id} as a bad peer")
        path = tag.path
        if tag.direction == "forward":
            if len(path) != stage or not path or path[-1] != tag.sender:
                raise TensorError(
                    f"a forward to stage {stage} must come from stage {stage - 1} with a path of "
                    f"{stage} nodes ending at its sender"
                )
            if self.is_last:
                # Forward and backward are one step here: a replay needs no next stage, and
                # there is nothing to recompute apart.
                if tag.mode == Mode.RECOMPUTE or tag.downstream:
                    raise TensorError(
                        f"the last stage replays microbatch {tag.microbatch} whole: no recompute "
                        "and no downstream node"
                    )
            elif tag.mode != Mode.FORWARD and (
                self._participants.get(tag.downstream) != stage + 1
            ):
                raise TensorError(
                    f"a recompute or replay of microbatch {tag.microbatch} must name its "
                    f"stage-{stage + 1} node"
                )
            elif tag.mode == Mode.FORWARD and tag.downstream:
                raise TensorError("an ordinary forward names no downstream node")
        else:
            if len(path) != self.num_stages or path[stage] != me or path[stage + 1] != tag.sender:
                raise TensorError(
                    f"a backward to {me} must carry the microbatch's whole path, with {me} at "
                    f"stage {stage} and the sender after it"
                )
        for index, hop in enumerate(path):
            if self._participants.get(hop) != index:
                raise TensorError(f"{hop} is not a stage-{index} node of job {self.job_id}")

    async def _reach(self, iteration: int, round_: int, deadline: float) -> None:
        """Wait until this node works on `iteration` in `round_` (it may still be committing the
        one before, or not know of the restart yet); TensorError for one that is over."""
        while True:
            if self._stopped:
                raise TensorError(f"job {self.job_id} has ended here")
            it = self._it
            if (iteration, round_) < (it.number, it.round):
                raise TensorError(
                    f"iteration {iteration} round {round_} is over here (now at {it.number} "
                    f"round {it.round})"
                )
            if iteration > it.number + 1:
                raise TensorError(
                    f"iteration {iteration} is ahead of this node's {it.number}"
                )
            if (iteration, round_) == (it.number, it.round):
                return
            try:
                await self._wait_change(deadline)
            except TimeoutError:
                raise _busy(
                    f"this node did not reach iteration {iteration} round {round_} in time"
                ) from None

    async def on_tensors(self, tag: MicrobatchTag, tensors: dict[str, Tensor]) -> None:
        """The data plane's handler: a microbatch arrived (already checked against `expect`).
        Returns once the microbatch is taken (a forward needs a free slot); raises TensorError
        (answered INVALID_ARGUMENT) for one this node must refuse. A repeated send of a
        microbatch already taken from the same sender is taken again, with no effect."""
        deadline = time.monotonic() + self.config.data_timeout_s
        if not self._started.is_set():
            try:
                await asyncio.wait_for(self._started.wait(), self.config.data_timeout_s)
            except TimeoutError:
                raise TensorError(f"job {self.job_id} has not started here") from None
        self._check_tag(tag)
        await self._reach(tag.iteration, tag.round, deadline)
        it = self._it
        m = tag.microbatch
        if set(tensors) != ({"gradient"} if tag.direction == "backward" else
                            {"activation", "labels"}):
            raise TensorError(f"microbatch {m} lacks tensors: got {sorted(tensors)}")
        if tag.direction == "forward":
            await self._take_forward(it, tag, tensors, deadline)
        else:
            self._take_backward(it, tag, tensors["gradient"])
        self._count_data("received", tag.direction, tensors)

    async def _take_forward(
        self, it: _Iteration, tag: MicrobatchTag, tensors: dict[str, Tensor], deadline: float
    ) -> None:
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
            free = self._free  # a restart replaces it: a slot goes back where it came from
            try:
                await asyncio.wait_for(free.acquire(), deadline - time.monotonic())
                acquired = True
            except TimeoutError:
                raise _busy(f"no memory slot freed up for microbatch {m}") from None
            finally:
                if not acquired and it.forwards.get(m) == tag.sender:
                    del it.forwards[m]
            if not self._current(it):
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
        self.ledger.activation_received(m, tag.sender)
        if mode != Mode.FORWARD and not self.is_last:
            # The replacement keeps the input of the next-stage node that holds the microbatch
            # (ledger docs), and asks it for the gradient at once: the recompute runs meanwhile.
            self.ledger.activation_sent(m, tag.downstream)
            self._spawn(self._redirect(it, m, tag.downstream, mode), f"redirect {m}", it)
        self._spawn(self._forward(it, m, tensors), f"forward {it.number}/{m}", it)

    def _take_backward(self, it: _Iteration, tag: MicrobatchTag, gradient: Tensor) -> None:
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
        receiver = self.ledger.activation_receiver(m)
        if receiver != tag.sender:
            raise TensorError(
                f"microbatch {m}'s activation went to {receiver}, not to {tag.sender}"
            )
        it.backwards[m] = tag.sender
        # This node's own prefix (a redirect may have rewritten the stage above), the rest from
        # the sender: where the microbatch went after this node.
        it.paths[m] = (*it.paths[m][: self.stage + 1], *tag.path[self.stage + 1 :])
        self.ledger.gradient_received(m, tag.sender)
        self._spawn(self._backward(it, m, gradient), f"backward {it.number}/{m}", it)

    async def _forward(self, it: _Iteration, m: int, tensors: dict[str, Tensor]) -> None:
        key = MicrobatchKey(self.job_id, it.number, m)
        activation, labels = tensors["activation"], tensors["labels"]
        mode = it.modes[m]
        share = 1.0 if self.is_last else FORWARD_SHARE
        redo = mode != Mode.FORWARD or m in it.recovered
        run = self.executor.recompute if redo else self.executor.forward

        def work() -> Any:
            self._hit("forward", key.iteration, m)
            if self.is_last:  # forward and backward are one step here
                self._hit("backward", key.iteration, m)
            return run(key, activation, labels if self.is_last else None)

        try:
            result = await self._compute(_FORWARD, work, self._emulated(share), it)
        except (WorkerStopped, _Stale):
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run microbatch {key}: {err}")
            return
        self._forward_done(it, m, mode)
        if self.is_last:
            assert result.loss is not None and result.grad_input is not None
            it.losses[m] = result.loss
            path = it.paths[m]
            it.routes[path] = it.routes.get(path, 0) + 1
            self.ledger.accumulated(m)
            self._hit("after-backward", key.iteration, m)
            if mode == Mode.REPLAY:
                self._replayed(it, m)
                return
            await self._send_backward(it, m, result.grad_input)
            return
        assert result.output is not None
        it.fwd_done[m].set()
        out = {"activation": result.output, "labels": labels}
        if mode == Mode.FORWARD:
            await self._send_forward(it, m, out)
        else:
            downstream = self.ledger.activation_receiver(m)
            assert downstream is not None
            it.kept[(m, "forward")] = (downstream, out)

    async def _backward(self, it: _Iteration, m: int, gradient: Tensor) -> None:
        key = MicrobatchKey(self.job_id, it.number, m)
        await it.fwd_done[m].wait()
        if not self._current(it):
            return

        def work() -> Tensor | None:
            self._hit("backward", key.iteration, m)
            return self.executor.backward(key, gradient)

        try:
            grad_input = await self._compute(
                _BACKWARD, work, self._emulated(1 - FORWARD_SHARE), it,
            )
        except (WorkerStopped, _Stale):
            return
        except ExecutorError as err:
            self._fail(f"{self.host.node_id} could not run the backward of {key}: {err}")
            return
        finally:
            if self._current(it):
                self._free.release()
        self.ledger.accumulated(m)
        self.host.log.debug(
            "job %s it %d mb %d: backward done at stage %d", self.job_id, it.number, m,
            self.stage, extra=job_event(self.job_id, it.number, m),
        )
        self._hit("after-backward", key.iteration, m)
        if it.modes.get(m) == Mode.REPLAY:
            self._replayed(it, m)
            return
        if not self.is_first:
            assert grad_input is not None
            await self._send_backward(it, m, grad_input)
            return
        it.finished.add(m)
        self.host.report_done(self.job_id, it.number, it.round, (m,))

    def _forward_done(self, it: _Iteration, m: int, mode: Mode) -> None:
        self.host.log.debug(
            "job %s it %d mb %d: forward%s done at stage %d (%s)", self.job_id, it.number, m,
            " and backward" if self.is_last else "", self.stage, mode.name.lower(),
            extra=job_event(self.job_id, it.number, m),
        )
        if mode == Mode.RECOMPUTE:
            self._metrics.count("gwtf_job_replays", self.job_id, "recompute")

    def _count_data(self, verb: str, direction: str, tensors: Mapping[str, Tensor]) -> None:
        """A microbatch `verb` (sent, received) on the data plane, and its payload bytes."""
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self._metrics.count(f"gwtf_job_microbatches_{verb}", self.job_id, direction)
        self._metrics.count(f"gwtf_job_bytes_{verb}", self.job_id, direction, nbytes)

    def _replayed(self, it: _Iteration, m: int) -> None:
        self._metrics.count("gwtf_job_replays", self.job_id, "replay")
        self.host.log.info(
            "job %s it %d mb %d: replayed stage %d here (rule 3)", self.job_id, it.number, m,
            self.stage, extra=job_event(self.job_id, it.number, m),
        )
        self.host.report_replayed(self.job_id, it.number, it.round, m, self.stage)

    # ------------------------------------------------------------------ sending

    def _candidates(self, exclude: str = "") -> dict[str, float]:
        out: dict[str, float] = {}
        for peer, stage in self._participants.items():
            if stage != self.stage + 1 or peer == exclude or peer in self._departed:
                continue
            member = self.host.member(peer)
            if member is not None:
                out[peer] = member.capacity
        return out

    def _backoff(self, attempt: int) -> float:
        return float(min(self.config.retry_max_s, self.config.retry_s * 2 ** max(0, attempt)))

    async def _send_forward(
        self,
        it: _Iteration,
        m: int,
        tensors: dict[str, Tensor],
        *,
        mode: Mode = Mode.FORWARD,
        dead: str = "",
        downstream: str = "",
    ) -> None:
        """Send `m`'s activation to a next-stage node picked by the flows (for a recovery, with
        `mode`, never to `dead`). The send is on the record before it leaves; a receiver that
        dies with it is left to the recovery of its death (the record is the evidence)."""
        excluded: set[str] = set()
        attempt = 0
        waited = False
        while self._current(it):
            weights, source = self.host.next_hop_weights(self._candidates(exclude=dead))
            target = self._rr.pick(weights, excluded) or self._rr.pick(weights)
            if target is None:
                if mode != Mode.FORWARD and not waited:
                    self.host.log.warning(
                        "job %s it %d mb %d: stage %d has no live node; the recovery waits for "
                        "one to join (rule 5)", self.job_id, it.number, m, self.stage + 1,
                        extra=job_event(self.job_id, it.number, m),
                    )
                    waited = True
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1
                continue
            self.route_sources[source] = self.route_sources.get(source, 0) + 1
            self.ledger.activation_sent(m, target, mode)
            outcome = await self._send(
                it, m, "forward", target, tensors, attempt, mode=mode, downstream=downstream,
                recovered_from=dead,
            )
            if outcome == _SENT:
                if mode != Mode.FORWARD or dead:
                    self.rerouted += 1
                    rule = Rule(int(mode) + 1 if mode else 1).name
                    self._metrics.count("gwtf_job_reroutes", self.job_id, rule.lower())
                    self.host.log.info(
                        "job %s it %d mb %d: rerouted from dead %s to %s (%s)", self.job_id,
                        it.number, m, dead, target, rule,
                        extra=job_event(self.job_id, it.number, m),
                    )
                return
            if outcome == _GIVE_UP or self.ledger.activation_receiver(m) != target:
                return
            if outcome == _BUSY:
                excluded.add(target)  # it did not take it: another node may
            elif self.host.member(target) is None:
                return  # it died with the microbatch: the recovery of its death resends it
            attempt += 1

    async def _send_backward(self, it: _Iteration, m: int, gradient: Tensor) -> None:
        """Send `m`'s input gradient to the node of the stage above on its path; a redirect
        changes that node while this runs. Kept for a resend until the iteration steps."""
        key = (m, "backward")
        target = it.paths[m][self.stage - 1]
        it.kept[key] = (target, {"gradient": gradient})
        if key in it.sending:
            return
        it.sending.add(key)
        try:
            attempt = 0
            while self._current(it):
                target = it.paths[m][self.stage - 1]
                self.ledger.gradient_sent(m, target)
                outcome = await self._send(
                    it, m, "backward", target, {"gradient": gradient}, attempt
                )
                if outcome == _GIVE_UP:
                    return
                if outcome == _SENT and it.paths[m][self.stage - 1] == target:
                    return
                if outcome != _SENT and self.host.member(target) is None and (
                    it.paths[m][self.stage - 1] == target
                ):
                    return  # dead: a recovery will redirect this gradient (it is kept)
                attempt += 1
        finally:
            it.sending.discard(key)

    async def _send(
        self,
        it: _Iteration,
        m: int,
        direction: str,
        target: str,
        tensors: dict[str, Tensor],
        attempt: int,
        *,
        mode: Mode = Mode.FORWARD,
        downstream: str = "",
        recovered_from: str = "",
    ) -> int:
        """One attempt: _SENT once `target` took the microbatch, _BUSY when it refused it for
        now, _RETRY on a failed call, _GIVE_UP when the job failed or the iteration moved on."""
        if attempt:
            await asyncio.sleep(self._backoff(attempt - 1))
        if not self._current(it):
            return _GIVE_UP
        member = self.host.member(target)
        if member is None:
            return _RETRY
        tag = MicrobatchTag(
            job_id=self.job_id,
            iteration=it.number,
            microbatch=m,
            direction=direction,
            sender=self.host.node_id,
            # Forward: the path up to this node (a resend after the gradient came back knows
            # the whole path); backward: all of it.
            path=it.paths[m][: self.stage + 1] if direction == "forward" else it.paths[m],
            attempt=attempt,
            mode=int(mode),
            round=it.round,
            downstream=downstream,
            recovered_from=recovered_from,
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
            if not self._current(it):
                return _GIVE_UP
            if err.code() in _FINAL_CODES:
                if "is over here" in (err.details() or ""):
                    return _GIVE_UP  # the receiver moved on (a restart): so will this node
                if "does not take part" in (err.details() or "") and (
                    target in self._departed or attempt < _UNHEARD_ATTEMPTS
                ):
                    # The receiver stopped its part: it was excluded or it left, and that news
                    # reaches every node a moment later. Until then the tensors are kept and
                    # sent again; once it is heard, the recovery of that departure redirects
                    # them (the same as for a death). Refused on and on, unheard of, it fails.
                    self.host.log.info(
                        "job %s it %d mb %d: %s no longer takes part in the job; the %s is "
                        "kept for its recovery", self.job_id, it.number, m, target, direction,
                        extra=job_event(self.job_id, it.number, m),
                    )
                    return _RETRY
                self._fail(f"{target} refused microbatch {m} of iteration {it.number}: "
                           f"{err.details()}")
                return _GIVE_UP
            self.host.log.warning(
                "job %s it %d mb %d: %s to %s failed (%s), attempt %d",
                self.job_id, it.number, m, direction, target, err.code().name, attempt + 1,
                extra=job_event(self.job_id, it.number, m),
            )
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return _BUSY
            if is_refused(err):
                self.host.refused(member)
            return _RETRY
        except TensorError as err:
            self._fail(f"microbatch {m} of iteration {it.number} could not be sent: {err}")
            return _GIVE_UP
        self._count_data("sent", direction, tensors)
        return _SENT

    # ------------------------------------------------------------------ recovery

    async def report(self, iteration: int, round_: int, dead: str) -> NeighbourReport:
        """This node's ledger evidence about `dead` for the iteration in progress."""
        deadline = time.monotonic() + self.config.rpc_timeout_s
        try:
            await self._reach(iteration, round_, deadline)
        except TensorError as err:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(err)) from None
        return self.ledger.report_about(dead)

    def _check_recovery(self, iteration: int, round_: int, m: int) -> _Iteration | None:
        it = self._it
        if self._stopped or (iteration, round_) != (it.number, it.round):
            return None
        if not 0 <= m < self.job.microbatches:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"no microbatch {m} in the job")
        return it

    def recover(self, request: job_pb2.RecoverRequest) -> None:
        """The coordinator's order: carry out one recovery of a dead node's microbatch."""
        it = self._check_recovery(request.iteration, request.round, request.microbatch)
        if it is None:
            return  # the iteration moved on: moot
        m = request.microbatch
        rule = Rule(request.rule)
        mode = rule.mode
        if request.stage == self.stage == 0:
            if m in it.forwards:
                return  # recovered here already
            if not request.gradient_from:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "a stage-0 recovery names no "
                              "downstream node")
            self._spawn(self._recover_holder(it, m, mode, request.gradient_from, request.dead),
                        f"recover {m}", it)
            return
        if request.stage != self.stage + 1:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"stage {self.stage} cannot recover stage {request.stage}")
        if self.ledger.activation_receiver(m) != request.dead:
            return  # already moved on from the dead node (a repeated order)
        kept = it.kept.get((m, "forward"))
        if kept is None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.host.node_id} keeps no activation of microbatch {m}")
        downstream = request.gradient_from if mode != Mode.FORWARD else ""
        last = request.stage == self.num_stages - 1
        if mode != Mode.FORWARD and not downstream and not last:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "a recompute or replay names no "
                          "downstream node")
        if last and (downstream or mode == Mode.RECOMPUTE):
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "the last stage is replayed whole, "
                          "with no downstream node")
        self._spawn(
            self._send_forward(it, m, kept[1], mode=mode, dead=request.dead,
                               downstream=downstream),
            f"resend {m}", it,
        )

    async def _recover_holder(
        self, it: _Iteration, m: int, mode: Mode, downstream: str, dead: str
    ) -> None:
        """Stage 0 of a dead holder's microbatch, again, here: the token ids from this holder's
        copy of the data, forward recomputed, the gradient asked from `downstream`."""
        free = self._free  # a restart replaces it: a slot goes back where it came from
        await free.acquire()
        if not self._current(it) or m in it.forwards:
            free.release()
            return
        it.forwards[m] = ""
        it.paths[m] = (self.host.node_id,)
        it.modes[m] = mode
        it.fwd_done[m] = asyncio.Event()
        self.ledger.activation_sent(m, downstream)
        self.rerouted += 1
        self._metrics.count("gwtf_job_reroutes", self.job_id, Rule(int(mode) + 1).name.lower())
        self.host.log.info(
            "job %s it %d mb %d: stage 0 of dead %s's microbatch is recovered here (%s)",
            self.job_id, it.number, m, dead, mode.name.lower(),
            extra=job_event(self.job_id, it.number, m),
        )
        self._spawn(self._redirect(it, m, downstream, mode), f"redirect {m}", it)
        await self._own_forward(it, m)

    async def _redirect(self, it: _Iteration, m: int, downstream: str, mode: Mode) -> None:
        """Ask `downstream` to send `m`'s gradient here (again, if the dead node had it)."""
        request = job_pb2.RedirectRequest(
            sender=self.host.node_id, job_id=self.job_id, iteration=it.number, round=it.round,
            microbatch=m, stage=self.stage, mode=int(mode),
        )
        attempt = 0
        while self._current(it):
            member = self.host.member(downstream)
            if member is None:
                return  # it died too: its own recovery takes the microbatch from here
            try:
                await self.host.job_stub(member).Redirect(
                    request, timeout=self.config.rpc_timeout_s
                )
                return
            except aio.AioRpcError as err:
                if err.code() in _FINAL_CODES:
                    self.host.log.warning(
                        "job %s it %d mb %d: %s refused the redirect: %s", self.job_id,
                        it.number, m, downstream, err.details(),
                        extra=job_event(self.job_id, it.number, m),
                    )
                    return
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    def redirect(self, request: job_pb2.RedirectRequest) -> None:
        """A replacement of the stage above took over microbatch `m`: its gradient goes there
        (resent now if it went to the dead node already)."""
        it = self._check_recovery(request.iteration, request.round, request.microbatch)
        if it is None:
            return
        m = request.microbatch
        new = request.sender
        if request.stage != self.stage - 1 or self._participants.get(new) != request.stage:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{new[:40]!r} is not a stage-{self.stage - 1} node of the job")
        if request.mode not in (Mode.RECOMPUTE, Mode.REPLAY):
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "a redirect is for a recompute or "
                          "a replay")
        if m not in it.forwards or m not in it.paths:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                          f"microbatch {m} never came to {self.host.node_id}")
        self.ledger.gradient_target(m, new, Mode(request.mode))
        path = list(it.paths[m])
        path[self.stage - 1] = new
        it.paths[m] = tuple(path)
        kept = it.kept.get((m, "backward"))
        if kept is not None:
            self._spawn(self._send_backward(it, m, kept[1]["gradient"]), f"regrad {m}", it)

    # ------------------------------------------------------------------ restarts

    def restart(self, iteration: int, round_: int, holders: tuple[str, ...],
                weights: Mapping[str, int] | None, participants: Mapping[str, int]) -> None:
        """Start `iteration` again from scratch as `round_` (see the module docstring)."""
        self._participants.update(participants)
        it = self._it
        if (iteration, round_) <= (it.number, it.round):
            return
        if iteration > it.number:
            self._restarts[iteration] = (round_, holders, weights)
            return
        self._abandon(it, round_, holders, weights)

    def _abandon(self, old: _Iteration, round_: int, holders: tuple[str, ...],
                 weights: Mapping[str, int] | None) -> None:
        self.host.log.warning(
            "job %s iteration %d starts again as round %d", self.job_id, old.number, round_,
            extra=job_event(self.job_id, old.number),
        )
        self._metrics.count("gwtf_job_restarts", self.job_id)
        compute = self.executor.stats.compute_s
        self._abandoned_s += compute - self._round_start_s
        self._round_start_s = compute
        for task in list(old.tasks):
            task.cancel()
        self._it = _Iteration(old.number, round_)
        self._sums = {k: v for k, v in self._sums.items() if k[0] > old.number}
        self.ledger.reset(old.number)
        stale, self._free = self._free, asyncio.Semaphore(self.slots)
        for _ in range(self.slots):
            stale.release()  # wake whoever waited for a slot of the old round: it gives up
        self._spawn(self._compute(_COMMIT, self.executor.abandon), "abandon")
        self._signal()
        self._begin(holders, weights)

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
            or header.sender in self._excluded
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
        """A stage peer's gradient sums for an attempt of this iteration's commit (or the
        next iteration's)."""
        self.contribution_numel(header)
        store = self._sums.setdefault((header.iteration, header.round, header.attempt), {})
        if header.sender in store:
            raise ContributionError(
                f"{header.sender} sent two contributions for iteration {header.iteration} "
                f"attempt {header.attempt}"
            )
        self._metrics.count("gwtf_job_bytes_received", self.job_id, "gradient_sums",
                            flat.numel() * flat.element_size())
        store[header.sender] = GradContribution(
            node_id=header.sender,
            stage=self.stage,
            iteration=header.iteration,
            microbatch_ids=header.microbatches,
            grad_sums=unflatten(flat, self._shapes) if header.microbatches else {},
        )
        self._signal()

    def order_commit(self, order: CommitOrder) -> None:
        """Phase one of an attempt of the coordinator's commit (a repeated one is ignored)."""
        if self._stopped:
            return
        self._spawn(self._prepare(order), f"prepare {order.iteration}/{order.attempt}")

    async def _prepare(self, order: CommitOrder) -> None:
        began = time.monotonic()
        deadline = began + self.config.commit_timeout_s
        try:
            await asyncio.wait_for(self._started.wait(), self.config.commit_timeout_s)
            await self._reach(order.iteration, order.round, deadline)
        except (TimeoutError, TensorError, Refusal):
            return  # over, or never reached: the coordinator orders another attempt
        it = self._it
        if order.attempt <= it.attempt:
            return
        it.attempt = order.attempt
        it.prepared = None
        me = self.host.node_id
        try:
            mine = await self._compute(_COMMIT, lambda: self.executor.contribution(me), 0.0, it)
        except (WorkerStopped, _Stale):
            return
        if set(mine.microbatch_ids) != set(self.ledger.contributions()):
            self._fail(
                f"{me}'s gradient sums hold microbatches {sorted(mine.microbatch_ids)[:8]} but its "
                f"ledger says {sorted(self.ledger.contributions())[:8]}"
            )
            return
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
            round=it.round,
            attempt=order.attempt,
        )
        peers = sorted(p for p, s in order.members.items() if s == self.stage and p != me)
        sent = self._poisoned(flat, it.number) if peers else flat
        for index, peer in enumerate(peers):
            if index == 1:
                self._hit("aggregation", it.number)
            ok = await self._contribute(peer, header, sent, deadline, it, order.attempt)
            if not ok:
                return
        if len(peers) == 1:
            self._hit("aggregation", it.number)
        key = (it.number, it.round, order.attempt)
        while not set(peers) <= set(self._sums.get(key, {})):
            if not self._current(it) or it.attempt != order.attempt:
                return
            if any(self.host.member(p) is None for p in peers):
                return  # a member died: the coordinator voids the attempt and orders another
            try:
                await self._wait_change(deadline)
            except TimeoutError:
                return
        got = self._sums.get(key, {})
        held = [mine, *(got[p] for p in peers)]
        outliers: tuple[str, ...] = ()
        rule = self.job.aggregation
        if rule.robust:
            try:
                outliers = tuple(await self._compute(
                    _COMMIT, lambda: norm_outliers(held, rule.norm_factor), 0.0, it))
            except (WorkerStopped, _Stale):
                return
            if outliers:
                self.host.log.warning(
                    "job %s iteration %d attempt %d: stage %d screen names %s out of bounds "
                    "(gradient norm above %g times the median, or not finite)", self.job_id,
                    it.number, order.attempt, self.stage, ", ".join(outliers), rule.norm_factor,
                )
        it.prepared = (order, held)
        compute_s, replayed_s = self.compute_delta()
        self._metrics.observe("gwtf_job_commit_seconds", self.job_id, time.monotonic() - began,
                              "prepare")
        self.host.report_prepared(self.job_id, PreparedReport(
            sender=me,
            iteration=it.number,
            round=it.round,
            attempt=order.attempt,
            stage=self.stage,
            contributed=self.ledger.contributions(),
            losses=dict(it.losses),
            routes=dict(it.routes),
            compute_s=compute_s,
            replayed_s=replayed_s,
            outliers=frozenset(outliers),
        ))

    def _poisoned(self, flat: Tensor, iteration: int) -> Tensor:
        """What this node sends its stage peers: its sums, unless armed to poison them."""
        scale = self.fault.gradient_scale(iteration) if self.fault is not None else None
        if scale is None:
            return flat
        self.host.log.warning("fault injected: gradient sums of iteration %d sent scaled by %g",
                              iteration, scale)
        return flat * scale

    async def _contribute(
        self, peer: str, header: ContributionHeader, flat: Tensor, deadline: float,
        it: _Iteration, attempt: int,
    ) -> bool:
        for tries in range(self.config.send_attempts):
            if tries:
                await asyncio.sleep(self._backoff(tries - 1))
            member = self.host.member(peer)
            if member is None or not self._current(it) or it.attempt != attempt:
                return False
            nbytes = flat.numel() * flat.element_size()
            delay = self.host.wan_delay(member, nbytes)
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.host.job_stub(member).Contribute(
                    encode(header, flat), timeout=max(0.001, deadline - time.monotonic())
                )
                self._metrics.count("gwtf_job_bytes_sent", self.job_id, "gradient_sums", nbytes)
                return True
            except aio.AioRpcError as err:
                if err.code() in _FINAL_CODES:
                    self.host.log.warning(
                        "job %s: %s refused the gradient sums for iteration %d attempt %d: %s",
                        self.job_id, peer, header.iteration, attempt, err.details(),
                    )
                    return False
        return False

    def step(self, order: StepOrder) -> None:
        """Phase two: every member is prepared, step."""
        it = self._it
        if (order.iteration, order.round) != (it.number, it.round) or self._stopped:
            return  # a repeated order
        prepared = it.prepared
        if prepared is None or prepared[0].attempt != order.attempt:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.host.node_id} is not prepared for attempt {order.attempt} of iteration "
                f"{order.iteration}",
            )
        self._spawn(self._step(it, order, prepared[0], prepared[1]), f"step {order.iteration}")

    async def _step(
        self, it: _Iteration, order: StepOrder, commit: CommitOrder,
        contributions: list[GradContribution],
    ) -> None:
        began = time.monotonic()
        expected = commit.microbatches
        me = self.host.node_id
        alone = not any(
            s == self.stage and p != me and p not in self._departed
            and self.host.member(p) is not None
            for p, s in order.participants.items()
        )

        rule = self.job.aggregation
        noise = self.fault.weight_noise(order.iteration) if self.fault is not None else None

        def step() -> tuple[str, dict[str, str], bytes | None]:
            if rule.robust:
                aggregated = aggregate(
                    contributions, rule.rule, expected_ids=expected, trim=rule.trim,
                    clip_iterations=rule.clip_iterations,
                )
            else:
                aggregated = combine_contributions(contributions, expected_ids=expected)
            checksum = self.executor.commit(aggregated)
            if noise is not None:
                checksum = self._corrupt(noise, order.iteration)
            digests = self.executor.digests() if order.final else {}
            # The last replica of a stage keeps its new state elsewhere before it does anything
            # of the next iteration: a node joining the stage after it died starts from there.
            state = self.executor.state_bytes() if alone and not order.final else None
            return checksum, digests, state

        try:
            checksum, digests, state = await self._compute(_COMMIT, step, 0.0, it)
        except (WorkerStopped, _Stale):
            return
        except (CombineError, ExecutorError) as err:
            self._fail(
                f"stage {self.stage} could not commit iteration {order.iteration} on "
                f"{me}: {err}"
            )
            return
        self.last_step = LastStep(order.iteration, order.loss, order.trained, order.dropped)
        self._observe_step(order, time.monotonic() - began)
        report = CommittedReport(
            sender=me,
            iteration=it.number,
            stage=self.stage,
            checksum=checksum,
            digests=digests,
        )
        self._participants.update(order.participants)
        if state is not None:
            await self.host.keep_backup(self.job_id, self.stage, order.iteration + 1, state)
        self._advance(order)
        self.host.report_committed(self.job_id, report)

    def _observe_step(self, order: StepOrder, seconds: float) -> None:
        job, metrics = self.job_id, self._metrics
        metrics.observe("gwtf_job_commit_seconds", job, seconds, "step")
        metrics.count("gwtf_job_iterations_committed", job)
        metrics.count("gwtf_job_microbatches_trained", job, by=order.trained)
        metrics.count("gwtf_job_dropped_microbatches", job, by=len(order.dropped))
        metrics.set("gwtf_job_loss", job, order.loss)
        metrics.set("gwtf_job_iteration", job, order.iteration + 1)

    def _corrupt(self, scale: float, iteration: int) -> str:
        """The `poison:weights` fault: noise on this replica's parameters (compute thread)."""
        self.host.log.warning("fault injected: stage parameters corrupted after iteration %d",
                              iteration)
        generator = torch.Generator().manual_seed(iteration)
        with torch.no_grad():
            for _, param in sorted(self.executor.parameters().items()):
                noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
                noise = noise.to(param.device)
                param.add_(noise * scale * float(param.abs().mean()))
        return self.executor.checksum()

    def _advance(self, order: StepOrder) -> None:
        number = order.iteration + 1
        self._round_start_s = self.executor.stats.compute_s
        self._it = _Iteration(number)
        self._sums = {k: v for k, v in self._sums.items() if k[0] >= number}
        self.ledger.reset(number)
        self._signal()
        if order.final:
            return
        pending = self._restarts.pop(number, None)
        if pending is not None:
            self._it.round = pending[0]
            self._begin(pending[1], pending[2])
        else:
            self._begin(order.next_holders, order.weights())

    # ------------------------------------------------------------------ state

    async def state_bytes(self) -> tuple[int, bytes]:
        """(iteration, this stage's weights and optimizer state at its start), for a joiner."""
        it = self._it
        data = await self._compute(_COMMIT, self.executor.state_bytes)
        return it.number, data

    async def weights(self) -> tuple[int, bytes]:
        """(iterations trained into them, this stage's parameters as safetensors bytes), read on
        the compute thread between two of its steps."""
        return await self._compute(_COMMIT, self.executor.weights)

    def sync(self) -> job_pb2.SyncReply:
        it = self._it
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
