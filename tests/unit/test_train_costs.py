"""What a node reports to the router: activation bytes and measured compute per microbatch."""

from __future__ import annotations

import pytest
import torch

from gwtf.train.costs import activation_bytes, measure_stage_compute
from gwtf.train.executor import StageExecutor
from gwtf.train.job import PRESETS, JobConfig, ModelConfig


def test_activation_bytes_is_float32_batch_by_sequence_by_width() -> None:
    assert activation_bytes(PRESETS["tiny-gpt"]) == 8 * 64 * 64 * 4


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_measuring_compute_leaves_the_stage_as_it_was(stage: int) -> None:
    model = ModelConfig(kind="llama", layers=3, width=16, heads=2, seq_len=8)
    job = JobConfig(model=model, iterations=1, microbatches=2, microbatch_size=2)
    executor = StageExecutor(job, stage, 3)
    before, rng = executor.checksum(), torch.random.get_rng_state()
    seconds = measure_stage_compute(executor.module, job, repeats=2)
    assert 0 < seconds < 5
    assert executor.checksum() == before and executor.accumulated == ()
    assert all(p.grad is None for p in executor.module.parameters())
    assert torch.equal(rng, torch.random.get_rng_state())
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        measure_stage_compute(executor.module, job, repeats=0)
