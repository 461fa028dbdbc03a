"""The tensor data plane: one microbatch's tensors from a node to its next hop (docs/design.md 3).

The API (what the job runtime uses):

    MicrobatchTag(job_id, iteration, microbatch, direction, sender, path, attempt=0)
        which microbatch a stream carries; `direction` is "forward" (activations, plus labels
        to the last stage) or "backward" (gradients); `path` lists the node ids the microbatch
        went through so far, its data holder first; `attempt` counts resends/replays.
    TensorSpec(dtype, shape)
        what a receiver expects of one named tensor; a None field allows anything.
    TensorLimits(max_tensor_bytes, max_tensors, allowed_dtypes, require_finite)
        what a receiver accepts from any peer at all.
    TensorError(ValueError)
        anything wrong with a stream; its message is one line, fit for the peer and the log.

    encode(tag, tensors, *, chunk_bytes=CHUNK_BYTES) -> Iterator[DataChunk]
    encode_wire(tag, tensors, *, chunk_bytes=CHUNK_BYTES) -> Iterator[bytes]
    Assembler(limits, expect=None); .add(chunk: DataChunk | bytes); .finish() -> (tag, tensors)
    await send(stub, tag, tensors, *, timeout, chunk_bytes=CHUNK_BYTES, delay=None)
    DataPlaneStub(channel)
        the client stub `send` is fastest with (chunks serialised straight from the tensors);
        `data_pb2_grpc.DataPlaneStub` works too, through protobuf messages
    DataPlaneServicer(handler, limits, expect=None)
    add_DataPlaneServicer_to_server(servicer, server)
        serves it with chunks handed over as wire bytes (one copy of the payload, into the
        tensor); the generated `data_pb2_grpc.add_DataPlaneServicer_to_server` works too

`expect(tag, name)` is asked once per tensor, when the header arrives (before any payload is
received or memory allocated): it returns the `TensorSpec` that tensor must meet, or None when
no tensor of that name belongs in this microbatch (the stream is then rejected). It may raise
`TensorError`, or the node's `Refusal` (for example for an unknown job), to reject the stream.

The wire (protos/gwtf/v1/data.proto): a client stream of `DataChunk`s. Chunk 0 carries the tag
and every tensor's header (name, dtype, shape, nbytes); the payload of the chunks, concatenated,
is the raw bytes of the tensors in header order (C-contiguous, little-endian: every machine gwtf
runs on). Chunks are numbered, so a lost, repeated or reordered chunk is an error, not a silently
corrupted tensor. The receiver checks every header against its limits and `expect` before it
allocates, allocates a tensor only once its first byte arrives (a peer cannot pin memory with
headers alone), copies each chunk's payload straight into the tensor's storage, checks floating
tensors for NaN and infinity as their elements complete, and at the end checks completeness.

Sizes: a chunk carries `chunk_bytes` of payload (the last one less), chunk 0 the header besides
(`MAX_HEADER_BYTES` at most), so a tensor of a power-of-two size is whole chunks and a small
microbatch one message. With the default `CHUNK_BYTES` every message stays under
`DATA_PLANE_MAX_MESSAGE_BYTES`, itself under the node's `MAX_MESSAGE_BYTES` (4 MiB): the node's
channel and server options need no change for the data plane.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch
from google.protobuf.message import DecodeError
from grpc import aio

from gwtf.node.config import MAX_ID_LENGTH, MAX_STAGES
from gwtf.node.errors import Refusal
from gwtf.node.rpc.chunks import Incoming, pieces
from gwtf.node.rpc.edge import drain, status
from gwtf.v1 import data_pb2, data_pb2_grpc

__all__ = [
    "CHUNK_BYTES",
    "SEND_METHOD",
    "DATA_PLANE_MAX_MESSAGE_BYTES",
    "DEFAULT_DTYPES",
    "MAX_HEADER_BYTES",
    "MAX_PATH",
    "Assembler",
    "DataPlaneServicer",
    "DataPlaneStub",
    "Expect",
    "MicrobatchTag",
    "TensorError",
    "TensorLimits",
    "TensorSpec",
    "add_DataPlaneServicer_to_server",
    "encode",
    "encode_wire",
    "send",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 * 2**20
"""Payload bytes per chunk. Measured by `python -m benchmarks tensor` (section "tensor" of
benchmarks/RESULTS.md): 256 KiB to 2.9 MiB chunks move 16 and 64 MiB tensors equally fast
within the noise, whereas 16 MiB chunks or one message per tensor are 2-3x slower: sender,
wire and receiver then work one after the other instead of in a pipeline, and the receiver
holds the whole message besides the tensor. 1 MiB keeps the pipeline, adds no message to
tensors up to 1 MiB, and leaves room for the largest header under the node's 4 MiB limit."""

