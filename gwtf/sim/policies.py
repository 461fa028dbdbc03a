"""The routing policies the simulator compares: gwtf, oracle, swarm, swarm-rebalance,
swarm-routing, dtfm.

Each policy answers the simulator's questions (where does a sender's next microbatch go, may a
data holder inject, when is a crash noticed, what happens then) and keeps its own state.

- `gwtf`: routes as the node does. By default (`routing = "local"`, `gwtf.sim.routing.localrouting`)
  every node solves its own membership view with the node's `LocalRoute`, its view updated by
  simulated gossip, so routing after a change takes the time it takes a node; with `routing =
  "relax"` (`gwtf.sim.routing.relaxrouting`) the decentralized flow state machines of `gwtf.flow`
  run inside the simulation, each control message taking the simulated link delay. A node routes
  with its *current* `routes()` (smooth weighted round-robin over its out-rates; with no flow
  yet, the cheapest live arc). Each iteration's microbatches are dealt over the data holders in
  proportion to their out-flows, as the job coordinator deals them (`gwtf.job.iterations.assign`);
  a holder injects its share as fast as its memory slots allow.
- `oracle`: the networkx optimum, recomputed at once at every change, crashes noticed at once;
  otherwise like gwtf (same recovery rules). The upper bound.
- `swarm` / `swarm-rebalance`: SWARM's chooser, `gwtf.job.swarmroute` (the node's too); no
  pacing (each trainer keeps its memory slots full), peers discovered every `swarm_refresh_s`,
  dead peers banned when a call to them fails (after the detection timeout); rebalancing every
  `swarm_rebalance_period_s` moves a peer from the stage with the most throughput to the one
  with the least when that raises the minimum (the move takes effect at the next iteration
  boundary, after the state download). `swarm-routing`: SWARM's routing under gwtf's recovery
  rules and exact commit, as `gwtf node --routing swarm` runs it.
- `gwtf-uncompressed`: `gwtf` sending every boundary uncompressed where the scenario compresses
  (`gwtf.sim.compression`: there the gwtf policies and the oracle plan codecs per boundary and the
  swarm ones send 8-bit everywhere), to compare against on the same scenario.
- `dtfm`: a schedule computed once (`gwtf.sim.routing.baselines.dtfm_schedule`); pipeline
  heads inject equal shares; a crash of a scheduled node loses the iteration, and the job
  restarts after `restart_delay_s` with a schedule recomputed for the live nodes (joiners wait
  for a restart).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence

import numpy as np

from gwtf.flow.balance import JOB_OBJECTIVE, Balance
from gwtf.flow.oracle import solve_oracle
from gwtf.flow.placement import Seat, Swarm, best_stage, propose_move
from gwtf.flow.topology import NodeSpec
from gwtf.job.iterations import assign
from gwtf.job.nexthop import live_weights, next_hop_weights
from gwtf.job.swarmroute import SwarmBalancer
from gwtf.sim.churn import Churn
from gwtf.sim.compression import for_policy, route_view
from gwtf.sim.costs import allreduce_s
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import MB, Iteration, SimNode
from gwtf.sim.recovery.recovering import RestartRecovery, RuleRecovery, SwarmRecovery
from gwtf.sim.recovery.shipping import Shipper
from gwtf.sim.routing.baselines import DtfmNode, dtfm_schedule
from gwtf.sim.routing.localrouting import LocalRouting
from gwtf.sim.routing.relaxrouting import RelaxRouting
from gwtf.sim.scenario import NodeInfo, Scenario
from gwtf.sim.simulator import Simulation

__all__ = ["Policy", "make_policy", "simulation"]


class Policy:
    """Defaults shared by every policy (the gwtf recovery rules, no pacing)."""

    name = ""
    recovery: type[RuleRecovery] = RuleRecovery
    """What is done about a dead node's work (`gwtf.sim.recovery.recovering`): the rules, with an
    exact commit, unless the policy says otherwise."""
    activate_at_commit = True
    paced = False
    """Whether the policy follows each node's measured pace (docs/design.md 2.13)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink

    # -- lifecycle
    def start(self) -> None:
        pass

    def on_iteration_start(self, it: Iteration) -> None:
        pass

    def on_commit(self, it: Iteration) -> None:
        pass

    # -- injection
    def may_inject(self, holder: SimNode, it: Iteration) -> bool:
        return it.to_inject > 0

    def inject_rate(self, holder: SimNode) -> float | None:
        return None

    def injected(self, holder: SimNode, it: Iteration) -> None:
        it.to_inject -= 1

    # -- routing
    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None:
        """The node of `stage` that `source` sends `mb` to (for stage 0: the data holder a
        stage-1 node restarts a microbatch at)."""
        if stage == 0:
            return self._cheapest(source, 0, upstream=True)
        return self._cheapest(source, stage, upstream=False)

    def _cheapest(self, source: SimNode, stage: int, *, upstream: bool) -> SimNode | None:
        sim = self.sim
        act = sim.sc.boundary(stage - 1 if stage > 0 else 0)
        best = None
        best_cost = math.inf
        for node in sim.active_nodes(stage):
            if node.detected or sim.link(source, node) is None:
                continue
            cost = sim.one_way(source, node, act) + node.compute_s
            if cost < best_cost or (cost == best_cost and best is not None and node.id < best.id):
                best, best_cost = node, cost
        return best

    def forward_done(self, node: SimNode, mb: MB, stage: int) -> None:
        pass

    def aggregation_members(self, stage: int) -> list[SimNode]:
        return self.sim.active_nodes(stage)

    # -- churn
    def detection_delay(self) -> float:
        return self.sim.sc.detection_timeout_s

    def on_death(self, node: SimNode, was_active: bool) -> None:
        pass

    def on_activate(self, node: SimNode) -> None:
        pass

    def activate_now(self, node: SimNode) -> bool:
        """May a ready joiner enter now, rather than at the next commit? (Its state is that of
        the last commit, which is what every peer of its stage computes with until the next.)"""
        return True

    def on_link_change(self, loc_a: str, loc_b: str) -> None:
        pass

    def on_speed_change(self, node: SimNode) -> None:
        """Its machine changed speed: seen as the policy sees it (swarm through its throughput
        averages, gwtf through its pace, the oracle at once)."""

    def on_record(self, node: SimNode) -> None:
        """Its measured pace reached its record (`paced` policies)."""

    def place(self, info: NodeInfo) -> int | None:
        """The stage a joiner whose stage the trace leaves open takes (None: the scenario's,
        the stage with the fewest live nodes)."""
        return None


