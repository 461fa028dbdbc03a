"""What a simulated swarm does about work that died (docs/design.md 4 and 5), one class per way
of recovering, chosen by the policy (`Policy.recovery`), around the same simulation:

- `RuleRecovery` (gwtf, gwtf-fixed, oracle): the rules of `gwtf.recovery`, from each node's
  `Ledger` through the real `plan_crash`; the commit needs `check_commit` to hold and the run
  asserts conservation (every injected microbatch finished or dropped, never both);
- `SwarmRecovery` (swarm, swarm-rebalance): in-flight work is retried elsewhere like rules 1-2,
  but a dead peer's accumulated gradients and a dead trainer's microbatches are lost (counted in
  `lost`, and not in the throughput), and the trainer gives up a microbatch whose gradient died;
- `RestartRecovery` (dtfm): nothing is recovered; the policy restarts the iteration
  (`Simulation.restart`) when a scheduled node dies.

Every class also moves data along (`pump`): whenever a microbatch changes state, it sends what a
stage now waits for (a gradient, or a recovery's inputs) as soon as its source has it.
"""

from __future__ import annotations

from typing import Any

from gwtf.job.exchange import WHOLE
from gwtf.recovery import Rule, check_commit, plan_crash
from gwtf.sim.costs import allreduce_s
from gwtf.sim.engine import Kind
from gwtf.sim.entities import (
    BWD_Q,
    DONE,
    FWD_Q,
    INFLIGHT,
    J_FUSED,
    J_FWD,
    J_RFWD,
    MB,
    NONE,
    WAIT_G,
    Iteration,
    SimNode,
    SimulationError,
)
from gwtf.sim.exchange import ExchangeLedger
from gwtf.sim.network import commit_timeline, exchange_of
from gwtf.sim.recovery.snapshots import StageSnapshots
from gwtf.sim.simulator import Simulation

__all__ = ["RestartRecovery", "RuleRecovery", "SwarmRecovery"]


