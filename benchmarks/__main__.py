"""`python -m benchmarks`: the routing algorithm against the oracle, on the geo10 matrix.

(a) quality: flow ratio and cost ratio against the networkx oracle measured in the same run;
(b) cost: messages and rounds to quiescence, cold start vs warm restart after one crash.
Each case has a wall-clock budget; a case over budget is reported as such, not dropped.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import numpy as np

from gwtf.flow.bus import NotConverged, solve_decentralized
from gwtf.flow.generate import geo10
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units, make_result

CASES = [(12, 3), (24, 4), (40, 4)]
SEEDS = [0, 1]
MAX_ROUNDS = 60_000


def main() -> int:
    rows = []
    for n, stages in CASES:
        for seed in SEEDS:
            topo = geo10(np.random.default_rng(seed), n, stages)
            t0 = time.perf_counter()
            oracle = solve_oracle(topo)
            t_oracle = time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                cold, bus = solve_decentralized(topo, seed=seed, max_rounds=MAX_ROUNDS)
            except NotConverged:
                rows.append(f"| {n} | {stages} | {seed} | no quiescence within {MAX_ROUNDS} "
                            f"rounds ({time.perf_counter() - t0:.1f} s) | | | | | |")
                continue
            t_cold = time.perf_counter() - t0
            flow_ratio = cold.flow_value_units / oracle.flow_value_units
            cost_ratio = cost_units(topo, cold.flows) / oracle_cost_units(topo, oracle)
            victim = topo.stage_nodes(1)[0]
            smaller = topo.without_node(victim)
            bus.reset_counts()
            bus.remove(victim)
            try:
                warm = bus.run(MAX_ROUNDS)
                after = make_result(smaller, bus.flows())
                o2 = solve_oracle(smaller)
                warm_txt = (f"{warm.messages} | {warm.rounds} | "
                            f"{warm.messages / cold.messages:.3f} | "
                            f"{after.flow_value_units / o2.flow_value_units:.6f}")
            except NotConverged:
                warm_txt = "no quiescence | | | "
            rows.append(
                f"| {n} | {stages} | {seed} | {flow_ratio:.6f} | {cost_ratio:.6f} | "
                f"{cold.messages} | {cold.rounds} | {warm_txt} | {t_cold:.2f} / {t_oracle:.2f} |"
            )
            print(rows[-1], flush=True)
    out = Path(__file__).with_name("RESULTS.md")
    header = [
        "# Benchmark results",
        "",
        "Produced by `make bench` (`python -m benchmarks`) on "
        f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {sys.version.split()[0]}, "
        "one core. Topologies from `gwtf.flow.generate.geo10` (10 AWS regions of "
        "`geo10_aws.csv`, GPU speeds of `gpu_train_throughput.csv`, 0.1 s per stage on a V100, "
        "8 MiB activations). Ratios are against the networkx oracle computed in the same run; "
        "warm = one stage-1 node crashed from the converged state, counted alone.",
        "",
        "| nodes | stages | seed | flow ratio | cost ratio | cold msgs | cold rounds | "
        "warm msgs | warm rounds | warm/cold msgs | warm flow ratio | wall s (ours / oracle) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out.write_text("\n".join(header + rows) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
