"""Simulator benchmark: every scenario of simulations/, every policy, full length.

`python -m benchmarks sim [--quick]` (or `simulations/run_all`). Writes, per scenario, the
outputs of `gwtf simulate --out` into benchmarks/out/sim/<scenario>/ (git-ignored), and the
comparison into the `sim` section of benchmarks/RESULTS.md. `--quick` runs the first half hour
of the two short scenarios only (a smoke run).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.report import machine, write_section
from gwtf.sim.policies import simulation
from gwtf.sim.report import TABLE_HEADER, markdown_table, write_outputs
from gwtf.sim.scenario import POLICIES, load_scenario
from gwtf.sim.simulator import SimResult

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["homogeneous", "geo10_hetero_links", "geo10_spot", "high_churn", "spot_waves"]
QUICK = (["homogeneous", "geo10_hetero_links"], 1800.0)
OUT = ROOT / "benchmarks" / "out" / "sim"


def run_scenario(
    name: str, policies: list[str], duration: float | None = None, out: Path = OUT
) -> tuple[list[str], list[SimResult]]:
    sc = load_scenario(ROOT / "simulations" / f"{name}.toml")
    if duration is not None and duration < sc.duration_s:
        sc = replace(sc, duration_s=duration, name=f"{sc.name} ({duration / 3600:.1f} h)")
    results = []
    for policy in policies:
        t0 = time.perf_counter()
        result = simulation(sc, policy).run()
        results.append(result)
        print(
            f"sim {name:<20} {policy:<16} {result.throughput_mean:7.3f} mb/s "
            f"{result.iterations_completed:4d} it {time.perf_counter() - t0:7.1f} s wall",
            file=sys.stderr,
            flush=True,
        )
    write_outputs(out / name, sc, sc.seed, results)
    return markdown_table(sc, results), results


def run(quick: bool = False, policies: list[str] | None = None) -> str:
    names, duration = QUICK if quick else (SCENARIOS, None)
    policies = policies or list(POLICIES)
    rows: list[str] = []
    speed: list[str] = []
    for name in names:
        table, results = run_scenario(name, policies, duration)
        rows += table
        for r in results:
            speed.append(
                f"| {name} | {r.policy} | {r.sim_time_s / 3600:.1f} | {r.events} | "
                f"{r.sim_wall_s:.1f} | {r.events / max(r.sim_wall_s, 1e-9):,.0f} |"
            )
    lines = [
        "## Simulator: policies compared (`python -m benchmarks sim`, `simulations/run_all`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one core per run, seed 0"
        + (", first half hour only (`--quick`)" if quick else ", full length")
        + ". Throughput = microbatches committed per simulated second, barriers and "
        "aggregation included, counting only microbatches whose gradient reached every "
        "stage's optimizer; progress = the same plus the microbatches finished in the "
        "iteration still open at the end (the ratios use it: committed throughput moves in "
        "steps of one iteration); time to train = commit of the scenario's `iterations`-th "
        "iteration (in parentheses: projected from the rate when the run ended first); "
        "wasted = compute thrown away or redone / all compute; lost = microbatches whose "
        "gradient at some stage never reached the optimizer, uncounted (SWARM: a dead peer's "
        "accumulated gradients, a dead trainer's microbatches).",
        "",
        *TABLE_HEADER,
        *rows,
        "",
        "Simulator speed:",
        "",
        "| scenario | policy | simulated h | events | wall s | events/s |",
        "|---|---|---|---|---|---|",
        *speed,
    ]
    body = "\n".join(lines)
    write_section("sim", body)
    return body
