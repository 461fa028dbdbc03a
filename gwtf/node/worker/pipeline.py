"""The microbatch pipeline of a stage worker: a microbatch's life on this node (docs/design.md 1,
3.7 and 4; the module docstring of gwtf.node.worker.worker tells it whole, memory slots included): a
holder injects it, a relay or the last stage receives it, and each runs its forward and backward
on the compute runtime (gwtf.node.worker.runtime) and passes the result on with the data-plane
sender (gwtf.node.worker.sender), keeping the ledger's record as it goes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from gwtf.job.iterations import assign
from gwtf.job.microbatches import tag_problem
from gwtf.node.dataplane.tensors import MicrobatchTag, TensorError, TensorSpec
from gwtf.node.errors import Busy
from gwtf.node.observe import job_event
from gwtf.node.worker.runtime import BACKWARD, FORWARD, INJECT, ComputeRuntime
from gwtf.node.worker.sender import ENCODE_INLINE_BYTES, DataPlaneSender
from gwtf.node.worker.stage import (
    FORWARD_SHARE,
    Iteration,
    StageContext,
    Stale,
    WorkerStopped,
)
from gwtf.recovery import Mode
from gwtf.train import Corpus, ExecutorError, MicrobatchKey, job_microbatch
from gwtf.train.codecs import CodecError, pack_specs, unpack

__all__ = ["MicrobatchPipeline"]


def _spec(dtype: torch.dtype, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(dtype=dtype, shape=shape)


class MicrobatchPipeline:
    """Injecting, receiving, forward and backward of the stage's microbatches."""

    def __init__(
        self,
        ctx: StageContext,
        runtime: ComputeRuntime,
        sender: DataPlaneSender,
        corpus: Corpus | None,
        accumulated: Callable[[Iteration], None],
    ) -> None:
        """`accumulated`: called each time this node accumulated a microbatch (its shipper's
        cue, gwtf.node.worker.shipping)."""
        self._ctx = ctx
        self._accumulated = accumulated
        self._runtime = runtime
        self._sender = sender
        self.host = ctx.host
        self.job = job = ctx.job
        self.job_id = ctx.job_id
        self.executor = ctx.executor
        self.stage = ctx.stage
        self.is_first = ctx.is_first
        self.is_last = ctx.is_last
        self.corpus = corpus
        self.config = ctx.config
        self._metrics = ctx.metrics
        batch = (job.microbatch_size, job.model.seq_len)
        self._shape = (*batch, job.model.width)
        self._labels = _spec(torch.int64, batch)
        self._vocab = job.model.vocab
        # What arrives: activations through the codec of the boundary above this stage,
        # gradients through the one below (the job's plan, docs/design.md 2.15).
        spec = ctx.executor.spec
        self._codec_in = job.compression.codec_after(spec.first_layer)
        self._codec_out = job.compression.codec_after(spec.end_layer)
        self._expected = {
            "forward": {
                **{k: _spec(*v) for k, v in pack_specs(self._codec_in, "activation",
                                                      self._shape).items()},
                "labels": self._labels,
            },
            "backward": {k: _spec(*v) for k, v in pack_specs(self._codec_out, "gradient",
                                                             self._shape).items()},
        }  # fmt: skip

    # ------------------------------------------------------------------ injecting (holders)

    def begin(self, holders: tuple[str, ...], weights: Mapping[str, int] | None = None) -> None:
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
            ctx.spawn(self.own_forward(it, m), f"forward {it.number}/{m}", it)

    async def own_forward(self, it: Iteration, m: int) -> None:
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
            return self._expected["forward"].get(name)
        if tag.direction == "backward" and not self.is_last:
            return self._expected["backward"].get(name)
        return None

    async def _decoded(self, tag: MicrobatchTag, wire: dict[str, Tensor]) -> dict[str, Tensor]:
        """The microbatch's float32 activation (and labels) or gradient from what its sender
        put on the wire; TensorError (INVALID_ARGUMENT) when the parts do not decode to it."""
        forward = tag.direction == "forward"
        name, field = (self._codec_in, "activation") if forward else (self._codec_out, "gradient")
        if name == "none":
            return wire
        try:
            if sum(t.numel() * t.element_size() for t in wire.values()) > ENCODE_INLINE_BYTES:
                value = await asyncio.to_thread(unpack, name, field, wire, self._shape)
            else:
                value = unpack(name, field, wire, self._shape)
        except CodecError as err:
            raise TensorError(f"microbatch {tag.microbatch}'s {field} does not decode: {err}"
                              ) from None
        return {field: value, "labels": wire["labels"]} if forward else {field: value}

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
        if set(tensors) != set(self._expected[tag.direction]):
            raise TensorError(f"microbatch {m} lacks tensors: got {sorted(tensors)}")
        wire, tensors = tensors, await self._decoded(tag, tensors)
        if tag.direction == "forward":
            await self._take_forward(it, tag, tensors, deadline)
        else:
            self._take_backward(it, tag, tensors["gradient"])
        self._sender.count_data("received", tag.direction, wire)

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
                raise Busy(f"no memory slot freed up for microbatch {m}") from None
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
            ctx.spawn(self._sender.ask_redirect(it, m, tag.downstream, mode),
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
            self._accumulated(it)
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
        self._accumulated(it)
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
