"""Phase one's exchange of gradient sums within a stage, on the wire (docs/design.md 3.7): the
reduce-scatter and all-gather (`SliceExchange`, the slices and what is kept across attempts in
gwtf.node.worker.slices), and the one send of a contribution stream both it and the all-to-all
exchange of robust aggregations use (`contribute`, the chunks from gwtf.node.dataplane.gradsync).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TypeVar

import torch
from grpc import aio
from torch import Tensor

from gwtf.job.iterations import CommitOrder
from gwtf.node.dataplane.gradsync import PARTIAL, REDUCED, ContributionHeader, encode, unflatten
from gwtf.node.worker.runtime import COMMIT, ComputeRuntime
from gwtf.node.worker.slices import Delivered, SliceStore, Summed, basis, bounds
from gwtf.node.worker.stage import FINAL_CODES, Iteration, StageContext, Stale, WorkerStopped
from gwtf.train import sum_in_order
from gwtf.v1 import job_pb2

__all__ = ["SliceExchange", "contribute", "poisoned"]

T = TypeVar("T")


def poisoned(ctx: StageContext, flat: Tensor, iteration: int) -> Tensor:
    """What a node sends its stage peers: its sums, unless armed to poison them."""
    scale = ctx.fault.gradient_scale(iteration) if ctx.fault is not None else None
    if scale is None:
        return flat
    ctx.host.log.warning("fault injected: gradient sums of iteration %d sent scaled by %g",
                         iteration, scale)
    return flat * scale


async def contribute(
    ctx: StageContext, peer: str, header: ContributionHeader, flat: Tensor, deadline: float,
    it: Iteration, attempt: int, kind: str = "gradient_sums",
) -> job_pb2.ContributionAck | None:
    """One contribution stream to `peer`, retried with backoff; its ack, or None when the peer
    is gone, refused it for good, or the attempt is over here. `kind`: the bytes' label in
    `gwtf_job_bytes_sent` ("kept_sums" for a shipment to a keeper)."""
    for tries in range(ctx.config.send_attempts):
        if tries:
            await asyncio.sleep(ctx.backoff(tries - 1))
        member = ctx.peer(peer)
        if member is None and ctx.current(it) and it.attempt == attempt:
            ctx.host.log.info("job %s iteration %d attempt %d: %s died or left; the attempt "
                              "ends here", ctx.job_id, header.iteration, attempt, peer)
        if member is None or not ctx.current(it) or it.attempt != attempt:
            return None
        nbytes = flat.numel() * flat.element_size()
        delay = ctx.host.wan_delay(member, nbytes)
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            ack: job_pb2.ContributionAck = await ctx.host.job_stub(member).Contribute(
                encode(header, flat), timeout=max(0.001, deadline - time.monotonic())
            )
            ctx.metrics.count("gwtf_job_bytes_sent", ctx.job_id, kind, nbytes)
            return ack
        except aio.AioRpcError as err:
            if err.code() in FINAL_CODES:
                ctx.host.log.warning(
                    "job %s: %s refused the gradient sums for iteration %d attempt %d: %s",
                    ctx.job_id, peer, header.iteration, attempt, err.details(),
                )
                return None
    return None


class SliceExchange:
    """This replica's reduce-scatter and all-gather of its stage's sums
    (gwtf.node.worker.slices)."""

    def __init__(
        self, ctx: StageContext, runtime: ComputeRuntime, shapes: dict[str, tuple[int, ...]],
        dtype: torch.dtype,
    ) -> None:
        self._ctx = ctx
        self._runtime = runtime
        self._shapes = shapes
        self._numel = sum(int(torch.Size(s).numel()) for s in shapes.values())
        self._dtype = dtype
        self.store = SliceStore()
        self.delivered = Delivered()

    def forget(self, before: int) -> None:
        self.store.forget(before)
        self.delivered.forget(before)

    def forget_all(self) -> None:
        self.store.forget_all()
        self.delivered.forget_all()

    def on_slice(self, header: ContributionHeader, flat: Tensor) -> bool:
        """A peer's PARTIAL or REDUCED stream (its header checked): does this node now hold
        all the stream declared?"""
        key = (header.iteration, header.round)
        want = (header.slice_lo, header.slice_hi)
        if header.kind == PARTIAL:
            return self.store.add_partial(
                key, header.attempt, header.sender, header.microbatches, header.offset, flat,
                want,
            )
        assert header.kind == REDUCED
        if flat.numel() == want[1] - want[0] or not header.microbatches:
            self.store.add_reduced(key, header.sender, want, header.basis, flat)
            return True
        # A header alone: the owner's record says this node holds the slice already.
        return self.store.reduced(key, header.sender, want, header.basis) is not None

    async def run(
        self, order: CommitOrder, it: Iteration, header: ContributionHeader, flat: Tensor,
        deadline: float,
    ) -> Summed | None:
        """The exchange of one attempt: this node's slices out, its own slice reduced and sent
        to every peer, the stage's whole sum back (None: the attempt is over here)."""
        ctx = self._ctx
        me = ctx.host.node_id
        members = sorted(p for p, s in order.members.items() if s == ctx.stage)
        if me not in members:
            return None
        peers = [p for p in members if p != me]
        ranges = {m: bounds(self._numel, len(members), i) for i, m in enumerate(members)}
        key = (it.number, it.round)
        attempt = order.attempt
        ids = header.microbatches
        sent = poisoned(ctx, flat, it.number) if peers else flat
        # Reduce-scatter: slice j of this node's sums to owner j. Past a peer that is gone the
        # sends go on while the attempt is current: what lands is kept for the next attempt.
        failed = False
        for index, peer in enumerate(peers):
            if index == 1:
                ctx.hit("aggregation", it.number)
            if not await self._partial(peer, header, sent, ranges[peer], key, deadline, it):
                if not ctx.current(it) or it.attempt != attempt:
                    return None
                failed = True
        if len(peers) == 1:
            ctx.hit("aggregation", it.number)
        if failed:
            return None
        mine = ranges[me]
        declared = await self._until(it, attempt, peers, deadline, lambda: self._ready(
            key, attempt, peers, mine))
        if declared is None:
            return None
        parts = tuple(sorted([(me, ids), *((p, declared[p]) for p in peers)]))
        digest = basis(parts)
        union = tuple(sorted(mb for _, these in parts for mb in these))

        held: list[list[Tensor]] = []
        for node, these in parts:
            if not these:
                continue  # nothing counted: left out of the sum, as combine_contributions does
            views = [flat[mine[0] : mine[1]]] if node == me else self.store.pieces(
                key, node, these, mine)
            assert views is not None  # _ready saw every peer's pieces cover the slice
            held.append(views)

        def reduce() -> Tensor:
            if not held:
                return torch.empty(0, dtype=self._dtype)
            values = [torch.cat(views) if views else flat[:0] for views in held]
            return sum_in_order(values)

        try:
            reduced = await self._runtime.compute(COMMIT, reduce, 0.0, it)
        except (WorkerStopped, Stale):
            return None
        # All-gather: this node's reduced slice to every peer, theirs here.
        out = dataclasses.replace(
            header, kind=REDUCED, microbatches=union, numel=reduced.numel(), offset=mine[0],
            slice_lo=mine[0], slice_hi=mine[1], basis=digest,
        )
        for peer in peers:
            if not await self._reduced(peer, out, reduced, key, deadline, it):
                return None
        got = await self._until(it, attempt, peers, deadline, lambda: self._gathered(
            key, peers, ranges, digest))
        if got is None:
            return None
        if not union:
            return Summed(parts, {})
        got[me] = reduced
        whole = torch.cat([got[m] for m in members])
        return Summed(parts, unflatten(whole, self._shapes))

    def _ready(
        self, key: tuple[int, int], attempt: int, peers: list[str], mine: tuple[int, int]
    ) -> dict[str, tuple[int, ...]] | None:
        """Every peer's microbatch ids for the attempt, once this node holds its slice of
        each peer's sums."""
        declared = self.store.declared(key, attempt)
        if any(p not in declared for p in peers):
            return None
        for p in peers:
            if declared[p] and self.store.pieces(key, p, declared[p], mine) is None:
                return None
        return {p: declared[p] for p in peers}

    def _gathered(
        self, key: tuple[int, int], peers: list[str], ranges: dict[str, tuple[int, int]],
        digest: str,
    ) -> dict[str, Tensor] | None:
        got: dict[str, Tensor] = {}
        for p in peers:
            values = self.store.reduced(key, p, ranges[p], digest)
            if values is None:
                return None
            got[p] = values
        return got

    async def _until(
        self, it: Iteration, attempt: int, peers: list[str], deadline: float,
        ready: Callable[[], T | None],
    ) -> T | None:
        ctx = self._ctx
        while (value := ready()) is None:
            if not ctx.current(it) or it.attempt != attempt:
                return None
            if any(ctx.peer(p) is None for p in peers):
                return None  # a member died: the coordinator voids the attempt, orders another
            try:
                await ctx.wait_change(deadline)
            except TimeoutError:
                return None
        return value

    async def _partial(
        self, peer: str, header: ContributionHeader, sent: Tensor, want: tuple[int, int],
        key: tuple[int, int], deadline: float, it: Iteration,
    ) -> bool:
        """Slice `want` (the peer's) of this node's sums to `peer`: only what it has not
        acknowledged for these microbatch ids in an earlier attempt of the round."""
        ids = header.microbatches
        what = "p" + ",".join(map(str, ids))
        pieces = self.delivered.missing(key, peer, what, want) if ids else []
        for again in (False, True):
            if again:
                self.delivered.lost(key, peer, what)
                pieces = [want]
            ack = None
            for lo, hi in pieces or [(want[0], want[0])]:
                if not ids:
                    lo = hi = want[0]
                piece = dataclasses.replace(
                    header, kind=PARTIAL, offset=lo, numel=hi - lo, slice_lo=want[0],
                    slice_hi=want[1],
                )
                ack = await contribute(self._ctx, peer, piece, sent[lo:hi], deadline, it,
                                       header.attempt)
                if ack is None:
                    return False
                self.delivered.add(key, peer, what, (lo, hi))
            if ack is not None and ack.complete:
                return True
        self._ctx.host.log.warning(
            "job %s: %s does not hold slice %s of %s's sums after a whole send",
            self._ctx.job_id, peer, want, header.sender)
        return False

    async def _reduced(
        self, peer: str, header: ContributionHeader, reduced: Tensor, key: tuple[int, int],
        deadline: float, it: Iteration,
    ) -> bool:
        """This node's reduced slice to `peer`, or only its header where the peer acknowledged
        the same slice (same range, same basis) in an earlier attempt of the round."""
        want = (header.slice_lo, header.slice_hi)
        what = "r" + header.basis
        held = want[1] > want[0] and not self.delivered.missing(key, peer, what, want)
        for whole in (not held, True):
            values = reduced if whole else reduced[:0]
            sent = dataclasses.replace(header, numel=values.numel())
            ack = await contribute(self._ctx, peer, sent, values, deadline, it, header.attempt)
            if ack is None:
                return False
            if ack.complete:
                self.delivered.add(key, peer, what, want)
                return True
            self.delivered.lost(key, peer, what)
        return False