class _FlowPolicy(Policy):
    """Routing by rates: smooth weighted round-robin over a node's out-flows, shares of each
    iteration dealt to holders by their out-flows."""

    def routes(self, node: SimNode) -> dict[str, int]:
        raise NotImplementedError

    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None:
        if stage > 0 and stage == source.stage + 1:
            # The node's sender (gwtf.node.worker.sender) and its chooser (gwtf.job.nexthop): the
            # flows to the job's live participants of the next stage (an id of the routes may
            # now be a node that moved to another stage), else their capacities.
            sim = self.sim
            nodes = sim.nodes
            routes = self.routes(source)
            # Where a flow reaches a live candidate the weights are the flows, so those
            # candidates need no capacity (1.0 stands in): no scan of the whole stage per pick.
            candidates = {p: 1.0 for p, u in routes.items()
                          if u > 0 and p in nodes and nodes[p].active and not nodes[p].detected
                          and nodes[p].stage == stage}
            if not candidates:
                candidates = {n.id: sim.capacity(n) for n in sim.active_nodes(stage)
                              if not n.detected}
            weights, _ = next_hop_weights(routes, candidates, settled=True)
            if self.paced:
                # What each next hop tells the sender in its acknowledgements: its pace now
                # (here without the delay of its last acknowledgement).
                weights = live_weights(
                    weights, {p: nodes[p].record_s for p in weights},
                    {p: nodes[p].pace.live_s() for p in weights if nodes[p].pace is not None},
                )
            choice = source.wrr.pick(weights)
            if choice is not None:
                return nodes[choice]
        return super().pick(source, stage, mb)

    def inject_rate(self, holder: SimNode) -> float | None:
        """Unpaced: a holder injects the share dealt to it as fast as its memory slots let it,
        as a node does (the flows weigh the shares, not the pace)."""
        return None

    # -- the iteration's shares, dealt as the job coordinator deals them (docs/design.md 3.7)
    _dealt = 0
    """Microbatches dealt to holders and not injected yet (the sum of their quotas)."""

    def on_iteration_start(self, it: Iteration) -> None:
        if self._dealt:
            for node in self.sim.nodes.values():
                node.quota = 0
            self._dealt = 0
        self._deal(it, it.to_inject)

    def _holders(self) -> list[SimNode]:
        return [n for n in self.sim.active_nodes(0) if not n.detected]

    def _deal(self, it: Iteration, count: int) -> None:
        """Deal `count` microbatches over the live holders in proportion to their out-flows
        (`gwtf.job.iterations.assign`, equal shares while no holder has a flow). A holder
        injects only its share: pooled, the first holder's burst of memory slots would take a
        whole small iteration and leave the others idle, which no node does."""
        holders = self._holders()
        if count <= 0 or not holders:
            return
        flows = {n.id: sum(self.routes(n).values()) for n in holders}
        shares = assign(count, sorted(flows), flows if any(flows.values()) else None)
        for node in holders:
            node.quota += len(shares[node.id])
        self._dealt += count

    def may_inject(self, holder: SimNode, it: Iteration) -> bool:
        if it.to_inject <= 0:
            return False
        if holder.quota <= 0 and it.to_inject > self._dealt:
            # Microbatches no holder was there to take at the start (a dead holder's share
            # stays its own until the crash is noticed, then goes to the live holders).
            self._deal(it, it.to_inject - self._dealt)
        return holder.quota > 0

    def injected(self, holder: SimNode, it: Iteration) -> None:
        holder.quota -= 1
        self._dealt -= 1
        it.to_inject -= 1

    def _forfeit(self, node: SimNode) -> None:
        """A dead holder's share it had not injected goes to the live holders once the crash
        is noticed (the node's coordinator drops it instead, docs/design.md 5)."""
        it = self.sim.iteration
        if node.quota <= 0 or it is None:
            return
        self._dealt -= node.quota
        node.quota = 0
        self.sim.sink.emit(self.sim.engine.now, Kind.INJECT, self._redeal, it)

    @returns_events
    def _redeal(self, it: Iteration) -> None:
        if self.sim.iteration is it:
            for holder in self._holders():
                self.sim.try_inject(holder)


