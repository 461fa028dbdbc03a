"""The simulator's entities (docs/design.md 5): nodes, microbatches, the iteration in progress,
and what a run measured. State only: the rules that change it live in the simulation
(`gwtf.sim.simulator`), its churn (`gwtf.sim.churn`) and its recovery
(`gwtf.sim.recovery.recovering`).

A microbatch's progress at stage s is one of NONE, INFLIGHT (its activation travels to the node),
FWD_Q, WAIT_G (forward done, activations kept, waiting for the gradient), BWD_Q, DONE
(accumulated). A compute job is a forward (J_FWD), a recovery's forward only (J_RFWD), a
backward (J_BWD), or forward and backward as one (J_FUSED: the last stage, and replays).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gwtf.job.nexthop import SmoothRoundRobin
from gwtf.recovery import Ledger
from gwtf.sim.scenario import NodeInfo

__all__ = [
    "BWD_Q", "DONE", "FWD_Q", "INFLIGHT", "J_BWD", "J_FUSED", "J_FWD", "J_RFWD", "MB", "NONE",
    "WAIT_G", "Iteration", "SimNode", "SimResult", "SimulationError",
]

NONE, INFLIGHT, FWD_Q, WAIT_G, BWD_Q, DONE = range(6)
J_FWD, J_RFWD, J_BWD, J_FUSED = range(4)


class SimulationError(RuntimeError):
    """An invariant broke (a bug in the simulator or the rules), never a user error."""


class SimNode:
    __slots__ = (
        "id", "info", "stage", "compute_s", "f_s", "b_s", "location", "alive", "active",
        "detected", "epoch", "slots", "slot_mbs", "busy", "job", "job_start", "bwd_q", "fwd_q",
        "ledger", "iter_compute", "ready", "tokens", "tokens_t", "inject_at", "wrr", "quota",
        "dtfm_next", "balancer", "pending_resp", "move_to", "left", "started", "ready_at",
        "wake_at", "steps_from", "work", "base_s", "slow", "record_s", "revision", "pace",
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
        self.work: dict[int, float] = {}
        """Compute seconds behind each of its contributions in this iteration (its own work on
        the microbatch, or the work behind a sum it adopted): what a keeper's adoption saves."""
        self.ready = False
        self.tokens = float(slots)
        self.tokens_t = 0.0
        self.inject_at: float | None = None
        self.steps_from = 0
        """The iteration from which it keeps its own steps for joiners to catch up with (the
        state it started from, or its stage's rollback point; gwtf.job.catchup)."""
        self.ready_at = 0.0
        """When the step order of the last commit reaches it (docs/design.md 3.7): it takes no
        work of the next iteration before, as the node waits to reach an iteration."""
        self.wake_at: float | None = None
        self.wrr = SmoothRoundRobin(owner=self.id)
        """Its next hops, as the node's sender picks them (gwtf.job.nexthop)."""
        self.quota = 0
        self.dtfm_next: SimNode | None = None
        self.balancer: Any = None
        self.pending_resp: list[tuple[float, str, float, int]] = []
        self.move_to: int | None = None
        self.left = False
        """It went by a graceful leave (it told every member), not a crash."""
        self.started = 0.0
        """When this life of the node started (its record's start, as a node's epoch)."""
        self.slow = 1.0
        """The machine's compute time over its normal one now (a `speed` event, 2.13)."""
        self.revision = 0
        """Its record's revision: bumped when its pace reaches its record."""
        self.pace: Any = None
        """Its `gwtf.flow.pace.Pace`, where the policy follows paces (gwtf)."""
        self.set_compute(compute_s)

    def set_compute(self, compute_s: float) -> None:
        """Its normal compute time at the stage it enters; its record says what it runs at then
        (as a node's warm-up or declared speed), and its pace starts over."""
        self.base_s = compute_s
        self._apply()
        self.record_s = self.compute_s
        """The compute time its record says: what the routing solves with."""
        self.pace = None

    def set_slow(self, factor: float) -> None:
        """The machine runs `factor` times its normal compute time from now on; its record does
        not know (its pace will tell, docs/design.md 2.13)."""
        self.slow = factor
        self._apply()

    def _apply(self) -> None:
        self.compute_s = self.base_s * self.slow
        self.f_s = self.compute_s / 3
        self.b_s = self.compute_s - self.f_s


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
    reported: dict[str, tuple[NodeInfo, float]] = field(default_factory=dict)
    """Per node that finished a microbatch's last stage (a holder, or a replayer), the time
    of its last one: when it reported it to the coordinator."""

@dataclass
class SimResult:
    """Everything a run measured; `summary()` is the JSON of the issue."""

    policy: str
    scenario: str
    sim_time_s: float
    iterations_completed: int
    iteration_target: int
    time_to_train_s: float | None
    """When `microbatch_target` microbatches had their gradient in every stage's step."""
    time_to_iterations_s: float | None
    """When the `iteration_target`-th iteration committed, however many microbatches it held."""
    microbatch_target: int
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
    rollbacks: list[tuple[float, int, int, int]] = field(default_factory=list)
    """(time, stage wiped, iteration rolled back from, to), docs/design.md 4.6."""
    failed: str | None = None
    """Why the job could not go on (a wiped stage that no snapshot restores), if it could not."""
    snapshots: dict[str, Any] = field(default_factory=dict)
    """Stage snapshots sent, landed, cut off on the way, and their bytes (4.6)."""
    catch_ups: int = 0
    """Joiners' states that steps made stale, caught up with the steps (3.8)."""
    refetches: int = 0
    """Joiners' states that steps made stale, fetched again whole."""
    codecs: tuple[str, ...] = ()
    """The codec of each stage boundary the policy sent with, where the scenario compresses
    (gwtf/sim/compression.py); empty where it does not."""

    @property
    def rolled_back_iterations(self) -> int:
        """Iterations committed and then undone by rollbacks: progress lost, trained again."""
        return sum(before - to for _, _, before, to in self.rollbacks)

    @property
    def wasted_compute_fraction(self) -> float:
        return self.wasted_compute_s / self.total_compute_s if self.total_compute_s else 0.0

    def summary(self) -> dict[str, Any]:
        iters = [b - a for a, b in zip([0.0] + self.commit_times, self.commit_times,
                                       strict=False)]
        projected = self.time_to_train_s
        if projected is None and self.committed_microbatches:
            projected = (self.sim_time_s * self.microbatch_target
                         / self.committed_microbatches)
        return {
            "throughput_mean": round(self.throughput_mean, 6),
            "iterations_completed": self.iterations_completed,
            "time_to_train_s": None if self.time_to_train_s is None
            else round(self.time_to_train_s, 3),
            "projected_time_to_train_s": None if projected is None else round(projected, 3),
            "time_to_iterations_s": None if self.time_to_iterations_s is None
            else round(self.time_to_iterations_s, 3),
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
            "rollbacks": [list(r) for r in self.rollbacks],
            "rolled_back_iterations": self.rolled_back_iterations,
            "snapshots": dict(self.snapshots),
            "catch_ups": self.catch_ups,
            "refetches": self.refetches,
            "failed": self.failed,
        } | ({"codecs": list(self.codecs)} if self.codecs else {})
