"""Bounded replay (docs/design.md 4.9): partial gradient sums shipped to a stage peer every
`replay_bound` microbatches, or when the adaptive rule says it pays (`auto`), against the
replay they save, under churn.

`python -m benchmarks replay [--quick]`: gwtf on `high_churn`, `spot_waves`, `geo10_spot` and
`home_links` (access links) for each bound (off, 1, 4, 16, auto), seed 0 (and seeds 1-2 of
the short `spot_waves` and `home_links`), beside swarm and swarm-rebalance, two runs at a time;
writes the `replay` section of benchmarks/RESULTS.md. `--quick` runs the first half hour of
`spot_waves` only (a smoke run).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from benchmarks.report import machine, write_section
from gwtf.recovery import REPLAY_AUTO
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario
from gwtf.sim.simulator import SimResult

ROOT = Path(__file__).resolve().parents[1]
BOUNDS = (0, 1, 4, 16, REPLAY_AUTO)
CASES = (("high_churn", 0), ("spot_waves", 0), ("spot_waves", 1), ("spot_waves", 2),
         ("geo10_spot", 0), ("home_links", 0), ("home_links", 1), ("home_links", 2))
QUICK = ((("spot_waves", 0),), 1800.0, (0, 4, REPLAY_AUTO))
BASELINES = ("swarm", "swarm-rebalance")
WORKERS = 2


def _label(bound: int) -> str:
    return "auto" if bound == REPLAY_AUTO else str(bound) if bound else "off"


def _run(name: str, seed: int, policy: str, bound: int, duration: float | None) -> SimResult:
    sc = load_scenario(ROOT / "simulations" / f"{name}.toml", seed=seed)
    sc = replace(sc, replay_bound=bound)
    if duration is not None and duration < sc.duration_s:
        sc = replace(sc, duration_s=duration)
    t0 = time.perf_counter()
    result = simulation(sc, policy, seed).run()
    print(f"replay {name:<12} seed {seed} {policy:<16} bound {_label(bound):>4} "
          f"{result.progress_microbatches / result.sim_time_s:7.3f} mb/s "
          f"{time.perf_counter() - t0:6.1f} s wall", file=sys.stderr, flush=True)
    return result


def _progress(r: SimResult) -> float:
    return r.progress_microbatches / r.sim_time_s if r.sim_time_s else 0.0


def _ttt(r: SimResult) -> str:
    if r.time_to_train_s is not None:
        return f"{r.time_to_train_s:.0f}"
    if r.iterations_completed:
        return f"({r.sim_time_s * r.iteration_target / r.iterations_completed:.0f})"
    return "-"


def run(quick: bool = False) -> str:
    cases, duration, bounds = QUICK if quick else (CASES, None, BOUNDS)
    rows = []
    jobs = [(name, seed, policy, bound, duration) for name, seed in cases
            for policy, bound in [*((p, 0) for p in BASELINES), *(("gwtf", b) for b in bounds)]]
    with ProcessPoolExecutor(WORKERS) as pool:
        done = dict(zip([j[:4] for j in jobs], pool.map(_run, *zip(*jobs, strict=True)),
                        strict=True))
    for name, seed in cases:
        base = {p: done[(name, seed, p, 0)] for p in BASELINES}
        off: SimResult | None = None
        for bound in bounds:
            r = done[(name, seed, "gwtf", bound)]
            off = off or r
            ship = r.shipping
            committed = max(r.committed_microbatches, 1)
            saved = off.wasted_compute_s - r.wasted_compute_s
            rows.append(
                f"| {name} | {seed} | {_label(bound)} | {_progress(r):.3f} | "
                f"{_progress(r) / max(_progress(off), 1e-9):.3f} | "
                f"{_progress(r) / max(_progress(base['swarm']), 1e-9):.3f} | "
                f"{_progress(r) / max(_progress(base['swarm-rebalance']), 1e-9):.3f} | "
                f"{r.iterations_completed} | {_ttt(r)} | {_ttt(base['swarm'])} | "
                f"{100 * r.wasted_compute_fraction:.2f}% | {r.wasted_compute_s:.0f} | "
                f"{saved:.0f} | {r.recoveries.get('replay', 0)} | "
                f"{r.recoveries.get('keep', 0)} | {ship.get('shipments', 0)} | "
                f"{ship.get('shipped_bytes', 0.0) / committed / 1e6:.0f} | "
                f"{ship.get('shipping_upload_s', 0.0):.0f} |"
            )
    lines = [
        "## Bounded replay: partial sums shipped every `replay_bound` microbatches "
        "or when it pays (`auto`) (`python -m benchmarks replay`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one core per run, "
        f"{WORKERS} runs at a time, policy gwtf"
        + (", first half hour of spot_waves only (`--quick`)" if quick else ", full length")
        + ". progress: microbatches committed or finished in the open iteration per simulated "
        "second; / off, / swarm, / s-rebal: progress ratios (swarm and swarm-rebalance do not "
        "ship); time to train: of the scenario's iterations (in parentheses: projected); wasted: "
        "compute thrown away or redone (s: seconds; saved: seconds less than with shipping "
        "off); replays: rule-3 replays planned; kept: microbatches a keeper's sum covered "
        "(rule KEEP); MB / mb: bytes shipped per committed microbatch; upload s: the seconds "
        "those bytes take on the paths to the keepers (pair model: the pair's own link, which "
        "carries nothing else; access model, home_links: the sender's uplink and the keeper's "
        "downlink, which the data plane shares, so they delay activations too).",
        "",
        "| scenario | seed | bound | progress (mb/s) | / off | / swarm | / s-rebal | iterations "
        "| time to train (s) | swarm's (s) | wasted | wasted s | saved s | replays | kept "
        "| shipments | MB / mb | upload s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    body = "\n".join(lines)
    write_section("replay", body)
    return body
