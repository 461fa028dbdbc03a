"""The trained model out: model.safetensors and job.toml (gwtf.train.checkpoints.checkpoint)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gwtf.cli import main
from gwtf.train import PRESETS, AggregationConfig, train_reference
from gwtf.train.checkpoints.checkpoint import (
    MODEL_FILE,
    CheckpointError,
    job_toml,
    load_model,
    merge_stages,
    save_model,
    weights_bytes,
    weights_from_bytes,
)
from gwtf.train.job import load_job
from gwtf.train.partition import partition
from gwtf.train.stage import build_model, build_stage, canonical_order
from gwtf.train.state import param_checksum


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_job_file_reads_back_as_the_same_job(name: str, tmp_path: Path) -> None:
    job = dataclasses.replace(
        PRESETS[name], iterations=3, aggregation=AggregationConfig("trimmed-mean", trim=0.25)
    )
    (tmp_path / "job.toml").write_text(job_toml(job))
    assert load_job(tmp_path / "job.toml").job_id == job.job_id


def test_the_stages_merge_into_the_whole_model_with_its_names(tmp_path: Path) -> None:
    job = PRESETS["tiny-gpt"]
    whole = dict(build_model(job.model, job.seed).named_parameters())
    stages = [dict(build_stage(job.model, job.seed, spec).named_parameters())
              for spec in partition(job.model.layers, 3)]  # fmt: skip
    # Over the wire: each stage as safetensors bytes.
    merged = merge_stages([weights_from_bytes(weights_bytes(s)) for s in stages])
    assert list(merged) == canonical_order(list(whole))  # embed, blocks by index, head
    assert all(torch.equal(merged[n], whole[n]) for n in whole)
    with pytest.raises(CheckpointError, match="both hold"):
        merge_stages([stages[0], stages[0]])

    path = save_model(tmp_path, merged, job, 0, expect_checksum=param_checksum(whole))
    saved = load_model(path.parent)
    assert (saved.iteration, saved.job.job_id, saved.checksum) == (0, job.job_id,
                                                                   param_checksum(whole))
    assert all(torch.equal(saved.parameters[n], whole[n]) for n in whole)


def test_a_checkpoint_that_is_not_what_it_says_is_refused(tmp_path: Path) -> None:
    job = PRESETS["tiny-gpt"]
    params = dict(build_model(job.model, job.seed).named_parameters())
    with pytest.raises(CheckpointError, match="not the job's"):
        save_model(tmp_path, params, job, 1, expect_checksum="0" * 64)
    save_model(tmp_path, params, job, 1)
    model = tmp_path / MODEL_FILE
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF  # one bit of the last tensor
    model.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged"):
        load_model(tmp_path)
    with pytest.raises(CheckpointError, match="elsewhere does not exist; give a checkpoint"):
        load_model(tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty holds no model.safetensors"):
        load_model(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="not a safetensors"):
        weights_from_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")


def test_gwtf_reference_writes_the_model_it_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = dataclasses.replace(PRESETS["tiny-llama"], iterations=2)
    assert main(["reference", "--job", "tiny-llama", "--iterations", "2", "--json",
                 "--checkpoint-dir", str(tmp_path)]) == 0  # fmt: skip
    capsys.readouterr()
    ref = train_reference(job)
    saved = load_model(tmp_path)
    assert saved.job.job_id == job.job_id and saved.iteration == 2
    assert saved.checksum == ref.param_checksum
    assert list(saved.parameters) == canonical_order(list(ref.parameters))
