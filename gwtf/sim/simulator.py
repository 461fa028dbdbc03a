"""The discrete-event simulation of one policy on one scenario: the pipeline's core.

What is simulated (docs/design.md 5):

- Compute: each node runs one job at a time; backward jobs go first (they free memory), then
  forward jobs while a memory slot is free. A slot is held from a microbatch's forward at the node
  until its backward there. Forward takes 1/3 of the stage's compute time, backward 2/3; the last
  stage does both as one job.
- Links (gwtf/sim/network.py): a send from i to j waits for the pair's previous send to finish
  (and, where nodes have access links, for i's uplink and j's downlink), takes
  `bytes * 8 / bandwidth`, then arrives one-way latency (RTT / 2) later. Activations and gradients
  have their boundary's size (`Scenario.boundary`: the activation's, or a codec's parts where the
  policy compresses, gwtf/sim/compression.py); flow control messages `message_bytes`.
- Iterations: the data holders inject the iteration's microbatches (the flow policies through a
  token bucket at the holder's out-rate, burst = its memory slots; swarm and dtfm whenever a slot
  is free, which is how they work); when every one is finished
  or dropped and every stage covers every finished one exactly once (`check_commit`), each stage
  all-reduces its gradients (ring: `2 (n-1)/n * bytes / slowest bandwidth + 2 (n-1) * latency`)
  and the iteration commits.

The pieces around this core, each built by `gwtf.sim.policies.simulation` and reached through
the hooks below (so that no module here names the ones built around it): the entities
(`gwtf.sim.entities`: nodes, microbatches, the iteration), the routing policy
(`gwtf.sim.policies`), churn (`gwtf.sim.churn`: joins, leaves, crashes, moves, detection),
recovery (`gwtf.sim.recovery.recovering`: the rules of docs/design.md 4, SWARM's losses, or nothing,
and the sends a microbatch waits for) and shipments of partial sums (`gwtf.sim.recovery.shipping`,
4.9).

Events are handled vidur-style: a handler (`@returns_events`) changes the entities and returns
the new events it caused; the engine orders them by time, kind and scheduling order.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from gwtf.flow.topology import LinkSpec, NodeSpec, Topology, TopologyError
from gwtf.recovery import CrashPlan, Rule
from gwtf.sim.compression import access_bound, flow_topology
from gwtf.sim.costs import allreduce_s, hop_estimate
from gwtf.sim.engine import Engine, EventSink, Kind, returns_events
from gwtf.sim.entities import (
    BWD_Q,
    DONE,
    FWD_Q,
    J_BWD,
    J_FUSED,
    J_FWD,
    J_RFWD,
    MB,
    WAIT_G,
    Iteration,
    SimNode,
    SimResult,
    SimulationError,
)
from gwtf.sim.network import Network
from gwtf.sim.paces import Paces
from gwtf.sim.scenario import NodeInfo, Scenario
from gwtf.sim.traces import TraceEvent

__all__ = ["SimulationError", "Simulation", "SimResult", "allreduce_s", "hop_estimate"]


class PolicyHooks(Protocol):
    """What the simulation asks of its routing policy (gwtf.sim.policies.Policy and its kinds):
    the policies drive the simulation's entities, so they are built around it
    (`gwtf.sim.policies.simulation`) rather than named by it."""

    activate_at_commit: bool
    paced: bool
    """The policy follows each node's measured pace (gwtf: its records, 2.13)."""

    def start(self) -> None: ...

    def on_iteration_start(self, it: Iteration) -> None: ...

    def on_commit(self, it: Iteration) -> None: ...

    def may_inject(self, holder: SimNode, it: Iteration) -> bool: ...

    def inject_rate(self, holder: SimNode) -> float | None: ...

    def injected(self, holder: SimNode, it: Iteration) -> None: ...

    def pick(self, source: SimNode, stage: int, mb: MB) -> SimNode | None: ...

    def forward_done(self, node: SimNode, mb: MB, stage: int) -> None: ...

    def aggregation_members(self, stage: int) -> list[SimNode]: ...

    def detection_delay(self) -> float: ...

    def on_death(self, node: SimNode, was_active: bool) -> None: ...

    def on_activate(self, node: SimNode) -> None: ...

    def activate_now(self, node: SimNode) -> bool: ...

    def on_link_change(self, loc_a: str, loc_b: str) -> None: ...

    def on_speed_change(self, node: SimNode) -> None:
        """`node`'s machine changed speed (a speed row): a policy that knows at once acts."""
        ...

    def on_record(self, node: SimNode) -> None:
        """`node`'s pace reached its record (`paced` policies)."""
        ...

    def place(self, info: NodeInfo) -> int | None: ...


