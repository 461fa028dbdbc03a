"""Bounded replay at a node (docs/design.md 4.9): the node ships the running sum of its gradient
to a stage peer, its keeper, keeps the sums its stage peers ship to it, and adopts one when the
coordinator says so.

The rule is gwtf.recovery's (`ship_due`, `ship_interval`, `pick_keeper`, `HazardEstimate`), the
one the simulator drives too (gwtf.sim.recovery.shipping). Here:

- After each microbatch it accumulates (or a sum it adopts) the node decides. With a fixed
  `replay_bound` N (a job key) it ships once N of its contributions are not covered by its last
  shipment; with "auto" (the default) once Young's interval says so, from what it sees: its
  microbatch rate in the iteration, the upload time of its sum to the keeper, the share of that
  time its own data plane would otherwise use (its bytes sent in the iteration per second over
  the link's rate, counted for both ends as the simulator counts the sender's uplink and the
  keeper's downlink), the compute and resends a replayed microbatch costs here, and the deaths
  of participants it has seen per node-second. The link's rate is the link matrix's where the
  swarm emulates a WAN, else the node's declared uplink (`--uplink-mbps`), else
  `DEFAULT_LINK_GBPS`. A node re-evaluates at most every `RECHECK` microbatches
  (`gwtf.recovery.recheck_at`, as the simulator).
- At most one shipment is on the wire. It travels as a contribution stream of kind KEPT
  (gwtf.node.dataplane.gradsync), with the node's records of each microbatch it covers
  (`Ledger.hops`; on the last stage the loss and path too), to the keeper: the live stage peer with
  the fastest link from this node (ties by the smaller id), kept while it lives. When the keeper has
  it, the ledger records the shipment (`Ledger.shipped`).
- The keeper keeps the last sum of each sender for the iteration in progress
  (`Iteration.kept_sums`, `Ledger.kept`). Once it reported a dead sender's sum to the coordinator
  it takes no later one from it: the plan adopts the sum that was reported, or none.

Off for the robust aggregations: their screen judges each replica's own vector, which an adopted
sum would change (docs/design.md 4.7).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from gwtf.node.dataplane.gradsync import KEPT, ContributionHeader, KeptHop, flatten
from gwtf.node.worker.allreduce import contribute
from gwtf.node.worker.runtime import BACKWARD, ComputeRuntime
from gwtf.node.worker.stage import Iteration, StageContext, Stale, WorkerStopped
from gwtf.recovery import (
    REPLAY_AUTO,
    HazardEstimate,
    ShipCost,
    pick_keeper,
    recheck_at,
    replay_bound,
    ship_due,
    ship_interval,
)

__all__ = ["DEFAULT_LINK_GBPS", "SumShipper"]

DEFAULT_LINK_GBPS = 1.0
"""The rate assumed to a keeper when neither a link matrix nor a declared uplink gives one."""

COPY_BYTES_S = 1e9
"""Before its first shipment, a node assumes its compute thread copies the sum into one vector
at this rate (then it uses the time the last copy took)."""


class SumShipper:
    """This node's shipments of its running gradient sum, and the hazard it sees."""

    def __init__(self, ctx: StageContext, runtime: ComputeRuntime) -> None:
        self._ctx = ctx
        self._runtime = runtime
        self.bound = replay_bound(ctx.job.replay_bound, ctx.job.aggregation.robust)
        self.hazard = HazardEstimate()
        self._busy = False
        self._next_check = 1.0
        self._checked: Iteration | None = None
        self.shipments = 0
        self.shipped_bytes = 0
        """Bytes of running sums this node shipped (that landed) in the iteration in progress."""
        self._copy_s: float | None = None
        self._dtype = torch.float64 if ctx.job.grad_accum == "float64" else torch.float32
        self._sum_bytes = sum(p.numel() for p in ctx.executor.parameters().values()) * (
            8 if self._dtype == torch.float64 else 4)

    # ------------------------------------------------------------------ what it sees

    def census(self) -> None:
        """The job's live participants may have changed: count the node-seconds so far."""
        ctx = self._ctx
        live = sum(1 for p in ctx.participants if p not in ctx.departed)
        self.hazard.census(time.monotonic(), live)

    def death(self) -> None:
        """A participant crashed (a leave after a drain costs no replay, and is not counted)."""
        self.census()
        self.hazard.death()

    def _gbps(self, peer: str) -> float:
        """The rate from this node to `peer` (module doc)."""
        host = self._ctx.host
        me, other = host.member(host.node_id), host.member(peer)
        spec = host.link(me, other) if me is not None and other is not None else None
        if spec is not None and spec.bandwidth_gbps > 0:
            return float(spec.bandwidth_gbps)
        if me is not None and me.uplink_gbps > 0:
            return float(me.uplink_gbps)
        return DEFAULT_LINK_GBPS

    def _peers(self) -> dict[str, float]:
        """Live stage peers and the rate to each (`pick_keeper`'s scores)."""
        ctx = self._ctx
        me = ctx.host.node_id
        return {p: self._gbps(p) for p, s in ctx.participants.items()
                if s == ctx.stage and p != me and p not in ctx.departed
                and ctx.host.member(p) is not None}

    def _interval(self, it: Iteration, gbps: float, nbytes: int) -> float:
        """Young's interval for a shipment of `nbytes` at `gbps` now (module doc)."""
        ctx = self._ctx
        elapsed = max(1e-3, time.monotonic() - it.began)
        done = len(ctx.ledger.contributions())
        rate = done / elapsed
        stats = ctx.executor.stats
        compute_s = stats.compute_s / max(1, stats.backwards)
        per_mb_bytes = it.sent_bytes / max(1, done)
        sides = (ctx.stage > 0) + (not ctx.is_last)
        contention = 2 * min(1.0, it.sent_bytes * 8 / elapsed / (gbps * 1e9))
        # The copy of the sum into one vector holds the compute thread up whatever the link,
        # so a shipment is never free, even on an idle link.
        copy_s = self._copy_s if self._copy_s is not None else nbytes / COPY_BYTES_S
        self.census()
        return ship_interval(ShipCost(
            upload_s=nbytes * 8 / (gbps * 1e9), contention=contention, rate=rate,
            replay_s=compute_s + sides * per_mb_bytes * 8 / (gbps * 1e9),
            hazard=self.hazard.rate(time.monotonic()), copy_s=copy_s,
        ))

    # ------------------------------------------------------------------ shipping

    def stepped(self, iteration: int) -> None:
        """`iteration` was stepped here: say what was shipped in it (once a shipment went)."""
        ctx = self._ctx
        if self.shipped_bytes:
            ctx.host.log.info(
                "job %s it %d: shipped %d running sums to a keeper in the iteration, %d bytes "
                "in all", ctx.job_id, iteration, self.shipments, self.shipped_bytes,
            )
        self.shipments = 0
        self.shipped_bytes = 0

    def accumulated(self, it: Iteration) -> None:
        """This node accumulated a microbatch (or adopted a sum): ship if due."""
        ctx = self._ctx
        if not self.bound or self._busy or not ctx.current(it) or it.attempt:
            return
        if self._checked is not it:
            self._checked, self._next_check = it, 1.0
        ledger = ctx.ledger
        keeper = ledger.keeper
        if keeper is not None and (keeper in ctx.departed or ctx.host.member(keeper) is None):
            ledger.keeper_lost()
        unshipped = ledger.unshipped()
        if self.bound == REPLAY_AUTO:
            if unshipped < max(1.0, self._next_check):
                return
        elif not ship_due(ledger, self.bound):
            return
        peers = self._peers()
        keeper = pick_keeper(ctx.host.node_id, peers, ledger.keeper)
        if keeper is None:
            return
        if self.bound == REPLAY_AUTO:
            interval = self._interval(it, peers[keeper], self._sum_bytes)
            if not ship_due(ledger, interval):
                self._next_check = recheck_at(interval, unshipped)
                return
            self._next_check = 1.0
        self._busy = True
        ctx.spawn(self._ship(it, keeper), f"ship to {keeper}", it)

    async def _ship(self, it: Iteration, keeper: str) -> None:
        ctx = self._ctx
        me = ctx.host.node_id
        try:
            def snapshot() -> tuple[tuple[int, ...], Tensor]:
                began = time.perf_counter()
                mine = ctx.executor.contribution(me)
                flat = flatten(mine.grad_sums, sorted(mine.grad_sums), self._dtype)
                self._copy_s = time.perf_counter() - began
                return mine.microbatch_ids, flat

            try:
                ids, flat = await self._runtime.compute(BACKWARD, snapshot, 0.0, it)
            except (WorkerStopped, Stale):
                return
            if not ids or not ctx.current(it):
                return
            hops = ctx.ledger.hops(ids)
            header = ContributionHeader(
                sender=me, job_id=ctx.job_id, iteration=it.number, stage=ctx.stage,
                microbatches=ids, dtype=ctx.job.grad_accum, numel=flat.numel(),
                round=it.round, kind=KEPT,
                hops=tuple(KeptHop(
                    m, hops[m][0] or "", hops[m][1] or "", it.losses.get(m, 0.0),
                    it.paths.get(m, ()) if ctx.is_last else (),
                ) for m in ids),
            )
            deadline = time.monotonic() + ctx.config.commit_timeout_s
            ack = await contribute(ctx, keeper, header, flat, deadline, it, it.attempt,
                                   "kept_sums")
            if ack is None or not ctx.current(it):
                return
            ctx.ledger.shipped(ids, keeper)
            self.shipments += 1
            self.shipped_bytes += flat.numel() * flat.element_size()
            ctx.metrics.count("gwtf_job_kept_sums", ctx.job_id, "shipped")
        finally:
            self._busy = False
        self.accumulated(it)
