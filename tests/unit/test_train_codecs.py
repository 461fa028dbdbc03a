"""Codecs at stage boundaries (gwtf.train.codecs, gwtf.flow.compression): error bounds,
determinism, refusal of bad parts, the job's plan, and the central property with compression
on: a pipeline whose stages send each other the codecs' parts ends equal to the one-process
reference with the same plan, bit for bit."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from gwtf.flow.compression import (
    CODECS,
    boundary_sizes,
    plan_boundaries,
    stage_codec_seconds,
    swarm_plan,
    wire_bytes,
)
from gwtf.flow.topology import LinkSpec, NodeSpec
from gwtf.train.codecs import CodecError, decode, encode, part_specs, roundtrip, side_seconds
from gwtf.train.commit import combine_contributions
from gwtf.train.data import Corpus, job_microbatch, load_corpus
from gwtf.train.executor import MicrobatchKey, StageExecutor
from gwtf.train.job import JobConfig, JobError, ModelConfig, job_from_dict
from gwtf.train.reference import train_reference

LOSSY = [name for name in CODECS if name != "none"]


def _tensor(seed: int, shape: tuple[int, ...] = (4, 16, 32)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Blocks of very different magnitudes, as activations and gradients have.
    scale = torch.logspace(-6, 2, shape[-1])
    return torch.randn(*shape, generator=generator) * scale


@pytest.mark.parametrize("name", LOSSY)
def test_each_codec_stays_within_half_a_step_of_its_block(name: str) -> None:
    x = _tensor(1)
    y = roundtrip(name, x)
    assert y.shape == x.shape and y.dtype == torch.float32
    levels, block = CODECS[name].levels, CODECS[name].block
    flat, err = x.reshape(-1, block), (x - y).abs().reshape(-1, block)
    bound = flat.abs().amax(dim=1, keepdim=True) / (2 * levels)
    assert bool((err <= bound * (1 + 1e-5) + 1e-30).all())
    # And not trivially: the codec does lose something, and less for int8 than for int4.
    assert float(err.max()) > 0


def test_int8_is_closer_than_int4_and_both_keep_the_signal() -> None:
    x = _tensor(2)
    rel = {n: float((x - roundtrip(n, x)).norm() / x.norm()) for n in LOSSY}
    assert rel["int8"] < rel["int4"] < 0.15
    assert rel["int8"] < 0.01


@pytest.mark.parametrize("name", LOSSY)
def test_parts_take_the_bytes_the_routing_counts(name: str) -> None:
    x = _tensor(3, (5, 7, 11))  # not a whole number of blocks: the last is padded
    parts = encode(name, x)
    sent = sum(p.numel() * p.element_size() for p in parts.values())
    assert sent == wire_bytes(name, x.numel())
    assert {k: (v.dtype, tuple(v.shape)) for k, v in parts.items()} == part_specs(name, x.numel())
    assert torch.equal(decode(name, parts, tuple(x.shape)), roundtrip(name, x))


def test_zeros_and_a_block_of_zeros_survive() -> None:
    x = torch.zeros(2, 64)
    x[1, 3] = -5.0
    for name in LOSSY:
        y = roundtrip(name, x)
        assert torch.equal(y[0], x[0]) and float(y[1, 3]) == -5.0


@pytest.mark.parametrize("name", LOSSY)
def test_the_same_bits_on_any_thread_count_and_in_another_process(name: str) -> None:
    x = _tensor(4, (8, 64, 64))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = encode(name, x)
        torch.set_num_threads(max(2, threads))
        many = encode(name, x)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one[k], many[k]) for k in one)
    digest = "import hashlib,torch\n"
    code = (
        f"{digest}from gwtf.train.codecs import encode\n"
        "g=torch.Generator().manual_seed(4)\n"
        "x=torch.randn(8,64,64,generator=g)*torch.logspace(-6,2,64)\n"
        f"p=encode({name!r},x)\n"
        "print(hashlib.sha256(b''.join(p[k].numpy().tobytes() for k in sorted(p))).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import hashlib

    local = hashlib.sha256(b"".join(one[k].numpy().tobytes() for k in sorted(one))).hexdigest()
    assert out.stdout.strip() == local


@pytest.mark.parametrize("name", LOSSY)
def test_parts_that_do_not_decode_are_refused_in_one_line(name: str) -> None:
    x = _tensor(5)
    parts = encode(name, x)
    shape = tuple(x.shape)
    bad = [
        {"q": parts["q"]},
        {**parts, "q": parts["q"][:-1]},
        {**parts, "q": parts["q"].to(torch.int16)},
        {**parts, "scale": parts["scale"].clone().fill_(float("nan"))},
        {**parts, "scale": -parts["scale"]},
    ]
    for broken in bad:
        with pytest.raises(CodecError) as err:
            decode(name, broken, shape)
        assert "\n" not in str(err.value)
    with pytest.raises(CodecError):
        decode(name, parts, (shape[0] + 1, *shape[1:]))
    with pytest.raises(CodecError):
        decode("int2", parts, shape)


def test_the_plan_compresses_only_where_the_flow_needs_it() -> None:
    # Two boundaries; the flow is bound by the worst boundary's bytes (a chain), and boundary 1
    # has a fast link: only boundary 0 needs a codec, and only the weakest that lifts it.
    ratio = {"none": 1.0, "int8": 3.76, "int4": 7.1}
    link = (1.0, 100.0)
    compute = 3.0

    def flow(plan: tuple[str, ...]) -> float:
        return min(compute, *(link[b] * ratio[c] for b, c in enumerate(plan)))

    assert plan_boundaries(2, ["int8", "int4"], flow) == ("int8", "none")
    assert plan_boundaries(2, [], flow) == ("none", "none")
    # Both boundaries bind equally: one alone lifts nothing, both get the codec.
    even = (1.0, 1.0)
    assert plan_boundaries(2, ["int8"], lambda p: min(5.0, *(even[b] * ratio[c]
                                                       for b, c in enumerate(p)))) == (
        "int8", "int8")
    # Compute binds: nothing to gain, nothing compressed.
    assert plan_boundaries(2, ["int8", "int4"], lambda p: 0.5) == ("none", "none")


def test_the_swarm_plan_weighs_the_codecs_compute_and_the_activations_dtype() -> None:
    # Two nodes in one place, each on a 0.1 Gbit/s uplink carrying 8 MiB float32 activations
    # (1.5 microbatches/s) while their GPUs do 10: the uplink binds and int8 lifts it.
    act = 8 * 2**20
    nodes = [(NodeSpec.make("a", 0, 0.1, "X"), 0.1), (NodeSpec.make("b", 1, 0.1, "X"), 0.1)]
    intra = LinkSpec(1.0, 100.0)

    def plan(**kwargs: Any) -> tuple[str, ...]:
        return swarm_plan(2, act, nodes, {}, intra, ["int8"], **kwargs)

    assert plan() == ("int8",)
    assert plan(codec_seconds=lambda name: 0.05) == ("int8",)
    # A codec that takes a second a side would slow each node below what its uplink carries.
    assert plan(codec_seconds=lambda name: 1.0) == ("none",)
    # The same bytes as fp16 hold twice the values: int8 halves them rather than quartering.
    assert boundary_sizes(act, ("int8",), values=act // 2) == (wire_bytes("int8", act // 2),)
    assert boundary_sizes(act, ("none", "int8")) == (act, wire_bytes("int8", act // 4))
    assert stage_codec_seconds(("int8", "none", "int4"), {"int8": 1.0, "int4": 2.0}.get) == (
        1.0, 1.0, 2.0, 2.0)


def test_a_codec_side_is_timed_on_this_machine() -> None:
    assert side_seconds("none", 1 << 20) == 0.0
    small, large = side_seconds("int8", 1 << 16), side_seconds("int8", 1 << 24)
    assert 0 < small < large  # scaled past what is timed


def _job(after: dict[int, str] | None, allow: tuple[str, ...] = ("int8", "int4")) -> JobConfig:
    table: dict[str, object] = {
        "iterations": 3, "microbatches": 4, "microbatch_size": 2, "seed": 3,
        "model": {"kind": "gpt", "layers": 4, "width": 32, "heads": 2, "seq_len": 16,
                  "dropout": 0.2},
        "optimizer": {"lr": 3e-3},
        "compression": {"allow": list(allow)},
    }  # fmt: skip
    if after is not None:
        table["compression"]["after"] = {str(b): c for b, c in after.items()}  # type: ignore[index]
    return job_from_dict(table)


def test_the_job_states_its_plan_and_its_id_follows_what_it_computes() -> None:
    plain = _job(None)
    assert not plain.is_planned
    assert _job({}).job_id == plain.job_id  # planned to compress nothing: the same computation
    planned = _job({2: "int8"})
    assert planned.job_id != plain.job_id
    assert planned.compression.codec_after(2) == "int8"
    assert planned.compression.codec_after(1) == "none"
    again = job_from_dict(planned.to_dict())
    assert again == planned and again.job_id == planned.job_id
    assert plain.planned({2: "int8"}).job_id == planned.job_id
    # Jobs that never mention compression keep the ids they had.
    bare = JobConfig(model=ModelConfig(kind="gpt", layers=2, width=32, heads=2, seq_len=16),
                     iterations=1, microbatches=1, microbatch_size=1)
    assert "compression" not in bare.to_dict()
    off = job_from_dict({**bare.to_dict(), "compression": "off"})
    assert off.compression.allow == () and off.job_id == bare.job_id


@pytest.mark.parametrize(
    "compression, words",
    [
        ({"allow": ["int3"]}, "the codecs are"),
        ({"allow": "int8"}, "list of codec names"),
        ({"allow": ["int8"], "after": {"2": "int4"}}, "does not allow"),
        ({"after": {"9": "int8"}}, "between blocks"),
        ({"after": {"x": "int8"}}, "block counts"),
        ({"level": 3}, "unknown key"),
        ("fast", '"off"'),
    ],
)
def test_a_wrong_compression_table_is_one_sentence(compression: object, words: str) -> None:
    table = {**_job(None).to_dict(), "compression": compression}
    with pytest.raises(JobError) as err:
        job_from_dict(table)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def _pipeline(job: JobConfig, corpus: Corpus, stages: int) -> str:
    """The job through `stages` executors that hand each other only the codecs' parts, as nodes
    do over the data plane; returns the parameters' checksum."""
    executors = [StageExecutor(job, s, stages) for s in range(stages)]
    ends = [e.spec.end_layer for e in executors[:-1]]
    codecs = [job.compression.codec_after(end) for end in ends]

    def cross(b: int, tensor: torch.Tensor) -> torch.Tensor:
        parts = encode(codecs[b], tensor)
        return decode(codecs[b], {k: v.clone() for k, v in parts.items()}, tuple(tensor.shape))

    for k in range(job.iterations):
        for m in range(job.microbatches):
            key = MicrobatchKey(job.job_id, k, m)
            tokens, labels = job_microbatch(corpus, job, k, m)
            x = tokens
            for s in range(stages - 1):
                out = executors[s].forward(key, x).output
                assert out is not None
                x = cross(s, out)
            grad = executors[-1].forward(key, x, labels).grad_input
            for s in reversed(range(stages - 1)):
                assert grad is not None
                grad = executors[s].backward(key, cross(s, grad))
        for e in executors:
            e.commit(combine_contributions([e.contribution("n")],
                                           expected_ids=range(job.microbatches)))
    digests = {}
    for e in executors:
        digests.update(e.digests())
    from gwtf.train.state import checksum_of_digests

    return checksum_of_digests(digests)


