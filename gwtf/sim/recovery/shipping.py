"""Bounded replay in the simulation (docs/design.md 4.9): partial gradient sums shipped to a stage
peer, so that a crash replays only what the last shipment did not cover.

The rule itself is `gwtf.recovery` (`ship_due`, `pick_keeper`, `best_cover`, `plan_crash`'s
`Rule.KEEP`); this module drives it with simulated transfers:

- after a node accumulates a microbatch, if `ship_due` and it has no shipment on the wire, it
  sends its running sum (`params_per_stage[s] * grad_bytes_per_param` bytes, the size of one
  all-reduce contribution) to its keeper over the pair's link, behind the pair's earlier sends.
  The keeper is the best-connected live stage peer, kept while it lives. A stage of one node
  ships nothing. The sum counts as kept when it lands, if both ends are still alive and the
  iteration has not moved on (a sender that dies mid-upload ships nothing);
- when a death is noticed, the largest sum a live peer keeps for the dead node goes to
  `plan_crash`; each `Rule.KEEP` microbatch stays done at its stage, now held by the keeper
  (which adopts the sum), and the neighbours' ledgers move their records to the keeper. Senders
  whose keeper died start over with a new keeper;
- a keeper holds a kept microbatch's contribution, not the dead node's activations: when a
  later recovery needs that microbatch's stage output (the input of the next stage's redo) or
  its input gradient (for the previous stage's replay), the keeper computes it again first, from
  the previous stage's kept output (`regenerate`, `regenerate_gradient`): a forward, or a
  forward and backward whose gradient is not accumulated. That compute is wasted compute;
- wasted compute: the dead node's compute on kept microbatches (as it was spent, `SimNode.work`:
  the forwards and backwards it ran for them, or the work behind a sum it had adopted) is not
  wasted; if the keeper dies in turn before the commit, it is again.

With the adaptive bound (`replay_bound = "auto"`, the default) a node ships when
`gwtf.recovery.ship_interval` says so: it weighs the upload of the sum on its own path to the
keeper (`Network.gbps`: the pair link, or the access links where nodes have them) and the share of
that time its uplink and the keeper's downlink carry activations and gradients (its microbatch
rate in this iteration times the data-plane bytes per microbatch, over the access link's rate; 0
in the pair model, where sends to a stage peer share no link with the data plane) against the
replay it saves: the deaths per node-second noticed so far in the run (`HazardEstimate`, fed by
`census`), times a microbatch's stage compute plus the resend of its two inputs (`hop_estimate`).
A node evaluates the rule again every `gwtf.recovery.RECHECK` microbatches at most, so that new
deaths and rates count within an iteration.

Only the policies that recover by the rules and commit exactly (gwtf, gwtf-fixed, oracle) ship.
"""

from __future__ import annotations

from typing import Any

from gwtf.recovery import (
    REPLAY_AUTO,
    CrashPlan,
    HazardEstimate,
    Hops,
    Rule,
    ShipCost,
    best_cover,
    pick_keeper,
    recheck_at,
    ship_due,
    ship_interval,
)
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import DONE, MB, WAIT_G, SimNode, SimulationError
from gwtf.sim.simulator import Simulation

__all__ = ["Shipper"]


