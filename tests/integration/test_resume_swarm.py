"""Resume after killing every node (issue: real training): a swarm trains a job, a checkpoint is
taken from its replicas while it runs, every node is SIGKILLed, and a new swarm, cut into another
number of stages, resumes the job from the checkpoint (`gwtf submit --resume DIR`). It must end
bit for bit where the same job trained without a stop ends (`train_reference`, one thread as the
nodes): the same parameters, the same losses from the resumed iteration on.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cluster import REPO, LocalSwarm, wait_for

from gwtf.client import GwtfClient
from gwtf.train import PRESETS, train_reference
from gwtf.train.checkpoints.checkpoint import load_model
from gwtf.train.checkpoints.resume import load_resumable

pytestmark = pytest.mark.integration

ITERATIONS = 16
WAIT_S = 240.0



def test_a_job_resumed_after_every_node_died_equals_an_uninterrupted_run(
    tmp_path: Path, one_thread: None
) -> None:
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=ITERATIONS)
    checkpoint = tmp_path / "checkpoint"
    for logs in ("first", "second"):
        (tmp_path / logs).mkdir()
    with LocalSwarm(tmp_path / "first", train=True) as first:
        first.start([("h0", 0, 0.05), ("a0", 1, 0.05), ("b0", 2, 0.05), ("b1", 2, 0.05)], 3)
        first.wait_formed()
        client = GwtfClient(first.procs["a0"].address)
        job_id = client.submit(job)
        wait_for(lambda: client.progress(job_id).iterations_completed >= 3, WAIT_S,
                 "three iterations")  # fmt: skip
        client.download(job_id, checkpoint)  # from the replicas, while the job runs
        for proc in list(first.live()):
            first.kill(proc.id)
    saved = load_resumable(checkpoint)
    stop = saved.iteration
    assert 3 <= stop < ITERATIONS, stop  # it did stop in the middle
    assert saved.job.job_id == job_id and saved.optimizer  # AdamW's state is in the folder

    with LocalSwarm(tmp_path / "second", train=True) as second:
        # Another swarm: two stages instead of three, other node ids, other ports.
        second.start([("n0", 0, 0.05), ("n1", 0, 0.05), ("m0", 1, 0.05)], 2)
        second.wait_formed()
        result = subprocess.run(
            [sys.executable, "-m", "gwtf", "submit", "--to", second.procs["m0"].address,
             "--resume", str(checkpoint), "--wait", "--json", "--checkpoint-dir",
             str(tmp_path / "resumed")],
            cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    reference = train_reference(job)
    assert summary["job_id"] == job_id and summary["resumed_from"] == stop
    assert summary["iterations_completed"] == ITERATIONS
    assert summary["loss"] == list(reference.loss[stop:])
    assert summary["param_checksum"] == reference.param_checksum
    model = load_model(tmp_path / "resumed")
    assert model.iteration == ITERATIONS and model.checksum == reference.param_checksum
    assert all(torch.equal(t, reference.parameters[n]) for n, t in model.parameters.items())


def test_a_checkpoint_that_cannot_be_resumed_is_refused_in_one_sentence(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "gwtf", "reference", "--job", "tiny-gpt", "--iterations", "1",
         "--threads", "1", "--checkpoint-dir", str(tmp_path / "done")],
        cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=True,
    )  # fmt: skip
    for folder, words in ((tmp_path / "done", "only a checkpoint written while the job ran"),
                          (tmp_path / "none", "none does not exist; give a checkpoint folder")):
        result = subprocess.run(
            [sys.executable, "-m", "gwtf", "submit", "--to", "127.0.0.1:1", "--resume",
             str(folder)],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], result.stderr
