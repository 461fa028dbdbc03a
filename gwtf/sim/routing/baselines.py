"""Small pure pieces of the baseline policies: SWARM's throughput estimate and peer choice, and
DT-FM's schedule search. (gwtf's own next hops are the node's, `gwtf.job.nexthop`.)

- `PerformanceEMA`: hivemind's `utils/performance_ema.py`: an exponential moving average of
  seconds per sample with the bias correction `1 - (1 - alpha)^n`, fed with simulated times.
  Concurrent calls count time from `max(call start, last update)`, as hivemind's
  `update_threadsafe` does, so the estimate is a throughput, not a latency.
- `SwarmBalancer`: SWARM's `moe/client/balancer.py` (`ExpertBalancer.use_another_expert`): each
  peer has a virtual "busy until" time; a sender takes the peer with the least, and adds the
  expected time of the task (1 / estimated throughput, or `initial_s` before any measurement);
  a new peer starts at the current least load, a failed peer is banned.
- `dtfm_schedule`: DT-FM's scheduler (Yuan et al. 2022) restricted to nodes whose stage is fixed:
  choose D pipelines (one node per stage each, D = the smallest stage) minimising DT-FM's cost
  model, max over pipelines of the pipeline time + max over stages of the data-parallel
  all-reduce time. DT-FM searches with a genetic algorithm plus local search; this is a seeded
  multi-start local search (swap two nodes of a stage between pipelines, or a used node with an
  unused one) on the same cost, with a budget of cost evaluations. DT-FM's model counts only
  communication (its GPUs are equal); ours are not, so each pipeline's time also counts its
  compute (a GPipe estimate), without which the schedule would ignore GPU speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DtfmNode",
    "PerformanceEMA",
    "SwarmBalancer",
    "dtfm_cost",
    "dtfm_schedule",
]


class PerformanceEMA:
    """Samples per second, by a bias-corrected EMA of seconds per sample (hivemind)."""

    __slots__ = ("alpha", "ema_seconds_per_sample", "num_updates", "samples_per_second",
                 "timestamp")

    def __init__(self, alpha: float = 0.1, now: float = 0.0) -> None:
        self.alpha = alpha
        self.ema_seconds_per_sample = 0.0
        self.num_updates = 0
        self.samples_per_second = 1e-20
        self.timestamp = now

    def update(self, task_size: float, started: float, now: float) -> float:
        """A call that started at `started` answered at `now` (hivemind's update_threadsafe)."""
        interval = max(now - max(started, self.timestamp), 0.0)
        self.timestamp = now
        self.ema_seconds_per_sample = (
            self.alpha * interval / task_size + (1 - self.alpha) * self.ema_seconds_per_sample
        )
        self.num_updates += 1
        adjusted = self.ema_seconds_per_sample / (1 - (1 - self.alpha) ** self.num_updates)
        self.samples_per_second = 1 / max(adjusted, 1e-20)
        return self.samples_per_second


class SwarmBalancer:
    """One sender's view of the next stage: virtual busy times, throughput EMAs, bans."""

    __slots__ = ("alpha", "initial_s", "runtime", "tiebreak", "ema", "banned", "rng")

    def __init__(self, rng: np.random.Generator, alpha: float = 0.1, initial_s: float = 1.0):
        self.alpha = alpha
        self.initial_s = initial_s
        self.runtime: dict[str, float] = {}
        self.tiebreak: dict[str, float] = {}
        self.ema: dict[str, PerformanceEMA] = {}
        self.banned: set[str] = set()
        self.rng = rng

    def add(self, peer: str, now: float) -> None:
        if peer in self.runtime or peer in self.banned:
            return
        base = min(self.runtime.values(), default=0.0)
        self.runtime[peer] = base
        self.tiebreak[peer] = float(self.rng.random())
        self.ema[peer] = PerformanceEMA(self.alpha, now)

    def ban(self, peer: str) -> None:
        self.banned.add(peer)
        self.runtime.pop(peer, None)
        self.tiebreak.pop(peer, None)
        self.ema.pop(peer, None)

    def choose(self) -> str | None:
        """The peer with the least expected busy time; charges it with this task."""
        best: str | None = None
        key = (math.inf, 0.0)
        for peer, runtime in self.runtime.items():
            candidate = (runtime, self.tiebreak[peer])
            if candidate < key:
                best, key = peer, candidate
        if best is None:
            return None
        ema = self.ema[best]
        expected = 1.0 / ema.samples_per_second if ema.num_updates else self.initial_s
        self.runtime[best] = key[0] + expected
        self.tiebreak[best] = float(self.rng.random())
        return best

    def measured(self, peer: str, started: float, now: float) -> None:
        ema = self.ema.get(peer)
        if ema is not None:
            ema.update(1.0, started, now)


@dataclass(frozen=True, slots=True)
class DtfmNode:
    id: str
    stage: int
    compute_s: float


def dtfm_cost(
    pipelines: Sequence[Sequence[DtfmNode]],
    hop_s: Callable[[str, str], float],
    allreduce_s: Callable[[Sequence[str]], float],
    microbatches: int,
) -> float:
    """DT-FM's cost of a schedule: the slowest pipeline's GPipe time (m microbatches through S
    stages: fill and drain, then m - 1 more at the slowest step; a step is a stage's compute or a
    hop's transfer) plus the slowest stage's all-reduce among its chosen nodes."""
    if not pipelines:
        return math.inf
    m = max(1, math.ceil(microbatches / len(pipelines)))
    worst = 0.0
    for chain in pipelines:
        steps = [n.compute_s for n in chain]
        hops = [hop_s(a.id, b.id) for a, b in zip(chain, chain[1:], strict=False)]
        fill = sum(steps) + 2 * sum(hops)
        slowest = max(steps + hops)
        worst = max(worst, fill + (m - 1) * slowest)
    stages = len(pipelines[0])
    reduce = max(allreduce_s([p[s].id for p in pipelines]) for s in range(stages))
    return worst + reduce


def dtfm_schedule(
    stage_nodes: Sequence[Sequence[DtfmNode]],
    hop_s: Callable[[str, str], float],
    allreduce_s: Callable[[Sequence[str]], float],
    microbatches: int,
    rng: np.random.Generator,
    evaluations: int = 4000,
    restarts: int = 4,
) -> list[list[DtfmNode]]:
    """The best schedule found: D pipelines, each a list of one node per stage."""
    if not stage_nodes or any(len(s) == 0 for s in stage_nodes):
        return []
    d = min(len(s) for s in stage_nodes)
    stages = len(stage_nodes)

    def cost(assign: list[list[DtfmNode]]) -> float:
        pipes = [[assign[s][p] for s in range(stages)] for p in range(d)]
        return dtfm_cost(pipes, hop_s, allreduce_s, microbatches)

    # Greedy start: the fastest d nodes of each stage, paired fastest with fastest.
    greedy = [sorted(nodes, key=lambda n: (n.compute_s, n.id)) for nodes in stage_nodes]
    starts = [greedy]
    for _ in range(max(0, restarts - 1)):
        starts.append([list(rng.permutation(np.array(nodes, dtype=object))) for nodes in
                       stage_nodes])
    best: list[list[DtfmNode]] | None = None
    best_cost = math.inf
    budget = max(1, evaluations // len(starts))
    for start in starts:
        assign = [list(nodes) for nodes in start]  # first d used, the rest spare
        current = cost(assign)
        for _ in range(budget):
            s = int(rng.integers(stages))
            row = assign[s]
            i = int(rng.integers(d))
            j = int(rng.integers(len(row)))
            if i == j:
                continue
            row[i], row[j] = row[j], row[i]
            candidate = cost(assign)
            if candidate < current:
                current = candidate
            else:
                row[i], row[j] = row[j], row[i]
        if current < best_cost:
            best_cost, best = current, [list(r) for r in assign]
    assert best is not None
    return [[best[s][p] for s in range(stages)] for p in range(d)]
