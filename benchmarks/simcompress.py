"""Activation compression in the simulator: gwtf with compression against gwtf without it and
against SWARM's 8-bit, on every scenario of simulations/ with compression allowed, seeds 0-2,
full length (docs/design.md 2.15; gwtf/sim/compression.py says what is charged).

`python -m benchmarks simcompress [--quick]` (`GWTF_SIMCOMPRESS_SEEDS=0,1`,
`GWTF_SIMCOMPRESS_SCENARIOS=a,b` for fewer): per scenario and seed, with `[compression] allow`
set to `int8` and to `int8, int4`,

- `gwtf`: the job's plan from `swarm_plan` at its start, one codec per boundary;
- `gwtf-uncompressed`: gwtf sending every boundary uncompressed;
- `swarm`: SWARM with 8-bit on every boundary, as it ships.

A scenario's links bind when the maximum flow of its first members with their links (and access
links) is below `1 - PLAN_SLACK` of what their GPUs alone carry (`plan_flow` over
`compute_bound_flow`, both at the bytes the simulator charges). The project's targets: where
links bind, gwtf with compression at least 2x gwtf without and at least 1.3x SWARM with 8-bit;
elsewhere no loss (gwtf with at least gwtf without, within `NOISE`). Where the plan compresses
nothing the gwtf run is the gwtf-uncompressed run (the same scenario, the same policy:
tests/unit/test_sim_compression.py checks they are equal) and is not run twice. Where links bind
the job is also planned and run with the codecs' compute free (`codec_cost = 0`: the codecs on
the GPU, or on many more cores than the one measured), to show what that compute costs, and
with activations of no bytes (`CEILING`), to show the most compression could give there. The codecs'
speed on this CPU is measured again beside the table. Runs go `WORKERS` at a time, one process
each. `--quick` runs the first half hour of seed 0 of home_links and volunteer_sessions.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.report import machine, run_all, write_section
from gwtf.flow.compression import PLAN_SLACK
from gwtf.sim.compression import (
    CODEC_S_PER_BYTE,
    compute_bound_flow,
    job_plan,
    plan_flow,
)
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
Allow = tuple[str, ...]
Job = tuple[str, int, float | None, str, Allow, float]
"""A run: scenario, seed, duration (None: full), policy, codecs allowed, codec_cost."""
ALLOWS: tuple[Allow, ...] = (("int8",), ("int8", "int4"))
NOISE = 0.02
"""gwtf with compression may fall this far below gwtf without and count as no loss."""
TARGET_WITHOUT = 2.0
TARGET_SWARM = 1.3
QUICK = (("home_links", "volunteer_sessions"), (0,), 1800.0)
WORKERS = 2
_SHORT = {"none": "-", "int8": "8", "int4": "4"}


def chosen() -> tuple[list[str], tuple[int, ...]]:
    names = os.environ.get("GWTF_SIMCOMPRESS_SCENARIOS")
    seeds = os.environ.get("GWTF_SIMCOMPRESS_SEEDS", "0,1,2")
    return ([n for n in names.split(",") if n] if names else
            sorted(p.stem for p in (ROOT / "simulations").glob("*.toml")),
            tuple(int(s) for s in seeds.split(",")))


def load(name: str, seed: int, duration: float | None, allow: tuple[str, ...] = ("int8",),
         codec_cost: float = 1.0) -> Scenario:
    sc = load_scenario(ROOT / "simulations" / f"{name}.toml", seed=seed)
    sc = replace(sc, compression=allow, codec_cost=codec_cost)
    return sc if duration is None else replace(sc, duration_s=min(duration, sc.duration_s))


CEILING = "gwtf-no-bytes"
"""gwtf with activations and their gradients of a thousandth of their bytes and no codec
compute: what no codec can beat, since what remains of an iteration (compute, the commit's
gradient exchange, state transfers to joiners) is what compression does not touch."""


def _one(name: str, seed: int, duration: float | None, policy: str, allow: tuple[str, ...],
         codec_cost: float) -> dict[str, Any]:
    if policy == CEILING:
        sc = load(name, seed, duration, ())
        tiny = max(1, sc.activation_bytes // 1000)
        sc = replace(sc, boundary_bytes=(tiny,) * (sc.stages - 1))
        result = simulation(sc, "gwtf").run()
    else:
        result = simulation(load(name, seed, duration, allow, codec_cost), policy).run()
    return {"mb_s": result.throughput_mean, "codecs": result.codecs, "failed": result.failed,
            "iterations": result.iterations_completed}


def binds(name: str, seed: int) -> float:
    """The first members' maximum flow with their links over their GPUs' alone (uncompressed)."""
    sc = load(name, seed, None)
    return plan_flow(sc, ("none",) * (sc.stages - 1)) / compute_bound_flow(sc)


def codec_speed(repeats: int = 7) -> str:
    """Encode + decode of gwtf.train.codecs on this CPU now, one thread, best of `repeats`."""
    import torch

    from gwtf.train.codecs import decode, encode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cells = []
    try:
        for mib in (16, 64):
            x = torch.randn(mib * 2**20 // 4, generator=torch.Generator().manual_seed(0))
            for name in ("int8", "int4"):
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    decode(name, encode(name, x), tuple(x.shape))
                    best = min(best, time.perf_counter() - t0)
                cells.append(f"{name} {mib} MiB {best / (4 * x.numel()) * 1e9:.2f} ns")
    finally:
        torch.set_num_threads(threads)
    charged = ", ".join(f"{name} {rates[-1][1] * 1e9:.1f} ns (up to 16 MiB "
                        f"{rates[0][1] * 1e9:.1f} ns)" for name, rates in CODEC_S_PER_BYTE.items()
                        if name != "none")
    return (f"Codec speed on this CPU now (encode + decode per float32 byte, one thread, best of "
            f"{repeats}): {'; '.join(cells)}. The simulator charges {charged} "
            "(gwtf/sim/compression.py, `CODEC_S_PER_BYTE`).")


def _plan(plan: tuple[str, ...]) -> str:
    return "".join(_SHORT[c] for c in plan)


def _mean(ratios: list[float]) -> float:
    """Geometric mean (a zero, a run that trained nothing, counts as a tiny ratio)."""
    return statistics.geometric_mean([min(max(r, 1e-9), 1e9) for r in ratios])


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf") if a > 0 else 1.0


def run(quick: bool = False) -> str:
    names, seeds = chosen()
    duration = None
    if quick:
        names, seeds, duration = list(QUICK[0]), QUICK[1], QUICK[2]
    bound = {(n, s): binds(n, s) for n in names for s in seeds}
    plans: dict[tuple[str, int, Allow, float], tuple[str, ...]] = {
        (n, s, allow, cost): job_plan(load(n, s, duration, allow, cost))
        for n in names for s in seeds for allow in ALLOWS
        for cost in ((1.0, 0.0) if bound[(n, s)] < 1 - PLAN_SLACK else (1.0,))}
    jobs: list[Job] = []
    for n in names:
        for s in seeds:
            jobs += [(n, s, duration, "gwtf-uncompressed", ("int8",), 1.0),
                     (n, s, duration, "swarm", ("int8",), 1.0)]
            if bound[(n, s)] < 1 - PLAN_SLACK:
                jobs.append((n, s, duration, CEILING, (), 0.0))
            for allow in ALLOWS:
                for cost in (1.0, 0.0):
                    plan = plans.get((n, s, allow, cost), ())
                    if any(c != "none" for c in plan):
                        jobs.append((n, s, duration, "gwtf", allow, cost))
    started = time.perf_counter()
    done = run_all(_one, jobs, workers=WORKERS)
    results: dict[Job, dict[str, Any]] = {job: done[job] for job in jobs}
    wall = time.perf_counter() - started

    def mb_s(n: str, s: int, policy: str, allow: tuple[str, ...] = ("int8",),
             cost: float = 1.0) -> float | None:
        if policy == "gwtf" and all(c == "none" for c in plans[(n, s, allow, cost)]):
            policy, allow, cost = "gwtf-uncompressed", ("int8",), 1.0
        found = results.get((n, s, duration, policy, allow, cost))
        return None if found is None else float(found["mb_s"])

    rows = []
    verdicts = []
    unbound: list[tuple[str, bool]] = []
    for n in names:
        per_allow: dict[tuple[str, ...], list[tuple[float, float]]] = {a: [] for a in ALLOWS}
        ceilings: list[float] = []
        link_bound = all(bound[(n, s)] < 1 - PLAN_SLACK for s in seeds)
        for s in seeds:
            without = mb_s(n, s, "gwtf-uncompressed") or 0.0
            swarm8 = mb_s(n, s, "swarm") or 0.0
            ceiling = mb_s(n, s, CEILING, (), 0.0)
            cells = []
            for allow in ALLOWS:
                with_ = mb_s(n, s, "gwtf", allow) or 0.0
                up, over = _ratio(with_, without), _ratio(with_, swarm8)
                per_allow[allow].append((up, over))
                extra = ""
                if ceiling is not None:
                    free = mb_s(n, s, "gwtf", allow, 0.0) or 0.0
                    extra = (f"; codecs free {_plan(plans[(n, s, allow, 0.0)])} "
                             f"{_ratio(free, without):.2f}x")
                cells.append(f"{_plan(plans[(n, s, allow, 1.0)])} {with_:.3f} "
                             f"({up:.2f}x / {over:.2f}x{extra})")
            if ceiling is not None:
                ceilings.append(_ratio(ceiling, without))
                cells.append(f"{ceiling:.3f} ({ceilings[-1]:.2f}x)")
            else:
                cells.append("")
            failed = [k for k, v in results.items() if k[0] == n and k[1] == s and v["failed"]]
            mark = " binds" if bound[(n, s)] < 1 - PLAN_SLACK else ""
            rows.append(f"| {n} | {bound[(n, s)]:.2f}{mark} "
                        f"| {s} | {without:.3f} | {swarm8:.3f} | " + " | ".join(cells)
                        + (" | FAILED: " + ", ".join(k[3] for k in failed) if failed else " |"))
        for allow in ALLOWS:
            ups = [u for u, _ in per_allow[allow]]
            overs = [o for _, o in per_allow[allow]]
            up, over = _mean(ups), _mean(overs)
            if link_bound:
                ok = up >= TARGET_WITHOUT and over >= TARGET_SWARM
                want = f"links bind: >= {TARGET_WITHOUT}x without, >= {TARGET_SWARM}x swarm-8bit"
            else:
                unbound.append((f"{n} ({'+'.join(allow)})", min(ups) >= 1 - NOISE))
                continue
            top = f"{_mean(ceilings):.2f}x" if ceilings else ""
            verdicts.append(f"| {n} | {'+'.join(allow)} | {up:.2f}x | {over:.2f}x | {top} | "
                            f"{want} | {'met' if ok else 'NOT met'} |")
    where = "first half hour, seed 0" if quick else "full length"
    body = (
        "## Activation compression in the simulator (`python -m benchmarks simcompress`)\n\n"
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, {len(jobs)} runs in "
        f"{wall:.0f} s ({where}). Every scenario with `[compression] allow` set; mb/s committed. "
        "*Links*: the first members' maximum flow with their links over their GPUs' alone "
        f"(`binds` below {1 - PLAN_SLACK:.2f}). Each compressed column: the plan gwtf's "
        "members chose at the start (one character a boundary: `-` none, `8` int8, `4` int4), "
        "gwtf's mb/s with it, and in brackets its ratio over gwtf without compression and over "
        "SWARM with 8-bit everywhere (and, where links bind, the plan and its ratio over gwtf "
        "without when the codecs' compute is free: on a GPU, or many more cores). A plan of `-` "
        "only is the gwtf-uncompressed run itself. *No bytes*, where links bind: gwtf with "
        "activations and gradients of a thousandth of their bytes and no codec compute, and its "
        "ratio over gwtf without: about the most any activation codec could give, since the "
        "rest of an iteration (compute, the commit's gradient exchange, joiners' state "
        "downloads) is untouched (under churn not a strict bound on one seed: other bytes move "
        "placement and recovery onto other paths).\n\n"
        "| scenario | links | seed | gwtf uncompressed | swarm 8-bit | gwtf int8 | "
        "gwtf int8+int4 | no bytes |\n|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n\n"
        "Targets where links bind (geometric means over the seeds):\n\n"
        "| scenario | allow | with / without | with / swarm 8-bit | no bytes / without | target "
        "| |\n|---|---|---|---|---|---|---|\n" + "\n".join(verdicts) + "\n\n"
        f"Where links do not bind, no loss (>= {1 - NOISE:.2f}x without on every seed): "
        + ("met on all" if all(ok for _, ok in unbound) else "NOT met on "
           + ", ".join(name for name, ok in unbound if not ok))
        + f" ({len(unbound)} scenario-allow pairs).\n\n" + codec_speed() + "\n"
    )
    if not quick:
        write_section("simcompress", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