class Shipper:
    """The shipments of one simulation and what they cost (`totals`)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink
        on = sim.recovery.ships
        self.bound = sim.sc.replay_bound if on else 0
        self.auto = self.bound == REPLAY_AUTO
        self.hazard = HazardEstimate()
        self._census = 0
        self._next_check: dict[str, float] = {}
        self.shipments = 0
        self.bytes = 0.0
        self.upload_s = 0.0
        self.kept = 0
        self._busy: set[str] = set()
        self._credit: dict[str, float] = {}
        self._kept_at: dict[tuple[int, int], SimNode] = {}

    def _peers(self, node: SimNode) -> list[SimNode]:
        return [p for p in self.sim.active_nodes(node.stage) if p is not node and not p.detected]

    def _bandwidth(self, a: SimNode, b: SimNode) -> float:
        return self.sim.network.gbps(a.info, b.info)

    def census(self, change: int, *, death: bool) -> None:
        """`change` nodes entered (> 0) or left (< 0) the job now; `death`: a death was
        noticed (its work is recovered by the rules)."""
        if not self.bound:
            return
        self._census += change
        self.hazard.census(self.sim.engine.now, self._census)
        if death:
            self.hazard.death()

    def _interval(self, node: SimNode, keeper: SimNode, gbps: float, nbytes: float,
                  start_s: float) -> float:
        """The adaptive bound for `node` shipping to `keeper` now (module doc)."""
        sim = self.sim
        sc = sim.sc
        now = sim.engine.now
        elapsed = now - start_s
        s = node.stage
        sides = (s > 0) + (s < sim.S - 1)
        rate = len(node.ledger.contributions()) / elapsed if elapsed > 0 else 0.0
        rate = min(rate, 1.0 / node.compute_s) if rate > 0 else 1.0 / node.compute_s
        keeper_rate = len(keeper.ledger.contributions()) / elapsed if elapsed > 0 else rate
        # Its data plane's bytes per microbatch, each neighbouring boundary at its own size.
        bits = ((sc.boundary(s - 1) if s > 0 else 0)
                + (sc.boundary(s) if s < sim.S - 1 else 0)) * 8
        contention = (min(1.0, rate * bits / (node.info.uplink_gbps * 1e9))
                      + min(1.0, keeper_rate * bits / (keeper.info.downlink_gbps * 1e9)))
        return ship_interval(ShipCost(
            upload_s=nbytes * 8 / (gbps * 1e9), contention=contention, rate=rate,
            replay_s=node.compute_s + sides * sim.hop_estimate, hazard=self.hazard.rate(now)))

    def accumulated(self, node: SimNode) -> None:
        """`node` accumulated a microbatch (or adopted a sum, or lost its keeper): ship if due."""
        it = self.sim.iteration
        if not self.bound or it is None or node.id in self._busy or not node.alive:
            return
        if self.auto:
            unshipped = node.ledger.unshipped()
            if unshipped < 1 or unshipped < self._next_check.get(node.id, 1):
                return
        elif not ship_due(node.ledger, self.bound):
            return
        peers = {p.id: self._bandwidth(node, p) for p in self._peers(node)}
        keeper_id = pick_keeper(node.id, peers, node.ledger.keeper)
        if keeper_id is None:
            return
        keeper = self.sim.nodes[keeper_id]
        nbytes = self.sim.sc.params_per_stage[node.stage] * self.sim.sc.grad_bytes_per_param
        if self.auto:
            interval = self._interval(node, keeper, peers[keeper_id], nbytes, it.start_s)
            if not ship_due(node.ledger, interval):
                self._next_check[node.id] = recheck_at(interval, unshipped)
                return
            self._next_check.pop(node.id, None)
        ids = node.ledger.contributions()
        node.ledger.shipped(ids, keeper_id)
        self.shipments += 1
        self.bytes += nbytes
        self.upload_s += nbytes * 8 / (peers[keeper_id] * 1e9)
        self._busy.add(node.id)
        arrive = self.sim.transfer(node, keeper, nbytes)
        self.sink.emit(arrive, Kind.ARRIVE, self._on_arrive,
                       (node, node.epoch, keeper, keeper.epoch, it.index, ids,
                        node.ledger.hops(ids)))

    @returns_events
    def _on_arrive(self, payload: tuple[SimNode, int, SimNode, int, int, frozenset[int],
                                        dict[int, Hops]]) -> None:
        node, epoch, keeper, keeper_epoch, index, ids, hops = payload
        if node.epoch != epoch or not node.alive:
            return
        self._busy.discard(node.id)
        it = self.sim.iteration
        if (it is not None and it.index == index and keeper.alive and keeper.active
                and keeper.epoch == keeper_epoch and keeper.stage == node.stage
                and node.ledger.iteration == index and keeper.ledger.iteration == index):
            keeper.ledger.kept(node.id, ids, hops)
        self.accumulated(node)

    def crashed(self, node: SimNode) -> float:
        """`node` died: the compute of the sums it had adopted is lost again (seconds)."""
        self._busy.discard(node.id)
        return self._credit.pop(node.id, 0.0)

    def cover(self, dead: SimNode) -> tuple[frozenset[int], str | None]:
        """What a live peer keeps for `dead` (the largest), for `plan_crash`."""
        if not self.bound:
            return frozenset(), None
        keeper, ids = best_cover(dead.id, {p.id: p.ledger.held_for(dead.id)
                                           for p in self._peers(dead)})
        return ids, keeper

    def keep(self, plan: CrashPlan, dead: SimNode) -> list[MB]:
        """Carry out the plan's `Rule.KEEP`s (see the module doc); returns the microbatches
        whose holder changed (the caller pumps them: what waited on the dead node may go on)."""
        moved: list[MB] = []
        if not self.bound:
            return moved
        sim = self.sim
        it = sim.iteration
        keeps = [r for r in plan.recoveries if r.rule == Rule.KEEP]
        peers = self._peers(dead)
        s = dead.stage
        # Stage 0's `activation_from` is the stage-1 node holding the tokens, no upstream.
        upstream = {r.mb: r.activation_from for r in keeps if r.activation_from} if s else {}
        downstream = {r.mb: r.gradient_from for r in keeps if r.gradient_from}
        for peer in peers:
            if keeps and peer.id == keeps[0].keeper:
                peer.ledger.adopt(dead.id, upstream, downstream)
            else:
                peer.ledger.drop_kept(dead.id)
            if peer.ledger.keeper == dead.id:
                peer.ledger.keeper_lost()
        if keeps and it is not None:
            keeper = sim.nodes[str(keeps[0].keeper)]
            for rec in keeps:
                mb = it.mbs.get(rec.mb)
                if mb is None or mb.node[s] is not dead or mb.st[s] != DONE:
                    raise SimulationError(
                        f"microbatch {rec.mb} kept for {dead.id} is not its done work at stage {s}")
                mb.node[s] = keeper
                self._kept_at[(mb.id, s)] = keeper
                moved.append(mb)
                for t in (s - 1, s + 1):
                    n = mb.node[t] if 0 <= t < sim.S else None
                    if n is not None and n.alive:
                        n.ledger.contribution_moved(mb.id, s, keeper.id)
            credit = 0.0
            for rec in keeps:
                work = dead.work.get(rec.mb, 0.0)
                keeper.work[rec.mb] = work
                credit += work
            sim.wasted -= credit
            self._credit[keeper.id] = self._credit.get(keeper.id, 0.0) + credit
            self.kept += len(keeps)
            sim.recoveries["keep"] += len(keeps)
        for peer in peers:
            self.accumulated(peer)
        return moved

    def reset(self) -> None:
        """A new iteration: the sums of the last one are gone with its commit."""
        self._credit.clear()
        self._kept_at.clear()
        self._next_check.clear()

    def is_kept(self, mb: MB, s: int) -> bool:
        """Is `mb`'s contribution at stage `s` a kept sum (its holder has no activations)?"""
        keeper = self._kept_at.get((mb.id, s))
        return keeper is not None and mb.node[s] is keeper

    def _redo(self, seconds: float, charge: bool = True) -> float:
        if charge:
            self.sim.total_compute += seconds
            self.sim.wasted += seconds
        return seconds

    def regenerate(self, mb: MB, s: int, *, charge: bool) -> float | None:
        """Seconds until the holder of `mb` at stage `s` has its stage-`s` output again: 0 unless
        the contribution there is kept; then a forward from stage `s - 1`'s output (stage 0
        rebuilds the tokens), or None while that is not available. `charge`: count the compute
        (the redo happens now), else only ask."""
        if not self.is_kept(mb, s):
            return 0.0
        keeper = mb.node[s]
        assert keeper is not None
        if s == 0:
            return self._redo(keeper.f_s, charge)
        up = mb.node[s - 1]
        if up is None or not up.alive or mb.st[s - 1] < WAIT_G:
            return None
        before = self.regenerate(mb, s - 1, charge=charge)
        if before is None:
            return None
        hop = self.sim.one_way(up, keeper, self.sim.sc.boundary(s - 1))
        return before + hop + self._redo(keeper.f_s, charge)

    def regenerate_gradient(self, mb: MB, s: int, up: SimNode) -> float:
        """Seconds for the holder of `mb` at stage `s` to have the input gradient for `up`
        (stage `s - 1`, which holds its output again): 0 unless the contribution is kept; then
        the output travels to the keeper, which runs forward and backward without
        accumulating."""
        if not self.is_kept(mb, s):
            return 0.0
        keeper = mb.node[s]
        assert keeper is not None
        hop = self.sim.one_way(up, keeper, self.sim.sc.boundary(s - 1))
        return hop + self._redo(keeper.compute_s)

    def totals(self) -> dict[str, Any]:
        return {"replay_bound": "auto" if self.auto else self.bound,
                "hazard_per_h": round(self.hazard.rate(self.sim.engine.now) * 3600, 6),
                "shipments": self.shipments,
                "shipped_bytes": self.bytes, "shipping_upload_s": round(self.upload_s, 3),
                "kept_microbatches": self.kept}
