"""Issue 16's simulator targets beside throughput: stalls, wasted compute, time to train.

`python -m benchmarks simtargets [--quick]` (`GWTF_SIMBASE_SEEDS`, `GWTF_SIMBASE_SCENARIOS` as
for `simbase`): gwtf on every scenario of simulations/ at seeds 0-2, two at a time, and swarm
beside it where the time to train is compared (`high_churn`). Per run:

- the longest time without a commit (`SimResult.commit_times`, from the start to the run's
  end): a stall shows as a gap as long as the rest of the run. Commits a rollback undid are
  not in `commit_times`, so a gap spans a rollback's lost iterations;
- wasted compute (`wasted_compute_fraction`): compute done again or thrown away;
- joiners' states that steps made stale, caught up with the steps or fetched again
  (docs/design.md 3.8);
- time to train gwtf / swarm: `time_to_train_s`, else its projection from the committed rate
  (`projected_time_to_train_s`) where the run ends first.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.report import machine, write_section
from benchmarks.simbase import QUICK, ROOT, WORKERS, chosen_scenarios, chosen_seeds

COMPARED = ("high_churn",)
"""Scenarios whose time to train is compared with swarm's (the issue's target: at most 0.7x)."""


def _one(name: str, seed: int) -> dict[str, Any]:
    from gwtf.sim.policies import simulation
    from gwtf.sim.scenario import load_scenario

    sc = load_scenario(ROOT / "simulations" / f"{name}.toml", seed=seed)
    r = simulation(sc, "gwtf").run()
    times = [0.0, *r.commit_times, r.sim_time_s]
    out: dict[str, Any] = {
        "gap": max(b - a for a, b in zip(times, times[1:], strict=False)),
        "duration": r.sim_time_s, "iterations": r.iterations_completed,
        "wasted": r.wasted_compute_fraction, "catch_ups": r.catch_ups,
        "refetches": r.refetches, "rollbacks": [(b, t) for _, _, b, t in r.rollbacks],
        "failed": r.failed,
    }
    if name in COMPARED:
        swarm = simulation(sc, "swarm").run().summary()
        out["train"] = (r.summary()["projected_time_to_train_s"],
                        swarm["projected_time_to_train_s"])
    return out


def _cells(result: dict[str, Any]) -> str:
    back = " ".join(f"{b}->{t}" for b, t in result["rollbacks"]) or "-"
    train = "-"
    if "train" in result:
        ours, theirs = result["train"]
        train = f"{ours:,.0f} / {theirs:,.0f} s = **{ours / theirs:.2f}**"
    failed = " FAILED" if result["failed"] else ""
    return (f"{result['gap']:,.0f} of {result['duration']:,.0f} s | {result['iterations']} "
            f"({back}){failed} | {100 * result['wasted']:.2f}% | {result['catch_ups']} / "
            f"{result['refetches']} | {train}")


def run(quick: bool = False) -> str:
    names, seeds = (list(QUICK[0]), QUICK[1]) if quick else (chosen_scenarios(), chosen_seeds())
    jobs = [(name, seed) for name in names for seed in seeds]
    with ProcessPoolExecutor(WORKERS) as pool:
        results = dict(zip(jobs, pool.map(_one, *zip(*jobs, strict=True)), strict=True))
    lines = [
        "| scenario | seed | longest time without a commit | iterations (rollbacks) "
        "| wasted | stale joiners caught up / fetched again | time to train gwtf / swarm |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {seed} | {_cells(results[(name, seed)])} |" for name, seed in jobs]
    body = ("## Issue 16's simulator targets beside throughput (`python -m benchmarks "
            f"simtargets`)\n\nMeasured {time.strftime('%Y-%m-%d')} on {machine()}, gwtf, "
            "full length (benchmarks/simtargets.py says what each column is).\n\n"
            + "\n".join(lines) + "\n")
    write_section("simtargets", body)
    return body
