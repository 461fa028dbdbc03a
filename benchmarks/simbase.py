"""gwtf against swarm in the simulator, this tree against a base commit in one run: every
scenario of simulations/, seeds 0-2, full length (issue 16: a change to a rule must show what it
does to every scenario, not the one it was made for).

`python -m benchmarks simbase [--quick]` (`GWTF_SIMBASE_BASE=REF` for another base than `main`,
`GWTF_SIMBASE_BASE=none` for this tree alone,
`GWTF_SIMBASE_SEEDS=0,1,2,3` for other seeds, `GWTF_SIMBASE_SCENARIOS=a,b` for some scenarios
only): the base is exported with `git archive` into a temporary folder; each (tree, scenario,
seed) runs gwtf, swarm and swarm-rebalance in a fresh process on that tree's own scenario
files, two at a time
(one core each: the simulator is deterministic, so the load does not change a figure). Writes
the `simbase` section of benchmarks/RESULTS.md: per scenario and seed, gwtf's committed
throughput over swarm's and over swarm-rebalance's on each tree and the rollbacks gwtf made
(iteration wiped at -> restored at). `--quick` runs seed 0 of the two shortest scenarios.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.report import base_tree, machine, write_section

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("gwtf", "swarm", "swarm-rebalance")
QUICK = (("fidelity", "volunteer_sessions"), (0,))
WORKERS = 2

CHILD = """
import json, sys
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario
sc = load_scenario(sys.argv[1], seed=int(sys.argv[2]))
out = {}
for policy in sys.argv[3:]:
    r = simulation(sc, policy).run()
    out[policy] = {"mb_s": r.throughput_mean, "iterations": r.iterations_completed,
                   "rollbacks": [[int(b), int(t)] for _, _, b, t in r.rollbacks],
                   "failed": r.failed}
print(json.dumps(out))
"""


def chosen_scenarios() -> list[str]:
    chosen = os.environ.get("GWTF_SIMBASE_SCENARIOS")
    if chosen:
        return [s for s in chosen.split(",") if s]
    return sorted(p.stem for p in (ROOT / "simulations").glob("*.toml"))


def chosen_seeds() -> tuple[int, ...]:
    return tuple(int(s) for s in os.environ.get("GWTF_SIMBASE_SEEDS", "0,1,2").split(","))


def _one(tree: str, name: str, seed: int) -> dict[str, dict[str, Any]] | None:
    """gwtf's and swarm's results on `name` at `seed`, simulated by the package of `tree`; None
    when that tree has no such scenario (a scenario added since the base)."""
    if not Path(tree, "simulations", f"{name}.toml").exists():
        return None
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, f"{tree}/simulations/{name}.toml", str(seed), *POLICIES],
        cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {name} seed {seed}: {done.stderr.strip()[-400:]}")
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


def _cell(result: dict[str, dict[str, Any]] | None) -> str:
    if result is None:
        return "- (not in this tree)"
    gwtf = result["gwtf"]
    ratio = gwtf["mb_s"] / result["swarm"]["mb_s"]
    rebalance = gwtf["mb_s"] / result["swarm-rebalance"]["mb_s"]
    back = " ".join(f"{b}->{t}" for b, t in gwtf["rollbacks"]) or "-"
    failed = " FAILED" if gwtf["failed"] else ""
    return f"{ratio:.3f} / {rebalance:.3f} ({gwtf['mb_s']:.3f}; {back}){failed}"


def run(quick: bool = False) -> str:
    base_ref = os.environ.get("GWTF_SIMBASE_BASE", "main")
    names, seeds = (list(QUICK[0]), QUICK[1]) if quick else (chosen_scenarios(), chosen_seeds())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    alone = base_ref == "none"
    base_rev = "" if alone else subprocess.run(
        ["git", "rev-parse", "--short", base_ref], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout.strip()
    with contextlib.nullcontext(None) if alone else base_tree(base_ref, ROOT) as base:
        trees = {"this": str(ROOT)} if base is None else {"base": str(base), "this": str(ROOT)}
        jobs = [(label, name, seed) for name in names for seed in seeds for label in trees]
        with ProcessPoolExecutor(WORKERS) as pool:
            futures = {job: pool.submit(_one, trees[job[0]], job[1], job[2]) for job in jobs}
            results = {job: future.result() for job, future in futures.items()}
    where = f"this tree ({head or 'working tree'}, uncommitted changes included)"
    lines = [
        "gwtf's committed throughput over swarm's / over swarm-rebalance's, and in brackets "
        "gwtf's own (mb/s) and its rollbacks (iteration wiped at -> restored at), on "
        + (where if alone else f"the base `{base_ref}` ({base_rev}) and on {where}")
        + ", full length.",
        "",
        "| scenario | seed | " + ("" if alone else "base: gwtf / swarm, / rebalance | ")
        + "this tree: gwtf / swarm, / rebalance |",
        "|---|---|" + ("" if alone else "---|") + "---|",
    ]
    for name in names:
        for seed in seeds:
            cells = [_cell(results[(label, name, seed)]) for label in trees]
            lines.append(f"| {name} | {seed} | " + " | ".join(cells) + " |")
    body = ("## gwtf against swarm, this tree against a base commit "
            "(`python -m benchmarks simbase`)\n\n"
            f"Measured {time.strftime('%Y-%m-%d')} on {machine()}. " + "\n".join(lines) + "\n")
    write_section("simbase", body)
    return body