class ShippingHooks(Protocol):
    """Bounded replay (docs/design.md 4.9), `gwtf.sim.recovery.shipping.Shipper`."""

    def accumulated(self, node: SimNode) -> None: ...

    def census(self, change: int, *, death: bool) -> None: ...

    def crashed(self, node: SimNode) -> float: ...

    def cover(self, dead: SimNode) -> tuple[frozenset[int], str | None]: ...

    def keep(self, plan: CrashPlan, dead: SimNode) -> list[MB]: ...

    def is_kept(self, mb: MB, s: int) -> bool: ...

    def regenerate(self, mb: MB, s: int, *, charge: bool) -> float | None: ...

    def regenerate_gradient(self, mb: MB, s: int, up: SimNode) -> float: ...

    def reset(self) -> None: ...

    def totals(self) -> dict[str, Any]: ...

class RecoveryHooks(Protocol):
    """What is done about dead work, and the sends a microbatch waits for
    (`gwtf.sim.recovery.recovering`)."""

    ships: bool

    def pump(self, mb: MB) -> None: ...

    def on_death(self, dead: SimNode) -> None: ...

    def verify_commit(self, it: Iteration) -> None: ...

    def commit_s(self) -> float: ...

    def step_delays(self) -> Mapping[str, float]: ...

    def conserve(self, it: Iteration) -> None: ...

    def wake(self, stage: int) -> None: ...

    def forget_waits(self) -> None: ...

    def boundary(self, index: int) -> None: ...

    def snapshot_source(self, stage: int) -> SimNode | None: ...

    def snapshot_totals(self) -> dict[str, Any]: ...


class ChurnHooks(Protocol):
    """Joins, leaves, crashes and moves (`gwtf.sim.churn.Churn`)."""

    def on_trace(self, event: TraceEvent) -> list[Any]: ...

    def activate(self, node: SimNode, *, start: bool) -> None: ...

    def move(self, node: SimNode, stage: int) -> None: ...

    def relocate(self, node: SimNode, stage: int) -> None: ...

    def transfer_s(self, node: SimNode, stage: int) -> float: ...


