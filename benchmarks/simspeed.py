"""Simulator speed against another commit: events per second of the same runs, this tree
against `BASE` (default `main`), interleaved, three rounds each (issue 15: a change to the
simulator must not slow it down).

`python -m benchmarks simspeed [--quick]` (`GWTF_SIMSPEED_BASE=REF` to compare with another
commit, `GWTF_SIMSPEED_ROUNDS=N` for another number of rounds): the base is exported with
`git archive` into a temporary folder and each round runs the same set of simulations in a
fresh process per tree (scenarios of simulations/ at seed 0, part length, with a fixed
`replay_bound` of 16 so that both trees do the same work whatever their default); writes the
`simspeed` section of benchmarks/RESULTS.md. `--quick` runs one round of the two shortest
cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import base_tree, machine, write_section

ROOT = Path(__file__).resolve().parents[1]
RUNS = (("high_churn", "gwtf", 1800.0), ("high_churn", "swarm", 3600.0),
        ("geo10_spot", "gwtf", 3600.0), ("geo10_spot", "oracle", 7200.0),
        ("spot_waves", "gwtf", 0.0), ("spot_waves", "swarm-rebalance", 0.0),
        ("home_links", "gwtf", 0.0), ("homogeneous", "dtfm", 0.0))
QUICK = (("spot_waves", "gwtf", 1800.0), ("homogeneous", "dtfm", 1800.0))
ROUNDS = int(os.environ.get("GWTF_SIMSPEED_ROUNDS", "3"))

CHILD = """
import sys, time
from dataclasses import replace
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario
for spec in sys.argv[2:]:
    name, policy, duration = spec.split(":")
    sc = replace(load_scenario(f"{sys.argv[1]}/simulations/{name}.toml", seed=0), replay_bound=16)
    if float(duration):
        sc = replace(sc, duration_s=float(duration))
    t0 = time.perf_counter()
    result = simulation(sc, policy).run()
    print(result.events, time.perf_counter() - t0)
"""


def _measure(tree: Path, runs: tuple[tuple[str, str, float], ...]) -> list[tuple[float, float]]:
    """(events, wall seconds) of each of `runs`, simulated by the gwtf package of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    specs = [f"{name}:{policy}:{duration}" for name, policy, duration in runs]
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), *specs], cwd=tree, env=env,
                          capture_output=True, text=True, check=True, timeout=1800)
    return [(float(e), float(w)) for e, w in (line.split() for line in done.stdout.splitlines())]


def _run_row(spec: tuple[str, str, float], base: list[float], this: list[float]) -> str:
    name, policy, duration = spec
    length = f", {duration / 3600:g} h" if duration else ""
    ratio = (this[0] / this[1]) / (base[0] / base[1])
    return (f"| {name} {policy}{length} | {base[0]:.0f} / {this[0]:.0f} | {base[1]:.1f} / "
            f"{this[1]:.1f} | {ratio:.3f} | {'yes' if base[0] == this[0] else 'no'} |")


def run(quick: bool = False) -> str:
    base = os.environ.get("GWTF_SIMSPEED_BASE", "main")
    runs, rounds = (QUICK, 1) if quick else (RUNS, ROUNDS)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    ref = subprocess.run(["git", "rev-parse", "--short", base], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    rows = []
    totals = {"base": [0.0, 0.0], "this": [0.0, 0.0]}
    per_run = {label: [[0.0, 0.0] for _ in runs] for label in totals}
    with base_tree(ref, ROOT) as tmp:
        trees = {"base": tmp, "this": ROOT}
        for k in range(1, rounds + 1):
            for label in ("base", "this"):
                measured = _measure(trees[label], runs)
                for acc, (e, w) in zip(per_run[label], measured, strict=True):
                    acc[0] += e
                    acc[1] += w
                events = sum(e for e, _ in measured)
                wall = sum(w for _, w in measured)
                totals[label][0] += events
                totals[label][1] += wall
                rows.append(f"| {k} | {label} | {events:.0f} | {wall:.1f} | "
                            f"{events / wall:,.0f} |")
                print(f"simspeed round {k} {label}: {events / wall:,.0f} events/s",
                      file=sys.stderr, flush=True)
    rate = {label: e / w for label, (e, w) in totals.items()}
    body = "\n".join([
        "## Simulator speed against a base commit (`python -m benchmarks simspeed`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}: this tree ({head}, with its "
        f"working changes) against {base} ({ref}), {len(runs)} runs "
        f"({', '.join(f'{n} {p}' for n, p, _ in runs)}; seed 0, part length, replay_bound 16), "
        f"{rounds} rounds, the trees interleaved, one process per tree and round.",
        "",
        "| round | tree | events | wall (s) | events/s |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"All rounds: base {rate['base']:,.0f} events/s, this tree {rate['this']:,.0f} events/s: "
        f"**{rate['this'] / rate['base']:.3f}x** the base's; wall time for the same simulated "
        f"runs {totals['this'][1] / totals['base'][1]:.3f}x the base's.",
        "",
        "Per run, all rounds (a policy whose events differ between the trees simulates other "
        "work: compare its wall time, not its events/s):",
        "",
        "| run | events base / this | wall s base / this | events/s this / base | same events |",
        "|---|---|---|---|---|",
        *(_run_row(spec, per_run["base"][i], per_run["this"][i]) for i, spec in enumerate(runs)),
    ])
    write_section("simspeed", body)
    return body
