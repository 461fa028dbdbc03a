"""Resuming from a checkpoint (gwtf.train.checkpoints.resume): a job stopped after iteration k,
written to a folder, and continued from there (under any cut of the model into stages) ends bit for
bit equal to the same job trained without a stop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gwtf.train.checkpoints.checkpoint import CheckpointError, merge_stages, save_model
from gwtf.train.checkpoints.resume import (
    OPTIMIZER_FILE,
    _meta_stage,
    _positions,
    _state_positions,
    load_resumable,
    save_optimizer,
    stage_state,
    unpack_stage,
)
from gwtf.train.commit import combine_contributions
from gwtf.train.data import Corpus, job_microbatch, load_corpus
from gwtf.train.executor import MicrobatchKey, StageExecutor
from gwtf.train.job import JobConfig, ModelConfig, OptimizerConfig
from gwtf.train.reference import train_reference
from gwtf.train.state import unpack_state

JOB = JobConfig(
    model=ModelConfig(kind="llama", layers=4, width=32, heads=2, seq_len=16, dropout=0.1),
    optimizer=OptimizerConfig(lr=3e-3),
    iterations=4,
    microbatches=4,
    microbatch_size=2,
    seed=3,
)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def _pipeline_iteration(stages: list[StageExecutor], corpus: Corpus, k: int) -> None:
    """Every microbatch of iteration k forward and back through the stages, then the commits."""
    ids = list(range(JOB.microbatches))
    for m in ids:
        key = MicrobatchKey(JOB.job_id, k, m)
        tokens, labels = job_microbatch(corpus, JOB, k, m)
        payload = tokens
        for stage in stages[:-1]:
            out = stage.forward(key, payload).output
            assert out is not None
            payload = out
        grad = stages[-1].forward(key, payload, labels).grad_input
        for stage in reversed(stages[:-1]):
            assert grad is not None
            grad = stage.backward(key, grad)
    for stage in stages:
        stage.commit(combine_contributions([stage.contribution("n")], expected_ids=ids))


def _checkpoint(stages: list[StageExecutor], folder: Path) -> None:
    """What the client writes from the replicas' state bytes (gwtf.client.download)."""
    parts = [unpack_stage(stage.state_bytes(), JOB) for stage in stages]
    (iteration,) = {part[0] for part in parts}
    optimizer = {name: t for part in parts for name, t in part[2].items()}
    save_optimizer(folder, optimizer, JOB, iteration)
    save_model(folder, merge_stages([part[1] for part in parts]), JOB, iteration)


@pytest.mark.parametrize(("before", "after", "stop"), [(2, 3, 2), (3, 1, 1), (1, 4, 0)])
def test_a_job_resumed_under_another_cut_ends_equal_to_an_uninterrupted_run(
    before: int, after: int, stop: int, corpus: Corpus, tmp_path: Path
) -> None:
    first = [StageExecutor(JOB, s, before) for s in range(before)]
    for k in range(stop):
        _pipeline_iteration(first, corpus, k)
    _checkpoint(first, tmp_path)
    checkpoint = load_resumable(tmp_path)
    assert checkpoint.iteration == stop
    second = [
        StageExecutor.from_state(JOB, s, after, stage_state(checkpoint, s, after))
        for s in range(after)
    ]
    assert all(stage.iteration == stop for stage in second)
    for k in range(stop, JOB.iterations):
        _pipeline_iteration(second, corpus, k)
    reference = train_reference(JOB, corpus)
    resumed = merge_stages([stage.parameters() for stage in second])
    assert resumed.keys() == reference.parameters.keys()
    assert all(torch.equal(resumed[n], reference.parameters[n]) for n in resumed)
    # Without the optimizer state the same weights continue differently: it was needed.
    if stop:
        bare = StageExecutor(JOB, 0, 1)
        with torch.no_grad():
            for name, param in bare.parameters().items():
                param.copy_(checkpoint.saved.parameters[name])
        bare.iteration = stop
        for k in range(stop, JOB.iterations):
            _pipeline_iteration([bare], corpus, k)
        assert not torch.equal(bare.parameters()["head.out.weight"],
                               reference.parameters["head.out.weight"])  # fmt: skip


def test_a_checkpoint_that_cannot_resume_says_why(corpus: Corpus, tmp_path: Path) -> None:
    stages = [StageExecutor(JOB, s, 2) for s in range(2)]
    _pipeline_iteration(stages, corpus, 0)
    save_model(tmp_path, merge_stages([s.parameters() for s in stages]), JOB, 1)
    with pytest.raises(CheckpointError, match=f"no {OPTIMIZER_FILE}: only a checkpoint written"):
        load_resumable(tmp_path)
    _checkpoint(stages, tmp_path)
    with safe_open(str(tmp_path / OPTIMIZER_FILE), framework="pt") as handle:
        meta = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    assert meta["iteration"] == "1" and any(n.startswith("exp_avg_sq/blocks.3.") for n in tensors)
    _pipeline_iteration(stages, corpus, 1)  # the weights move on; the optimizer file does not
    save_model(tmp_path, merge_stages([s.parameters() for s in stages]), JOB, 2)
    with pytest.raises(CheckpointError, match="iteration 1 but the weights of iteration 2"):
        load_resumable(tmp_path)
    save_optimizer(tmp_path, {"exp_avg/blocks.9.nothing": torch.zeros(1)}, JOB, 2)
    with pytest.raises(CheckpointError, match="which no parameter of the model has"):
        load_resumable(tmp_path)


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_state_names_its_optimizer_positions_as_its_module_does(kind: str) -> None:
    """A client reads a stage's optimizer state by name without building the stage (whose first
    build on the meta device held its first checkpoint up for seconds)."""
    model = ModelConfig(kind=kind, layers=4, width=32, heads=2, seq_len=16, kv_heads=1)
    job = JobConfig(model=model, iterations=1, microbatches=1, microbatch_size=1)
    for stage in range(3):
        state = StageExecutor(job, stage, 3).state_bytes()
        from_state = _state_positions(unpack_state(state).model)
        assert from_state == _positions(_meta_stage(job, stage, 3), job)
