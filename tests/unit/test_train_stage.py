"""Partitioning and stage modules: a stage built alone is bit-identical to its slice of the model,
and a chain of stages computes exactly the whole model's forward and gradients."""

from __future__ import annotations

import pytest
import torch

from gwtf.train.data import load_corpus, microbatch
from gwtf.train.executor import MicrobatchKey, StageExecutor
from gwtf.train.job import JobConfig, ModelConfig
from gwtf.train.partition import PartitionError, partition, stage_spec
from gwtf.train.stage import DropoutSeeds, build_model, build_stage_of, canonical_order


def small_job(kind: str, layers: int = 4) -> JobConfig:
    model = ModelConfig(kind=kind, layers=layers, width=32, heads=4, seq_len=16, dropout=0.2)
    return JobConfig(model=model, iterations=2, microbatches=4, microbatch_size=3, seed=7)


@pytest.mark.parametrize(
    ("layers", "stages", "sizes"),
    [(6, 3, [2, 2, 2]), (7, 3, [3, 2, 2]), (8, 3, [3, 3, 2]), (5, 5, [1] * 5), (3, 1, [3])],
)
def test_blocks_are_spread_evenly_extra_ones_first(
    layers: int, stages: int, sizes: list[int]
) -> None:
    specs = partition(layers, stages)
    assert [len(spec.layers) for spec in specs] == sizes
    assert specs[0].first_layer == 0 and specs[-1].end_layer == layers
    assert all(a.end_layer == b.first_layer for a, b in zip(specs, specs[1:], strict=False))
    assert specs[0].is_first and specs[-1].is_last


def test_a_model_that_does_not_cut_is_one_sentence() -> None:
    with pytest.raises(PartitionError) as caught:
        partition(2, 3)
    assert str(caught.value) == (
        "a model with 2 layers cannot be cut into 3 stages (every stage holds at least one "
        "block); use at most 2 stages or a model with at least 3 layers"
    )
    with pytest.raises(PartitionError, match="at least one stage"):
        partition(2, 0)
    with pytest.raises(PartitionError, match=r"stage 3 does not exist .* \(stages are 0..2\)"):
        stage_spec(6, 3, 3)
    with pytest.raises(PartitionError, match="cannot be cut into 3 stages"):
        StageExecutor(small_job("gpt", layers=2), 0, 3)


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_stage_built_alone_equals_its_slice_of_the_whole_model(kind: str) -> None:
    job = small_job(kind, layers=5)
    whole = build_model(job.model, job.seed).state_dict()
    seen: set[str] = set()
    for stage in range(3):
        alone = build_stage_of(job.model, job.seed, stage, 3).state_dict()
        for name, tensor in alone.items():
            assert torch.equal(tensor, whole[name]), name
        assert not seen & alone.keys()
        seen |= alone.keys()
    assert seen == whole.keys()
    other_seed = build_model(job.model, job.seed + 1).state_dict()
    assert not torch.equal(
        other_seed["blocks.0.attn.qkv.weight"], whole["blocks.0.attn.qkv.weight"]
    )


def test_building_and_running_a_stage_leaves_the_global_rng_alone() -> None:
    job = small_job("gpt")
    before = torch.random.get_rng_state()
    module = build_model(job.model, job.seed)
    tokens = torch.zeros(2, 16, dtype=torch.int64)
    module(tokens, DropoutSeeds(job.seed, 0, 0)).sum().backward()
    assert torch.equal(before, torch.random.get_rng_state())


def test_dropout_masks_follow_the_seeds_and_none_disables_them() -> None:
    job = small_job("llama")
    module = build_model(job.model, job.seed)
    tokens = torch.arange(32, dtype=torch.int64).view(2, 16)
    with torch.no_grad():
        a = module(tokens, DropoutSeeds(job.seed, 0, 0))
        b = module(tokens, DropoutSeeds(job.seed, 0, 0))
        c = module(tokens, DropoutSeeds(job.seed, 0, 1))
        d = module(tokens, DropoutSeeds(job.seed, 1, 0))
        e = module(tokens, None)
        f = module(tokens, None)
    assert torch.equal(a, b) and torch.equal(e, f)
    assert not torch.equal(a, c) and not torch.equal(a, d) and not torch.equal(a, e)


def test_canonical_order_is_embed_blocks_by_index_then_head() -> None:
    names = ["head.out.weight", "blocks.10.ln1.weight", "blocks.2.fc.bias", "embed.tok.weight"]
    assert canonical_order(names) == [
        "embed.tok.weight",
        "blocks.2.fc.bias",
        "blocks.10.ln1.weight",
        "head.out.weight",
    ]


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_stages_chained_compute_the_whole_model_bit_for_bit(kind: str) -> None:
    """The forward and every per-microbatch gradient of a 3-stage chain equal the one-stage
    model's exactly: cutting the graph changes no floating-point operation."""
    job = small_job(kind)
    corpus = load_corpus()
    tokens, labels = microbatch(corpus, job.seed, 0, 2, job.microbatch_size, job.model.seq_len)
    key = MicrobatchKey(job.job_id, 0, 2)

    whole = StageExecutor(job, 0, 1)
    loss_whole = whole.forward(key, tokens, labels).loss

    stages = [StageExecutor(job, s, 3) for s in range(3)]
    h = stages[0].forward(key, tokens).output
    assert h is not None
    h = stages[1].forward(key, h).output
    assert h is not None
    last = stages[2].forward(key, h, labels)
    assert last.grad_input is not None
    g = stages[1].backward(key, last.grad_input)
    assert g is not None
    assert stages[0].backward(key, g) is None

    assert last.loss == loss_whole
    sums = whole.contribution("whole").grad_sums
    for executor in stages:
        for name, grad in executor.contribution("part").grad_sums.items():
            assert torch.equal(grad, sums[name]), name
