"""`python -m benchmarks stragglers`: a straggler in a real swarm, this tree against the tree
before live paces (docs/design.md 2.13), both measured in one run.

    .venv/bin/python -m benchmarks stragglers            # section `stragglers` of RESULTS.md
    .venv/bin/python -m benchmarks stragglers --quick    # shorter windows

Six `gwtf node` processes in three stages, two per stage, 8 memory slots each (the default),
train tiny-gpt at 32 microbatches per iteration. Once the job runs, one relay of stage 1 is
slowed from outside to a quarter of its speed for `SLOW_S` seconds: SIGSTOP and SIGCONT at a
duty cycle of 0.3 s stopped in every 0.4 s, a machine busy with something else that does not
know it (any tree can be slowed so). Two cases (`CASES`): the straggler's stage peer alone can
carry what the swarm trains (stage 2 binds), so the optimum while it is slowed is the rate
before; or it cannot (every stage alike), and the flow value's fall is what the routing
predicts. Per case and tree, from the iterations' completion times: iterations per second
before the slowdown, from `SETTLE_S` after it began to its end, and from `SETTLE_S` after it
ended, the last two as ratios to the first; and the flow value the routing held before and at
its lowest while slowed (a stage-0 node's `gwtf status`).

The base is `GWTF_STRAGGLERS_BASE` (default `BASE`, the commit before live paces), unpacked with
`git archive` and run by the same interpreter: its nodes import its own gwtf (the process's
working directory comes first on `sys.path`). The trees run one after the other on the same
machine; each ratio is within one tree's run.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import base_tree, machine, write_section
from benchmarks.swarmrun import log, submit_when_formed
from tests.integration.cluster import LocalSwarm, wait_for

ROOT = Path(__file__).resolve().parents[1]
BASE = "08169e8"
"""The commit before live paces: the tree the routing never heard of a slowdown in."""
MICROBATCHES = 32
SLOTS = int(os.environ.get("GWTF_STRAGGLERS_SLOTS", "8"))
SLOW_S = 90.0
SETTLE_S = 15.0
"""The issue's measure: the throughput from 15 s after a change."""
BEFORE_S = 30.0
AFTER_S = 40.0
CASES = (("peer carries", (0.08, 0.08, 0.16)), ("peer cannot carry", (0.08, 0.08, 0.08)))
"""Emulated compute per stage: stage 2 binds in the first, so that the straggler's stage peer
alone carries the swarm's rate."""
NODES = (("h0", 0), ("h1", 0), ("r0", 1), ("r1", 1), ("l0", 2), ("l1", 2))
STRAGGLER = "r0"


@dataclass
class Run:
    """One tree's run: iteration completion times and flow values, with the window's times."""

    label: str
    done: list[tuple[float, int]] = field(default_factory=list)
    flows: list[tuple[float, float]] = field(default_factory=list)
    slow_at: float = 0.0
    slow_end: float = 0.0
    end: float = 0.0
    error: str = ""

    def rate(self, start: float, stop: float) -> float:
        """Iterations per second between two times, from the first completions after each."""
        inside = [(t, k) for t, k in self.done if start <= t <= stop]
        if len(inside) < 2:
            return 0.0
        (t0, k0), (t1, k1) = inside[0], inside[-1]
        return (k1 - k0) / (t1 - t0) if t1 > t0 else 0.0

    def flow(self, start: float, stop: float,
             pick: Callable[[Iterable[float]], float] = min) -> float:
        values = [f for t, f in self.flows if start <= t <= stop]
        return pick(values) if values else 0.0