class OraclePolicy(_FlowPolicy):
    name = "oracle"
    balance: Balance = JOB_OBJECTIVE
    """The routing objective (docs/design.md 2.2); None: least cost alone
    (`benchmarks/balance.py` compares the objectives)."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.flows: dict[str, dict[str, int]] = {}
        self.solves = 0
        self.max_flow_value = 0.0
        """The largest maximum flow (microbatches/s) of any swarm seen in the run."""

    def detection_delay(self) -> float:
        return 0.0

    def solve(self) -> None:
        topo = self.sim.topology()
        self.flows = {}
        if topo is None:
            return
        self.solves += 1
        result = solve_oracle(topo, balance=self.balance)
        self.max_flow_value = max(self.max_flow_value, result.flow_value)
        for (src, dst), units in result.flows.items():
            self.flows.setdefault(src, {})[dst] = units

    def routes(self, node: SimNode) -> dict[str, int]:
        return self.flows.get(node.id, {})

    def start(self) -> None:
        self.solve()

    def on_death(self, node: SimNode, was_active: bool) -> None:
        self._forfeit(node)
        if was_active:
            self.solve()

    def on_activate(self, node: SimNode) -> None:
        self.solve()

    def on_link_change(self, loc_a: str, loc_b: str) -> None:
        self.solve()

    def on_speed_change(self, node: SimNode) -> None:
        self.sim.set_record(node, node.compute_s)
        if node.active:
            self.solve()


class GwtfPolicy(_FlowPolicy):
    """gwtf: routing by local solves (`LocalRouting`, as the node) or by the relaxation
    (`RelaxRouting`), as the scenario's `routing` says; placement unless `gwtf-fixed`."""

    name = "gwtf"
    paced = True

    def __init__(self, sim: Simulation, placement: bool = True) -> None:
        super().__init__(sim)
        self.placement = placement
        self.name = "gwtf" if placement else "gwtf-fixed"
        # Placement (gwtf.flow.placement): moves are weighed at a commit after the swarm
        # changed, one move at a time.
        self.changes = 0
        self.weighed = -1  # the first commit weighs the swarm as it started
        self.mover: SimNode | None = None
        self.view = route_view(sim.sc)
        """Placement's view of the boundaries' bytes (gwtf.sim.compression.RouteView)."""
        self.locations = sorted({i.location for i in sim.sc.nodes.values()})
        self.router: LocalRouting | RelaxRouting = (
            LocalRouting(sim) if sim.sc.routing == "local"
            else RelaxRouting(sim, placement=placement)
        )

    # -- policy
    def routes(self, node: SimNode) -> dict[str, int]:
        return self.router.routes(node)

    def start(self) -> None:
        self.router.start()

    def on_death(self, node: SimNode, was_active: bool) -> None:
        self.changes += 1
        self._forfeit(node)
        self.router.retire(node, left=node.left)
        if self.placement and was_active:
            self._fill_empty_stages()

    def _fill_empty_stages(self) -> None:
        """A stage with no node left pauses the job: a node moves there now, in the middle
        of the iteration (`Simulation.relocate`), rather than at a commit that cannot come."""
        sim = self.sim
        while True:
            swarm = self._swarm()
            if all(swarm.count(s) for s in range(sim.S)):
                return
            move = propose_move(swarm, self._movable(), lambda node_id, stage: 0.0, 0.0)
            if move is None:
                return
            sim.churn.relocate(sim.nodes[move.node], move.stage)

    def on_activate(self, node: SimNode) -> None:
        self.changes += 1
        self.router.activated(node)
        if self.placement and self.sim.topology() is None:
            self._fill_empty_stages()  # the joiner may let a stage spare a node

    # -- placement (gwtf.flow.placement, docs/design.md 2.11)
    def _seat(self, info: NodeInfo, stage: int) -> NodeSpec:
        sim = self.sim
        return NodeSpec.make(info.id, stage, sim.sc.compute_s(info, stage),
                             self.view.location(info.location, stage),
                             sim.capacity_at(info, stage))

    def _swarm(self) -> Swarm:
        """The swarm as its members know it: every node not yet known dead, downloading
        joiners and movers at the stage they are entering."""
        sim = self.sim
        nodes = tuple(self._seat(n.info, n.stage) for n in sorted(sim.nodes.values(),
                                                                  key=lambda n: n.id)
                      if not n.detected)
        links = self.view.links(sim.links, sim.sc.intra, self.locations)
        return Swarm(sim.S, self.view.activation_bytes, nodes, links, sim.sc.intra)

    def _movable(self) -> dict[str, Seat]:
        """The nodes that may move: those whose stage keeps another live node (a node checks
        that a peer of its stage answers before it leaves the stage)."""
        sim = self.sim
        return {n.id: functools.partial(self._seat, n.info)
                for n in sim.active_nodes() if len(sim.active_nodes(n.stage)) > 1}

    def place(self, info: NodeInfo) -> int | None:
        if not self.placement:
            return None
        return best_stage(self._swarm(), lambda stage: self._seat(info, stage))

    def on_commit(self, it: Iteration) -> None:
        sim = self.sim
        if not self.placement or self.weighed == self.changes:
            return
        if self.mover is not None and self.mover.alive and not self.mover.active:
            return  # one move at a time: the last one is still downloading
        self.weighed = self.changes
        move = propose_move(self._swarm(), self._movable(),
                            lambda node_id, stage: sim.churn.transfer_s(sim.nodes[node_id], stage),
                            sim.sc.placement_horizon_s)
        if move is None:
            return
        node = sim.nodes[move.node]
        self.router.retire(node, left=True)
        sim.churn.move(node, move.stage)
        self.mover = node

    def on_link_change(self, loc_a: str, loc_b: str) -> None:
        self.router.link_changed(loc_a, loc_b)

    def on_record(self, node: SimNode) -> None:
        self.router.record_changed(node)


