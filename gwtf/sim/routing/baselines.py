"""Small pure pieces of the DT-FM baseline: its schedule search. (SWARM's chooser is the node's
too, `gwtf.job.swarmroute`; gwtf's own next hops are `gwtf.job.nexthop`.)

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
    "dtfm_cost",
    "dtfm_schedule",
]


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