@pytest.mark.parametrize(
    "after, stages",
    [({2: "int8"}, 2), ({1: "int4", 3: "int8"}, 4), ({1: "int8", 3: "int4"}, 2)],
)
def test_a_pipeline_with_compression_equals_the_reference_with_it(
    corpus: Corpus, after: dict[int, str], stages: int
) -> None:
    """With stages cut where the plan compresses, the codec crosses the wire; with a cut
    elsewhere (the last case: boundary 1 and 3 inside stages of 2 blocks), inside the stage.
    Either way the swarm's arithmetic is the reference's, bit for bit."""
    job = _job(after)
    reference = train_reference(job, corpus)
    assert _pipeline(job, corpus, stages) == reference.param_checksum
    # And compression did change the training: the uncompressed pipeline differs.
    if stages == 2:
        return
    assert _pipeline(_job({}), corpus, stages) != reference.param_checksum


def test_a_planned_job_is_written_beside_a_checkpoint_and_read_back() -> None:
    """The client saves the job a swarm ran (its plan included) as a TOML file beside each
    checkpoint; a plan, even an empty one, must survive that."""
    import tomllib

    from gwtf.train.checkpoints.checkpoint import job_toml

    for after in ({}, {2: "int8", 3: "int4"}):
        job = _job(after)
        again = job_from_dict(tomllib.loads(job_toml(job)))
        assert again == job and again.job_id == job.job_id and again.is_planned
