"""Gradient sums on the wire between stage replicas (gwtf.node.dataplane.gradsync)."""

import dataclasses

import pytest
import torch

from gwtf.node.dataplane.gradsync import (
    KEPT,
    PARTIAL,
    REDUCED,
    WHOLE,
    ContributionAssembler,
    ContributionError,
    ContributionHeader,
    KeptHop,
    encode,
    flatten,
    unflatten,
)
from gwtf.v1 import job_pb2

SHAPES = {"b.weight": (3, 5), "a.bias": (7,), "c": (2, 2, 2)}
NUMEL = sum(torch.Size(s).numel() for s in SHAPES.values())


def sums(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in SHAPES.items()}


def header(numel: int = NUMEL, ids: tuple[int, ...] = (0, 3), dtype: str = "float64") -> (
    ContributionHeader
):
    return ContributionHeader("peer", "job-1", 4, 1, ids, dtype, numel)


def assemble(chunks: list[job_pb2.ContributionChunk]) -> tuple[ContributionHeader, torch.Tensor]:
    assembler = ContributionAssembler(lambda h: NUMEL)
    for chunk in chunks:
        # Through the wire format, as grpc carries it.
        assembler.add(job_pb2.ContributionChunk.FromString(chunk.SerializeToString()))
    return assembler.finish()


def test_sums_arrive_bit_for_bit_in_small_chunks() -> None:
    original = sums()
    flat = flatten(original, sorted(SHAPES), torch.float64)
    chunks = list(encode(header(), flat, chunk_bytes=40))
    assert len(chunks) == 1 + -(-NUMEL * 8 // 40)
    got_header, got = assemble(chunks)
    assert got_header == header()
    back = unflatten(got, SHAPES)
    assert set(back) == set(SHAPES)
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor)
        assert back[name].dtype == torch.float64


def test_a_replica_with_nothing_accumulated_sends_the_header_alone() -> None:
    flat = flatten({}, sorted(SHAPES), torch.float64)
    chunks = list(encode(header(0, ids=()), flat))
    assert len(chunks) == 1
    got_header, got = assemble(chunks)
    assert got_header.microbatches == () and got.numel() == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: [job_pb2.ContributionChunk(seq=1)], "where chunk 0"),
        (lambda: [job_pb2.ContributionChunk(seq=0)], "no header"),
        (lambda: list(encode(header(NUMEL - 1), torch.zeros(NUMEL - 1, dtype=torch.float64))),
         "values"),
        (lambda: list(encode(header(dtype="int8"), torch.zeros(NUMEL, dtype=torch.float64))),
         "dtype"),
        (lambda: list(encode(header(ids=(1, 1)), torch.zeros(NUMEL, dtype=torch.float64))),
         "twice"),
        (lambda: list(encode(header(), torch.zeros(NUMEL + 3, dtype=torch.float64))), "more than"),
        (lambda: list(encode(header(), torch.zeros(NUMEL, dtype=torch.float64)))[:1], "ended"),
        (lambda: list(encode(header(), torch.full((NUMEL,), float("nan"), dtype=torch.float64))),
         "NaN"),
        (lambda: [*encode(header(), torch.zeros(NUMEL, dtype=torch.float64), chunk_bytes=64),
                  ][:1] + [job_pb2.ContributionChunk(seq=1, header=job_pb2.ContributionHeader())],
         "second header"),
    ],
)
def test_malformed_streams_are_refused_with_one_sentence(make: object, message: str) -> None:
    with pytest.raises(ContributionError, match=message):
        assemble(make())  # type: ignore[operator]


def test_unflatten_refuses_a_vector_of_another_size() -> None:
    with pytest.raises(ContributionError):
        unflatten(torch.zeros(NUMEL + 1, dtype=torch.float64), SHAPES)


def test_a_screening_stage_takes_non_finite_sums_in_for_its_screen_to_name() -> None:
    flat = flatten(sums(), sorted(SHAPES), torch.float64)
    flat[3] = float("inf")
    assembler = ContributionAssembler(lambda h: NUMEL)
    for chunk in encode(header(), flat, chunk_bytes=40):
        assembler.add(chunk)
    got_header, got = assembler.finish(allow_non_finite=True)
    assert got_header == header() and torch.equal(got, flat)


def test_a_slice_travels_with_its_kind_range_and_basis() -> None:
    flat = flatten(sums(), sorted(SHAPES), torch.float64)
    for kind, offset in ((PARTIAL, 9), (REDUCED, 6)):
        sent = dataclasses.replace(
            header(numel=8), kind=kind, offset=offset, slice_lo=6, slice_hi=17,
            basis="ab" * 16 if kind == REDUCED else "",
        )
        assembler = ContributionAssembler(lambda h: h.numel)
        for chunk in encode(sent, flat[offset : offset + 8], chunk_bytes=24):
            assembler.add(job_pb2.ContributionChunk.FromString(chunk.SerializeToString()))
        got_header, got = assembler.finish()
        assert got_header == sent
        assert torch.equal(got, flat[offset : offset + 8])
    assert header().kind == WHOLE


def test_a_contribution_of_an_unknown_kind_is_refused() -> None:
    pb = job_pb2.ContributionHeader(sender="peer", job_id="job-1", dtype="float64", kind=7)
    assembler = ContributionAssembler(lambda h: 0)
    with pytest.raises(ContributionError, match="kind 7 is not known"):
        assembler.add(job_pb2.ContributionChunk(seq=0, header=pb))


def test_a_kept_sum_travels_with_the_senders_records_and_bad_ones_are_refused() -> None:
    """A shipment to a keeper (bounded replay): the running sum and, per microbatch, where it
    came from, whose gradient came back, and on the last stage its loss and path."""
    flat = flatten(sums(), sorted(SHAPES), torch.float64)
    sent = dataclasses.replace(header(), kind=KEPT, hops=(
        KeptHop(0, "up", "down"), KeptHop(3, "", "", 2.5, ("h0", "a1", "peer"))))
    got_header, got = assemble(list(encode(sent, flat, chunk_bytes=64)))
    assert got_header == sent and torch.equal(got, flat)
    for hops, message in (
        ((KeptHop(9, "up", "down"),), "hops name a microbatch it does not hold"),
        ((KeptHop(0, "x" * 201),), "longer than 200"),
        ((KeptHop(0, loss=float("nan")),), "has loss nan"),
    ):
        bad = dataclasses.replace(sent, hops=hops)
        with pytest.raises(ContributionError, match=message):
            assemble(list(encode(bad, flat)))
