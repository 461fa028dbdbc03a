"""The compute runtime of a stage worker: one thread, one item at a time, by priority
(docs/design.md 3.6 and 3.7).

torch runs on one thread with one intra-op thread (the count the one-process reference uses to
give the same bits), from a priority queue: commit work first, then backward (it frees memory and
finishes microbatches), then forwards, then new microbatches. The event loop stays free for gRPC
and heartbeats meanwhile. With `emulate_compute_s`, each item is padded with sleep to the node's
declared compute time, as the emulated WAN pads messages (a `slow:compute` fault stretches it, or
the real work, F times). Every forward and backward is a sample of the node's pace, handed to the
node as it ends (gwtf.flow.pace). The runtime also keeps the books of that compute: busy time,
and what the next report to the coordinator carries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from gwtf.node.worker.stage import Iteration, StageContext, Stale, WorkerStopped

__all__ = ["BACKWARD", "COMMIT", "FORWARD", "INJECT", "ComputeRuntime"]

T = TypeVar("T")

# Compute priorities: lower runs first.
COMMIT, BACKWARD, FORWARD, INJECT = 0, 1, 2, 3
WARM_UP_ITEMS = 9
"""A job's first forwards and backwards of each kind on a node are not samples of its pace: they
build the stage's kernels and caches, and every node of a swarm starts them at once (seen: each
relay of a six-process swarm published twice its pace in the first iteration, then its pace
back, which doubled its hold for the slowdown that came later)."""
_KIND = {COMMIT: "commit", BACKWARD: "backward", FORWARD: "forward", INJECT: "forward"}
"""The `kind` label of gwtf_job_compute_seconds per priority (the last stage's forward: loss)."""


class ComputeRuntime:
    """The stage's compute thread and its queue."""

    def __init__(self, ctx: StageContext, emulate_compute_s: float | None) -> None:
        self._ctx = ctx
        self._emulate_s = emulate_compute_s
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gwtf-compute", initializer=torch.set_num_threads,
            initargs=(1,),
        )
        self._queue: asyncio.PriorityQueue[
            tuple[int, int, Callable[[], Any], float, asyncio.Future[Any], Iteration | None]
        ] = asyncio.PriorityQueue()
        self._seq = 0
        self.busy_s = 0.0
        """Seconds the compute thread was busy (with the emulated padding)."""
        self._reported = (0.0, 0.0)
        """(compute, replayed) seconds already reported to the coordinator."""
        self._abandoned_s = 0.0
        """Compute of rounds that started over, not reported yet."""
        self._round_start_s = 0.0
        """The executor's compute seconds when the round in progress began."""
        self._warming = {"forward": WARM_UP_ITEMS, "backward": WARM_UP_ITEMS}
        """Items of each kind still to run before they count as samples of the pace."""

    def start(self) -> None:
        """Start taking work (a task of the job: stopping the job cancels it)."""
        self._ctx.tasks.add(asyncio.get_running_loop().create_task(self._loop()))

    def close(self) -> None:
        """The job stopped (its tasks, this loop's too, are cancelled): drop what is queued."""
        while not self._queue.empty():
            *_, future, _ = self._queue.get_nowait()
            future.cancel()
        self._ctx.metrics.set("gwtf_job_queue_depth", self._ctx.job_id, 0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def compute(
        self,
        priority: int,
        work: Callable[[], T],
        emulate_s: float = 0.0,
        it: Iteration | None = None,
    ) -> T:
        """Run `work` on the compute thread. With `it`: Stale if that iteration (round) is over
        before the work starts or when it ends (its result is then moot)."""
        ctx = self._ctx
        if ctx.stopped:
            raise WorkerStopped
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._seq += 1
        self._queue.put_nowait((priority, self._seq, work, emulate_s, future, it))
        ctx.metrics.set("gwtf_job_queue_depth", ctx.job_id, self._queue.qsize())
        result = await future
        if it is not None and not ctx.current(it):
            raise Stale
        return result

    async def _loop(self) -> None:
        ctx = self._ctx
        loop = asyncio.get_running_loop()
        while True:
            priority, _, work, emulate_s, future, it = await self._queue.get()
            ctx.metrics.set("gwtf_job_queue_depth", ctx.job_id, self._queue.qsize())
            if future.cancelled():
                continue
            if it is not None and it is not ctx.it:
                future.set_exception(Stale())
                continue
            start = loop.time()
            began = time.monotonic()  # the stall watcher's clock (gwtf.node.stalls)
            try:
                result = await loop.run_in_executor(self._pool, work)
            except Exception as err:  # handed to the awaiting coroutine, which knows what it was
                if not future.cancelled():
                    future.set_exception(err)
                continue
            slow = 1.0 if ctx.fault is None else ctx.fault.slowdown("compute", ctx.it.number)
            worked = loop.time() - start
            device_s = max(emulate_s, worked) * slow  # a slower device: all of it F times
            rest = device_s - worked
            if rest > 0:
                await asyncio.sleep(rest)
            ended = loop.time()
            took = ended - start
            self.busy_s += took
            kind = "loss" if ctx.is_last and priority == FORWARD else _KIND[priority]
            ctx.metrics.observe("gwtf_job_compute_seconds", ctx.job_id, took, kind)
            if priority != COMMIT:
                sample = "backward" if priority == BACKWARD else "forward"
                if self._warming[sample]:
                    self._warming[sample] -= 1
                else:
                    # An emulated item's sample is its emulated device's time (its real work
                    # where that took longer), not the event loop's lag in waking from the
                    # padding: six processes on two cores put 0.05-0.25 s of it on a 0.05 s
                    # item, which no device of a real swarm sees. Stalls of the process
                    # still count through its availability (gwtf.node.stalls).
                    ctx.host.observe_compute(
                        sample, began, time.monotonic(),
                        device_s if emulate_s > 0 else None,
                    )
            if not future.cancelled():
                future.set_result(result)

    def emulated(self, share: float) -> float:
        """Seconds of emulated compute for `share` of a microbatch (0 without emulation)."""
        return self._emulate_s * share if self._emulate_s is not None else 0.0

    # ------------------------------------------------------------------ the books

    def compute_delta(self) -> tuple[float, float]:
        """(compute, wasted) seconds since the last call: what the next report carries. Wasted
        is the work done again for a dead node (recompute, replay, resend) and the work of
        rounds that started over."""
        stats = self._ctx.executor.stats
        compute, replayed = self._reported
        self._reported = (stats.compute_s, stats.replayed_s)
        abandoned, self._abandoned_s = self._abandoned_s, 0.0
        return stats.compute_s - compute, stats.replayed_s - replayed + abandoned

    def round_abandoned(self) -> None:
        """The round in progress starts over: its compute so far was wasted."""
        compute = self._ctx.executor.stats.compute_s
        self._abandoned_s += compute - self._round_start_s
        self._round_start_s = compute

    def round_began(self) -> None:
        """A new iteration begins (after a step): its compute counts from here."""
        self._round_start_s = self._ctx.executor.stats.compute_s