class SwarmPolicy(Policy):
    """SWARM parallelism's stochastic wiring (its chooser: `gwtf.job.swarmroute`)."""

    name = "swarm"
    recovery: type[RuleRecovery] = SwarmRecovery

    def __init__(self, sim: Simulation, rebalance: bool = False) -> None:
        super().__init__(sim)
        self.rebalance = rebalance
        self.name = "swarm-rebalance" if rebalance else "swarm"
        self.balancers: dict[tuple[str, int], SwarmBalancer] = {}
        self.dead: set[str] = set()

    def _balancer(self, node: SimNode, stage: int) -> SwarmBalancer:
        key = (node.id, stage)
        bal = self.balancers.get(key)
        if bal is None:
            sc = self.sim.sc
            seed = [sc.seed, stage, *map(ord, node.id)]
            bal = SwarmBalancer(np.random.default_rng(seed), sc.swarm_ema_alpha)
            self.balancers[key] = bal
            self._refresh(bal, stage)
        return bal

    def _refresh(self, bal: SwarmBalancer, stage: int) -> None:
        now = self.sim.engine.now
        for peer in self.sim.active_nodes(stage):
            if peer.id not in self.dead:
                bal.add(peer.id, now)

    def start(self) -> None:
        sim = self.sim
        sim.sink.emit(sim.sc.swarm_refresh_s, Kind.PERIODIC, self._on_refresh, None)
        if self.rebalance:
            sim.sink.emit(sim.sc.swarm_rebalance_period_s, Kind.PERIODIC,
                                self._on_rebalance, None)

    @returns_events
    def _on_refresh(self, _: object) -> None:
        for (_, stage), bal in sorted(self.balancers.items()):
            self._refresh(bal, stage)
        sim = self.sim
        sim.sink.emit(sim.engine.now + sim.sc.swarm_refresh_s, Kind.PERIODIC,
                            self._on_refresh, None)

    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None:
        if stage == 0:
            return None  # a dead trainer's microbatches are gone with it
        sim = self.sim
        now = sim.engine.now
        bal = self._balancer(source, stage)
        pending = source.pending_resp
        while pending and pending[0][0] <= now:
            t, peer, started, st = heapq.heappop(pending)
            self._balancer(source, st).measured(peer, started, t)
        choice = bal.choose()
        if choice is None:
            self._refresh(bal, stage)  # SWARM refreshes at once when it has no expert left
            choice = bal.choose()
        if choice is None:
            return None
        node = sim.nodes[choice]
        if not node.active and node.alive:
            bal.ban(choice)  # it moved to another stage
            bal.unban(choice)
            return self.pick(source, stage, mb)
        return node

    def forward_done(self, node: SimNode, mb: MB, stage: int) -> None:
        """The sender's call to `node` returns (SWARM measures throughput from these)."""
        if stage == 0:
            return
        sender = mb.node[stage - 1]
        if sender is None or not sender.alive:
            return
        t = self.sim.engine.now + self.sim.one_way(node, sender, 0)
        heapq.heappush(sender.pending_resp, (t, node.id, mb.sent_at[stage], stage))

    def on_death(self, node: SimNode, was_active: bool) -> None:
        self.dead.add(node.id)
        for bal in self.balancers.values():
            bal.ban(node.id)

    @returns_events
    def _on_rebalance(self, _: object) -> None:
        sim = self.sim
        sim.sink.emit(sim.engine.now + sim.sc.swarm_rebalance_period_s, Kind.PERIODIC,
                            self._on_rebalance, None)
        stages = sim.S
        throughput = [sum(1 / n.compute_s for n in sim.active_nodes(s) if n.move_to is None)
                      for s in range(stages)]
        low = min(range(stages), key=lambda s: (throughput[s], s))
        high = max(range(stages), key=lambda s: (throughput[s], -s))
        donors = [n for n in sim.active_nodes(high) if n.move_to is None]
        if low == high or len(donors) < 2:
            return
        best = None
        best_min = min(throughput)
        for peer in donors:
            gain = 1 / sim.sc.compute_s(peer.info, low)
            new_low = throughput[low] + gain
            new_high = throughput[high] - 1 / peer.compute_s
            others = [throughput[s] for s in range(stages) if s not in (low, high)]
            new_min = min([new_low, new_high, *others])
            if new_min > best_min + 1e-12:
                best, best_min = peer, new_min
        if best is not None:
            best.move_to = low

    def on_commit(self, it: Iteration) -> None:
        sim = self.sim
        for node in sorted(sim.active_nodes(), key=lambda n: n.id):
            if node.move_to is None:
                continue
            stage = node.move_to
            node.move_to = None
            for bal in self.balancers.values():
                bal.ban(node.id)
                bal.unban(node.id)
            sim.churn.move(node, stage)


