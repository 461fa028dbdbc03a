"""Routing benchmarks on the geo10 matrix, against the networkx oracle on the full node graph.

Section `flow` (`python -m benchmarks flow`), the default method, local solves on gossiped records
(docs/design.md 2.12):
(a) flow and cost ratios against the oracle, messages and rounds of the gossip, wall times;
(b) wall time of `gwtf route` (a child process) on 1,000 nodes in 10 stages against
    `gwtf route --oracle`, and on 10,000 nodes in 20 stages, checked independently;
(c) after a crash at 1,000 nodes, the delivered flow over the new optimum, round by round.

Section `flow-relax` (`python -m benchmarks flow-relax`), the epsilon-relaxation (`--method relax`):
(a) quality: flow ratio and cost ratio against the oracle computed in the same run;
(b) cost: messages per node and rounds to quiescence, cold start vs warm restart after one
    crash, for a relay of the bottleneck stage (the minimum cut moves) and one of another stage;
(c) wall time of `gwtf route` (the real command, a child process) on 1,000 nodes in 10 stages,
    against the oracle's wall time in the same run (`gwtf route --oracle`).

`python -m benchmarks flow|flow-relax [--quick]`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.report import machine, write_section
from gwtf.flow.generate import geo10, topology_to_file
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.relax.bus import solve_decentralized
from gwtf.flow.solution import cost_units, make_result
from gwtf.flow.topology import Topology

QUALITY_CASES = [(40, 4), (100, 6), (200, 8), (400, 12)]
QUICK_CASES = [(40, 4), (100, 6)]
SEEDS = [0, 1]
ROUTE_CASE = (1000, 10)
ROUTE_TARGET_S = 30.0


@dataclass
class Row:
    nodes: int
    stages: int
    seed: int
    flow_ratio: float
    cost_ratio: float
    msgs_per_node: float
    rounds: int
    wall_s: float
    oracle_s: float
    warm: list[tuple[str, float, int, float, bool]]  # victim kind, msgs ratio, rounds, flow ratio


def _bottleneck_stage(topology: Topology, flows: dict[tuple[str, str], int]) -> int:
    """The stage whose nodes are closest to saturation (the minimum cut, in these swarms)."""
    through: dict[str, int] = {}
    for (src, dst), units in flows.items():
        through[dst] = through.get(dst, 0) + units
        if topology.node(src).stage == 0:
            through[src] = through.get(src, 0) + units
    load = []
    for stage in range(topology.num_stages):
        ids = topology.stage_nodes(stage)
        cap = sum(topology.node(n).cap_units for n in ids)
        load.append((sum(through.get(n, 0) for n in ids) / max(1, cap), stage))
    return max(load)[1]


def measure(nodes: int, stages: int, seed: int) -> Row:
    topo = geo10(np.random.default_rng(seed), nodes, stages)
    t0 = time.perf_counter()
    oracle = solve_oracle(topo)
    oracle_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cold, bus = solve_decentralized(topo, seed=seed)
    wall_s = time.perf_counter() - t0
    flows = dict(cold.flows)
    warm = []
    hot = _bottleneck_stage(topo, flows)
    cool = (hot + 1) % stages
    for kind, stage in (("bottleneck", hot), ("other", cool)):
        candidates = [n for n in topo.stage_nodes(stage) if bus.nodes[n].throughput() > 0]
        if not candidates or len(topo.stage_nodes(stage)) < 2:
            continue
        victim = candidates[0]
        smaller = topo.without_node(victim)
        bus.reset_counts()
        bus.remove(victim)
        stats = bus.run()
        after = make_result(smaller, bus.flows())
        ratio = after.flow_value_units / solve_oracle(smaller).flow_value_units
        warm.append((kind, stats.messages / cold.messages, stats.rounds, ratio, bus.rescales > 0))
        topo = smaller
    first = geo10(np.random.default_rng(seed), nodes, stages)
    return Row(
        nodes,
        stages,
        seed,
        cold.flow_value_units / oracle.flow_value_units,
        cost_units(first, flows) / oracle_cost_units(first, oracle),
        cold.messages / nodes,
        cold.rounds,
        wall_s,
        oracle_s,
        warm,
    )


def time_route(nodes: int, stages: int) -> tuple[float, float, dict[str, float]]:
    """Wall seconds of `gwtf route` and of `gwtf route --oracle` on one generated file."""
    topo = geo10(np.random.default_rng(0), nodes, stages)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topology.json"
        topology_to_file(topo, path)
        times = []
        outputs = []
        for extra in ([], ["--oracle"]):
            t0 = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "gwtf", "route", str(path), "--json", "--method", "relax",
                 *extra],
                capture_output=True,
                text=True,
                check=True,
            )
            times.append(time.perf_counter() - t0)
            outputs.append(json.loads(done.stdout))
    ours, oracle = outputs
    return times[0], times[1], {
        "flow_ratio": ours["flow_value"] / oracle["flow_value"],
        "cost_ratio": ours["total_cost"] / oracle["total_cost"],
        "messages": ours["messages"],
        "rounds": ours["rounds"],
    }


def run_relax(quick: bool = False) -> str:
    rows = []
    for nodes, stages in QUICK_CASES if quick else QUALITY_CASES:
        for seed in SEEDS:
            row = measure(nodes, stages, seed)
            rows.append(row)
            print(
                f"flow {nodes}x{stages} seed {seed}: flow {row.flow_ratio:.6f} "
                f"cost {row.cost_ratio:.6f} {row.wall_s:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    lines = [
        "## Routing by epsilon-relaxation (`--method relax`) vs the networkx oracle "
        "(`python -m benchmarks flow-relax`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one core per process. Topologies "
        "from `gwtf.flow.generate.geo10`: nodes spread uniformly over the 10 AWS regions of "
        "`geo10_aws.csv`, GPUs drawn from `gpu_train_throughput.csv` (0.1 s per stage on a V100), "
        "8 MiB activations. The bus delivers each message 1-3 rounds after it is sent, in seeded "
        "random order. Ratios are against the oracle solved in the same run on the same integers.",
        "",
        "| nodes | stages | seed | flow ratio | cost ratio | msgs/node | rounds | wall s | "
        "oracle s | warm: bottleneck relay (msgs vs cold, rounds, rescaled) | "
        "warm: other relay (msgs vs cold, rounds, rescaled) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        warm = {kind: rest for kind, *rest in r.warm}
        cells = []
        for kind in ("bottleneck", "other"):
            if kind in warm:
                ratio, rounds, flow, rescaled = warm[kind]
                ok = "" if flow == 1.0 else f", flow ratio {flow:.6f}"
                cells.append(f"{ratio:.3f}, {rounds}, {'yes' if rescaled else 'no'}{ok}")
            else:
                cells.append("n/a")
        lines.append(
            f"| {r.nodes} | {r.stages} | {r.seed} | {r.flow_ratio:.6f} | {r.cost_ratio:.6f} | "
            f"{r.msgs_per_node:.0f} | {r.rounds} | {r.wall_s:.1f} | {r.oracle_s:.2f} | "
            f"{cells[0]} | {cells[1]} |"
        )
    if not quick:
        nodes, stages = ROUTE_CASE
        ours, oracle, facts = time_route(nodes, stages)
        verdict = "met" if ours < ROUTE_TARGET_S else "missed"
        lines += [
            "",
            f"`gwtf route` on {nodes} nodes in {stages} stages (a child process, file load and "
            f"JSON output included): **{ours:.1f} s** (target under {ROUTE_TARGET_S:.0f} s: "
            f"{verdict}); `gwtf route --oracle` on the same file: {oracle:.1f} s, so the "
            f"decentralized simulation costs {ours / oracle:.1f}x the central solve. Flow ratio "
            f"{facts['flow_ratio']:.6f}, cost ratio {facts['cost_ratio']:.6f}, "
            f"{facts['messages']:.0f} messages, {facts['rounds']:.0f} rounds.",
        ]
    body = "\n".join(lines)
    write_section("flow-relax", body)
    return body


def run(quick: bool = False) -> str:
    from benchmarks.flow_local import run_local

    return run_local(quick)
