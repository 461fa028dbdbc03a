"""`python -m benchmarks snapshots`: what stage snapshots cost the real swarm, this tree against a
base commit, interleaved in one run (docs/design.md 4.6, *Background*).

Six `gwtf node` processes on 127.0.0.1 (2 data holders, 2 + 2 relays), each stage's two replicas
at two of three sites on the emulated WAN: London, Frankfurt and Ireland with their round trips
from gwtf/data/geo10_aws.csv and a home-grade 40 Mbit/s per link (a plan tier of the
`home_links` scenario, not a measurement), compute padded to `COMPUTE_S` a microbatch
(`--emulate-compute`). One tiny-gpt job with the default snapshot policy: every stage has two
replicas, so it is thin and its sender sends its state after every step to the four nodes of the
other stages. The emulated WAN delays each copy by its bytes and the link's latency, in a queue
of its own per peer (`WanEmulator.delay(bulk=True)`), so the figures count the transfer and not
its interference with the data plane.

`GWTF_SNAPBENCH_BASE=REF` (default `main`): the base, exported with `git archive`; each round
runs the job on the base's nodes, then on this tree's (the client is this tree's either way).
`GWTF_SNAPBENCH_ROUNDS=N` (default 2; `--quick`: 1). Writes the `snapshots-node` section of
benchmarks/RESULTS.md: per run the job's throughput and median iteration time, and this tree's
over the base's.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import base_tree, machine, write_section
from benchmarks.swarmrun import log
from gwtf.flow.generate import data_path
from tests.integration.cluster import REPO, LocalSwarm, pipeline_arcs, wait_for

SECTION = "snapshots-node"
SITES = ("London", "Frankfurt", "Ireland")
BANDWIDTH_GBPS = 0.04
COMPUTE_S = 0.05
NODES = [("h0", 0, 0), ("h1", 0, 1), ("a0", 1, 1), ("a1", 1, 2), ("z0", 2, 2), ("z1", 2, 0)]
"""(id, stage, site): each stage's replicas at two different sites."""
ITERATIONS = 12
MICROBATCHES = 8


def matrix(path: Path) -> Path:
    """The three sites' round trips from geo10_aws.csv at BANDWIDTH_GBPS, as a link matrix."""
    rows = []
    for line in data_path("geo10_aws.csv").read_text().splitlines()[1:]:
        src, dst, rtt, _ = line.split(",")
        if src in SITES and dst in SITES:
            rows.append(f"{src},{dst},{rtt},{BANDWIDTH_GBPS}")
    assert len(rows) == 3, rows
    path.write_text("src,dst,rtt_ms,bandwidth_gbps\n" + "\n".join(rows) + "\n")
    return path


def _job(tree: Path, links: Path) -> dict[str, Any]:
    """The job on a swarm of `tree`'s nodes: its throughput and median iteration time."""
    from gwtf.client import GwtfClient
    from gwtf.train import PRESETS, activation_bytes

    job = dataclasses.replace(PRESETS["tiny-gpt"], name="snapshots", iterations=ITERATIONS,
                              microbatches=MICROBATCHES)
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-snap-") as tmp, LocalSwarm(
        Path(tmp), heartbeat_s=0.5, failure_timeout_s=5.0, train=True, cwd=tree,
        extra=("--emulate-compute", "--link-matrix", str(links)),
    ) as swarm:
        first_id, stage, site = NODES[0]
        first = swarm.spawn(first_id, stage, COMPUTE_S, "--stages", "3", "--activation-bytes",
                            str(activation_bytes(job)), "--location", SITES[site])
        swarm.wait_listening(first)
        swarm.bootstrap = first.address
        rest = [swarm.spawn(n, s, COMPUTE_S, "--location", SITES[i]) for n, s, i in NODES[1:]]
        swarm.wait_listening(*rest)
        wait_for(lambda: swarm.settled({n for n, _, _ in NODES}, pipeline_arcs([2, 2, 2])),
                 300.0, "the swarm to settle", interval_s=0.5)
        client = GwtfClient(first.address)
        load = os.getloadavg()[0]
        result = client.wait(client.submit(job), timeout_s=900.0)
        if result.state != "completed":
            raise RuntimeError(f"the job failed: {result.error}")
    return {"mb_s": result.throughput_mb_s, "iteration_s": statistics.median(result.iteration_s),
            "load": load}


def run(quick: bool = False) -> str:
    rounds = 1 if quick else int(os.environ.get("GWTF_SNAPBENCH_ROUNDS", "2"))
    ref = os.environ.get("GWTF_SNAPBENCH_BASE", "main")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, base_tree(ref, REPO) as base:
        links = matrix(Path(tmp) / "sites.csv")
        for r in range(rounds):
            row = {}
            for name, tree in (("base", base), ("this", REPO)):
                row[name] = _job(tree, links)
                log(f"round {r + 1} {name}: {row[name]}")
            rows.append(row)
    lines = [
        f"`GWTF_SNAPBENCH_BASE={ref} GWTF_SNAPBENCH_ROUNDS={rounds} python -m benchmarks "
        f"snapshots`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, on {machine()}; rounds interleaved (base, then "
        "this tree). Six nodes, 3 stages of 2 (thin: a snapshot after every step, to 4 "
        f"keepers), {', '.join(SITES)} at {BANDWIDTH_GBPS * 1000:.0f} Mbit/s per link, "
        f"{COMPUTE_S} s a microbatch; tiny-gpt, {MICROBATCHES} microbatches x {ITERATIONS} "
        "iterations.",
        "",
        "| round | base mb/s | base iteration s | this mb/s | this iteration s | this / base "
        "| load (1 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, row in enumerate(rows, 1):
        b, t = row["base"], row["this"]
        lines.append(f"| {r} | {b['mb_s']:.2f} | {b['iteration_s']:.2f} | {t['mb_s']:.2f} | "
                     f"{t['iteration_s']:.2f} | {t['mb_s'] / b['mb_s']:.2f} | "
                     f"{b['load']:.1f} / {t['load']:.1f} |")
    body = "\n".join(lines)
    write_section(SECTION, "## Snapshots in the real swarm (`python -m benchmarks snapshots`)"
                  f"\n\n{body}")
    return body
