"""`python -m benchmarks compress-real`: a link-bound swarm of real node processes, each in
its own network namespace with its uplink shaped by the kernel, trains with and without
compression (docs/design.md 2.15).

    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks compress-real           # 2 pairs
    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks compress-real --quick   # 1 pair

Six `gwtf node` processes, two per stage of three, each in a namespace of its own
(`gwtf.local.netns`: veth pairs on a bridge, `tc` tbf on each machine's uplink). The uplinks
are cable upload tiers of simulations/versus/nodes.csv (8 and 20 Mbit/s), declared to the node
as well (`--uplink-mbps`) so that the plan sees what the kernel enforces; no delay is shaped (no
netem here). Compute is emulated (0.2 s per microbatch, `--emulate-compute`), so the links bind:
a stage-1 machine's 8 Mbit/s uplink carries 0.95 float32 microbatches a second (activations and
gradients of 512 KiB each) where its compute does 5.

Each run trains tiny-gpt with microbatches of 32 sequences (32 microbatches an iteration) once
with `compression = "off"` and once as submitted by default (the node plans; 8-bit on both
boundaries here), alternated, on a fresh swarm each; the swarm's `--activation-bytes` is the
job's. Per run: microbatches per second over the iterations after the first two
(`JobResult.iteration_s`), the bytes the machines' uplinks sent (tc's counters), and the
maximum flow the plan predicts (`gwtf.flow.compression.swarm_plan`'s flow, the same function
the node planned with): measured over predicted says how much of the flow the commit and the
protocol leave.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.report import machine, write_section
from benchmarks.swarmrun import alternate, log, start_in_hosts, submit_when_formed
from gwtf.flow.compression import boundary_sizes, uplink_capacity
from gwtf.flow.placement import Swarm
from gwtf.flow.topology import DEFAULT_INTRA, NodeSpec
from gwtf.local.netns import Hosts, available

# (id, stage, uplink Mbit/s): simulations/versus/nodes.csv's tiers.
NODES = [("h0", 0, 8), ("h1", 0, 20), ("a0", 1, 8), ("a1", 1, 20), ("z0", 2, 20), ("z1", 2, 8)]
COMPUTE_S = 0.2
ITERATIONS = 8
MICROBATCHES = 32
MICROBATCH_SIZE = 32
"""Sequences per microbatch: 2,048 tokens, 512 KiB of float32 activations."""
PAIRS = 2
SKIP = 2
"""Iterations left out of the rate: the first ones pay for loading and the flows settling."""


def predicted(plan: tuple[str, str], activation_bytes: int) -> float:
    """The swarm's maximum flow (microbatches/s) under `plan`: each node the least of its
    compute and what its uplink carries of the plan's bytes."""
    sizes = boundary_sizes(activation_bytes, plan)
    nodes = tuple(
        NodeSpec(node, stage, COMPUTE_S, "home",
                 min(1 / COMPUTE_S, uplink_capacity(mbps / 1000, stage, sizes)))
        for node, stage, mbps in NODES
    )  # fmt: skip
    # One location: every pair is the intra link; the uplinks are in the nodes' capacities.
    return Swarm(3, activation_bytes, nodes, {}, DEFAULT_INTRA).max_flow()


def one_run(compress: bool, log_dir: Path) -> dict[str, Any]:
    from gwtf.client import GwtfClient
    from gwtf.train import PRESETS
    from gwtf.train.costs import activation_bytes
    from gwtf.train.job import CompressionConfig

    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=ITERATIONS,
                              microbatches=MICROBATCHES, microbatch_size=MICROBATCH_SIZE)
    if not compress:
        job = dataclasses.replace(job, compression=CompressionConfig(allow=()))
    names = [n for n, _, _ in NODES]
    with Hosts(names, {n: mbps for n, _, mbps in NODES}) as hosts:
        addresses = start_in_hosts(hosts, NODES, COMPUTE_S, 3, activation_bytes(job), log_dir)
        sent_before = {n: hosts.sent_bytes(n) for n in names}
        start = time.monotonic()
        job_id = submit_when_formed(addresses["h0"], job)
        result = GwtfClient(addresses["h0"], timeout_s=60).wait(job_id, timeout_s=900)
        wall = time.monotonic() - start
        sent = {n: hosts.sent_bytes(n) - sent_before[n] for n in names}
    if result.state != "completed":
        raise RuntimeError(f"the job {result.state}: {result.error}")
    steady = result.iteration_s[SKIP:]
    plan = dict(result.compression)
    ends = (2, 4)
    used = (plan.get(2, "none"), plan.get(4, "none"))
    rate = MICROBATCHES / statistics.mean(steady)
    flow = predicted(used, activation_bytes(job))
    log(f"{'with' if compress else 'without'} compression: {rate:.2f} mb/s (flow {flow:.2f}), "
        f"plan {used}, {wall:.0f} s")
    return {
        "compress": compress, "plan": used, "ends": ends, "rate": rate, "flow": flow,
        "iteration_s": list(result.iteration_s), "sent": sent, "wall_s": wall,
        "checksum": result.param_checksum, "loss": list(result.loss),
        "bytes_saved": result.bytes_saved,
    }  # fmt: skip


def run(quick: bool = False, pairs: int = PAIRS) -> str:
    why = available()
    if why:
        return f"compress-real: skipped, {why}"
    runs = alternate("compress-real", 1 if quick else pairs, one_run)
    rows = []
    ratios = []
    for pair in range(len(runs) // 2):
        off, on = runs[2 * pair], runs[2 * pair + 1]
        ratios.append(on["rate"] / off["rate"])
        for r in (off, on):
            mib = sum(r["sent"].values()) / 2**20
            rows.append(
                f"| {pair} | {'on: ' + '/'.join(r['plan']) if r['compress'] else 'off'} "
                f"| {r['rate']:.2f} | {r['flow']:.2f} | {r['rate'] / r['flow']:.2f} "
                f"| {mib:.0f} | {r['wall_s']:.0f} |"
            )
    body = "\n".join([
        "## compress-real: compression in a link-bound swarm, real processes and links",
        "",
        f"`python -m benchmarks compress-real`, {time.strftime('%Y-%m-%d')}, {machine()}. "
        "Six nodes (two a stage), each in its own network namespace, uplinks shaped by tc tbf "
        f"(8 and 20 Mbit/s), compute emulated at {COMPUTE_S} s a microbatch, tiny-gpt "
        f"({MICROBATCHES} microbatches of 512 KiB activations an iteration, {ITERATIONS} "
        f"iterations; the rate leaves out the first {SKIP}). Off: `compression = \"off\"`; on: "
        "the job as submitted, planned by the node.",
        "",
        "| pair | compression | mb/s | flow's prediction | measured / predicted | MiB sent by "
        "the uplinks | wall s |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"With over without: {', '.join(f'{x:.2f}' for x in ratios)} "
        f"(mean {statistics.mean(ratios):.2f}).",
    ])  # fmt: skip
    write_section("compress-real", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