class SwarmRoutingPolicy(SwarmPolicy):
    """SWARM's routing under gwtf's recovery, as `gwtf node --routing swarm` runs it: the
    same chooser, with the rules' exact recovery and commit (what SWARM's routing alone is
    worth against gwtf's, docs/design.md 2.14)."""

    recovery = RuleRecovery

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.name = "swarm-routing"

    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None:
        if stage == 0:  # a dead holder's microbatches are recovered by another (rule 1)
            return Policy.pick(self, source, stage, mb)
        return super().pick(source, stage, mb)


class DtfmPolicy(Policy):
    """DT-FM: a static schedule, no fault tolerance (restart from the last commit)."""

    name = "dtfm"
    recovery = RestartRecovery
    activate_at_commit = False

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)
        self.pipelines: list[list[SimNode]] = []
        self.members: set[str] = set()
        self.restarting = False
        self.rng = np.random.default_rng([sim.sc.seed, 7])

    def schedule(self) -> None:
        sim = self.sim
        sc = sim.sc
        stage_nodes = [
            [DtfmNode(n.id, n.stage, n.compute_s) for n in
             sorted(sim.active_nodes(s), key=lambda n: n.id)]
            for s in range(sim.S)
        ]
        nodes = sim.nodes

        def hop(a: str, b: str) -> float:
            return sim.one_way(nodes[a], nodes[b], sc.activation_bytes)

        def allreduce(ids: Sequence[str]) -> float:
            return allreduce_s(sc, sim.network, [nodes[i] for i in ids])

        chains = dtfm_schedule(stage_nodes, hop, allreduce, sc.microbatches_per_iteration,
                               self.rng, sc.dtfm_search_evaluations)
        self.pipelines = [[nodes[n.id] for n in chain] for chain in chains]
        self.members = {n.id for chain in self.pipelines for n in chain}
        for node in nodes.values():
            node.dtfm_next = None
            node.quota = 0
        for chain in self.pipelines:
            for a, b in zip(chain, chain[1:], strict=False):
                a.dtfm_next = b

    def start(self) -> None:
        self.schedule()

    def on_iteration_start(self, it: Iteration) -> None:
        d = len(self.pipelines)
        if d == 0:
            it.to_inject = 0
            it.target = 0
            return
        share, extra = divmod(it.target, d)
        for p, chain in enumerate(self.pipelines):
            chain[0].quota = share + (1 if p < extra else 0)

    def may_inject(self, holder: SimNode, it: Iteration) -> bool:
        return holder.quota > 0 and it.to_inject > 0

    def injected(self, holder: SimNode, it: Iteration) -> None:
        holder.quota -= 1
        it.to_inject -= 1

    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None:
        return source.dtfm_next if stage == source.stage + 1 else None

    def aggregation_members(self, stage: int) -> list[SimNode]:
        return [chain[stage] for chain in self.pipelines if chain[stage].alive]

    def activate_now(self, node: SimNode) -> bool:
        sim = self.sim
        if sim.iteration is None and not self.restarting:
            # Stalled for want of a stage: this joiner may be what the restart waits for.
            sim.pending_activation.append(node)
            self._restart_now()
            return False
        return False

    def on_death(self, node: SimNode, was_active: bool) -> None:
        sim = self.sim
        if node.id not in self.members or self.restarting:
            return
        self.restarting = True
        sim.restart()
        sim.paused_until = sim.engine.now + sim.sc.restart_delay_s
        sim.sink.emit(sim.paused_until, Kind.ITERATION, self._resume, None)

    @returns_events
    def _resume(self, _: object) -> None:
        self._restart_now()

    def _restart_now(self) -> None:
        sim = self.sim
        self.restarting = False
        sim.activate_pending()
        if any(not sim.active_nodes(s) for s in range(sim.S)):
            return  # wait for a joiner of the empty stage (activate_now)
        self.schedule()
        sim.resume()


