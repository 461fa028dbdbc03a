"""The discrete-event simulation of one policy on one scenario.

What is simulated (docs/design.md 5):

- Compute: each node runs one job at a time; backward jobs go first (they free memory), then
  forward jobs while a memory slot is free. A slot is held from a microbatch's forward at the node
  until its backward there. Forward takes 1/3 of the stage's compute time, backward 2/3; the last
  stage does both as one job.
- Links (gwtf/sim/network.py): a send from i to j waits for the pair's previous send to finish
  (and, where nodes have access links, for i's uplink and j's downlink), takes
  `bytes * 8 / bandwidth`, then arrives one-way latency (RTT / 2) later. Activations and gradients
  have the scenario's activation size; flow control messages `message_bytes`.
- Iterations: the data holders inject the iteration's microbatches (the flow policies through a
  token bucket at the holder's out-rate, burst = its memory slots; swarm and dtfm whenever a slot
  is free, which is how they work); when every one is finished
  or dropped and every stage covers every finished one exactly once (`check_commit`), each stage
  all-reduces its gradients (ring: `2 (n-1)/n * bytes / slowest bandwidth + 2 (n-1) * latency`)
  and the iteration commits. Joiners download their stage's state (weights and optimizer state
  only change at a commit, so a download is good until the next commit; one that spans a commit
  starts again), then enter at once (dtfm: at its next restart).
- Churn: joins, graceful leaves (noticed at once), crashes (noticed `detection_timeout_s` later;
  the `oracle` notices at once), link changes.
- Crash recovery: the rules of docs/design.md 4 from `gwtf.recovery`, driven by each node's
  `Ledger`, with partial gradient sums shipped to a stage keeper (4.9, `gwtf.sim.shipping`).
  `swarm` retries in-flight work elsewhere like rules 1-2, but a dead peer's accumulated
  gradients and a dead trainer's microbatches are lost (counted in `lost`, and not in the
  throughput: only microbatches whose gradient reached every stage's optimizer count as
  trained); `dtfm` loses the iteration and restarts after `restart_delay_s` with a schedule
  recomputed for the survivors.

A microbatch's progress at stage s is one of NONE, INFLIGHT (its activation travels to the node),
FWD_Q, WAIT_G (forward done, activations kept, waiting for the gradient), BWD_Q, DONE
(accumulated). Every state change calls `_pump`, which sends whatever a stage is now waiting for
(a gradient, or a recovery's inputs) as soon as its source has it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from gwtf.flow.topology import LinkSpec, NodeSpec, Topology, TopologyError
from gwtf.recovery import CrashPlan, Ledger, Rule, check_commit, plan_crash
from gwtf.sim.engine import Engine, EventSink, Kind, returns_events
from gwtf.sim.network import Network
from gwtf.sim.scenario import NodeInfo, Scenario
from gwtf.sim.traces import TraceEvent

__all__ = ["SimulationError", "Simulation", "SimResult", "allreduce_s", "hop_estimate"]

NONE, INFLIGHT, FWD_Q, WAIT_G, BWD_Q, DONE = range(6)
J_FWD, J_RFWD, J_BWD, J_FUSED = range(4)


class SimulationError(RuntimeError):
    """An invariant broke (a bug in the simulator or the rules), never a user error."""


class SimNode:
    __slots__ = (
        "id", "info", "stage", "compute_s", "f_s", "b_s", "location", "alive", "active",
        "detected", "epoch", "slots", "slot_mbs", "busy", "job", "job_start", "bwd_q", "fwd_q",
        "ledger", "iter_compute", "ready", "tokens", "tokens_t", "inject_at", "wrr", "quota",
        "dtfm_next", "balancer", "pending_resp", "move_to",
    )

    def __init__(self, info: NodeInfo, compute_s: float, slots: int, epoch: int) -> None:
        self.id = info.id
        self.info = info
        self.stage = info.stage
        self.location = info.location
        self.alive = True
        self.active = False
        self.detected = False
        self.epoch = epoch
        self.slots = slots
        self.slot_mbs: set[int] = set()
        self.busy = False
        self.job: tuple[int, MB, int] | None = None
        self.job_start = 0.0
        self.bwd_q: deque[tuple[int, MB, int]] = deque()
        self.fwd_q: deque[tuple[int, MB, int]] = deque()
        self.ledger = Ledger(info.id, info.stage)
        self.iter_compute = 0.0
        self.ready = False
        self.tokens = float(slots)
        self.tokens_t = 0.0
        self.inject_at: float | None = None
        self.wrr: dict[str, float] = {}
        self.quota = 0
        self.dtfm_next: SimNode | None = None
        self.balancer: Any = None
        self.pending_resp: list[tuple[float, str, float, int]] = []
        self.move_to: int | None = None
        self.set_compute(compute_s)

    def set_compute(self, compute_s: float) -> None:
        self.compute_s = compute_s
        self.f_s = compute_s / 3
        self.b_s = compute_s - self.f_s


class MB:
    __slots__ = ("id", "iteration", "node", "st", "need", "g_inflight", "finished", "dead",
                 "done_count", "spent", "waiting", "lost", "sent_at")

    def __init__(self, mb_id: int, iteration: int, stages: int) -> None:
        self.id = mb_id
        self.iteration = iteration
        self.node: list[SimNode | None] = [None] * stages
        self.st = [NONE] * stages
        self.need = [0] * stages
        self.g_inflight = [False] * stages
        self.finished = False
        self.dead = False  # dropped, or abandoned (swarm, dtfm)
        self.done_count = 0
        self.spent = [0.0] * stages
        self.waiting = False
        self.lost = False
        self.sent_at = [0.0] * stages


@dataclass
class Iteration:
    index: int
    target: int
    start_s: float
    to_inject: int
    injected: int = 0
    mbs: dict[int, MB] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    dropped: set[int] = field(default_factory=set)
    incomplete: int = 0
    aggregating: bool = False
    agg_token: int = 0


@dataclass
class SimResult:
    """Everything a run measured; `summary()` is the JSON of the issue."""

    policy: str
    scenario: str
    sim_time_s: float
    iterations_completed: int
    iteration_target: int
    time_to_train_s: float | None
    committed_microbatches: int
    throughput_mean: float
    progress_microbatches: int
    wasted_compute_s: float
    total_compute_s: float
    dropped_microbatches: int
    lost_microbatches: int
    control_messages: int
    events: int
    sim_wall_s: float
    recoveries: dict[str, int]
    crashes: int
    joins: int
    moves: int
    restarts: int
    paused_s: float
    commit_times: list[float]
    series: list[tuple[float, float, int, int, int]]
    audit: dict[str, int]
    shipping: dict[str, Any] = field(default_factory=dict)

    @property
    def wasted_compute_fraction(self) -> float:
        return self.wasted_compute_s / self.total_compute_s if self.total_compute_s else 0.0

    def summary(self) -> dict[str, Any]:
        iters = [b - a for a, b in zip([0.0] + self.commit_times, self.commit_times,
                                       strict=False)]
        projected = self.time_to_train_s
        if projected is None and self.iterations_completed:
            projected = self.sim_time_s * self.iteration_target / self.iterations_completed
        return {
            "throughput_mean": round(self.throughput_mean, 6),
            "iterations_completed": self.iterations_completed,
            "time_to_train_s": None if self.time_to_train_s is None
            else round(self.time_to_train_s, 3),
            "projected_time_to_train_s": None if projected is None else round(projected, 3),
            "wasted_compute_s": round(self.wasted_compute_s, 3),
            "wasted_compute_fraction": round(self.wasted_compute_fraction, 6),
            "dropped_microbatches": self.dropped_microbatches,
            "lost_microbatches": self.lost_microbatches,
            "control_messages": self.control_messages,
            "events": self.events,
            "sim_wall_s": round(self.sim_wall_s, 3),
            "events_per_s": round(self.events / self.sim_wall_s) if self.sim_wall_s else 0,
            "sim_time_s": round(self.sim_time_s, 3),
            "committed_microbatches": self.committed_microbatches,
            "progress_throughput": round(self.progress_microbatches / self.sim_time_s, 6)
            if self.sim_time_s else 0.0,
            "mean_iteration_s": round(statistics.fmean(iters), 3) if iters else None,
            "total_compute_s": round(self.total_compute_s, 3),
            "recoveries": dict(self.recoveries),
            "crashes": self.crashes,
            "joins": self.joins,
            "moves": self.moves,
            "restarts": self.restarts,
            "paused_s": round(self.paused_s, 3),
            "shipping": dict(self.shipping),
        }


class PolicyHooks(Protocol):
    """What the simulation asks of its routing policy (gwtf.sim.policies.Policy and its kinds):
    the policies drive the simulation's entities, so they are built around it
    (`gwtf.sim.policies.simulation`) rather than named by it."""

    exact_commit: bool
    recovers: bool
    activate_at_commit: bool

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

    def place(self, info: NodeInfo) -> int | None: ...


def hop_estimate(sc: Scenario) -> float:
    """A typical hop of an activation: the median link, at the median machine's access link
    where nodes have them (a home uplink, not the WAN path, is then what a microbatch waits
    for, and it decides how long memory slots stay taken)."""
    act = sc.activation_bytes
    infos = sc.nodes.values()
    access = min(statistics.median(i.uplink_gbps for i in infos),
                 statistics.median(i.downlink_gbps for i in infos)) if infos else math.inf
    values = [link.rtt_ms / 2000 + act * 8 / (min(link.bandwidth_gbps, access) * 1e9)
              for link in sc.links.values()]
    return statistics.median(values) if values else sc.intra.rtt_ms / 2000


def allreduce_s(sc: Scenario, network: Network, members: list[SimNode]) -> float:
    """Seconds of a ring all-reduce of one stage's gradients among `members`, at the
    slowest ring link's rate (access links included)."""
    n = len(members)
    if n <= 1:
        return 0.0
    nbytes = sc.params_per_stage[members[0].stage] * sc.grad_bytes_per_param
    worst_bw = math.inf
    worst_lat = 0.0
    ring = sorted(members, key=lambda m: (m.location, m.id))
    for a, b in zip(ring, ring[1:] + ring[:1], strict=False):
        link = network.link(a.info, b.info) or sc.intra
        worst_bw = min(worst_bw, network.gbps(a.info, b.info))
        worst_lat = max(worst_lat, link.rtt_ms / 2000)
    return 2 * (n - 1) / n * nbytes * 8 / (worst_bw * 1e9) + 2 * (n - 1) * worst_lat


