"""The balanced routing objective against least cost alone (docs/design.md 2.2).

`python -m benchmarks balance [--quick]`: every scenario of simulations/ at seeds 0-2, the
`oracle` policy (the optimum recomputed at once at every change, so routing converges in no time
and only the objective differs) run twice in the same process: with `balance = None` (the
least-cost maximum flow) and with the default headroom. Writes the `balance` section of
benchmarks/RESULTS.md. `--quick`: seed 0, the first half hour.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.report import machine, write_section
from gwtf.flow.balance import BALANCE_HEADROOM
from gwtf.sim.policies import OraclePolicy, simulation
from gwtf.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def _progress(path: Path, seed: int, balance: float | None, quick: bool) -> tuple[float, int]:
    """(progress throughput in microbatches/s, iterations) of the oracle on one scenario."""
    sc = load_scenario(path, seed=seed)
    if quick:
        sc = replace(sc, duration_s=min(sc.duration_s, 1800.0))
    sim = simulation(sc, "oracle")
    assert isinstance(sim.policy, OraclePolicy)
    sim.policy.balance = balance
    summary = sim.run().summary()
    return float(summary["progress_throughput"]), int(summary["iterations_completed"])


def run(quick: bool = False) -> str:
    seeds = (0,) if quick else (0, 1, 2)
    rows = []
    ratios = []
    for path in sorted((ROOT / "simulations").glob("*.toml")):
        for seed in seeds:
            plain, plain_its = _progress(path, seed, None, quick)
            even, even_its = _progress(path, seed, BALANCE_HEADROOM, quick)
            ratio = even / plain if plain else float("nan")
            ratios.append(ratio)
            rows.append(f"| {path.stem} | {seed} | {plain:.3f} | {plain_its} | {even:.3f} | "
                        f"{even_its} | {ratio:.3f} |")
            print(f"balance {path.stem} seed {seed}: {ratio:.3f}", file=sys.stderr, flush=True)
    finite = [r for r in ratios if r == r]
    body = "\n".join([
        "## Balanced routing objective (`python -m benchmarks balance`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}"
        + (", seed 0, first half hour (`--quick`)" if quick else ", seeds 0-2, full length")
        + ". The simulator's `oracle` policy (the optimum recomputed at every change) with the "
        "least-cost maximum flow against the balanced one (every node of a stage loaded within "
        f"{BALANCE_HEADROOM:.0%} of its even share, then least cost; docs/design.md 2.2). "
        "Progress = microbatches in every stage's step per simulated second, plus those of the "
        "open iteration.",
        "",
        "| scenario | seed | least cost (mb/s) | iterations | balanced (mb/s) | iterations | "
        "balanced / least cost |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Balanced / least cost: {min(finite):.3f} to {max(finite):.3f}, "
        f"mean {sum(finite) / len(finite):.3f} over {len(finite)} runs.",
    ])
    write_section("balance", body)
    return body