def simulation(scenario: Scenario, policy_name: str, seed: int | None = None) -> Simulation:
    """The simulation of `scenario` under the policy named `policy_name` (gwtf, gwtf-fixed,
    gwtf-uncompressed, oracle, swarm, swarm-rebalance, swarm-routing or dtfm), with the codecs
    that policy sends where the scenario compresses (`gwtf.sim.compression.for_policy`)."""
    return Simulation(for_policy(scenario, policy_name), policy_name, seed,
                      make_policy=lambda sim, name: make_policy(name, sim),
                      make_shipping=Shipper, make_recovery=_recovery, make_churn=Churn)


def _recovery(sim: Simulation) -> RuleRecovery:
    """The recovery the simulation's policy chose."""
    policy = sim.policy
    assert isinstance(policy, Policy)
    return policy.recovery(sim)


def make_policy(name: str, sim: Simulation) -> Policy:
    if name in ("gwtf", "gwtf-uncompressed"):
        return GwtfPolicy(sim)
    if name == "gwtf-fixed":
        return GwtfPolicy(sim, placement=False)
    if name == "oracle":
        return OraclePolicy(sim)
    if name == "swarm":
        return SwarmPolicy(sim)
    if name == "swarm-rebalance":
        return SwarmPolicy(sim, rebalance=True)
    if name == "swarm-routing":
        return SwarmRoutingPolicy(sim)
    if name == "dtfm":
        return DtfmPolicy(sim)
    raise ValueError(f"unknown policy {name!r}")