class RuleRecovery:
    """The crash rules of docs/design.md 4 on the simulation's entities."""

    ships = True
    """Partial sums are shipped to stage keepers (4.9, `gwtf.sim.recovery.shipping`)."""
    keeps_snapshots = True
    """Stages are snapshotted, and a wiped one restored from its keeper (4.6)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.S = sim.S
        self.snapshots = StageSnapshots(sim) if self.keeps_snapshots else None
        self.waiting: list[dict[int, MB]] = [{} for _ in range(sim.S)]
        """Per stage, the microbatches whose recovery waits for a node of the stage."""
        self.exchanges = ExchangeLedger()
        """What the commit's exchanges of the iteration delivered so far (reruns reuse it)."""
        self._step_delays: dict[str, float] = {}

    # ------------------------------------------------------------------ the commit

    def commit_s(self) -> float:
        """Seconds until the coordinator orders the step: the node's two-phase commit
        (docs/design.md 3.7; reports, order, sums exchanged within each stage all to all or by
        reduce-scatter and all-gather as gwtf.job.exchange chooses, prepared), each message
        timed from when its sender had it (`commit_timeline`), measured in section `fidelity`
        of benchmarks/RESULTS.md as the cost the real swarm pays; a ring all-reduce (two legs)
        under-charged it. The step order then reaches each member on its own link
        (`step_delays`). A rerun of a reduce-scatter and all-gather after a death moves only
        what the earlier attempts did not deliver (`gwtf.sim.exchange`); an all-to-all one
        moves every sum again."""
        sim = self.sim
        self._step_delays = {}
        members = [sim.policy.aggregation_members(s) for s in range(self.S)]
        if not members[0]:
            return self.allreduce_commit_s()
        sc = sim.sc
        it = sim.iteration
        now = sim.engine.now
        coordinator = min((n.info for n in members[0]), key=lambda i: i.id)
        stages = [[n.info for n in m] for m in members]
        sums = [p * sc.grad_bytes_per_param for p in sc.params_per_stage]
        whole = {s for s, stage in enumerate(stages)
                 if exchange_of(sim.network, stage, sums[s]) == WHOLE}
        reported = ({} if it is None else
                    {n: (info, t - now) for n, (info, t) in it.reported.items()})
        ordered = commit_timeline(sim.network, coordinator, reported, stages, sums,
                                  sc.message_bytes, whole=whole).ordered_s
        moves = self.exchanges.moves(
            now, (it.index, it.start_s) if it is not None else (-1, 0.0), sim.network,
            stages,
            {n.id: frozenset(n.ledger.contributions()) for m in members for n in m},
            [int(p) for p in sc.params_per_stage], sc.grad_bytes_per_param, ordered, whole,
        )
        timeline = commit_timeline(sim.network, coordinator, reported, stages, sums,
                                   sc.message_bytes, moves, whole)
        self._step_delays = {n: t - timeline.decided_s for n, t in timeline.step_s.items()}
        return timeline.decided_s

    def step_delays(self) -> dict[str, float]:
        """Per member of the last commit, how long after the coordinator's step order it
        reaches it (empty for the baselines' all-reduce, after which every node goes on at
        once)."""
        return self._step_delays

    def allreduce_commit_s(self) -> float:
        """Seconds of the slowest stage's ring all-reduce (the baselines' commit)."""
        sim = self.sim
        return max((allreduce_s(sim.sc, sim.network, sim.policy.aggregation_members(s))
                    for s in range(self.S)), default=0.0)

    def verify_commit(self, it: Iteration) -> None:
        """Before the all-reduce: every stage covers every finished microbatch exactly once.
        What the swarm knows: a crash not yet noticed still counts as a live node (the
        all-reduce then waits for it and fails when the crash is noticed)."""
        sim = self.sim
        contributions = {
            s: [n.ledger.contributions() for n in sim.nodes.values()
                if n.active and not n.detected and n.stage == s]
            for s in range(self.S)
        }
        verdict = check_commit(self.S, it.finished, contributions)
        sim.audit["commit_checks"] += 1
        if not verdict.ok:
            raise SimulationError(
                f"{sim.policy_name}: iteration {it.index} cannot commit: {verdict.reason()}"
            )

    def conserve(self, it: Iteration) -> None:
        """At the commit: every injected microbatch finished or dropped, never both."""
        injected = set(it.mbs)
        if it.finished & it.dropped or it.finished | it.dropped != injected:
            raise SimulationError(
                f"{self.sim.policy_name}: iteration {it.index}: {len(injected)} injected, "
                f"{len(it.finished)} finished, {len(it.dropped)} dropped"
            )
        self.sim.audit["conserved_iterations"] += 1

    # ------------------------------------------------------------------ a death

    def on_death(self, dead: SimNode) -> None:
        """`dead` was active when its death was noticed."""
        snapshots = self.snapshots
        if snapshots is not None:
            snapshots.died(dead)
        self.recover(dead)
        if snapshots is not None:
            if self.sim.active_nodes(dead.stage):
                snapshots.thinned(dead.stage)
            else:
                snapshots.wiped(dead.stage)

    def boundary(self, index: int) -> None:
        """Iteration `index` starts (snapshots due now are sent)."""
        if self.snapshots is not None:
            self.snapshots.boundary(index)

    def snapshot_source(self, stage: int) -> SimNode | None:
        """The keeper a joiner of the empty `stage` restores it from (None: no snapshots)."""
        return self.snapshots.source(stage) if self.snapshots is not None else None

    def snapshot_totals(self) -> dict[str, Any]:
        return self.snapshots.totals() if self.snapshots is not None else {}

    def recover(self, dead: SimNode) -> None:
        sim = self.sim
        it = sim.iteration
        if it is None:
            return
        sim.abort_aggregation()
        s = dead.stage
        reports = [n.ledger.report_about(dead.id) for n in sim.nodes.values()
                   if n.alive and n.stage in (s - 1, s + 1)]
        held = [mb.id for mb in it.mbs.values() if mb.node[0] is dead] if s == 0 else []
        covered, keeper = sim.shipping.cover(dead)
        plan = plan_crash(dead.id, s, self.S, reports, finished=it.finished, held_by_dead=held,
                          covered=covered, keeper=keeper, dropped_before=it.dropped)
        for kept in sim.shipping.keep(plan, dead):
            self.pump(kept)
        for mb_id in sorted(plan.dropped):
            mb = it.mbs.get(mb_id)
            if mb is None or mb.dead:
                continue
            if self._held_downstream(mb):
                continue  # its stage-1 node died unnoticed but it got further: see below
            sim.recoveries["drop"] += 1
            self._lose(mb)
        for rec in plan.recoveries:
            mb = it.mbs.get(rec.mb)
            if mb is None or mb.dead or mb.node[rec.stage] is not dead:
                continue
            self._apply(mb, rec.stage, rec.rule)
        # Microbatches no live neighbour could report (both of the dead node's neighbours on
        # its path are gone): the same rules, from the microbatch's own state (its path).
        for mb in list(it.mbs.values()):
            if mb.dead or mb.node[s] is not dead:
                continue
            st = mb.st[s]
            rule = (Rule.REPLAY if st == DONE else Rule.RECOMPUTE if st in (WAIT_G, BWD_Q)
                    else Rule.DROP if s == 0 else Rule.RESEND)
            if rule == Rule.RECOMPUTE and s == self.S - 1:
                rule = Rule.RESEND
            if rule == Rule.DROP and self._held_downstream(mb):
                # Its stage-0 work was being redone (a holder took over a dead holder's forward
                # or gradient sum) when that holder died too: the microbatch left a holder
                # long ago, later stages keep it, so rule 4 does not apply. Another holder
                # redoes the forward from the tokens (they depend only on the job, the
                # iteration and the id) and takes the gradient that comes back.
                rule = Rule.RECOMPUTE
            sim.recoveries["orphan"] += 1
            if rule == Rule.DROP:
                self._lose(mb)
            else:
                self._apply(mb, s, rule)
        sim.maybe_complete()

    def _lose(self, mb: MB) -> None:
        """A microbatch that never left a dead data holder (rule 4)."""
        self._drop(mb)

    def _apply(self, mb: MB, s: int, rule: Rule) -> None:
        self.sim.recoveries[rule.name.lower()] += 1
        self._redo(mb, s, rule)

    def _redo(self, mb: MB, s: int, rule: Rule) -> None:
        """Stage `s` of `mb` is to be done again under `rule` (the inputs are sent by `pump`)."""
        it = self.sim.iteration
        if mb.st[s] == DONE:
            mb.done_count -= 1
            if mb.done_count == self.S - 1 and it is not None:
                it.incomplete += 1
        mb.node[s] = None
        mb.st[s] = NONE
        mb.need[s] = rule
        mb.g_inflight[s] = False
        self.pump(mb)

    def _held_downstream(self, mb: MB) -> bool:
        """Does a live node past stage 0 hold `mb` (so its token ids survive)?"""
        for t in range(1, self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.st[t] > INFLIGHT:
                return True
        return False

    def _drop(self, mb: MB) -> None:
        sim = self.sim
        it = sim.iteration
        assert it is not None
        # An activation still on the wire when the crash is noticed (the oracle notices at
        # once) is discarded when it lands; state at a node that died unnoticed died with it;
        # anything else would mean the rules were broken.
        if self._held_downstream(mb):
            raise SimulationError(f"dropped microbatch {mb.id} is held past stage 0")
        mb.dead = True
        sim.dropped += 1
        sim.audit["dropped"] += 1
        it.dropped.add(mb.id)
        it.incomplete -= 1
        self.release(mb)

    def abandon(self, mb: MB, *, lost: bool) -> None:
        """Forget a microbatch that will not finish (swarm's dead trainer, dtfm's restart)."""
        sim = self.sim
        it = sim.iteration
        mb.dead = True
        sim.audit["abandoned"] += 1
        for t in range(self.S):
            n = mb.node[t]
            if n is not None and n.alive:
                sim.wasted += mb.spent[t]
        if lost:
            sim.lost.add(mb.id)
        if it is not None and mb.iteration == it.index:
            it.mbs.pop(mb.id, None)
            it.injected -= 1
            if mb.done_count < self.S:
                it.incomplete -= 1
            it.to_inject += 1
        self.release(mb)
        if it is not None and it.to_inject > 0:
            for holder in sim.active_nodes(0):
                sim.try_inject(holder)

    def release(self, mb: MB) -> None:
        """`mb` is gone: free the memory slots it held and forget its waits."""
        sim = self.sim
        for t in range(self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.id in n.slot_mbs:
                if n.job is None or n.job[1] is not mb:
                    n.slot_mbs.discard(mb.id)
                    sim.start_next(n)
                    if n.stage == 0:
                        sim.try_inject(n)
        for s in range(self.S):
            self.waiting[s].pop(mb.id, None)

    def wake(self, stage: int) -> None:
        """A node entered `stage`: what waited for one goes on."""
        waiting = self.waiting[stage]
        if waiting:
            self.waiting[stage] = {}
            for mb in list(waiting.values()):
                mb.waiting = False
                self.pump(mb)

    def forget_waits(self) -> None:
        """The iteration was thrown away (`Simulation.restart`)."""
        self.waiting = [{} for _ in range(self.S)]

    # ------------------------------------------------------------------ data movement

    def pump(self, mb: MB) -> None:
        """Send whatever a stage of `mb` waits for, if its source has it (see the module doc)."""
        if mb.dead:
            return
        S = self.S
        sim = self.sim
        for s in range(S):
            node = mb.node[s]
            if node is None:
                if mb.need[s]:
                    self._try_recover(mb, s)
                continue
            if mb.st[s] == WAIT_G and s < S - 1 and not mb.g_inflight[s] and node.alive:
                down = mb.node[s + 1]
                if down is None:
                    if mb.st[s + 1] == DONE and self._gradient_lost(mb):
                        return
                    continue
                if down.alive and mb.st[s + 1] == DONE:
                    mb.g_inflight[s] = True
                    down.ledger.gradient_sent(mb.id, node.id)
                    arrive = sim.transfer(down, node, sim.sc.boundary(s)) + \
                        sim.shipping.regenerate_gradient(mb, s + 1, node)
                    sim.sink.emit(arrive, Kind.ARRIVE, sim.on_gradient,
                                  (mb, s, node, down.id))

    def _gradient_lost(self, mb: MB) -> bool:
        """The gradient a stage of `mb` waits for died downstream and is not being redone (a
        downstream contribution marked lost). True: `mb` was given up."""
        return False

    def _input_source(self, mb: MB, s: int) -> SimNode | None:
        if s > 0:
            up = mb.node[s - 1]
            if up is not None and up.alive and mb.st[s - 1] >= WAIT_G:
                return up
            if up is None and mb.st[s - 1] == DONE:
                return self._kept_input(mb)
            return None
        for t in range(1, self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.st[t] >= FWD_Q:
                return n
        return self._rebuilder()

    def _kept_input(self, mb: MB) -> SimNode | None:
        """Who else holds the input of a stage whose upstream contribution is gone."""
        return None

    def _rebuilder(self) -> SimNode | None:
        """The live data holder that rebuilds a microbatch no later stage holds: the one with
        the fewest microbatches in hand (then by id). It rebuilds the token ids from (seed,
        iteration, id) and redoes stage 0 itself, which breaks the wait of stage 0 for stage 1
        and of stage 1 for stage 0 (docs/design.md 4, rule 4)."""
        holders = [n for n in self.sim.active_nodes(0) if not n.detected]
        return min(holders, key=lambda n: (len(n.slot_mbs), n.id), default=None)

    def _no_source(self, mb: MB, s: int) -> None:
        """No node can send stage `s` of `mb` its input now."""
        if s == 0:
            # No data holder is active yet to rebuild it (every holder died and the joiner
            # is still loading): wait for one, or the microbatch is never pumped again.
            mb.waiting = True
            self.waiting[0][mb.id] = mb

    def _try_recover(self, mb: MB, s: int) -> None:
        sim = self.sim
        shipping = sim.shipping
        rule = mb.need[s]
        source = self._input_source(mb, s)
        if source is None:
            self._no_source(mb, s)
            return
        if s > 0 and shipping.regenerate(mb, s - 1, charge=False) is None:
            return
        grad_source = None
        replay_now = rule == Rule.REPLAY
        if rule == Rule.REPLAY and s < self.S - 1:
            down = mb.node[s + 1]
            if down is not None and down.alive and mb.st[s + 1] == DONE:
                if shipping.is_kept(mb, s + 1):
                    replay_now = False  # its gradient needs this stage's output first
                else:
                    grad_source = down
            elif down is None or not down.alive:
                # The next stage's gradient died too and is itself being rebuilt, which needs
                # this stage's output first: redo the forward now, the backward when it comes.
                replay_now = False
            else:
                return
        # A data holder that rebuilds the tokens itself redoes stage 0 itself.
        target = source if source.stage == 0 == s else sim.policy.pick(source, s, mb)
        if target is None:
            mb.waiting = True
            self.waiting[s][mb.id] = mb
            return
        if mb.waiting:
            mb.waiting = False
            self.waiting[s].pop(mb.id, None)
        mb.need[s] = 0
        mb.node[s] = target
        mb.g_inflight[s] = False
        mb.st[s] = INFLIGHT
        mb.sent_at[s] = sim.engine.now
        mode = Rule(rule).mode
        if s > 0:
            source.ledger.activation_sent(mb.id, target.id, mode)
        elif source is not target:
            source.ledger.gradient_target(mb.id, target.id, mode)
        arrive = sim.transfer(source, target, sim.sc.boundary(s - 1) if s > 0 else 0) + (
            shipping.regenerate(mb, s - 1, charge=True) or 0.0 if s > 0 else 0.0)
        down = mb.node[s + 1] if s < self.S - 1 else None
        if down is not None and down.alive and s > 0:
            down.ledger.gradient_target(mb.id, target.id, mode)
        if grad_source is not None:
            grad_source.ledger.gradient_sent(mb.id, target.id)
            grad_source.ledger.gradient_target(mb.id, target.id, mode)
            arrive = max(arrive, sim.transfer(grad_source, target, sim.sc.boundary(s)))
        if rule == Rule.RESEND:
            job = J_FUSED if s == self.S - 1 else J_FWD
        elif rule == Rule.RECOMPUTE or not replay_now:
            job = J_RFWD
        else:
            job = J_FUSED
        sim.sink.emit(arrive, Kind.ARRIVE, sim.on_activation,
                      (mb, s, target, source.id, job, grad_source))


class SwarmRecovery(RuleRecovery):
    """SWARM keeps no ledger: a dead peer's accumulated gradient is simply gone (and a finished
    microbatch is never revisited), and a dead trainer's microbatches with it. The commit is
    not checked: SWARM trains on to its batch target without what it lost."""

    ships = False
    keeps_snapshots = False

    def commit_s(self) -> float:
        return self.allreduce_commit_s()

    def verify_commit(self, it: Iteration) -> None:
        pass

    def conserve(self, it: Iteration) -> None:
        pass

    def _lose(self, mb: MB) -> None:
        self.abandon(mb, lost=True)

    def _apply(self, mb: MB, s: int, rule: Rule) -> None:
        sim = self.sim
        sim.recoveries[rule.name.lower()] += 1
        if not (rule == Rule.REPLAY or s == 0 or mb.finished):
            self._redo(mb, s, rule)
            return
        if s == 0 and not mb.finished:
            self.abandon(mb, lost=True)
            return
        sim.lost.add(mb.id)
        mb.node[s] = None
        if mb.st[s] != DONE:
            mb.st[s] = DONE
            mb.done_count += 1
            if mb.done_count == self.S and sim.iteration is not None:
                sim.iteration.incomplete -= 1
        self.pump(mb)  # an upstream stage may wait for the gradient that died here

    def _gradient_lost(self, mb: MB) -> bool:
        # The gradient this stage waits for died with a downstream peer that was marked lost;
        # the trainer gives the microbatch up and takes a new one (waiting would stall the
        # iteration for good).
        self.abandon(mb, lost=True)
        return True

    def _kept_input(self, mb: MB) -> SimNode | None:
        # SWARM's trainer drives every stage and keeps every input (client-driven).
        trainer = mb.node[0]
        return trainer if trainer is not None and trainer.alive else None

    def _rebuilder(self) -> SimNode | None:
        return None  # a dead trainer's microbatches are gone with it

    def _no_source(self, mb: MB, s: int) -> None:
        pass


class RestartRecovery(RuleRecovery):
    """No recovery (dtfm): the policy restarts the iteration when a scheduled node dies
    (`on_death`); a death that it ignores (the node held none of its work) can only have held
    up the all-reduce, which runs again without it."""

    ships = False
    keeps_snapshots = False

    def commit_s(self) -> float:
        return self.allreduce_commit_s()

    def on_death(self, dead: SimNode) -> None:
        sim = self.sim
        if sim.iteration is not None and sim.iteration.aggregating:
            sim.abort_aggregation()
            sim.maybe_complete()