MAX_PATH = 4 * MAX_STAGES
"""Most node ids a tag's path may hold: forward through every stage and back, with room for
replays."""

MAX_HEADER_BYTES = 2 * MAX_PATH * (MAX_ID_LENGTH + 4)
"""Largest header a receiver accepts: a full path of longest ids, a few tensors, with room."""

_FRAMING_BYTES = 64
"""Protobuf framing of a chunk around its payload and header (field tags, lengths, seq)."""

DATA_PLANE_MAX_MESSAGE_BYTES = CHUNK_BYTES + MAX_HEADER_BYTES + _FRAMING_BYTES
"""The least `grpc.max_receive_message_length` (and send length) a node needs for the data
plane's messages with the default chunk size."""

DEFAULT_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
     torch.int8, torch.uint8}
)
"""int8 and uint8 carry compressed activations and gradients (gwtf.train.codecs)."""

# Wire names of the dtypes gwtf knows; a name not here is an unknown dtype, a name here but not
# in the receiver's `allowed_dtypes` a refused one.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
# No bool: a peer's byte other than 0 or 1 in a torch.bool tensor is undefined behaviour.
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

_DIRECTIONS = {
    "forward": data_pb2.DIRECTION_FORWARD,
    "backward": data_pb2.DIRECTION_BACKWARD,
}
_DIRECTION_NAMES = {number: name for name, number in _DIRECTIONS.items()}


class TensorError(ValueError):
    """A stream of tensors is malformed, oversized or not what the receiver expects."""


