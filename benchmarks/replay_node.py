"""`python -m benchmarks replaynode`: bounded replay in the real swarm (docs/design.md 4.9).

    .venv/bin/python -m benchmarks replaynode            # section `replaynode` of RESULTS.md
    .venv/bin/python -m benchmarks replaynode --quick    # the churn benchmark's shorter slice

The churn benchmark's slice of the Bamboo p3 spot trace (`benchmarks.churn_real`: every third
node, its joins and crashes replayed by `gwtf launch --churn` at a time scale, nodes padded to
their GPU's speed) is run once per case, each time with the tiny-gpt job at `MICROBATCHES`
microbatches per iteration (so that a node accumulates several in an iteration and a death has
something to replay) and another `replay_bound`: 0 (off: rule 3 replays everything a dead node
accumulated), 1 (a shipment after every microbatch) and "auto" (the default). From each run:
the crashes the job saw; the microbatches replayed (rules 2-3) and those kept at a stage peer
instead; the stage work done again over all stage compute; restarts; the running sums shipped
and their bytes (the nodes' log lines at each step; a dead node's last iteration is not
counted); and the microbatches trained per second, as a ratio to the run with shipping off.
The runs follow one another on the same machine, so the ratio carries the load of each.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.churn_real import measure
from benchmarks.report import machine, write_section
from benchmarks.swarmrun import log
from gwtf.client import JobResult

SECTION = "## Bounded replay in the real swarm (`python -m benchmarks replaynode`)"
MICROBATCHES = 32
CASES: tuple[tuple[str, int | str], ...] = (("0 (off)", 0), ("1", 1), ('"auto"', "auto"))
HEAD = ("| replay_bound | crashes | iterations / microbatches trained | replayed / kept | "
        "stage work redone (of all) | restarts | running sums shipped | microbatches/s (to "
        "off) |\n|---|---|---|---|---|---|---|---|")
_SHIPPED = re.compile(r"shipped (\d+) running sums to a keeper in the iteration, (\d+) bytes")


def shipped(log_dir: Path) -> tuple[int, int]:
    """(shipments, bytes) the nodes' logs report."""
    count = nbytes = 0
    for path in log_dir.glob("*.log"):
        for match in _SHIPPED.finditer(path.read_text(errors="replace")):
            count += int(match.group(1))
            nbytes += int(match.group(2))
    return count, nbytes


def run(quick: bool = False) -> str:
    rows: list[tuple[str, JobResult, float, int, int]] = []
    for label, bound in CASES:
        log(f"replay_bound = {bound}")
        m: dict[str, Any] = measure(quick, {"replay_bound": bound, "microbatches": MICROBATCHES,
                                            "name": f"replay-{bound}"}, predict=False)
        result: JobResult = m["result"]
        count, nbytes = shipped(Path(m["log_dir"]) / "logs")
        tput = result.microbatches_trained / m["elapsed_s"] if m["elapsed_s"] else 0.0
        rows.append((label, result, tput, count, nbytes))
    base = rows[0][2]
    lines = []
    for label, r, tput, count, nbytes in rows:
        waste = 100 * r.replayed_s / r.compute_s if r.compute_s else 0.0
        per_mb = nbytes / r.microbatches_trained / 1e6 if r.microbatches_trained else 0.0
        ratio = tput / base if base else float("nan")
        lines.append(
            f"| {label} | {r.crashes} | {r.iterations_completed} / {r.microbatches_trained} | "
            f"{r.replayed_microbatches} / {r.kept_microbatches} | {r.replayed_s:.2f} s = "
            f"{waste:.2f}% | {r.restarts} | {count}, {nbytes / 1e6:.1f} MB ({per_mb:.2f} MB per "
            f"microbatch trained) | {tput:.2f} = **{ratio:.2f}x** |"
        )
    table = "\n".join(lines)
    body = f"""{SECTION}

Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}{', quick mode' if quick else ''}.
Command: `python -m benchmarks replaynode{' --quick' if quick else ''}`. The churn benchmark's
slice (`churn`), once per `replay_bound`, a tiny-gpt job of {MICROBATCHES} microbatches per
iteration; the runs follow one another, so each ratio carries the machine's load during its run.

{HEAD}
{table}
"""
    write_section("replaynode", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
