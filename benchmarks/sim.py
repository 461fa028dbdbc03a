"""Simulator benchmark: every scenario of simulations/, every policy, full length, seeds 0-2.

`python -m benchmarks sim [--quick]` (or `simulations/run_all`). Writes, per scenario, the
outputs of `gwtf simulate --out` for seed 0 into benchmarks/out/sim/<scenario>/ (git-ignored),
and into the `sim` section of benchmarks/RESULTS.md: the full table of seed 0, and gwtf's ratios
against the baselines for every seed with the longest time any policy went without a commit
(a stall shows there). Runs go two at a time, one core each. `--quick` runs the first half hour
of the two short scenarios, seed 0 only (a smoke run).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from benchmarks.report import machine, write_section
from gwtf.sim.policies import simulation
from gwtf.sim.report import TABLE_HEADER, markdown_table, rollback_cell, write_outputs
from gwtf.sim.scenario import POLICIES, Scenario, load_scenario
from gwtf.sim.simulator import SimResult

ROOT = Path(__file__).resolve().parents[1]
FIRST = ["homogeneous", "geo10_hetero_links", "geo10_spot", "high_churn", "spot_waves"]
SCENARIOS = FIRST + sorted(
    p.stem for p in (ROOT / "simulations").glob("*.toml") if p.stem not in FIRST)
SEEDS = (0, 1, 2)
QUICK = (["homogeneous", "geo10_hetero_links"], 1800.0)
WORKERS = 2
OUT = ROOT / "benchmarks" / "out" / "sim"


def _load(name: str, duration: float | None, seed: int) -> Scenario:
    sc = load_scenario(ROOT / "simulations" / f"{name}.toml", seed=seed)
    if duration is not None and duration < sc.duration_s:
        sc = replace(sc, duration_s=duration, name=f"{sc.name} ({duration / 3600:.1f} h)")
    return sc


def _one(name: str, policy: str, duration: float | None, seed: int) -> SimResult:
    t0 = time.perf_counter()
    result = simulation(_load(name, duration, seed), policy).run()
    print(
        f"sim {name:<20} seed {seed} {policy:<16} {result.throughput_mean:7.3f} mb/s "
        f"{result.iterations_completed:4d} it {time.perf_counter() - t0:7.1f} s wall",
        file=sys.stderr,
        flush=True,
    )
    return result


def longest_gap(r: SimResult) -> float:
    """The longest simulated time without a commit (from the start, and to the end)."""
    times = [0.0, *r.commit_times, r.sim_time_s]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def _progress(r: SimResult) -> float:
    return float(r.summary()["progress_throughput"])


def _ttt(r: SimResult) -> float | None:
    s = r.summary()
    value = s["time_to_train_s"] if s["time_to_train_s"] is not None else (
        s["projected_time_to_train_s"])
    return float(value) if value else None


def ratio_rows(name: str, seed: int, results: list[SimResult]) -> list[str]:
    """gwtf against each baseline on one scenario and seed (progress ratios, time to train),
    and every policy's longest time without a commit."""
    by = {r.policy: r for r in results}
    gwtf = by.get("gwtf")
    if gwtf is None:
        return []

    def vs(other: str) -> str:
        base = by.get(other)
        return f"{_progress(gwtf) / _progress(base):.3f}" if base and _progress(base) else "-"

    ttt, swarm_ttt = _ttt(gwtf), _ttt(by["swarm"]) if "swarm" in by else None
    ttt_ratio = f"{ttt / swarm_ttt:.3f}" if ttt and swarm_ttt else "-"
    gaps = ", ".join(f"{r.policy} {longest_gap(r):.0f}" for r in results)
    return [
        f"| {name} | {seed} | {vs('swarm')} | {vs('swarm-rebalance')} | {vs('gwtf-fixed')} | "
        f"{vs('oracle')} | {ttt_ratio} | {100 * gwtf.wasted_compute_fraction:.2f}% | "
        f"{rollback_cell(gwtf)} | {gaps} |"
    ]


def failures(name: str, seed: int, results: list[SimResult]) -> list[str]:
    """One line per policy whose job failed (a wiped stage no snapshot restored), with why."""
    return [f"- {name}, seed {seed}, {r.policy}: {r.failed}" for r in results if r.failed]


RATIO_HEADER = [
    "| scenario | seed | gwtf / swarm | / swarm-rebalance | / gwtf-fixed | / oracle | "
    "time to train, gwtf / swarm | gwtf wasted | gwtf rollbacks (iterations undone) | "
    "longest time without a commit (s) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def run(quick: bool = False, policies: list[str] | None = None) -> str:
    names, duration = QUICK if quick else (SCENARIOS, None)
    seeds = (0,) if quick else SEEDS
    policies = policies or list(POLICIES)
    jobs = [(name, policy, duration, seed) for seed in seeds for name in names
            for policy in policies]
    with ProcessPoolExecutor(WORKERS) as pool:
        done = list(pool.map(_one, *zip(*jobs, strict=True)))
    results: dict[tuple[str, int], list[SimResult]] = {}
    for (name, _, _, seed), result in zip(jobs, done, strict=True):
        results.setdefault((name, seed), []).append(result)
    rows: list[str] = []
    ratios: list[str] = []
    failed: list[str] = []
    for name in names:
        seed0 = results[(name, 0)]
        write_outputs(OUT / name, _load(name, duration, 0), 0, seed0)
        rows += markdown_table(_load(name, duration, 0), seed0)
        for seed in seeds:
            ratios += ratio_rows(name, seed, results[(name, seed)])
            failed += failures(name, seed, results[(name, seed)])
    lines = [
        "## Simulator: policies compared (`python -m benchmarks sim`, `simulations/run_all`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one core per run, "
        f"{WORKERS} runs at a time, seed 0"
        + (", first half hour only (`--quick`)" if quick else ", full length")
        + ". Throughput = microbatches committed per simulated second, barriers and "
        "aggregation included, counting only microbatches whose gradient reached every "
        "stage's optimizer; progress = the same plus the microbatches finished in the "
        "iteration still open at the end (the ratios use it: committed throughput moves in "
        "steps of one iteration); time to train = the first commit after which "
        "`iterations` x `microbatches_per_iteration` microbatches are counted, the same work "
        "for every policy (in parentheses: projected from the committed rate when the run "
        "ended first); "
        "wasted = compute thrown away or redone / all compute; lost = microbatches whose "
        "gradient at some stage never reached the optimizer, uncounted (SWARM: a dead peer's "
        "accumulated gradients, a dead trainer's microbatches); rollbacks = a wiped stage "
        "restored from an older snapshot, the swarm's iterations since undone and trained "
        "again (the exact policies only; docs/design.md 4.6).",
        "",
        *TABLE_HEADER,
        *rows,
        "",
        f"gwtf against the baselines, seeds {', '.join(map(str, seeds))} (progress ratios; "
        "time to train or its projection; the longest simulated time each policy went "
        "without a commit, start and end of the run included):",
        "",
        *RATIO_HEADER,
        *ratios,
        "",
        "Jobs that failed (a stage wiped with no snapshot to restore it from, docs/design.md "
        "4.6): " + ("none." if not failed else ""),
        *failed,
    ]
    body = "\n".join(lines)
    write_section("sim", body)
    return body
