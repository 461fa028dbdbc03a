"""`gwtf submit --wait --checkpoint-dir DIR --checkpoint-every K` as a user runs it: the first
checkpoint lands at iteration K while the job trains on, and when every node dies the waiting
client says that DIR holds a checkpoint and how to resume from it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cluster import REPO, LocalSwarm, wait_for

from gwtf.train.checkpoints.resume import load_resumable

pytestmark = pytest.mark.integration

NODES = [("h0", 0, 0.01), ("a0", 1, 0.01), ("z0", 2, 0.01)]
JOB = """
iterations = 400
microbatches = 4
microbatch_size = 2

[model]
kind = "llama"
layers = 3
width = 32
heads = 4
seq_len = 16
"""
WAIT_S = 120.0


def test_the_first_checkpoint_lands_at_k_and_a_dead_swarm_says_how_to_resume(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.toml").write_text(JOB)
    (tmp_path / "logs").mkdir()
    ck = tmp_path / "ck"
    with LocalSwarm(tmp_path / "logs", train=True) as swarm:
        swarm.start(NODES, 3, "--activation-bytes", "4096")
        swarm.wait_formed()
        command = (f"{sys.executable} -m gwtf submit --to {swarm.procs['h0'].address} --job "
                   f"{tmp_path / 'job.toml'} --wait --checkpoint-dir {ck} --checkpoint-every 5")
        submit = subprocess.Popen(command.split(), cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        lines: list[str] = []

        def read() -> None:
            assert submit.stderr is not None
            lines.extend(submit.stderr)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_for(lambda: any("checkpoint of iteration" in line for line in lines), WAIT_S,
                     "the first checkpoint")  # fmt: skip
            first = next(i for i, line in enumerate(lines) if "checkpoint of iteration" in line)
            assert lines[first] == f"gwtf submit: checkpoint of iteration 5 written to {ck}\n"
            # Written as the job reached 5, not a dozen iterations later.
            shown = [int(m) for line in lines[:first] for m in re.findall(r"iteration +(\d+)/",
                                                                          line)]  # fmt: skip
            assert max(shown) <= 7, lines[:first + 1]
            # A few more iterations, and perhaps checkpoints, behind it; then every node dies.
            wait_for(lambda: any(re.match(r"iteration +8/", line) for line in lines), WAIT_S,
                     "iteration 8")  # fmt: skip
            for node in list(swarm.procs):
                swarm.kill(node)
            submit.wait(timeout=WAIT_S)
            reader.join(timeout=10)
        finally:
            if submit.poll() is None:
                submit.kill()
                submit.wait()
    kept = load_resumable(ck).iteration
    assert submit.returncode != 0
    last = lines[-1]
    assert last.startswith("gwtf submit: ") and "Traceback" not in "".join(lines), lines[-5:]
    assert last.endswith(
        f"; {ck} holds the checkpoint of iteration {kept} of job {load_resumable(ck).job.job_id}: "
        f"once every stage has a node again, resume it with gwtf submit --to HOST:PORT --resume "
        f"{ck}\n"
    ), last