def _duty_cycle(pid: int, stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            stop.wait(0.3)
            os.kill(pid, signal.SIGCONT)
            stop.wait(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)


def measure(label: str, tree: Path, slow_s: float, before_s: float, after_s: float,
            compute: tuple[float, ...]) -> Run:
    from gwtf.client import GwtfClient
    from gwtf.train import PRESETS

    run = Run(label)
    job = dataclasses.replace(PRESETS["tiny-gpt"], name=f"stragglers-{label}", iterations=10_000,
                              microbatches=MICROBATCHES)
    with tempfile.TemporaryDirectory(prefix="gwtf-stragglers-") as tmp, LocalSwarm(
        Path(tmp), heartbeat_s=0.25, failure_timeout_s=3.0, train=True, cwd=tree,
        extra=("--emulate-compute", "--memory-slots", str(SLOTS)),
    ) as swarm:
        swarm.start([(i, s, compute[s]) for i, s in NODES[:2]], 3,
                    "--activation-bytes", "131072")
        swarm.wait_formed()
        for node_id, stage in NODES[2:]:
            swarm.join(node_id, stage, compute[stage])
        swarm.wait_formed()
        address = swarm.procs["h0"].address
        job_id = submit_when_formed(address, job)
        client = GwtfClient(address, timeout_s=30)
        wait_for(lambda: client.progress(job_id).iterations_completed >= 3, 180.0,
                 "three iterations")
        stop = threading.Event()
        cycle = threading.Thread(target=_duty_cycle,
                                 args=(swarm.procs[STRAGGLER].popen.pid, stop), daemon=True)
        start = time.monotonic()
        run.slow_at = start + before_s
        run.slow_end = run.slow_at + slow_s
        run.end = run.slow_end + after_s
        last_flow = 0.0
        try:
            while (now := time.monotonic()) < run.end:
                if now >= run.slow_at and not cycle.is_alive() and not stop.is_set():
                    log(f"{label}: {STRAGGLER} slowed to a quarter for {slow_s:.0f} s")
                    cycle.start()
                if now >= run.slow_end and not stop.is_set():
                    stop.set()
                    cycle.join(5.0)
                    log(f"{label}: {STRAGGLER} back to its speed")
                progress = client.progress(job_id)
                if progress.over:
                    run.error = progress.error or progress.state
                    break
                if not run.done or progress.iterations_completed > run.done[-1][1]:
                    run.done.append((time.monotonic(), progress.iterations_completed))
                if now - last_flow >= 1.0:
                    view = swarm.status("h0")
                    if view is not None:
                        run.flows.append((now, view["flow_value"]))
                    last_flow = now
                time.sleep(0.1)
        finally:
            stop.set()
            if cycle.is_alive():
                cycle.join(5.0)
            client.cancel(job_id, "the benchmark is over")
    return run


def row(case: str, run: Run) -> str:
    before = run.rate(run.slow_at - BEFORE_S, run.slow_at)
    during = run.rate(run.slow_at + SETTLE_S, run.slow_end)
    after = run.rate(run.slow_end + SETTLE_S, run.end)
    flow_before = run.flow(run.slow_at - BEFORE_S, run.slow_at, max)
    flow_low = run.flow(run.slow_at + SETTLE_S, run.slow_end)
    error = f" (the job ended: {run.error})" if run.error else ""
    if not before or not flow_before:
        return f"| {case} | {run.label}{error} | - | - | - | - | - |"
    predicted = flow_low / flow_before
    return (f"| {case} | {run.label}{error} | {before:.3f} | {during:.3f} ({during / before:.2f})"
            f" | {after:.3f} ({after / before:.2f}) | {flow_before:.1f} -> {flow_low:.1f} "
            f"({predicted:.2f}) | {during / before / predicted:.2f} |")


def run(quick: bool = False) -> str:
    slow_s, after_s = (45.0, 30.0) if quick else (SLOW_S, AFTER_S)
    base_ref = os.environ.get("GWTF_STRAGGLERS_BASE", BASE)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    rows = []
    with base_tree(base_ref, ROOT) as base:
        for case, compute in CASES:
            for label, tree in ((f"base {base_ref}", base), (f"this tree {head}", ROOT)):
                log(f"{case}, {label}: six nodes, a tiny-gpt job, then {STRAGGLER} slowed")
                rows.append(row(case, measure(label, tree, slow_s, BEFORE_S, after_s, compute)))
    lines = [
        "## A straggler in a real swarm (`python -m benchmarks stragglers`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `python -m benchmarks stragglers"
        f"{' --quick' if quick else ''}` on {machine()}. Six node processes, two per stage, "
        f"{SLOTS} memory slots each, tiny-gpt at {MICROBATCHES} microbatches per iteration; "
        f"{STRAGGLER} (stage 1) slowed to a quarter by SIGSTOP/SIGCONT (0.3 s of every 0.4 s) "
        f"for {slow_s:.0f} s. Iterations per second in the {BEFORE_S:.0f} s before, from "
        f"{SETTLE_S:.0f} s after the slowdown began to its end, and from {SETTLE_S:.0f} s after "
        "it ended (ratio to before); the flow value (microbatches/s) a stage-0 node held "
        "before and at its lowest while slowed, and their ratio: what the routing predicts "
        "for the slowed swarm relative to the unslowed one; the last column is the measured "
        "ratio over that prediction. *Peer carries*: emulated compute 0.08 s per microbatch "
        "at stages 0 and 1, 0.16 s at stage 2, which binds: the straggler's stage peer alone "
        "can carry the swarm's rate, the flow value does not move and the optimum while "
        "slowed is the rate before. *Peer cannot carry*: 0.08 s everywhere.",
        "",
        "| case | tree | it/s before | while slowed (to before) | after (to before) | "
        "flow value (slowed to before) | slowed over predicted |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    body = "\n".join(lines) + "\n"
    write_section("stragglers", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