class Simulation:
    """One policy on one scenario. `run()` returns a `SimResult`. `make_policy` builds the
    policy around the simulation (`gwtf.sim.policies.simulation` does it by name), and
    `make_shipping` its shipments of partial sums, `make_recovery` what is done about dead
    work (the policy's choice) and `make_churn` the joins, leaves and crashes."""

    def __init__(
        self, scenario: Scenario, policy_name: str, seed: int | None = None, *,
        make_policy: Callable[[Simulation, str], PolicyHooks],
        make_shipping: Callable[[Simulation], ShippingHooks],
        make_recovery: Callable[[Simulation], RecoveryHooks],
        make_churn: Callable[[Simulation], ChurnHooks],
    ) -> None:
        self.sc = scenario
        self.policy_name = policy_name
        self.seed = scenario.seed if seed is None else seed
        self.rng = np.random.default_rng([self.seed, sum(map(ord, policy_name))])
        self.engine = Engine()
        self.sink = EventSink()
        self.S = scenario.stages
        self.nodes: dict[str, SimNode] = {}
        self.network = Network(scenario.links, scenario.intra)
        self._epoch = 0
        self._incarnations: dict[str, int] = {}
        self._mb_seq = 0
        self.pending_activation: list[SimNode] = []
        self.iteration: Iteration | None = None
        self.committed = 0
        self.committed_mbs = 0
        self.commit_times: list[float] = []
        self.time_to_train: float | None = None
        self.time_to_iterations: float | None = None
        self.paused_until = 0.0
        self.paused_s = 0.0
        self._pause_start: float | None = None
        # metrics
        self.wasted = 0.0
        self.total_compute = 0.0
        self.dropped = 0
        self.lost: set[int] = set()
        self.control_messages = 0
        self.recoveries = {r.name.lower(): 0 for r in Rule}
        self.recoveries["orphan"] = 0
        self.crashes = 0
        self.joins = 0
        self.moves = 0
        self.catch_ups = 0
        self.refetches = 0
        self.restarts = 0
        self.finished_count = 0
        self.series: list[tuple[float, float, int, int, int]] = []
        self._last_sample = (0.0, 0)
        self.audit = {"injected": 0, "finished": 0, "dropped": 0, "abandoned": 0,
                      "commit_checks": 0, "conserved_iterations": 0}
        self.hop_estimate = hop_estimate(scenario)
        # The median machine of each stage, for the time a microbatch spends downstream.
        universe = list(scenario.nodes.values())
        self._medians = [
            statistics.median(scenario.compute_s(i, t) for i in universe if i.stage == t)
            if any(i.stage == t for i in universe) else scenario.compute_s_v100[t]
            for t in range(self.S)
        ]
        self._caps: dict[tuple[str, int], float] = {}
        self.slowdowns: dict[str, float] = {}
        """Each machine's compute time over its normal one, as the trace's speed rows left it
        (a machine that joins later starts at it)."""
        self.policy = make_policy(self, policy_name)
        self.paces = Paces(self.engine.clock, self._publish_pace) if self.policy.paced else None
        self._history: list[tuple[int, int, float]] = []
        """Per committed iteration: microbatches counted as trained, dropped, and the compute
        not wasted (seconds) at its commit, which a rollback takes back (`rollback`)."""
        self.rollbacks: list[tuple[float, int, int, int]] = []
        self.failed: str | None = None
        self.failed_at: float | None = None
        self.recovery = make_recovery(self)
        self._pump = self.recovery.pump
        self.shipping = make_shipping(self)
        self.churn = make_churn(self)

    # ------------------------------------------------------------------ helpers

    @property
    def links(self) -> dict[frozenset[str], LinkSpec]:
        """The location links as they are now (the trace's link rows change them)."""
        return self.network.links

    def link(self, a: SimNode, b: SimNode) -> LinkSpec | None:
        return self.network.link(a.info, b.info)

    def one_way(self, a: SimNode, b: SimNode, nbytes: float) -> float:
        return self.network.one_way(a.info, b.info, nbytes)

    def transfer(self, a: SimNode, b: SimNode, nbytes: float) -> float:
        """Arrival time of `nbytes` sent now from a to b (gwtf/sim/network.py)."""
        return self.network.transfer(self.engine.now, a.info, b.info, nbytes)

    def capacity(self, node: SimNode) -> float:
        """Microbatches/s the node can sustain, as its record says: compute, and memory slots
        over the time a microbatch stays there (its own compute plus the rest of the pipeline
        and back)."""
        return self.capacity_at(node.info, node.stage, node.record_s)

    def capacity_at(self, info: NodeInfo, s: int, compute_s: float | None = None) -> float:
        """`capacity` of the machine `info` holding stage `s` (at its normal speed, or at
        `compute_s` seconds per microbatch)."""
        if compute_s is None:
            compute_s = self.sc.compute_s(info, s)
        residence = compute_s + sum(self._medians[s + 1:]) + 2 * (self.S - 1 - s) * \
            self.hop_estimate
        # Access links: a microbatch crosses the node's uplink once per neighbouring stage (the
        # activation down, the gradient up, at that boundary's bytes) and its downlink as often.
        access = access_bound(self.sc, info, s)
        return min(1.0 / compute_s, self.sc.memory_slots / residence, access)

    def active_nodes(self, stage: int | None = None) -> list[SimNode]:
        return [n for n in self.nodes.values()
                if n.active and n.alive and (stage is None or n.stage == stage)]

    def topology(self) -> Topology | None:
        """The active nodes as a flow topology (None while a stage is empty)."""
        nodes = [NodeSpec.make(n.id, n.stage, n.record_s, n.location, self._cap_cache(n))
                 for n in self.active_nodes()]
        if len({n.stage for n in nodes}) < self.S:
            return None
        try:
            return flow_topology(self.sc, nodes, self.links)
        except TopologyError:
            return None

    def _cap_cache(self, n: SimNode) -> float:
        key = (n.id, n.stage)
        if key not in self._caps:
            self._caps[key] = self.capacity(n)
        return self._caps[key]

    def set_record(self, node: SimNode, compute_s: float) -> None:
        """`node`'s record says `compute_s` now (its pace, or the oracle's knowledge)."""
        node.record_s = compute_s
        node.revision += 1
        self._caps.pop((node.id, node.stage), None)

    def _publish_pace(self, node: SimNode, pace_s: float) -> None:
        self.set_record(node, pace_s)
        self.policy.on_record(node)


    # ------------------------------------------------------------------ setup and run

    def reincarnate(self, node_id: str) -> None:
        """`node_id` starts a new life for the flow machines (it moved to another stage)."""
        self._incarnations[node_id] = self._incarnations.get(node_id, 0) + 1

    def incarnation(self, node_id: str) -> int:
        """How many times this id joined before its current life (the flow machines' epoch: 0
        for a first life, as a NodeView's arcs assume of every peer)."""
        return self._incarnations.get(node_id, 1) - 1

    def new_node(self, info: NodeInfo) -> SimNode:
        self._incarnations[info.id] = self._incarnations.get(info.id, 0) + 1
        self._epoch += 1
        node = SimNode(info, self.sc.compute_s(info), self.sc.memory_slots, self._epoch)
        slow = self.slowdowns.get(info.id, 1.0)
        if slow != 1.0:  # a slow machine measures itself slow as it enters
            node.set_slow(slow)
            node.record_s = node.compute_s
        node.started = self.engine.now
        self.nodes[info.id] = node
        return node

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        wall0 = time.perf_counter()
        sc = self.sc
        for node_id in sc.initial:
            node = self.new_node(sc.nodes[node_id])
            node.ready = True
            node.active = True
        self.shipping.census(len(sc.initial), death=False)
        for event in sc.events:
            kind = {"join": Kind.JOIN, "leave": Kind.LEAVE, "crash": Kind.CRASH,
                    "link": Kind.LINK, "speed": Kind.LINK}[event.kind]
            self.sink.emit(event.time_s, kind, self.churn.on_trace, event)
        self.sample_s = max(10.0, sc.duration_s / 400)
        self.sink.emit(self.sample_s, Kind.SAMPLE, self._on_sample, None)
        self.policy.start()
        self._start_iteration(0)
        self.engine.schedule_all(self.sink.take())
        chunks = 200 if progress is not None else 1
        for i in range(1, chunks + 1):
            self.engine.run(sc.duration_s * i / chunks)
            if progress is not None:
                progress(self.engine.now)
        if self._pause_start is not None:
            self.paused_s += sc.duration_s - self._pause_start
        # Compute in flight at the end is neither useful nor wasted yet: count what finished.
        sim_time = sc.duration_s
        return SimResult(
            policy=self.policy_name,
            scenario=sc.name,
            sim_time_s=sim_time,
            iterations_completed=self.committed,
            iteration_target=sc.iterations,
            time_to_train_s=self.time_to_train,
            time_to_iterations_s=self.time_to_iterations,
            microbatch_target=sc.iterations * sc.microbatches_per_iteration,
            committed_microbatches=self.committed_mbs,
            throughput_mean=self.committed_mbs / sim_time if sim_time else 0.0,
            progress_microbatches=self.committed_mbs + (
                len(self.iteration.finished) if self.iteration is not None else 0),
            wasted_compute_s=self.wasted,
            total_compute_s=self.total_compute,
            dropped_microbatches=self.dropped,
            lost_microbatches=len(self.lost),
            control_messages=self.control_messages,
            events=self.engine.events,
            sim_wall_s=time.perf_counter() - wall0,
            recoveries=self.recoveries,
            crashes=self.crashes,
            joins=self.joins,
            moves=self.moves,
            catch_ups=self.catch_ups,
            refetches=self.refetches,
            restarts=self.restarts,
            paused_s=self.paused_s,
            commit_times=self.commit_times,
            series=self.series,
            audit=self.audit,
            shipping=self.shipping.totals(),
            rollbacks=self.rollbacks,
            failed=self.failed,
            snapshots=self.recovery.snapshot_totals(),
            codecs=sc.codec_plan,
        )

    @returns_events
    def _on_sample(self, _: Any) -> None:
        now = self.engine.now
        t0, count0 = self._last_sample
        rate = (self.finished_count - count0) / (now - t0) if now > t0 else 0.0
        alive = sum(1 for n in self.nodes.values() if n.alive)
        active = len(self.active_nodes())
        self.series.append((now, rate, alive, active, self.committed))
        self._last_sample = (now, self.finished_count)
        self.sink.emit(now + self.sample_s, Kind.SAMPLE, self._on_sample, None)

    # ------------------------------------------------------------------ iterations

    def _start_iteration(self, index: int) -> None:
        it = Iteration(index, self.sc.microbatches_per_iteration, self.engine.now,
                       self.sc.microbatches_per_iteration)
        self.iteration = it
        for node in self.nodes.values():
            node.ledger.reset(index)
            node.iter_compute = 0.0
            node.work.clear()
        self.shipping.reset()
        self.recovery.boundary(index)
        self.policy.on_iteration_start(it)
        self.check_paused()
        for holder in self.active_nodes(0):
            self.try_inject(holder)

    def check_paused(self) -> None:
        empty = any(not self.active_nodes(s) for s in range(self.S))
        paused = empty or self.engine.now < self.paused_until or self.iteration is None
        if paused and self._pause_start is None:
            self._pause_start = self.engine.now
        elif not paused and self._pause_start is not None:
            self.paused_s += self.engine.now - self._pause_start
            self._pause_start = None

    def maybe_complete(self) -> None:
        it = self.iteration
        if it is None or it.aggregating or it.incomplete > 0:
            return
        if it.injected < it.target or it.to_inject > 0:
            return
        self.recovery.verify_commit(it)
        it.aggregating = True
        it.agg_token += 1
        duration = self.recovery.commit_s()
        self.sink.emit(self.engine.now + duration, Kind.ITERATION, self._on_commit,
                             (it, it.agg_token))

    @returns_events
    def _on_commit(self, payload: tuple[Iteration, int]) -> None:
        it, token = payload
        if self.iteration is not it or not it.aggregating or it.agg_token != token:
            return
        if any(not n.alive and n.active for n in self.nodes.values()):
            return  # a participant died: the all-reduce hangs until the crash is noticed
        self.recovery.conserve(it)
        self.committed += 1
        # A microbatch counts once its gradient is in every stage's commit. SWARM keeps no
        # ledger, so a dead peer's accumulated gradients are gone and their microbatches are
        # `lost`: the real SWARM would train on, to its per-stage batch target, without them,
        # so they do not count as trained (counting them would credit work it threw away).
        counted = len(it.finished - self.lost)
        self.committed_mbs += counted
        self._history.append((counted, len(it.dropped), self.total_compute - self.wasted))
        self.commit_times.append(self.engine.now)
        # Time to train is time to the same counted work for every policy (docs/design.md,
        # simulator reports): `iterations` full global batches in every stage's step. SWARM's
        # iterations hold fewer counted microbatches (what died with a peer is lost, as in
        # hivemind, where a dead peer's reported samples expire) and gwtf's drop a few, so
        # counting iterations would compare different amounts of training.
        if (self.time_to_train is None
                and self.committed_mbs >= self.sc.iterations * self.sc.microbatches_per_iteration):
            self.time_to_train = self.engine.now
        if self.committed == self.sc.iterations and self.time_to_iterations is None:
            self.time_to_iterations = self.engine.now
        self.policy.on_commit(it)
        # The step order reaches each member on its own link (docs/design.md 3.7): a node
        # takes no work of the next iteration before it has stepped.
        now = self.engine.now
        for node_id, delay in self.recovery.step_delays().items():
            node = self.nodes.get(node_id)
            if node is not None:
                node.ready_at = now + delay
        if self.policy.activate_at_commit:
            self.activate_pending()
        self._start_iteration(it.index + 1)

    def activate_pending(self) -> None:
        for node in list(self.pending_activation):
            if node.alive and node.ready:
                self.churn.activate(node, start=False)
        self.pending_activation = [n for n in self.pending_activation if n.alive and not n.ready]

    def abort_aggregation(self) -> None:
        it = self.iteration
        if it is not None and it.aggregating:
            it.aggregating = False
            it.agg_token += 1

    # ------------------------------------------------------------------ injection

    def try_inject(self, holder: SimNode) -> None:
        it = self.iteration
        now = self.engine.now
        if it is None or it.aggregating or now < self.paused_until:
            return
        if holder.ready_at > now:
            self._wake_later(holder)
            return
        while (
            holder.alive and holder.active and holder.stage == 0
            and len(holder.slot_mbs) + len(holder.fwd_q) < holder.slots
            and self.policy.may_inject(holder, it)
        ):
            rate = self.policy.inject_rate(holder)
            if rate is not None:
                # A token bucket: the holder's out-rate on average, with a burst of its memory
                # slots, so that an idle pipeline fills at once instead of at the rate.
                if rate <= 0:
                    self._inject_later(holder, now + 1.0)
                    return
                tokens = min(float(holder.slots), holder.tokens + (now - holder.tokens_t) * rate)
                holder.tokens_t = now
                if tokens < 1.0 - 1e-9:
                    holder.tokens = tokens
                    self._inject_later(holder, now + (1.0 - tokens) / rate)
                    return
                holder.tokens = tokens - 1.0
            self._mb_seq += 1
            mb = MB(self._mb_seq, it.index, self.S)
            it.mbs[mb.id] = mb
            it.injected += 1
            it.incomplete += 1
            self.policy.injected(holder, it)
            self.audit["injected"] += 1
            mb.node[0] = holder
            mb.st[0] = FWD_Q
            holder.fwd_q.append((J_FWD, mb, 0))
            self.start_next(holder)

    def _inject_later(self, holder: SimNode, at: float) -> None:
        if holder.inject_at is not None and holder.inject_at <= at:
            return
        holder.inject_at = at
        self.sink.emit(at, Kind.INJECT, self._on_inject, (holder, at))

    @returns_events
    def _on_inject(self, payload: tuple[SimNode, float]) -> None:
        holder, at = payload
        if holder.inject_at != at:
            return
        holder.inject_at = None
        self.try_inject(holder)

    def _wake_later(self, node: SimNode) -> None:
        """Take up `node`'s work when the last step order reaches it."""
        if node.wake_at == node.ready_at:
            return
        node.wake_at = node.ready_at
        self.sink.emit(node.ready_at, Kind.INJECT, self._on_ready, (node, node.ready_at))

    @returns_events
    def _on_ready(self, payload: tuple[SimNode, float]) -> None:
        node, at = payload
        if node.wake_at != at:
            return
        node.wake_at = None
        self.start_next(node)
        if node.stage == 0:
            self.try_inject(node)

    # ------------------------------------------------------------------ compute

    def start_next(self, node: SimNode) -> None:
        if node.busy or not node.alive:
            return
        if node.ready_at > self.engine.now:
            self._wake_later(node)
            return
        while True:
            if node.bwd_q:
                job = node.bwd_q.popleft()
                _, mb, s = job
                if mb.dead or mb.node[s] is not node:
                    continue
            elif node.fwd_q and len(node.slot_mbs) < node.slots:
                job = node.fwd_q.popleft()
                _, mb, s = job
                if mb.dead or mb.node[s] is not node:
                    continue
                node.slot_mbs.add(mb.id)
            else:
                return
            kind = job[0]
            duration = (node.f_s if kind <= J_RFWD else node.b_s if kind == J_BWD
                        else node.compute_s)
            node.busy = True
            node.job = job
            node.job_start = self.engine.now
            self.sink.emit(self.engine.now + duration, Kind.COMPUTE, self._on_compute,
                                 (node, job, node.epoch, duration))
            return

    @returns_events
    def _on_compute(self, payload: tuple[SimNode, tuple[int, MB, int], int, float]) -> None:
        node, job, epoch, duration = payload
        if not node.alive or node.epoch != epoch or node.job is not job:
            return
        node.busy = False
        node.job = None
        node.iter_compute += duration
        self.total_compute += duration
        kind, mb, s = job
        if self.paces is not None:
            self.paces.sample(node, kind, duration)
        mb.spent[s] += duration
        node.work[mb.id] = node.work.get(mb.id, 0.0) + duration
        if mb.dead or mb.node[s] is not node:
            node.slot_mbs.discard(mb.id)
            self.wasted += duration
        elif kind == J_FWD:
            mb.st[s] = WAIT_G
            self.policy.forward_done(node, mb, s)
            if mb.node[s + 1] is None and not mb.need[s + 1]:
                mb.need[s + 1] = Rule.RESEND
            self._pump(mb)
        elif kind == J_RFWD:
            mb.st[s] = WAIT_G
            self._pump(mb)
        else:
            if kind == J_FUSED:
                self.policy.forward_done(node, mb, s)
            node.slot_mbs.discard(mb.id)
            self._stage_done(node, mb, s)
        self.start_next(node)
        if node.stage == 0:
            self.try_inject(node)

    def _stage_done(self, node: SimNode, mb: MB, s: int) -> None:
        mb.st[s] = DONE
        mb.done_count += 1
        node.ledger.accumulated(mb.id)
        self.shipping.accumulated(node)
        it = self.iteration
        if s == 0 and not mb.finished:
            mb.finished = True
            self.finished_count += 1
            self.audit["finished"] += 1
            if it is not None and mb.iteration == it.index:
                it.finished.add(mb.id)
        if mb.done_count == self.S and it is not None and mb.iteration == it.index:
            it.reported[node.id] = (node.info, self.engine.now)
            it.incomplete -= 1
            self._pump(mb)
            self.maybe_complete()
            return
        self._pump(mb)

    # ------------------------------------------------------------------ arrivals

    @returns_events
    def on_activation(self, payload: tuple[MB, int, SimNode, str, int, SimNode | None]) -> None:
        mb, s, node, sender, job, grad_source = payload
        if mb.dead or mb.node[s] is not node or not node.alive:
            return
        if s > 0:
            node.ledger.activation_received(mb.id, sender)
        down = mb.node[s + 1] if s < self.S - 1 else None
        if down is not None and job != J_FWD:
            node.ledger.activation_sent(mb.id, down.id)  # it keeps what `down` holds
            if grad_source is not None:
                node.ledger.gradient_received(mb.id, grad_source.id)
        mb.st[s] = FWD_Q
        node.fwd_q.append((job, mb, s))
        self.start_next(node)

    @returns_events
    def on_gradient(self, payload: tuple[MB, int, SimNode, str]) -> None:
        mb, s, node, sender = payload
        if mb.dead or mb.node[s] is not node or not node.alive or mb.st[s] != WAIT_G:
            return
        mb.g_inflight[s] = False
        node.ledger.gradient_received(mb.id, sender)
        mb.st[s] = BWD_Q
        node.bwd_q.append((J_BWD, mb, s))
        self.start_next(node)

    # ------------------------------------------------------------------ restarts (dtfm)

    def restart(self) -> None:
        """Lose the iteration in progress (dtfm): every microbatch and all its compute."""
        if self.iteration is None:
            return
        self.restarts += 1
        self._discard_iteration()

    def _discard_iteration(self) -> None:
        it = self.iteration
        if it is None:
            return
        for node in self.nodes.values():
            if node.alive:
                self.wasted += node.iter_compute
                node.iter_compute = 0.0
                if node.busy and node.job is not None:
                    partial = self.engine.now - node.job_start
                    self.total_compute += partial
                    self.wasted += partial
                node.busy = False
                node.job = None
                node.bwd_q.clear()
                node.fwd_q.clear()
                node.slot_mbs.clear()
        for mb in it.mbs.values():
            mb.dead = True
            self.audit["abandoned"] += 1
        it.mbs.clear()
        self.recovery.forget_waits()
        self.iteration = None
        self.check_paused()

    def rollback(self, to: int, stage: int) -> None:
        """Stage `stage` was restored from a snapshot of iteration `to`, older than the one in
        progress: every iteration from `to` on is undone (its compute wasted, its microbatches
        no longer counted as trained or dropped, its commit no longer in the audit) and trained
        again (docs/design.md 4.6), as the node's job record forgets them."""
        before = self.iteration.index if self.iteration is not None else self.committed
        if self.iteration is not None:
            self.dropped -= len(self.iteration.dropped)  # of an iteration that never commits
        self._discard_iteration()
        undone = self._history[to:]
        if undone:
            useful = self._history[to - 1][2] if to > 0 else 0.0
            self.wasted += undone[-1][2] - useful
            self.committed_mbs -= sum(counted for counted, _, _ in undone)
            self.dropped -= sum(dropped for _, dropped, _ in undone)
            self.audit["conserved_iterations"] -= min(len(undone),
                                                      self.audit["conserved_iterations"])
        del self._history[to:]
        del self.commit_times[to:]
        self.committed = to
        for node in self.nodes.values():
            node.steps_from = to  # restored: its steps of the undone history are forgotten
        if self.committed_mbs < self.sc.iterations * self.sc.microbatches_per_iteration:
            self.time_to_train = None
        if to < self.sc.iterations:
            self.time_to_iterations = None
        self.rollbacks.append((self.engine.now, stage, before, to))
        self._start_iteration(to)

    def fail(self, reason: str) -> None:
        """The job cannot go on (a wiped stage no snapshot restores): the run ends here."""
        self.failed = reason
        self.failed_at = self.engine.now
        self._discard_iteration()
        self.iteration = None
        self.check_paused()
        self.engine.stop()

    def resume(self) -> None:
        index = self.committed
        self._start_iteration(index)
