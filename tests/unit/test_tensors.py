"""The tensor data plane: codec round trips, every way a peer's stream can be wrong, and a real
grpc.aio server on loopback receiving from `send`."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import pytest
import torch
from grpc import aio
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.node.config import MAX_ID_LENGTH, MAX_MESSAGE_BYTES
from gwtf.node.dataplane import tensors
from gwtf.node.dataplane.tensors import (
    DATA_PLANE_MAX_MESSAGE_BYTES,
    DEFAULT_DTYPES,
    MAX_HEADER_BYTES,
    MAX_PATH,
    Assembler,
    DataPlaneServicer,
    MicrobatchTag,
    TensorError,
    TensorLimits,
    TensorSpec,
    encode,
    encode_wire,
    send,
)
from gwtf.node.errors import Refusal, UnknownJob
from gwtf.v1 import data_pb2, data_pb2_grpc

TAG = MicrobatchTag(
    job_id="job-1",
    iteration=3,
    microbatch=7,
    direction="forward",
    sender="s1-a",
    path=("s0-a", "s1-a"),
)
LIMITS = TensorLimits()


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return torch.randint(-(2**30), 2**30, shape, generator=gen, dtype=torch.int64).to(dtype)


def assemble(
    chunks: Iterable[data_pb2.DataChunk | bytes],
    limits: TensorLimits = LIMITS,
    expect: Callable[[MicrobatchTag, str], TensorSpec | None] | None = None,
) -> tuple[MicrobatchTag, dict[str, torch.Tensor]]:
    assembler = Assembler(limits, expect)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.finish()


def round_trip(tensors: dict[str, torch.Tensor], chunk_bytes: int = 1 << 20) -> dict[str, Any]:
    """The microbatch through both forms of chunk (messages, wire bytes); checks they agree."""
    messages = list(encode(TAG, tensors, chunk_bytes=chunk_bytes))
    wire = list(encode_wire(TAG, tensors, chunk_bytes=chunk_bytes))
    assert wire == [m.SerializeToString() for m in messages]
    tag, got = assemble(messages)
    assert tag == TAG
    tag, from_wire = assemble(wire)
    assert tag == TAG
    assert_same(from_wire, got)
    return got


def assert_same(got: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(sent)
    for name, tensor in sent.items():
        assert got[name].dtype == tensor.dtype
        assert got[name].shape == tensor.shape
        assert got[name].is_contiguous()
        assert torch.equal(got[name], tensor), name


def rejected(
    chunks: Iterable[data_pb2.DataChunk],
    match: str,
    limits: TensorLimits = LIMITS,
    expect: Callable[[MicrobatchTag, str], TensorSpec | None] | None = None,
) -> str:
    """Both forms of the stream (messages, their wire bytes) are refused with one line."""
    messages = list(chunks)
    with pytest.raises(TensorError, match=match) as info:
        assemble(messages, limits, expect)
    message = str(info.value)
    assert "\n" not in message
    with pytest.raises(TensorError) as from_wire:
        assemble([m.SerializeToString() for m in messages], limits, expect)
    assert str(from_wire.value) == message
    return message


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", sorted(DEFAULT_DTYPES, key=str))
def test_every_allowed_dtype_round_trips_bit_for_bit(dtype: torch.dtype) -> None:
    sent = {"x": sample(dtype, (4, 3, 5))}
    if dtype.is_floating_point:
        # Extremes and signed zero survive too: the bytes travel, not the values.
        info = torch.finfo(dtype)
        sent["x"].view(-1)[:4] = torch.tensor([info.max, info.min, info.tiny, -0.0], dtype=dtype)
    got = round_trip(sent)
    assert_same(got, sent)
    if dtype.is_floating_point:
        assert math.copysign(1.0, float(got["x"].view(-1)[3])) == -1.0


def test_bfloat16_keeps_its_bits() -> None:
    bits = torch.arange(0, 2**15 - 2**7, 37, dtype=torch.int16)  # no NaN patterns
    sent = {"g": bits.view(torch.bfloat16)}
    got = round_trip(sent, chunk_bytes=100)
    assert torch.equal(got["g"].view(torch.int16), bits)


def test_non_contiguous_tensors_arrive_in_logical_order() -> None:
    base = sample(torch.float32, (6, 8))
    sent = {
        "transposed": base.t(),
        "strided": base[::2, 1::3],
        "expanded": torch.arange(4, dtype=torch.int64).expand(3, 4),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    assert not sent["transposed"].is_contiguous()
    got = round_trip(sent, chunk_bytes=17)
    assert_same(got, sent)


def test_tensors_that_need_grad_or_are_views_are_sent_as_values() -> None:
    weight = torch.randn(3, 4, requires_grad=True)
    sent = {"act": weight * 2}
    got = round_trip(sent)
    assert not got["act"].requires_grad
    assert torch.equal(got["act"], sent["act"].detach())


def test_empty_tensors_and_an_empty_microbatch() -> None:
    sent = {"none": torch.empty(0, 5, dtype=torch.float32), "x": torch.ones(3)}
    assert_same(round_trip(sent, chunk_bytes=4), sent)
    chunks = list(encode(TAG, {}))
    assert len(chunks) == 1 and chunks[0].header.tensors == []
    assert round_trip({}) == {}


def test_multiple_tensors_share_chunks_and_keep_their_order() -> None:
    sent = {
        "act": sample(torch.bfloat16, (4, 16, 32)),
        "labels": sample(torch.int64, (4, 16)),
        "mask": sample(torch.int32, (4, 16)),
    }
    assert_same(round_trip(sent, chunk_bytes=1000), sent)


def test_chunk_zero_carries_the_header_and_every_chunk_the_same_payload() -> None:
    sent = {"a": torch.arange(100, dtype=torch.float32), "b": torch.arange(10, dtype=torch.int64)}
    chunks = list(encode(TAG, sent, chunk_bytes=256))
    assert [c.seq for c in chunks] == [0, 1]
    assert chunks[0].HasField("header") and not chunks[1].HasField("header")
    assert [len(c.payload) for c in chunks] == [256, 480 - 256]
    heads = [(t.name, t.dtype, list(t.shape), t.nbytes) for t in chunks[0].header.tensors]
    assert heads == [("a", "float32", [100], 400), ("b", "int64", [10], 80)]
    # A power-of-two tensor is whole chunks: no tail message for the header's bytes.
    assert len(list(encode(TAG, {"x": torch.ones(2**18)}, chunk_bytes=2**20))) == 1


def test_the_largest_message_fits_the_nodes_limit() -> None:
    longest = "n" * MAX_ID_LENGTH
    tag = MicrobatchTag(longest, 2**63, 2**63, "backward", longest, (longest,) * MAX_PATH, 2**31)
    sent = {f"{i}".rjust(MAX_ID_LENGTH, "t"): torch.ones(2**19) for i in range(4)}
    sizes = [len(w) for w in encode_wire(tag, sent)]
    assert max(sizes) <= DATA_PLANE_MAX_MESSAGE_BYTES <= MAX_MESSAGE_BYTES
    header = next(encode(tag, sent)).header.ByteSize()
    assert header <= MAX_HEADER_BYTES
    assert_same(assemble(encode_wire(tag, sent))[1], sent)


def test_a_small_microbatch_is_one_message() -> None:
    sent = {"act": sample(torch.float32, (4, 128, 2))}  # 4 KiB
    chunks = list(encode(TAG, sent))
    assert len(chunks) == 1
    assert_same(round_trip(sent), sent)


@pytest.mark.parametrize("chunk_bytes", [1, 7, 400, 401, 480, 10_000])
def test_chunk_boundaries_anywhere(chunk_bytes: int) -> None:
    sent = {"a": torch.arange(100, dtype=torch.float32), "b": torch.arange(10, dtype=torch.int64)}
    assert_same(round_trip(sent, chunk_bytes=chunk_bytes), sent)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(
            st.sampled_from(sorted(DEFAULT_DTYPES, key=str)),
            st.lists(st.integers(0, 6), min_size=0, max_size=3),
            st.booleans(),
        ),
        max_size=4,
    ),
    chunk_bytes=st.integers(1, 600),
    seed=st.integers(0, 2**16),
)
def test_any_microbatch_round_trips(
    shapes: list[tuple[torch.dtype, list[int], bool]], chunk_bytes: int, seed: int
) -> None:
    sent = {}
    for i, (dtype, shape, transpose) in enumerate(shapes):
        tensor = sample(dtype, tuple(shape), seed + i)
        sent[f"t{i}"] = tensor.t() if transpose and tensor.dim() == 2 else tensor
    assert_same(round_trip(sent, chunk_bytes=chunk_bytes), sent)


def test_tag_round_trips_with_every_field() -> None:
    tag = MicrobatchTag("j", 2**40, 2**33, "backward", "s2-b", ("s0-a", "s1-c", "s2-b"), 3)
    got, tensors = assemble(encode(tag, {"g": torch.ones(2)}))
    assert got == tag and torch.equal(tensors["g"], torch.ones(2))


def test_a_tag_must_name_a_direction() -> None:
    with pytest.raises(ValueError, match="direction"):
        MicrobatchTag("j", 0, 0, "sideways", "s", ())


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
def test_a_dtype_gwtf_cannot_send_is_refused_at_the_sender(dtype: torch.dtype) -> None:
    with pytest.raises(TensorError, match=str(dtype).removeprefix("torch.")):
        list(encode(TAG, {"z": torch.zeros(2, dtype=dtype)}))


# ---------------------------------------------------------------------------- expectations


def expect_act(dtype: torch.dtype | None, shape: tuple[int, ...] | None) -> Any:
    def expect(tag: MicrobatchTag, name: str) -> TensorSpec | None:
        return TensorSpec(dtype, shape) if name == "act" else None

    return expect


def test_expected_dtype_and_shape_are_enforced() -> None:
    act = {"act": torch.ones(4, 8)}
    assert_same(assemble(encode(TAG, act), expect=expect_act(torch.float32, (4, 8)))[1], act)
    assert_same(assemble(encode(TAG, act), expect=expect_act(None, None))[1], act)
    rejected(encode(TAG, act), "'act' is float32, bfloat16 is expected",
             expect=expect_act(torch.bfloat16, None))
    rejected(encode(TAG, act), r"'act' has shape \[4, 8\], \[4, 16\] is expected",
             expect=expect_act(None, (4, 16)))
    rejected(encode(TAG, {"act": torch.ones(4, 8), "junk": torch.ones(1)}),
             "no tensor 'junk' is expected", expect=expect_act(None, None))


def test_expectations_are_checked_before_any_payload_arrives() -> None:
    seen = []

    def expect(tag: MicrobatchTag, name: str) -> TensorSpec | None:
        seen.append((tag, name))
        return TensorSpec(torch.float32, (2, 2))

    first = next(encode(TAG, {"act": torch.ones(3, 3)}, chunk_bytes=1))
    first.payload = b""  # the header alone
    with pytest.raises(TensorError, match="shape"):
        Assembler(LIMITS, expect).add(first)
    assert seen == [(TAG, "act")]


def test_a_refusal_from_expect_passes_through() -> None:
    def expect(tag: MicrobatchTag, name: str) -> TensorSpec | None:
        raise UnknownJob(f"no job {tag.job_id!r} here")

    with pytest.raises(Refusal, match="no job"):
        assemble(encode(TAG, {"act": torch.ones(1)}), expect=expect)


# ---------------------------------------------------------------------------- bad streams


def chunks_of(tensors: dict[str, torch.Tensor], chunk_bytes: int = 64) -> list[Any]:
    return list(encode(TAG, tensors, chunk_bytes=chunk_bytes))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_nan_and_infinity_are_refused(value: float, dtype: torch.dtype) -> None:
    tensor = torch.zeros(50, dtype=dtype)
    tensor[37] = value
    rejected(chunks_of({"ok": torch.ones(2), "act": tensor}), "'act' holds NaN or infinity")
    lenient = TensorLimits(require_finite=False)
    got = assemble(chunks_of({"act": tensor}), limits=lenient)[1]["act"]
    assert got[37].item() != got[37].item() if math.isnan(value) else got[37].item() == value


def test_a_nan_is_refused_as_soon_as_its_chunk_arrives() -> None:
    tensor = torch.zeros(1000)
    tensor[10] = math.nan
    chunks = chunks_of({"act": tensor}, chunk_bytes=400)
    assert len(chunks) > 2
    assembler = Assembler(LIMITS)
    with pytest.raises(TensorError, match="NaN"):
        assembler.add(chunks[0])  # element 10 is in the first chunk, after the header


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    size=st.integers(1, 300),
    bad=st.lists(st.tuples(st.integers(0, 299), st.sampled_from([math.nan, math.inf, -math.inf])),
                 max_size=3),
    chunk_bytes=st.integers(1, 700),
)
def test_nonfinite_values_are_found_wherever_chunks_split_them(
    dtype: torch.dtype, size: int, bad: list[tuple[int, float]], chunk_bytes: int
) -> None:
    tensor = sample(dtype, (size,))
    for where, value in bad:
        tensor[where % size] = value
    chunks = list(encode(TAG, {"act": tensor}, chunk_bytes=chunk_bytes))
    if bad:
        rejected(chunks, "'act' holds NaN or infinity")
    else:
        assert_same(assemble(chunks)[1], {"act": tensor})


def test_every_bfloat16_nan_and_infinity_pattern_is_refused() -> None:
    bits = torch.tensor([0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81], dtype=torch.int32)
    for pattern in bits.to(torch.int16).tolist():
        tensor = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
        tensor.view(torch.int16)[1] = pattern
        rejected(chunks_of({"g": tensor}), "'g' holds NaN or infinity")
    # The largest finite bfloat16 (exponent 0xFE) is fine.
    largest = torch.tensor([0x7F7F], dtype=torch.int16).view(torch.bfloat16)
    assert_same(round_trip({"g": largest}), {"g": largest})


def test_an_oversized_tensor_is_refused_from_its_header_alone() -> None:
    limits = TensorLimits(max_tensor_bytes=1000)
    assert_same(assemble(chunks_of({"x": torch.ones(250)}), limits)[1], {"x": torch.ones(250)})
    # The header of a 2 GiB tensor, without its payload: refused before anything is allocated.
    huge = data_pb2.DataChunk(seq=0)
    huge.header.tag.CopyFrom(chunks_of({})[0].header.tag)
    huge.header.tensors.add(name="x", dtype="float32", shape=[2**29], nbytes=2**31)
    with pytest.raises(TensorError, match=r"'x' is 2147483648 bytes \(at most 268435456\)"):
        Assembler(LIMITS).add(huge)
    rejected(chunks_of({"x": torch.ones(251)}), "'x' is 1004 bytes", limits=limits)


def test_shapes_whose_product_overflows_int64_are_refused() -> None:
    chunk = chunks_of({})[0]
    chunk.header.tensors.add(name="x", dtype="int64", shape=[2**40, 2**40], nbytes=0)
    rejected([chunk], "'x' declares 0 bytes")


def test_too_many_tensors() -> None:
    five = {f"t{i}": torch.ones(1) for i in range(5)}
    rejected(chunks_of(five), r"5 tensors in one microbatch \(at most 4\)")


def test_duplicate_tensor_names() -> None:
    chunks = chunks_of({"x": torch.ones(2)})
    chunks[0].header.tensors.append(chunks[0].header.tensors[0])
    rejected(chunks, "'x' appears twice")


def test_header_lies_about_nbytes() -> None:
    chunks = chunks_of({"x": torch.ones(2, 3)})
    chunks[0].header.tensors[0].nbytes = 20
    rejected(chunks, r"'x' declares 20 bytes, but float32 \[2, 3\] is 24")


def test_unknown_and_refused_dtypes() -> None:
    chunks = chunks_of({"x": torch.ones(2)})
    chunks[0].header.tensors[0].dtype = "float128"
    rejected(chunks, "'x' has unknown dtype 'float128'")
    # A bool tensor's bytes could be other than 0 and 1: no such dtype on the wire.
    chunks[0].header.tensors[0].dtype = "bool"
    chunks[0].header.tensors[0].nbytes = 2
    rejected(chunks, "'x' has unknown dtype 'bool'")
    rejected(chunks_of({"x": torch.ones(2, dtype=torch.int16)}), "int16, which is not accepted")
    only_float = TensorLimits(allowed_dtypes=frozenset({torch.float32}))
    rejected(chunks_of({"x": torch.ones(2, dtype=torch.int64)}), "int64", limits=only_float)


def test_a_stream_without_header() -> None:
    chunks = chunks_of({"x": torch.ones(64)})
    rejected(chunks[1:], "chunk 1 arrived where chunk 0 was expected")
    chunks[0].ClearField("header")
    rejected(chunks, "first chunk has no header")
    rejected([], "ended before its header")


def test_missing_repeated_and_reordered_chunks() -> None:
    chunks = chunks_of({"x": torch.ones(64)})
    assert len(chunks) >= 4
    rejected(chunks[:2] + chunks[3:], "chunk 3 arrived where chunk 2 was expected")
    rejected(chunks[:3] + chunks[2:], "chunk 2 arrived where chunk 3 was expected")
    rejected([chunks[0], chunks[2], chunks[1]] + chunks[3:], "chunk 2 arrived where chunk 1")
    rejected(chunks[:-1], rf"ended after {256 - len(chunks[-1].payload)} of its 256 bytes")


def test_a_second_header_or_extra_bytes() -> None:
    chunks = chunks_of({"x": torch.ones(64)})
    chunks[1].header.CopyFrom(chunks[0].header)
    rejected(chunks, "chunk 1 carries a second header")
    chunks = chunks_of({"x": torch.ones(64)})
    chunks.append(data_pb2.DataChunk(seq=len(chunks), payload=b"\0"))
    rejected(chunks, "more than the 256 bytes its header declares")


def test_bad_tags() -> None:
    def with_tag(**fields: Any) -> list[Any]:
        chunks = chunks_of({"x": torch.ones(2)})
        for key, value in fields.items():
            if key == "path":
                del chunks[0].header.tag.path[:]
                chunks[0].header.tag.path.extend(value)
            else:
                setattr(chunks[0].header.tag, key, value)
        return chunks

    rejected(with_tag(job_id=""), "job id is empty")
    rejected(with_tag(sender="a\nb"), "sender 'a\\\\nb' is not a short printable name")
    rejected(with_tag(direction=0), "direction 0 is neither forward nor backward")
    rejected(with_tag(path=["ok", ""]), "a node id in the path is empty")
    rejected(with_tag(path=["n"] * 5000), "path has 5000 nodes")
    chunks = chunks_of({})
    chunks[0].header.ClearField("tag")
    rejected(chunks, "header has no microbatch tag")


def test_an_oversized_header() -> None:
    chunks = chunks_of({})
    chunks[0].header.tensors.add(name="x" * (MAX_HEADER_BYTES + 1), dtype="float32")
    rejected(chunks, "header is over")


def test_a_failed_assembler_does_not_yield_partial_tensors() -> None:
    chunks = chunks_of({"x": torch.ones(64)})
    assembler = Assembler(LIMITS)
    assembler.add(chunks[0])
    with pytest.raises(TensorError):
        assembler.add(chunks[0])
    with pytest.raises(TensorError, match="ended after"):
        assembler.finish()


# ---------------------------------------------------------------------------- wire bytes


def wire_rejected(chunks: list[bytes], match: str) -> None:
    with pytest.raises(TensorError, match=match) as info:
        assemble(chunks)
    assert "\n" not in str(info.value)


def test_wire_chunks_that_do_not_parse() -> None:
    wire = list(encode_wire(TAG, {"x": torch.ones(64)}, chunk_bytes=100))
    wire_rejected([wire[0][:-1]], "truncated field")
    wire_rejected([wire[0] + b"\x80"], "bad varint")
    wire_rejected([b"\x0b"], "wire type 3")
    wire_rejected([b"\x00\x00"], "field 0")
    wire_rejected([b"\x0a\x01\x00"], "field 1 has the wrong wire type")
    wire_rejected([b"\x12\x02\xff\xff"], "header does not parse")
    wire_rejected([wire[0] + b"\x1a\x01\x00"], "repeats its field 3")


def test_wire_fields_this_version_does_not_know_are_skipped() -> None:
    sent = {"x": torch.arange(64, dtype=torch.float32)}
    wire = list(encode_wire(TAG, sent, chunk_bytes=100))
    # Field 9 (varint), 10 (8 bytes), 11 (length-delimited), 12 (4 bytes): a later version's.
    extra = b"\x48\x05" + b"\x51" + bytes(8) + b"\x5a\x02ab" + b"\x65" + bytes(4)
    assert_same(assemble([w + extra for w in wire])[1], sent)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_are_a_chunk_or_a_tensor_error(data: bytes) -> None:
    assembler = Assembler(LIMITS)
    try:
        assembler.add(data)
        assembler.finish()
    except TensorError as err:
        assert "\n" not in str(err)


@settings(max_examples=200, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1,
                      max_size=4))
def test_corrupted_wire_chunks_are_refused_or_carry_other_values(
    flips: list[tuple[int, int]],
) -> None:
    wire = [bytearray(w) for w in encode_wire(TAG, {"x": torch.ones(30)}, chunk_bytes=90)]
    for where, xor in flips:
        chunk = wire[where % len(wire)]
        chunk[where % len(chunk)] ^= xor
    try:
        assemble([bytes(w) for w in wire])
    except TensorError as err:
        assert "\n" not in str(err)


# ---------------------------------------------------------------------------- over gRPC


class Receiver:
    """A grpc.aio server on 127.0.0.1, port 0, serving DataPlaneServicer into a list; `wire`
    serves and sends chunks as wire bytes (tensors' own stub and registration), otherwise
    through the generated protobuf code."""

    def __init__(self, wire: bool, expect: Any = None, limits: TensorLimits = LIMITS) -> None:
        self.wire = wire
        self.got: list[tuple[MicrobatchTag, dict[str, torch.Tensor]]] = []
        self.expect = expect
        self.limits = limits
        self.fail_with: Exception | None = None

    async def handle(self, tag: MicrobatchTag, tensors: dict[str, torch.Tensor]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.got.append((tag, tensors))

    async def __aenter__(self) -> Any:
        self.server = aio.server()
        servicer = DataPlaneServicer(self.handle, self.limits, self.expect)
        if self.wire:
            tensors.add_DataPlaneServicer_to_server(servicer, self.server)
        else:
            data_pb2_grpc.add_DataPlaneServicer_to_server(servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = aio.insecure_channel(f"127.0.0.1:{port}")
        if self.wire:
            return tensors.DataPlaneStub(self.channel)
        return data_pb2_grpc.DataPlaneStub(self.channel)

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(grace=None)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


async def expect_code(code: grpc.StatusCode, call: Awaitable[Any]) -> str:
    with pytest.raises(aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_send_to_a_real_server(wire: bool) -> None:
    async def main() -> None:
        receiver = Receiver(wire, expect=expect_act(torch.bfloat16, (4, 64, 32)))
        async with receiver as stub:
            act = {"act": sample(torch.bfloat16, (4, 64, 32))}
            await send(stub, TAG, act, timeout=10, chunk_bytes=3000)
            strided = {"act": sample(torch.bfloat16, (4, 32, 64), seed=1).transpose(1, 2)}
            await send(stub, TAG, strided, timeout=10)
        assert [tag for tag, _ in receiver.got] == [TAG, TAG]
        assert_same(receiver.got[0][1], act)
        assert_same(receiver.got[1][1], strided)

    run(main)


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_a_large_tensor_in_many_chunks(wire: bool) -> None:
    async def main() -> None:
        receiver = Receiver(wire)
        async with receiver as stub:
            big = {"act": sample(torch.float32, (4, 1024, 1024))}  # 16 MiB
            await send(stub, TAG, big, timeout=30)
        assert_same(receiver.got[0][1], big)

    run(main)


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_bad_streams_get_invalid_argument_and_the_server_keeps_serving(wire: bool) -> None:
    async def main() -> None:
        receiver = Receiver(wire, expect=expect_act(torch.float32, None))
        async with receiver as stub:
            bad = torch.ones(8)
            bad[3] = math.nan
            details = await expect_code(
                grpc.StatusCode.INVALID_ARGUMENT, send(stub, TAG, {"act": bad}, timeout=10)
            )
            assert details == f"{TAG}: tensor 'act' holds NaN or infinity"
            await expect_code(
                grpc.StatusCode.INVALID_ARGUMENT,
                send(stub, TAG, {"act": torch.ones(2, dtype=torch.float64)}, timeout=10),
            )
            chunks = list(encode(TAG, {"act": torch.ones(100)}, chunk_bytes=64))
            del chunks[2]
            details = await expect_code(
                grpc.StatusCode.INVALID_ARGUMENT, stub.Send(iter(chunks), timeout=10)
            )
            assert "chunk 3 arrived where chunk 2 was expected" in details
            # The sender is still writing a long stream when the receiver refuses it: it hears
            # the refusal, not grpc's INTERNAL for a write to a finished call (3 in 200 did
            # before the receiver drained refused streams).
            long = list(encode(TAG, {"act": torch.ones(20_000)}, chunk_bytes=64))
            del long[2]
            for _ in range(20):
                await expect_code(
                    grpc.StatusCode.INVALID_ARGUMENT, stub.Send(iter(long), timeout=10)
                )
            await expect_code(grpc.StatusCode.INVALID_ARGUMENT, stub.Send(iter([]), timeout=10))
            # The next valid stream is served as if nothing had happened.
            await send(stub, TAG, {"act": torch.ones(3)}, timeout=10)
        assert len(receiver.got) == 1
        assert torch.equal(receiver.got[0][1]["act"], torch.ones(3))

    run(main)


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_a_chunk_that_does_not_parse(wire: bool) -> None:
    async def main() -> None:
        receiver = Receiver(wire)
        async with receiver as stub:
            raw = receiver.channel.stream_unary(
                "/gwtf.v1.DataPlane/Send",
                request_serializer=lambda b: b,
                response_deserializer=data_pb2.DataAck.FromString,
            )
            good = next(encode(TAG, {"act": torch.ones(4)})).SerializeToString()
            await expect_code(grpc.StatusCode.INVALID_ARGUMENT, raw(iter([b"\xff\xff\xff"])))
            await raw(iter([good]), timeout=10)
            await send(stub, TAG, {"act": torch.ones(3)}, timeout=10)
        assert len(receiver.got) == 2

    run(main)


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_the_handler_may_refuse_or_fail(wire: bool) -> None:
    async def main() -> None:
        receiver = Receiver(wire)
        async with receiver as stub:
            receiver.fail_with = UnknownJob("no job 'job-1' here")
            details = await expect_code(
                grpc.StatusCode.NOT_FOUND, send(stub, TAG, {"act": torch.ones(3)}, timeout=10)
            )
            assert details == "no job 'job-1' here"
            receiver.fail_with = RuntimeError("boom")
            details = await expect_code(
                grpc.StatusCode.INTERNAL, send(stub, TAG, {"act": torch.ones(3)}, timeout=10)
            )
            assert "RuntimeError" in details
            receiver.fail_with = None
            await send(stub, TAG, {"act": torch.ones(3)}, timeout=10)
        assert len(receiver.got) == 1

    run(main)


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "protobuf"])
def test_delay_is_awaited_once_with_the_stream_size_within_the_deadline(wire: bool) -> None:
    async def main() -> None:
        delays: list[int] = []

        async def delay(nbytes: int) -> None:
            delays.append(nbytes)
            await asyncio.sleep(0.2)

        receiver = Receiver(wire)
        async with receiver as stub:
            big = {"act": torch.ones(4096)}
            await send(stub, TAG, big, timeout=10, chunk_bytes=1000, delay=delay)
            assert len(delays) == 1 and 16384 < delays[0] < 16384 + 200
            await expect_code(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                send(stub, TAG, big, timeout=0.1, delay=delay),
            )
        assert len(receiver.got) == 1

    run(main)


def test_an_unreachable_peer_is_a_grpc_error() -> None:
    async def main() -> None:
        async with aio.insecure_channel("127.0.0.1:1") as channel:
            stub = data_pb2_grpc.DataPlaneStub(channel)
            await expect_code(
                grpc.StatusCode.UNAVAILABLE, send(stub, TAG, {"act": torch.ones(3)}, timeout=5)
            )

    run(main)
