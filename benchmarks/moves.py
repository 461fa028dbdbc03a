"""`python -m benchmarks moves`: what a move between stages gives a running job (docs/design.md
2.11, "Moves"), against the same swarm with the node pinned where it took its stage.

Two runs of one scenario, one after the other on the same machine: 2 stages, h0, h1 pinned at
stage 0, a0, a1 pinned at stage 1, and m0 with `--stage auto` (it takes stage 0, a tie), every
node padded to the same emulated compute per microbatch (`--emulate-compute`), so that stage
capacities, not the machine's two cores, bound the pipeline. A tiny-gpt job runs; a1 is killed
after iteration 2. With moves (the default) the coordinator moves m0 to stage 1; with
`--no-moves` on m0, stage 1 stays one node. The figure: the mean iteration time over the last
iterations of each run, and their ratio; both runs must train the same model (their checksums).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import machine, write_section
from benchmarks.swarmrun import log
from gwtf.client import GwtfClient
from gwtf.train import PRESETS
from tests.integration.cluster import LocalSwarm, wait_for

SECTION = "## Moves between stages on the node (`python -m benchmarks moves`)"
COMPUTE_S = 0.25
"""Emulated seconds per microbatch at every node: above tiny-gpt's real stage time on one
thread (about 0.07 s), so the padding, not the shared cores, sets the speed."""
WAIT_S = 600.0


def one_run(moves: bool, iterations: int, tail: int) -> dict[str, Any]:
    job = dataclasses.replace(PRESETS["tiny-gpt"], name="bench-moves", iterations=iterations)
    with tempfile.TemporaryDirectory(prefix="gwtf-moves-") as tmp, LocalSwarm(
        Path(tmp), heartbeat_s=0.25, failure_timeout_s=3.0, train=True,
        extra=("--emulate-compute",),
    ) as swarm:
        swarm.start([("h0", 0, COMPUTE_S), ("h1", 0, COMPUTE_S), ("a0", 1, COMPUTE_S),
                     ("a1", 1, COMPUTE_S)], 2, "--activation-bytes", "131072")
        swarm.wait_formed()
        swarm.join("m0", None, COMPUTE_S, *(() if moves else ("--no-moves",)))
        swarm.wait_formed()
        client = GwtfClient(swarm.procs["h0"].address)
        job_id = client.submit(job)
        wait_for(lambda: client.progress(job_id).iterations_completed >= 2, WAIT_S,
                 "two iterations")
        swarm.kill("a1")
        result = client.wait(job_id, timeout_s=WAIT_S)
        text = (Path(tmp) / "h0.log").read_text()
        named = [line for line in text.splitlines() if "moves from stage" in line]
        done = [line for line in text.splitlines() if "the move of" in line and "is done" in line]
    if result.state != "completed":
        raise RuntimeError(f"the job did not complete: {result.error}")
    took = None
    if named and done:
        took = _stamp(done[0]) - _stamp(named[0])
    return {"result": result, "tail_s": statistics.mean(result.iteration_s[-tail:]),
            "move_s": took}


def _counts(result: Any) -> str:
    return f"{result.crashes}, {result.leaves}, {result.joins}"


def _stamp(line: str) -> float:
    """Seconds of the day of a log line's `YYYY-MM-DD HH:MM:SS,mmm` time."""
    clock = line.split()[1]
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s.replace(",", "."))


def run(quick: bool = False) -> str:
    iterations, tail = (16, 5) if quick else (30, 10)
    log("moves: with moves")
    on = one_run(True, iterations, tail)
    log("moves: with --no-moves")
    off = one_run(False, iterations, tail)
    r_on, r_off = on["result"], off["result"]
    same = r_on.param_checksum == r_off.param_checksum and r_on.loss == r_off.loss
    moved = ", ".join(f"{m.node} {m.from_stage} -> {m.stage} at iteration {m.iteration} "
                      f"(flow {m.flow:.2f} -> {m.flow + m.gain:.2f} mb/s announced)"
                      for m in r_on.moves) or "none"
    move_s = f"{on['move_s']:.2f} s" if on["move_s"] is not None else "not found in the log"
    body = f"""{SECTION}

Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}{', quick mode' if quick else ''}; the
machine is shared with other work. Command: `flock /tmp/gwtf-heavy.lock python -m benchmarks
moves{' --quick' if quick else ''}`. Both runs in one invocation, one after the other.

2 stages, 4 pinned nodes (2 + 2) and m0 (`--stage auto`, takes stage 0), every node padded to
{COMPUTE_S:g} s per microbatch; tiny-gpt, {iterations} iterations of 8 microbatches; a1 (stage 1)
SIGKILLed after iteration 2.

| | with moves (default) | m0 `--no-moves` |
|---|---|---|
| moves named | {moved} | {len(r_off.moves)} |
| crashes, leaves, joins | {_counts(r_on)} | {_counts(r_off)} |
| mean iteration, last {tail} | **{on['tail_s']:.2f} s** | **{off['tail_s']:.2f} s** |
| job wall time | {r_on.elapsed_s:.1f} s | {r_off.elapsed_s:.1f} s |

Ratio of the last iterations' time, `--no-moves` / moves: **{off['tail_s'] / on['tail_s']:.2f}**.
From the step order naming the move to the mover's admission at its new stage (coordinator's
log): {move_s}. The two runs trained the same model: {'yes' if same else 'NO'} (checksum
{r_on.param_checksum[:16]}).
"""
    write_section("moves", body)
    return body


if __name__ == "__main__":
    print(run())
