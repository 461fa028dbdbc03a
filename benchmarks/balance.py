"""Routing objectives compared: least cost, the even-share headroom, the queueing cost
(docs/design.md 2.2).

`python -m benchmarks balance [--quick]`: every scenario of simulations/ at seeds 0-2, the
`oracle` policy (the optimum recomputed at once at every change, so routing converges in no time
and only the objective differs) run three times in the same process: with `balance = None` (the
least-cost maximum flow), with `Headroom()` (every node of a stage within 2% of its even share,
then least cost, the objective of jobs) and with `QUEUE_WEIGHT` (the nodes' modelled queueing
delay in the cost) and with `Headroom(BALANCE_HEADROOM, COMPUTE_BOUND)` (the headroom rule on
compute-bound nodes only). Writes the `balance` section of benchmarks/RESULTS.md. `--quick`: seed 0,
the first half hour. `GWTF_BALANCE_SCENARIOS=a,b` (and `GWTF_BALANCE_SEEDS=0,2`): those
scenarios (seeds) only, so that a run stays short; their rows are printed and the section is
left as it is.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.report import machine, write_section
from gwtf.flow.balance import BALANCE_HEADROOM, COMPUTE_BOUND, QUEUE_WEIGHT, Balance, Headroom
from gwtf.sim.policies import OraclePolicy, simulation
from gwtf.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]

ARMS: tuple[tuple[str, Balance], ...] = (
    ("least cost", None), ("headroom", Headroom(BALANCE_HEADROOM)), ("queue", QUEUE_WEIGHT),
    ("compute-bound headroom", Headroom(BALANCE_HEADROOM, COMPUTE_BOUND)),
)


def _progress(path: Path, seed: int, balance: Balance, quick: bool) -> tuple[float, int]:
    """(progress throughput in microbatches/s, iterations) of the oracle on one scenario."""
    sc = load_scenario(path, seed=seed)
    if quick:
        sc = replace(sc, duration_s=min(sc.duration_s, 1800.0))
    sim = simulation(sc, "oracle")
    assert isinstance(sim.policy, OraclePolicy)
    sim.policy.balance = balance
    summary = sim.run().summary()
    return float(summary["progress_throughput"]), int(summary["iterations_completed"])


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _span(name: str, ratios: list[float]) -> str:
    finite = [r for r in ratios if r == r]
    return (f"{name}: {min(finite):.3f} to {max(finite):.3f}, mean "
            f"{sum(finite) / len(finite):.3f} over {len(finite)} runs.")


def run(quick: bool = False) -> str:
    seeds: tuple[int, ...] = (0,) if quick else (0, 1, 2)
    if os.environ.get("GWTF_BALANCE_SEEDS"):
        seeds = tuple(int(x) for x in os.environ["GWTF_BALANCE_SEEDS"].split(","))
    only = [s for s in os.environ.get("GWTF_BALANCE_SCENARIOS", "").split(",") if s]
    paths = sorted((ROOT / "simulations").glob("*.toml"))
    if only:
        unknown = sorted(set(only) - {p.stem for p in paths})
        if unknown:
            raise SystemExit(f"unknown scenario {unknown[0]!r} in GWTF_BALANCE_SCENARIOS; "
                             f"choose from {', '.join(p.stem for p in paths)}")
        paths = [p for p in paths if p.stem in only]
    rows = []
    vs_plain: list[float] = []
    vs_even: list[float] = []
    even_plain: list[float] = []
    cb_plain: list[float] = []
    cb_even: list[float] = []
    for path in paths:
        for seed in seeds:
            got = [_progress(path, seed, balance, quick) for _, balance in ARMS]
            (plain, plain_its), (even, even_its), (queue, queue_its), (cb, cb_its) = got
            vs_plain.append(_ratio(queue, plain))
            vs_even.append(_ratio(queue, even))
            even_plain.append(_ratio(even, plain))
            cb_plain.append(_ratio(cb, plain))
            cb_even.append(_ratio(cb, even))
            rows.append(f"| {path.stem} | {seed} | {plain:.3f} | {plain_its} | {even:.3f} | "
                        f"{even_its} | {queue:.3f} | {queue_its} | {cb:.3f} | {cb_its} | "
                        f"{even_plain[-1]:.3f} | {vs_plain[-1]:.3f} | {vs_even[-1]:.3f} | "
                        f"{cb_plain[-1]:.3f} | {cb_even[-1]:.3f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    summary = [_span("Headroom / least cost", even_plain), "",
               _span("Queue / least cost", vs_plain), "",
               _span("Queue / headroom", vs_even), "",
               _span("Compute-bound headroom / least cost", cb_plain), "",
               _span("Compute-bound headroom / headroom", cb_even)]
    if only or os.environ.get("GWTF_BALANCE_SEEDS"):
        return "\n".join([*rows, "", *summary])
    body = "\n".join([
        "## Routing objectives compared (`python -m benchmarks balance`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}"
        + (", seed 0, first half hour (`--quick`)" if quick else ", seeds 0-2, full length")
        + ". The simulator's `oracle` policy (the optimum recomputed at every change) with three "
        "objectives among the maximum flows (docs/design.md 2.2): least cost; headroom (every "
        f"node of a stage loaded within {BALANCE_HEADROOM:.0%} of its even share, then least "
        "cost, the objective of jobs); queue (least cost with each node's modelled M/D/1 "
        "queueing delay); compute-bound headroom (the headroom rule on the nodes whose "
        f"compute is busy at least {COMPUTE_BOUND:.0%} of the time at their capacity only). "
        "Progress = microbatches in every stage's step per simulated second, plus "
        "those of the open iteration.",
        "",
        "| scenario | seed | least cost (mb/s) | iterations | headroom (mb/s) | iterations | "
        "queue (mb/s) | iterations | compute-bound (mb/s) | iterations | "
        "headroom / least cost | queue / least cost | queue / headroom | "
        "compute-bound / least cost | compute-bound / headroom |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *summary,
    ])
    write_section("balance", body)
    return body