@dataclass(frozen=True, slots=True)
class MicrobatchTag:
    job_id: str
    iteration: int
    microbatch: int
    direction: str
    sender: str
    path: tuple[str, ...]
    attempt: int = 0
    mode: int = 0
    """gwtf.recovery.Mode of a forward: 0 ordinary, 1 recompute, 2 replay (docs/design.md 4)."""
    round: int = 0
    """The iteration's round (one more each time its coordinator starts it again)."""
    downstream: str = ""
    """Recompute and replay: the next-stage node that holds the microbatch."""
    recovered_from: str = ""
    """A recovery send: the dead node whose work the receiver does again."""

    def __post_init__(self) -> None:
        if self.direction not in _DIRECTIONS:
            raise ValueError(f"direction must be 'forward' or 'backward', not {self.direction!r}")

    def __str__(self) -> str:
        return (
            f"{self.job_id}/{self.iteration}/{self.microbatch} {self.direction}"
            f" from {self.sender} (attempt {self.attempt})"
        )


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a receiver expects of one tensor; None allows any dtype, or any shape."""

    dtype: torch.dtype | None
    shape: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """What a receiver accepts from any peer, before any job-specific expectation."""

    max_tensor_bytes: int = 256 * 2**20
    max_tensors: int = 4
    allowed_dtypes: frozenset[torch.dtype] = field(default=DEFAULT_DTYPES)
    # A NaN or inf in an activation or gradient is refused: it would poison every replica's
    # weights at the next step, and the sender is the place to find why.
    require_finite: bool = True


Expect = Callable[[MicrobatchTag, str], TensorSpec | None]


# ---------------------------------------------------------------------------- helpers


def _dtype_name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def _check_id(what: str, value: str) -> str:
    if not value:
        raise TensorError(f"{what} is empty")
    if len(value) > MAX_ID_LENGTH or not value.isprintable() or value != value.strip():
        raise TensorError(f"{what} {value[:40]!r} is not a short printable name")
    return value


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, C order, as a flat byte view of its (contiguous, CPU) storage: no
    copy when the tensor is already contiguous on the CPU."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def _tag_to_pb(tag: MicrobatchTag) -> data_pb2.MicrobatchTag:
    return data_pb2.MicrobatchTag(
        job_id=tag.job_id,
        iteration=tag.iteration,
        microbatch=tag.microbatch,
        direction=_DIRECTIONS[tag.direction],
        sender=tag.sender,
        path=tag.path,
        attempt=tag.attempt,
        mode=tag.mode,
        round=tag.round,
        downstream=tag.downstream,
        recovered_from=tag.recovered_from,
    )


def _tag_from_pb(pb: data_pb2.MicrobatchTag) -> MicrobatchTag:
    _check_id("job id", pb.job_id)
    _check_id("sender", pb.sender)
    direction = _DIRECTION_NAMES.get(pb.direction)
    if direction is None:
        raise TensorError(
            f"microbatch direction {int(pb.direction)} is neither forward nor backward"
        )
    if len(pb.path) > MAX_PATH:
        raise TensorError(f"the microbatch's path has {len(pb.path)} nodes (at most {MAX_PATH})")
    path = tuple(_check_id("a node id in the path", hop) for hop in pb.path)
    if pb.mode > 2:
        raise TensorError(f"microbatch mode {pb.mode} is not 0 (forward), 1 or 2 (recovery)")
    if pb.downstream:
        _check_id("downstream", pb.downstream)
    if pb.recovered_from:
        _check_id("recovered from", pb.recovered_from)
    return MicrobatchTag(
        job_id=pb.job_id,
        iteration=pb.iteration,
        microbatch=pb.microbatch,
        direction=direction,
        sender=pb.sender,
        path=path,
        attempt=pb.attempt,
        mode=pb.mode,
        round=pb.round,
        downstream=pb.downstream,
        recovered_from=pb.recovered_from,
    )


# ---------------------------------------------------------------------------- sending


@dataclass(frozen=True, slots=True)
class _Plan:
    header: data_pb2.StreamHeader
    header_bytes: int
    buffers: list[memoryview]
    payload_bytes: int


def _plan(tag: MicrobatchTag, tensors: Mapping[str, torch.Tensor]) -> _Plan:
    """The header and the byte views of a stream; raises TensorError for what no receiver
    would accept (a dtype gwtf has no wire name for)."""
    header = data_pb2.StreamHeader(tag=_tag_to_pb(tag))
    buffers = []
    for name, tensor in tensors.items():
        dtype = _NAMES.get(tensor.dtype)
        if dtype is None:
            raise TensorError(f"tensor {name!r} has dtype {tensor.dtype}, which gwtf cannot send")
        view = _raw_bytes(tensor)
        header.tensors.add(name=name, dtype=dtype, shape=tensor.shape, nbytes=view.nbytes)
        buffers.append(view)
    return _Plan(header, header.ByteSize(), buffers, sum(b.nbytes for b in buffers))


def _pieces(
    plan: _Plan, chunk_bytes: int
) -> Iterator[tuple[int, data_pb2.StreamHeader | None, list[memoryview]]]:
    """The chunks of a stream as (seq, header or None, views of their payload bytes): the
    header on chunk 0, the tensors' bytes back to back (gwtf.node.rpc.chunks.pieces)."""
    for seq, parts in enumerate(pieces(plan.buffers, chunk_bytes)):
        yield seq, plan.header if seq == 0 else None, parts


def _messages(plan: _Plan, chunk_bytes: int) -> Iterator[data_pb2.DataChunk]:
    for seq, header, parts in _pieces(plan, chunk_bytes):
        payload = parts[0].tobytes() if len(parts) == 1 else b"".join(parts)
        yield data_pb2.DataChunk(seq=seq, header=header, payload=payload)


def _wire(plan: _Plan, chunk_bytes: int) -> Iterator[bytes]:
    """The chunks already serialised, byte for byte what `DataChunk.SerializeToString` gives,
    built with one copy of the payload (protobuf would make three: into a `bytes`, into the
    message, into its serialisation)."""
    header = plan.header.SerializeToString()
    for seq, has_header, parts in _pieces(plan, chunk_bytes):
        out: list[bytes | memoryview] = []
        if seq:
            out += (_SEQ_KEY, _varint(seq))
        if has_header is not None:
            out += (_HEADER_KEY, _varint(len(header)), header)
        size = sum(part.nbytes for part in parts)
        if size:
            out += (_PAYLOAD_KEY, _varint(size), *parts)
        yield b"".join(out)


