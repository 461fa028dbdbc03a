"""The reference trainer: the loss falls on the default data, and `gwtf reference` works as a
user runs it (a real process, bounded in time)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch

from gwtf.train.data import load_corpus
from gwtf.train.job import PRESETS, JobConfig, ModelConfig, OptimizerConfig
from gwtf.train.reference import train_reference

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60


def run_gwtf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gwtf", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_loss_falls_on_the_default_data() -> None:
    job = JobConfig(
        model=ModelConfig(kind="gpt", layers=2, width=32, heads=2, seq_len=32),
        optimizer=OptimizerConfig(lr=1e-2),
        iterations=25,
        microbatches=2,
        microbatch_size=16,
    )
    result = train_reference(job, load_corpus())
    assert len(result.loss) == 25 and result.iterations_completed == 25
    assert abs(result.loss[0] - 5.545) < 0.2  # ln 256: a uniform guess over bytes
    last = sum(result.loss[-5:]) / 5
    assert last < result.loss[0] - 1.5, result.loss  # observed: 5.54 -> about 3.3


def test_cli_reference_json_matches_the_function() -> None:
    done = run_gwtf(
        "reference", "--job", "tiny-gpt", "--iterations", "2", "--json", "--threads", "1"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {
        "job_id",
        "iterations_completed",
        "loss",
        "param_checksum",
        "throughput_mb_s",
        "dropped_microbatches",
    }
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=2)
    assert out["job_id"] == job.job_id
    assert out["iterations_completed"] == 2 and out["dropped_microbatches"] == 0
    assert out["throughput_mb_s"] > 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU reductions split by thread count: match the CLI's
    try:
        here = train_reference(job)
    finally:
        torch.set_num_threads(threads)
    assert out["loss"] == list(here.loss)
    assert out["param_checksum"] == here.param_checksum


def test_cli_reference_with_a_job_file_and_data_file(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 20)
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        'data = "text.txt"\niterations = 2\nmicrobatches = 2\nmicrobatch_size = 2\n'
        '[model]\nkind = "llama"\nlayers = 1\nwidth = 16\nheads = 2\nseq_len = 8\n'
    )
    done = run_gwtf("reference", "--job", str(job_file))
    assert done.returncode == 0, done.stderr
    assert "iteration    2/2  loss" in done.stdout
    assert str(text.resolve()) in done.stdout and "param checksum" in done.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text(job_file.read_text().replace("heads = 2", "heads = 3"))
    done = run_gwtf("reference", "--job", str(bad), "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        f"gwtf reference: job file {bad}: model.heads (3) must divide model.width (16); "
        "choose a width that is a multiple of heads"
    )