class ShippingHooks(Protocol):
    """Bounded replay (docs/design.md 4.9), `gwtf.sim.shipping.Shipper`."""

    def accumulated(self, node: SimNode) -> None: ...

    def crashed(self, node: SimNode) -> float: ...

    def cover(self, dead: SimNode) -> tuple[frozenset[int], str | None]: ...

    def keep(self, plan: CrashPlan, dead: SimNode) -> list[MB]: ...

    def is_kept(self, mb: MB, s: int) -> bool: ...

    def regenerate(self, mb: MB, s: int, *, charge: bool) -> float | None: ...

    def regenerate_gradient(self, mb: MB, s: int, up: SimNode) -> float: ...

    def reset(self) -> None: ...

    def totals(self) -> dict[str, Any]: ...


class Simulation:
    """One policy on one scenario. `run()` returns a `SimResult`. `make_policy` builds the
    policy around the simulation (`gwtf.sim.policies.simulation` does it by name), and
    `make_shipping` its shipments of partial sums."""

    def __init__(
        self, scenario: Scenario, policy_name: str, seed: int | None = None, *,
        make_policy: Callable[[Simulation, str], PolicyHooks],
        make_shipping: Callable[[Simulation], ShippingHooks],
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
        self.waiting: list[dict[int, MB]] = [{} for _ in range(self.S)]
        self.pending_activation: list[SimNode] = []
        self.iteration: Iteration | None = None
        self.committed = 0
        self.committed_mbs = 0
        self.commit_times: list[float] = []
        self.time_to_train: float | None = None
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
        self.policy = make_policy(self, policy_name)
        self.shipping = make_shipping(self)

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
        """Microbatches/s the node can sustain: compute, and memory slots over the time a
        microbatch stays there (its own compute plus the rest of the pipeline and back)."""
        return self.capacity_at(node.info, node.stage)

    def capacity_at(self, info: NodeInfo, s: int) -> float:
        """`capacity` of the machine `info` holding stage `s`."""
        compute_s = self.sc.compute_s(info, s)
        residence = compute_s + sum(self._medians[s + 1:]) + 2 * (self.S - 1 - s) * \
            self.hop_estimate
        # Access links: a microbatch crosses the node's uplink once per neighbouring stage (the
        # activation down, the gradient up) and its downlink as often.
        sides = (s > 0) + (s < self.S - 1)
        per_mb = sides * self.sc.activation_bytes * 8 / 1e9
        access = min(info.uplink_gbps, info.downlink_gbps) / per_mb
        return min(1.0 / compute_s, self.sc.memory_slots / residence, access)

    def active_nodes(self, stage: int | None = None) -> list[SimNode]:
        return [n for n in self.nodes.values()
                if n.active and n.alive and (stage is None or n.stage == stage)]

    def topology(self) -> Topology | None:
        """The active nodes as a flow topology (None while a stage is empty)."""
        nodes = [NodeSpec.make(n.id, n.stage, n.compute_s, n.location, self._cap_cache(n))
                 for n in self.active_nodes()]
        if len({n.stage for n in nodes}) < self.S:
            return None
        try:
            return Topology.build(self.sc.activation_bytes, nodes, dict(self.links),
                                  self.sc.intra)
        except TopologyError:
            return None

    def _cap_cache(self, n: SimNode) -> float:
        key = (n.id, n.stage)
        if key not in self._caps:
            self._caps[key] = self.capacity(n)
        return self._caps[key]

    # ------------------------------------------------------------------ setup and run

    def incarnation(self, node_id: str) -> int:
        """How many times this id joined before its current life (the flow machines' epoch: 0
        for a first life, as a NodeView's arcs assume of every peer)."""
        return self._incarnations.get(node_id, 1) - 1

    def _new_node(self, info: NodeInfo) -> SimNode:
        self._incarnations[info.id] = self._incarnations.get(info.id, 0) + 1
        self._epoch += 1
        node = SimNode(info, self.sc.compute_s(info), self.sc.memory_slots, self._epoch)
        self.nodes[info.id] = node
        return node

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        wall0 = time.perf_counter()
        sc = self.sc
        for node_id in sc.initial:
            node = self._new_node(sc.nodes[node_id])
            node.ready = True
            node.active = True
        for event in sc.events:
            kind = {"join": Kind.JOIN, "leave": Kind.LEAVE, "crash": Kind.CRASH,
                    "link": Kind.LINK}[event.kind]
            self.sink.emit(event.time_s, kind, self._on_trace, event)
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
            restarts=self.restarts,
            paused_s=self.paused_s,
            commit_times=self.commit_times,
            series=self.series,
            audit=self.audit,
            shipping=self.shipping.totals(),
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
        self.shipping.reset()
        self.policy.on_iteration_start(it)
        self._check_paused()
        for holder in self.active_nodes(0):
            self._try_inject(holder)

    def _check_paused(self) -> None:
        empty = any(not self.active_nodes(s) for s in range(self.S))
        paused = empty or self.engine.now < self.paused_until or self.iteration is None
        if paused and self._pause_start is None:
            self._pause_start = self.engine.now
        elif not paused and self._pause_start is not None:
            self.paused_s += self.engine.now - self._pause_start
            self._pause_start = None

    def _maybe_complete(self) -> None:
        it = self.iteration
        if it is None or it.aggregating or it.incomplete > 0:
            return
        if it.injected < it.target or it.to_inject > 0:
            return
        if self.policy.exact_commit:
            # What the swarm knows: a crash not yet noticed still counts as a live node (the
            # all-reduce then waits for it and fails when the crash is noticed).
            contributions = {
                s: [n.ledger.contributions() for n in self.nodes.values()
                    if n.active and not n.detected and n.stage == s]
                for s in range(self.S)
            }
            verdict = check_commit(self.S, it.finished, contributions)
            self.audit["commit_checks"] += 1
            if not verdict.ok:
                raise SimulationError(
                    f"{self.policy_name}: iteration {it.index} cannot commit: {verdict.reason()}"
                )
        it.aggregating = True
        it.agg_token += 1
        duration = max((allreduce_s(self.sc, self.network, self.policy.aggregation_members(s))
                        for s in range(self.S)), default=0.0)
        self.sink.emit(self.engine.now + duration, Kind.ITERATION, self._on_commit,
                             (it, it.agg_token))

    @returns_events
    def _on_commit(self, payload: tuple[Iteration, int]) -> None:
        it, token = payload
        if self.iteration is not it or not it.aggregating or it.agg_token != token:
            return
        if any(not n.alive and n.active for n in self.nodes.values()):
            return  # a participant died: the all-reduce hangs until the crash is noticed
        if self.policy.exact_commit:
            # Conservation: every injected microbatch finished or dropped, never both.
            injected = set(it.mbs)
            if it.finished & it.dropped or it.finished | it.dropped != injected:
                raise SimulationError(
                    f"{self.policy_name}: iteration {it.index}: {len(injected)} injected, "
                    f"{len(it.finished)} finished, {len(it.dropped)} dropped"
                )
            self.audit["conserved_iterations"] += 1
        self.committed += 1
        # A microbatch counts once its gradient is in every stage's commit. SWARM keeps no
        # ledger, so a dead peer's accumulated gradients are gone and their microbatches are
        # `lost`: the real SWARM would train on, to its per-stage batch target, without them,
        # so they do not count as trained (counting them would credit work it threw away).
        self.committed_mbs += len(it.finished - self.lost)
        self.commit_times.append(self.engine.now)
        if self.committed == self.sc.iterations and self.time_to_train is None:
            self.time_to_train = self.engine.now
        self.policy.on_commit(it)
        if self.policy.activate_at_commit:
            self.activate_pending()
        self._start_iteration(it.index + 1)

    def activate_pending(self) -> None:
        for node in list(self.pending_activation):
            if node.alive and node.ready:
                self._activate(node, start=False)
        self.pending_activation = [n for n in self.pending_activation if n.alive and not n.ready]

    def _abort_aggregation(self) -> None:
        it = self.iteration
        if it is not None and it.aggregating:
            it.aggregating = False
            it.agg_token += 1

    # ------------------------------------------------------------------ injection

    def _try_inject(self, holder: SimNode) -> None:
        it = self.iteration
        now = self.engine.now
        if it is None or it.aggregating or now < self.paused_until:
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
            self._start_next(holder)

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
        self._try_inject(holder)

    # ------------------------------------------------------------------ compute

    def _start_next(self, node: SimNode) -> None:
        if node.busy or not node.alive:
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
        mb.spent[s] += duration
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
        self._start_next(node)
        if node.stage == 0:
            self._try_inject(node)

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
            it.incomplete -= 1
            self._pump(mb)
            self._maybe_complete()
            return
        self._pump(mb)

    # ------------------------------------------------------------------ data movement

    def _pump(self, mb: MB) -> None:
        """Send whatever a stage of `mb` waits for, if its source has it (see the module doc)."""
        if mb.dead:
            return
        S = self.S
        for s in range(S):
            node = mb.node[s]
            if node is None:
                if mb.need[s]:
                    self._try_recover(mb, s)
                continue
            if mb.st[s] == WAIT_G and s < S - 1 and not mb.g_inflight[s] and node.alive:
                down = mb.node[s + 1]
                if down is None and mb.st[s + 1] == DONE and not self.policy.exact_commit:
                    # SWARM: the gradient this stage waits for died with a downstream peer
                    # that was marked lost; the trainer gives the microbatch up and takes a
                    # new one (waiting would stall the iteration for good).
                    self._abandon(mb, lost=True)
                    return
                if down is not None and down.alive and mb.st[s + 1] == DONE:
                    mb.g_inflight[s] = True
                    down.ledger.gradient_sent(mb.id, node.id)
                    arrive = self.transfer(down, node, self.sc.activation_bytes) + \
                        self.shipping.regenerate_gradient(mb, s + 1, node)
                    self.sink.emit(arrive, Kind.ARRIVE, self._on_gradient,
                                         (mb, s, node, down.id))

    def _input_source(self, mb: MB, s: int) -> SimNode | None:
        if s > 0:
            up = mb.node[s - 1]
            if up is not None and up.alive and mb.st[s - 1] >= WAIT_G:
                return up
            if up is None and not self.policy.exact_commit and mb.st[s - 1] == DONE:
                # SWARM's trainer drives every stage and keeps every input (client-driven).
                trainer = mb.node[0]
                return trainer if trainer is not None and trainer.alive else None
            return None
        for t in range(1, self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.st[t] >= FWD_Q:
                return n
        if self.policy.exact_commit:
            # No later stage holds it (they died too): any live data holder rebuilds its token
            # ids from (seed, iteration, id) and redoes stage 0 itself, which breaks the wait
            # of stage 0 for stage 1 and of stage 1 for stage 0 (docs/design.md 4, rule 3).
            return self._rebuilder()
        return None

    def _rebuilder(self) -> SimNode | None:
        """The live data holder that rebuilds a microbatch no later stage holds: the one with
        the fewest microbatches in hand (then by id)."""
        holders = [n for n in self.active_nodes(0) if not n.detected]
        return min(holders, key=lambda n: (len(n.slot_mbs), n.id), default=None)

    def _try_recover(self, mb: MB, s: int) -> None:
        rule = mb.need[s]
        source = self._input_source(mb, s)
        if source is None:
            if s == 0 and self.policy.exact_commit:
                # No data holder is active yet to rebuild it (every holder died and the joiner
                # is still loading): wait for one, or the microbatch is never pumped again.
                mb.waiting = True
                self.waiting[0][mb.id] = mb
            return
        if s > 0 and self.shipping.regenerate(mb, s - 1, charge=False) is None:
            return
        grad_source = None
        replay_now = rule == Rule.REPLAY
        if rule == Rule.REPLAY and s < self.S - 1:
            down = mb.node[s + 1]
            if down is not None and down.alive and mb.st[s + 1] == DONE:
                if self.shipping.is_kept(mb, s + 1):
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
        target = source if source.stage == 0 == s else self.policy.pick(source, s, mb)
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
        mb.sent_at[s] = self.engine.now
        act = self.sc.activation_bytes
        mode = Rule(rule).mode
        if s > 0:
            source.ledger.activation_sent(mb.id, target.id, mode)
        elif source is not target:
            source.ledger.gradient_target(mb.id, target.id, mode)
        arrive = self.transfer(source, target, act if s > 0 else 0) + (
            self.shipping.regenerate(mb, s - 1, charge=True) or 0.0 if s > 0 else 0.0)
        down = mb.node[s + 1] if s < self.S - 1 else None
        if down is not None and down.alive and s > 0:
            down.ledger.gradient_target(mb.id, target.id, mode)
        if grad_source is not None:
            grad_source.ledger.gradient_sent(mb.id, target.id)
            grad_source.ledger.gradient_target(mb.id, target.id, mode)
            arrive = max(arrive, self.transfer(grad_source, target, act))
        if rule == Rule.RESEND:
            job = J_FUSED if s == self.S - 1 else J_FWD
        elif rule == Rule.RECOMPUTE or not replay_now:
            job = J_RFWD
        else:
            job = J_FUSED
        self.sink.emit(arrive, Kind.ARRIVE, self._on_activation,
                             (mb, s, target, source.id, job, grad_source))

    @returns_events
    def _on_activation(self, payload: tuple[MB, int, SimNode, str, int, SimNode | None]) -> None:
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
        self._start_next(node)

    @returns_events
    def _on_gradient(self, payload: tuple[MB, int, SimNode, str]) -> None:
        mb, s, node, sender = payload
        if mb.dead or mb.node[s] is not node or not node.alive or mb.st[s] != WAIT_G:
            return
        mb.g_inflight[s] = False
        node.ledger.gradient_received(mb.id, sender)
        mb.st[s] = BWD_Q
        node.bwd_q.append((J_BWD, mb, s))
        self._start_next(node)

    # ------------------------------------------------------------------ churn

    @returns_events
    def _on_trace(self, event: TraceEvent) -> None:
        if event.kind == "join":
            self._join(event)
        elif event.kind in ("crash", "leave"):
            node = self.nodes.get(event.node)
            if node is not None and node.alive:
                self._crash(node, graceful=event.kind == "leave")
        elif event.kind == "link":
            a, b = event.link_pair
            assert event.rtt_ms is not None and event.bandwidth_gbps is not None
            self.links[frozenset((a, b))] = LinkSpec(event.rtt_ms, event.bandwidth_gbps)
            self.policy.on_link_change(a, b)

    def _join(self, event: TraceEvent) -> None:
        info = self.sc.nodes[event.node]
        old = self.nodes.get(event.node)
        if old is not None and old.alive:
            return
        stage = None if info.pinned else self.policy.place(info)
        if stage is not None and stage != info.stage:
            info = replace(info, stage=stage)
        node = self._new_node(info)
        self.joins += 1
        self.schedule_ready(node)

    def transfer_s(self, node: SimNode, stage: int) -> float:
        """Seconds `node` takes to download the state of `stage` from its best-connected live
        peer of that stage (or the stage's checkpoint, stored near it, when it has none)."""
        peers = [n for n in self.nodes.values() if n.alive and n.ready and n.stage == stage
                 and n is not node]
        nbytes = self.sc.params_per_stage[stage] * self.sc.state_bytes_per_param
        net = self.network
        if peers:
            best = max(peers, key=lambda p: (net.gbps(p.info, node.info), p.id))
            link = self.link(best, node) or self.sc.intra
            gbps = net.gbps(best.info, node.info)
        else:
            link = self.sc.intra
            gbps = min(link.bandwidth_gbps, node.info.downlink_gbps)
        return link.rtt_ms / 1000 + nbytes * 8 / (gbps * 1e9)

    def schedule_ready(self, node: SimNode) -> None:
        """`node` downloads its stage's state (`transfer_s`), then is ready."""
        node.ready = False
        ready_at = self.engine.now + self.transfer_s(node, node.stage)
        self.sink.emit(ready_at, Kind.JOIN, self._on_ready,
                             (node, node.epoch, self.committed))

    def move(self, node: SimNode, stage: int) -> None:
        """`node` leaves its stage for `stage` at an iteration boundary (nothing of its own is
        in flight then): it stops taking work, downloads the new stage's state and enters it as
        a joiner would, in a new life for the flow machines."""
        node.active = False
        node.ready = False
        node.stage = stage
        node.set_compute(self.sc.compute_s(node.info, stage))
        node.wrr.clear()
        self._incarnations[node.id] = self._incarnations.get(node.id, 0) + 1
        self.moves += 1
        self.schedule_ready(node)

    def relocate(self, node: SimNode, stage: int) -> None:
        """A move in the middle of an iteration: the machine leaves gracefully (its work of
        the iteration is recovered by the crash rules) and joins `stage` at once."""
        self._crash(node, graceful=True)
        fresh = self._new_node(replace(node.info, stage=stage))
        self.moves += 1
        self.schedule_ready(fresh)

    @returns_events
    def _on_ready(self, payload: tuple[SimNode, int, int]) -> None:
        node, epoch, snapshot = payload
        if not node.alive or node.epoch != epoch:
            return
        if snapshot != self.committed and self.active_nodes(node.stage):
            # The stage took an optimizer step during the download: fetch the new state.
            self.schedule_ready(node)
            return
        node.ready = True
        if self.policy.activate_now(node):
            self._activate(node, start=True)
        else:
            self.pending_activation.append(node)

    def _activate(self, node: SimNode, *, start: bool) -> None:
        if node.active or not node.alive:
            return
        node.active = True
        node.ledger = Ledger(node.id, node.stage,
                             self.iteration.index if self.iteration is not None else 0)
        node.iter_compute = 0.0
        self.policy.on_activate(node)
        self._check_paused()
        self._wake_stage(node.stage)
        if node.stage == 0 and start:
            self._try_inject(node)

    def _wake_stage(self, stage: int) -> None:
        waiting = self.waiting[stage]
        if waiting:
            self.waiting[stage] = {}
            for mb in list(waiting.values()):
                mb.waiting = False
                self._pump(mb)

    def _crash(self, node: SimNode, *, graceful: bool) -> None:
        self.crashes += 0 if graceful else 1
        node.alive = False
        if node.busy and node.job is not None:
            partial = self.engine.now - node.job_start
            self.total_compute += partial
            self.wasted += partial
        node.busy = False
        node.job = None
        it = self.iteration
        if node.active and it is not None:
            self.wasted += node.iter_compute + self.shipping.crashed(node)
        node.iter_compute = 0.0
        node.bwd_q.clear()
        node.fwd_q.clear()
        node.slot_mbs.clear()
        self.pending_activation = [n for n in self.pending_activation if n is not node]
        delay = 0.0 if graceful else self.policy.detection_delay()
        self.sink.emit(self.engine.now + delay, Kind.DETECT, self._on_detect, node)

    @returns_events
    def _on_detect(self, node: SimNode) -> None:
        node.detected = True
        was_active = node.active
        node.active = False
        self.policy.on_death(node, was_active)
        if was_active:
            self._check_paused()
            if self.policy.recovers:
                self._recover(node)
            elif self.iteration is not None and self.iteration.aggregating:
                # The all-reduce waited for this node (`_on_commit`); it held no work of the
                # policy's (else `on_death` restarted the iteration): run it again without it.
                self._abort_aggregation()
                self._maybe_complete()

    def _recover(self, dead: SimNode) -> None:
        it = self.iteration
        if it is None:
            return
        self._abort_aggregation()
        s = dead.stage
        reports = [n.ledger.report_about(dead.id) for n in self.nodes.values()
                   if n.alive and n.stage in (s - 1, s + 1)]
        held = [mb.id for mb in it.mbs.values() if mb.node[0] is dead] if s == 0 else []
        covered, keeper = self.shipping.cover(dead)
        plan = plan_crash(dead.id, s, self.S, reports, finished=it.finished, held_by_dead=held,
                          covered=covered, keeper=keeper, dropped_before=it.dropped)
        for kept in self.shipping.keep(plan, dead):
            self._pump(kept)
        swarm = not self.policy.exact_commit
        for mb_id in sorted(plan.dropped):
            mb = it.mbs.get(mb_id)
            if mb is None or mb.dead:
                continue
            if self._held_downstream(mb):
                continue  # its stage-1 node died unnoticed but it got further: see below
            self.recoveries["drop"] += 1
            if swarm:
                self._abandon(mb, lost=True)
            else:
                self._drop(mb)
        for rec in plan.recoveries:
            mb = it.mbs.get(rec.mb)
            if mb is None or mb.dead or mb.node[rec.stage] is not dead:
                continue
            self._apply(mb, rec.stage, rec.rule, swarm)
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
            self.recoveries["orphan"] += 1
            if rule == Rule.DROP:
                if swarm:
                    self._abandon(mb, lost=True)
                else:
                    self._drop(mb)
            else:
                self._apply(mb, s, rule, swarm)
        self._maybe_complete()

    def _apply(self, mb: MB, s: int, rule: Rule, swarm: bool) -> None:
        self.recoveries[rule.name.lower()] += 1
        if swarm and (rule == Rule.REPLAY or s == 0 or mb.finished):
            # SWARM keeps no ledger: a dead peer's accumulated gradient is simply gone (and a
            # finished microbatch is never revisited), and a dead trainer's microbatches with it.
            if s == 0 and not mb.finished:
                self._abandon(mb, lost=True)
                return
            self.lost.add(mb.id)
            mb.node[s] = None
            if mb.st[s] != DONE:
                mb.st[s] = DONE
                mb.done_count += 1
                if mb.done_count == self.S and self.iteration is not None:
                    self.iteration.incomplete -= 1
            self._pump(mb)  # an upstream stage may wait for the gradient that died here
            return
        if mb.st[s] == DONE:
            mb.done_count -= 1
            if mb.done_count == self.S - 1 and self.iteration is not None:
                self.iteration.incomplete += 1
        mb.node[s] = None
        mb.st[s] = NONE
        mb.need[s] = rule
        mb.g_inflight[s] = False
        self._pump(mb)

    def _held_downstream(self, mb: MB) -> bool:
        """Does a live node past stage 0 hold `mb` (so its token ids survive)?"""
        for t in range(1, self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.st[t] > INFLIGHT:
                return True
        return False

    def _drop(self, mb: MB) -> None:
        it = self.iteration
        assert it is not None
        # An activation still on the wire when the crash is noticed (the oracle notices at
        # once) is discarded when it lands; state at a node that died unnoticed died with it;
        # anything else would mean the rules were broken.
        if self._held_downstream(mb):
            raise SimulationError(f"dropped microbatch {mb.id} is held past stage 0")
        mb.dead = True
        self.dropped += 1
        self.audit["dropped"] += 1
        it.dropped.add(mb.id)
        it.incomplete -= 1
        self._release(mb)

    def _abandon(self, mb: MB, *, lost: bool) -> None:
        """Forget a microbatch that will not finish (swarm's dead trainer, dtfm's restart)."""
        it = self.iteration
        mb.dead = True
        self.audit["abandoned"] += 1
        for t in range(self.S):
            n = mb.node[t]
            if n is not None and n.alive:
                self.wasted += mb.spent[t]
        if lost:
            self.lost.add(mb.id)
        if it is not None and mb.iteration == it.index:
            it.mbs.pop(mb.id, None)
            it.injected -= 1
            if mb.done_count < self.S:
                it.incomplete -= 1
            it.to_inject += 1
        self._release(mb)
        if it is not None and it.to_inject > 0:
            for holder in self.active_nodes(0):
                self._try_inject(holder)

    def _release(self, mb: MB) -> None:
        for t in range(self.S):
            n = mb.node[t]
            if n is not None and n.alive and mb.id in n.slot_mbs:
                if n.job is None or n.job[1] is not mb:
                    n.slot_mbs.discard(mb.id)
                    self._start_next(n)
                    if n.stage == 0:
                        self._try_inject(n)
        for s in range(self.S):
            self.waiting[s].pop(mb.id, None)

    # ------------------------------------------------------------------ dtfm support

    def restart(self) -> None:
        """Lose the iteration in progress (dtfm): every microbatch and all its compute."""
        it = self.iteration
        if it is None:
            return
        self.restarts += 1
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
        self.waiting = [{} for _ in range(self.S)]
        self.iteration = None
        self._check_paused()

    def resume(self) -> None:
        index = self.committed
        self._start_iteration(index)
