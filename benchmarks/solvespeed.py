"""The local solve's time against another commit: `solve_members` on geo10 swarms, least cost
and the jobs' headroom objective, this tree against `BASE` (default `main`) in the same run
(docs/design.md 2.12: the solve must get faster without changing its answer).

`python -m benchmarks solvespeed [--quick]` (`GWTF_SOLVESPEED_BASE=REF` for another commit,
`GWTF_SOLVESPEED_ROUNDS=N` for another number of rounds, 2 by default): the base is exported
with `git archive` into a temporary folder; each round solves every case in a fresh process per
tree, the trees interleaved. Every solve's flows are hashed, and the table says whether both
trees found the same flows. Writes the `solvespeed` section of benchmarks/RESULTS.md.
`--quick`: one round of the 64-node cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import base_tree, machine, write_section

ROOT = Path(__file__).resolve().parents[1]
CASES = ((16, 4), (32, 4), (64, 4), (256, 8), (1000, 10))
QUICK_CASES = ((64, 4),)
SEEDS = (0, 1)
OBJECTIVES = ("least cost", "headroom")
ROUNDS = int(os.environ.get("GWTF_SOLVESPEED_ROUNDS", "2"))

CHILD = """
import hashlib, sys, time
import numpy as np
from gwtf.flow.balance import JOB_OBJECTIVE
from gwtf.flow.generate import geo10_members
from gwtf.flow.localsolve import solve_members
solve_members(geo10_members(np.random.default_rng(9), 12, 3), balance=JOB_OBJECTIVE)  # warm-up
for spec in sys.argv[1:]:
    nodes, stages, seed, objective = spec.split(":")
    members = geo10_members(np.random.default_rng(int(seed)), int(nodes), int(stages))
    balance = JOB_OBJECTIVE if objective == "headroom" else None
    t0 = time.perf_counter()
    solved = solve_members(members, balance=balance)
    wall = time.perf_counter() - t0
    digest = hashlib.sha256(repr(sorted(solved.flows.items())).encode()).hexdigest()[:12]
    print(wall, digest, flush=True)
"""

Spec = tuple[int, int, int, str]


def _measure(tree: Path, specs: list[Spec]) -> list[tuple[float, str]]:
    """(seconds, flows digest) of each solve, by the gwtf package of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [f"{n}:{s}:{seed}:{obj}" for n, s, seed, obj in specs]
    done = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=tree, env=env,
                          capture_output=True, text=True, check=True, timeout=3600)
    return [(float(w), d) for w, d in (line.split() for line in done.stdout.splitlines())]


def run(quick: bool = False) -> str:
    base = os.environ.get("GWTF_SOLVESPEED_BASE", "main")
    cases, rounds = (QUICK_CASES, 1) if quick else (CASES, ROUNDS)
    specs: list[Spec] = [(n, s, seed, obj) for n, s in cases for seed in SEEDS
                         for obj in OBJECTIVES]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    ref = subprocess.run(["git", "rev-parse", "--short", base], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    walls: dict[str, list[list[float]]] = {"base": [[] for _ in specs],
                                           "this": [[] for _ in specs]}
    digests: dict[str, list[set[str]]] = {"base": [set() for _ in specs],
                                          "this": [set() for _ in specs]}
    with base_tree(ref, ROOT) as tmp:
        trees = {"base": tmp, "this": ROOT}
        for k in range(1, rounds + 1):
            for label in ("base", "this"):
                for i, (wall, digest) in enumerate(_measure(trees[label], specs)):
                    walls[label][i].append(wall)
                    digests[label][i].add(digest)
                total = sum(w[-1] for w in walls[label])
                print(f"solvespeed round {k} {label}: {total:.1f} s", file=sys.stderr,
                      flush=True)
    rows = []
    for i, (n, s, seed, obj) in enumerate(specs):
        b = sum(walls["base"][i]) / rounds
        t = sum(walls["this"][i]) / rounds
        same = digests["base"][i] == digests["this"][i] and len(digests["this"][i]) == 1
        rows.append(f"| {n} | {s} | {seed} | {obj} | {b:.2f} | {t:.2f} | {b / t:.1f}x | "
                    f"{'yes' if same else 'no'} |")
    body = "\n".join([
        "## The local solve's time against a base commit (`python -m benchmarks solvespeed`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}: `solve_members` on "
        f"`geo10_members` swarms, this tree ({head}, with its working changes) against {base} "
        f"({ref}), {rounds} rounds, the trees interleaved, one process per tree and round; "
        "seconds are the mean over the rounds; `same flows`: every solve of both trees hashed "
        "to one digest.",
        "",
        "| nodes | stages | seed | objective | base (s) | this (s) | speed-up | same flows |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("solvespeed", body)
    return body