def encode(
    tag: MicrobatchTag, tensors: Mapping[str, torch.Tensor], *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[data_pb2.DataChunk]:
    """The chunks of one microbatch: each carries `chunk_bytes` of payload (the last less),
    chunk 0 also the tag and the tensors' headers. Tensors may live anywhere and be
    non-contiguous; a contiguous CPU tensor is read in place, so it must not change while the
    chunks are in use."""
    return _messages(_plan(tag, tensors), chunk_bytes)


def encode_wire(
    tag: MicrobatchTag, tensors: Mapping[str, torch.Tensor], *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """`encode`, serialised: the messages `DataPlaneStub` sends."""
    return _wire(_plan(tag, tensors), chunk_bytes)


# ---------------------------------------------------------------------------- wire format

# Keys (field number << 3 | wire type) of DataChunk's fields: seq varint, header and payload
# length-delimited.
_SEQ_KEY = b"\x08"
_HEADER_KEY = b"\x12"
_PAYLOAD_KEY = b"\x1a"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise TensorError("a chunk does not parse (bad varint)")


@dataclass(frozen=True, slots=True)
class _WireChunk:
    """A DataChunk read from its wire bytes without copying the payload."""

    seq: int
    header: data_pb2.StreamHeader | None
    payload: memoryview


def _parse(data: bytes) -> _WireChunk:
    """Reads a serialised DataChunk the way protobuf would, except that the payload stays a
    view of `data` (protobuf would copy it twice: into the message, then out as `bytes`) and
    that a field of DataChunk's own given twice is refused (no writer of this format repeats
    one; protobuf would merge them). Fields this version does not know are skipped, as
    protobuf does."""
    view = memoryview(data)
    seq, header, payload = 0, None, view[:0]
    seen: set[int] = set()
    pos = 0
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise TensorError("a chunk does not parse (field 0)")
        if number in seen and number in (1, 2, 3):
            raise TensorError(f"a chunk repeats its field {number}")
        seen.add(number)
        if kind == 0:
            value, pos = _read_varint(view, pos)
            if number == 1:
                seq = value
                continue
        elif kind == 2:
            size, pos = _read_varint(view, pos)
            if pos + size > len(view):
                raise TensorError("a chunk does not parse (truncated field)")
            field_bytes, pos = view[pos : pos + size], pos + size
            if number == 2:
                try:
                    header = data_pb2.StreamHeader.FromString(field_bytes.tobytes())
                except DecodeError:
                    raise TensorError("the stream's header does not parse") from None
                continue
            if number == 3:
                payload = field_bytes
                continue
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
        else:
            raise TensorError(f"a chunk does not parse (wire type {kind})")
        if number in (1, 2, 3):
            raise TensorError(f"a chunk's field {number} has the wrong wire type")
    if pos != len(view):
        raise TensorError("a chunk does not parse (truncated field)")
    return _WireChunk(seq, header, payload)


# ---------------------------------------------------------------------------- receiving


@dataclass(slots=True)
class _Slot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    itemsize: int
    tensor: torch.Tensor | None = None
    view: memoryview | None = None  # its bytes, written in place
    values: np.ndarray[Any, Any] | None = None  # its elements as numpy sees them, to check
    checked: int = 0  # elements found finite so far


def _check_values(tensor: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """What `_nonfinite` reads of a tensor: its elements (bfloat16: their bits, numpy has no
    bfloat16), None when it cannot hold NaN or infinity."""
    if not tensor.is_floating_point():
        return None
    flat = tensor.reshape(-1)
    return flat.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else flat.numpy()


def _nonfinite(values: np.ndarray[Any, Any]) -> bool:
    """True when a NaN or infinity is among `values`. numpy, not torch: a torch reduction this
    size runs on torch's thread pool, whose threads then spin and starve grpc's on a small
    machine (1 MiB transfers took 10x longer on 2 cores)."""
    if values.dtype == np.int16:  # bfloat16 bits: exponent all ones is inf or NaN
        return bool(np.any(values & _BF16_EXPONENT == _BF16_EXPONENT))
    return not bool(np.isfinite(values).all())


_BF16_EXPONENT = 0x7F80


class Assembler:
    """Builds one microbatch from the chunks of one incoming stream, checking everything a peer
    could get wrong; any problem raises `TensorError` and the assembler is then unusable."""

    def __init__(self, limits: TensorLimits, expect: Expect | None = None) -> None:
        self._limits = limits
        self._expect = expect
        self._tag: MicrobatchTag | None = None
        self._slots: list[_Slot] = []
        self._in = Incoming(TensorError)
        self._index = 0  # slot being filled
        self._offset = 0  # bytes of that slot filled

    @property
    def received_bytes(self) -> int:
        return self._in.received

    @property
    def tag(self) -> MicrobatchTag | None:
        """The stream's tag, once its header has arrived."""
        return self._tag

    def add(self, chunk: data_pb2.DataChunk | bytes) -> None:
        """One chunk, as a message or as its wire bytes (then its payload is copied once,
        straight into the tensor)."""
        if isinstance(chunk, bytes):
            wire = _parse(chunk)
            self._next(wire.seq, wire.header)
            self._write(wire.payload)
        else:
            self._next(chunk.seq, chunk.header if chunk.HasField("header") else None)
            self._write(memoryview(chunk.payload))

    def _next(self, seq: int, header: data_pb2.StreamHeader | None) -> None:
        if self._in.next(seq, header is not None) and header is not None:
            self._read_header(header)

    def _read_header(self, header: data_pb2.StreamHeader) -> None:
        if header.ByteSize() > MAX_HEADER_BYTES:
            raise TensorError(f"the stream's header is over {MAX_HEADER_BYTES} bytes")
        if not header.HasField("tag"):
            raise TensorError("the stream's header has no microbatch tag")
        tag = _tag_from_pb(header.tag)
        limits = self._limits
        if len(header.tensors) > limits.max_tensors:
            raise TensorError(
                f"{len(header.tensors)} tensors in one microbatch (at most {limits.max_tensors})"
            )
        names: set[str] = set()
        for pb in header.tensors:
            slot = self._slot(tag, pb)
            if slot.name in names:
                raise TensorError(f"tensor {slot.name!r} appears twice")
            names.add(slot.name)
            self._slots.append(slot)
            self._in.total += slot.nbytes
        self._tag = tag

    def _slot(self, tag: MicrobatchTag, pb: data_pb2.TensorHeader) -> _Slot:
        name = _check_id("tensor name", pb.name)
        dtype = _DTYPES.get(pb.dtype)
        if dtype is None:
            raise TensorError(f"tensor {name!r} has unknown dtype {pb.dtype[:40]!r}")
        limits = self._limits
        if dtype not in limits.allowed_dtypes:
            raise TensorError(f"tensor {name!r} has dtype {pb.dtype}, which is not accepted")
        shape = tuple(pb.shape)
        if len(shape) > 16:
            raise TensorError(f"tensor {name!r} has {len(shape)} dimensions (at most 16)")
        itemsize = dtype.itemsize
        # Exact integer arithmetic: a lying header cannot overflow its way past the limit.
        expected = math.prod(shape) * itemsize
        if pb.nbytes != expected:
            raise TensorError(
                f"tensor {name!r} declares {pb.nbytes} bytes, but {pb.dtype} {list(shape)}"
                f" is {expected}"
            )
        if expected > limits.max_tensor_bytes:
            raise TensorError(
                f"tensor {name!r} is {expected} bytes (at most {limits.max_tensor_bytes})"
            )
        if self._expect is not None:
            spec = self._expect(tag, name)
            if spec is None:
                raise TensorError(f"no tensor {name!r} is expected in {tag.direction} {tag.job_id}")
            if spec.dtype is not None and spec.dtype != dtype:
                raise TensorError(
                    f"tensor {name!r} is {pb.dtype}, {_dtype_name(spec.dtype)} is expected"
                )
            if spec.shape is not None and spec.shape != shape:
                raise TensorError(
                    f"tensor {name!r} has shape {list(shape)}, {list(spec.shape)} is expected"
                )
        return _Slot(name, dtype, shape, expected, itemsize)

    def _write(self, payload: memoryview) -> None:
        size = payload.nbytes
        if size == 0:
            return
        self._in.take(size)
        source = payload
        done = 0
        while done < size:
            slot = self._slots[self._index]
            if slot.view is None:
                # Allocated only now that its bytes arrive; written in place, chunk by chunk.
                slot.tensor = torch.empty(slot.shape, dtype=slot.dtype)
                slot.view = slot.tensor.reshape(-1).view(torch.uint8).numpy().data
                if self._limits.require_finite:
                    slot.values = _check_values(slot.tensor)
            take = min(slot.nbytes - self._offset, size - done)
            slot.view[self._offset : self._offset + take] = source[done : done + take]
            done += take
            self._offset += take
            if slot.values is not None:
                # Checked as the elements complete, while the next chunk is on its way.
                whole = self._offset // slot.itemsize
                if _nonfinite(slot.values[slot.checked : whole]):
                    raise TensorError(f"tensor {slot.name!r} holds NaN or infinity")
                slot.checked = whole
            if self._offset == slot.nbytes:
                self._index, self._offset = self._index + 1, 0

    def finish(self) -> tuple[MicrobatchTag, dict[str, torch.Tensor]]:
        """The tag and the tensors (in header order), once the stream is complete and every
        tensor passed the checks."""
        self._in.finish()
        assert self._tag is not None  # the header came
        tensors: dict[str, torch.Tensor] = {}
        for slot in self._slots:
            tensor = slot.tensor
            if tensor is None:  # no bytes: an empty tensor
                tensor = torch.empty(slot.shape, dtype=slot.dtype)
            tensors[slot.name] = tensor
        return self._tag, tensors


# ---------------------------------------------------------------------------- the service

SEND_METHOD = "/gwtf.v1.DataPlane/Send"

Handler = Callable[[MicrobatchTag, dict[str, torch.Tensor]], Awaitable[None]]


def _serialize(chunk: bytes | data_pb2.DataChunk) -> bytes:
    return chunk if isinstance(chunk, bytes) else chunk.SerializeToString()


class DataPlaneStub:
    """The client side of the data plane on `channel`: `data_pb2_grpc.DataPlaneStub`, except
    that `send` hands it chunks already serialised from the tensors' memory (it also takes
    `DataChunk` messages)."""

    def __init__(self, channel: aio.Channel) -> None:
        self.Send = channel.stream_unary(
            SEND_METHOD,
            request_serializer=_serialize,
            response_deserializer=data_pb2.DataAck.FromString,
        )


async def send(
    stub: DataPlaneStub | data_pb2_grpc.DataPlaneStub,
    tag: MicrobatchTag,
    tensors: Mapping[str, torch.Tensor],
    *,
    timeout: float,
    chunk_bytes: int = CHUNK_BYTES,
    delay: Callable[[int], Awaitable[None]] | None = None,
) -> float:
    """Stream one microbatch to the peer behind `stub`; returns once the peer has taken it, with
    the seconds per microbatch the peer says it runs at now (0: it did not say).
    With this module's `DataPlaneStub` the chunks are serialised with one copy of the payload;
    with the generated stub, through protobuf messages.

    `delay(nbytes)` is awaited once, before the first chunk leaves, with the stream's payload
    plus header bytes: the emulated WAN holds the whole microbatch for its link's latency and
    serialisation time, as it holds any other message. That time counts against `timeout`,
    which covers the whole call. gRPC errors (UNAVAILABLE, DEADLINE_EXCEEDED, the receiver's
    INVALID_ARGUMENT...) reach the caller as `grpc.aio.AioRpcError`. Contiguous CPU tensors
    are read in place: they must not change until `send` returns.
    """
    plan = _plan(tag, tensors)
    deadline = time.monotonic() + timeout
    if delay is not None:
        await delay(plan.header_bytes + plan.payload_bytes)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise aio.AioRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            aio.Metadata(),
            aio.Metadata(),
            details=f"the deadline passed while the emulated link held {tag}",
        )
    chunks: Iterator[bytes] | Iterator[data_pb2.DataChunk]
    if isinstance(stub, DataPlaneStub):
        chunks = _wire(plan, chunk_bytes)
    else:
        chunks = _messages(plan, chunk_bytes)
    ack = await stub.Send(chunks, timeout=remaining)
    if ack.received_bytes != plan.payload_bytes:
        raise TensorError(
            f"the peer acknowledged {ack.received_bytes} of {plan.payload_bytes} bytes of {tag}"
        )
    pace_s: float = ack.pace_s
    return pace_s if math.isfinite(pace_s) and pace_s > 0 else 0.0


class DataPlaneServicer(data_pb2_grpc.DataPlaneServicer):
    """Receives microbatches and hands each one, checked, to `handler`.

    Served with this module's `add_DataPlaneServicer_to_server`, it reads the chunks' wire
    bytes itself and copies each payload once, into its tensor; the generated
    `data_pb2_grpc.add_DataPlaneServicer_to_server` works too, through protobuf messages.

    A stream that is malformed or fails a check is answered INVALID_ARGUMENT with one line; a
    `Refusal` from `expect` or `handler` is answered with its code in the RPC edge's table
    (`gwtf.node.rpc.edge.STATUS`); a handler that fails otherwise gets INTERNAL and a log line.
    Either way the node goes on serving.
    """

    def __init__(
        self,
        handler: Handler,
        limits: TensorLimits,
        expect: Expect | None = None,
        pace: Callable[[], float] | None = None,
    ) -> None:
        """`pace`: the receiver's seconds per microbatch now, told in every acknowledgement
        (`DataAck.pace_s`: how a sender sees a straggler before the flows move)."""
        self._handler = handler
        self._limits = limits
        self._expect = expect
        self._pace = pace

    async def Send(self, request_iterator: Any, context: aio.ServicerContext) -> data_pb2.DataAck:
        assembler = Assembler(self._limits, self._expect)
        reading = True
        try:
            async for chunk in request_iterator:
                assembler.add(chunk)
            reading = False
            tag, tensors = assembler.finish()
            await self._handler(tag, tensors)
        except aio.AbortError:
            raise
        except Exception as err:
            if reading:
                await drain(request_iterator)
            await _refuse(context, assembler, err)
        pace_s = self._pace() if self._pace is not None else 0.0
        return data_pb2.DataAck(received_bytes=assembler.received_bytes, pace_s=pace_s)


async def _refuse(context: aio.ServicerContext, assembler: Assembler, err: Exception) -> None:
    """Ends the call with the status that says what went wrong (abort raises)."""
    tag = assembler.tag
    where = f"{tag}: " if tag is not None else ""
    if isinstance(err, Refusal):
        code, message = status(err)
    elif isinstance(err, TensorError):
        code, message = grpc.StatusCode.INVALID_ARGUMENT, f"{where}{err}"
    elif isinstance(err, DecodeError):
        # Served through protobuf, grpc parses each chunk as the loop asks for it.
        code, message = grpc.StatusCode.INVALID_ARGUMENT, f"{where}a chunk does not parse"
    else:
        log.error("data plane: the receiver failed on %s", tag, exc_info=err)
        code = grpc.StatusCode.INTERNAL
        message = f"{where}the receiver failed ({type(err).__name__})"
    if code != grpc.StatusCode.INTERNAL:
        log.warning("data plane: refused %s (%s)", message, code.name)
    await context.abort(code, message)


def add_DataPlaneServicer_to_server(servicer: DataPlaneServicer, server: aio.Server) -> None:
    """Serves `servicer` on `server`, its chunks handed over as wire bytes (no request
    deserializer): the payload is then copied once, from grpc's buffer into the tensor."""
    handlers = {
        "Send": grpc.stream_unary_rpc_method_handler(
            servicer.Send,
            request_deserializer=None,
            response_serializer=data_pb2.DataAck.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gwtf.v1.DataPlane", handlers),)
    )
    server.add_registered_method_handlers("gwtf.v1.DataPlane", handlers)
