"""A stage replica's gradient sums on the wire, to its stage peers at every commit.

One replica's contribution for one iteration (`gwtf.train.GradContribution`) is a few dozen
named tensors. It travels as one flat vector: the sums of the parameters in sorted-name order,
concatenated, in the job's gradient dtype (float64 by default), as raw little-endian bytes in a
client stream of `ContributionChunk`s of `CHUNK_BYTES` (chunk 0 holds the header). Every replica
of a stage has the same parameter names and shapes (they come from the job and the cut), so the
receiver knows exactly how many elements to expect and splits the vector back by itself: a peer
cannot make it allocate more than its own stage's size. A replica that accumulated no microbatch
sends a header with no payload.

The receiver checks the order of the chunks, the header (once, first), the dtype and the size
against what its stage expects, and that every value is finite, before it hands the contribution
on. A job with a robust aggregation takes non-finite sums in (`finish(allow_non_finite=True)`):
its screen names the sender, so that the stage can exclude it rather than stall on a refusal.
Splitting is a view of the received bytes: the sums arrive bit for bit, which is what lets every
replica combine them into the same bits.

The same stream carries a node's running sum to its keeper between commits (kind KEPT, bounded
replay, gwtf.node.worker.shipping), with the sender's records of each microbatch it covers
(`KeptHop`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gwtf.node.rpc.chunks import Incoming, pieces
from gwtf.v1 import job_pb2

__all__ = [
    "CHUNK_BYTES",
    "KEPT",
    "PARTIAL",
    "REDUCED",
    "WHOLE",
    "KeptHop",
    "ContributionAssembler",
    "ContributionError",
    "ContributionHeader",
    "encode",
    "flatten",
    "unflatten",
]

CHUNK_BYTES = 2**20
"""Payload bytes per chunk: within STYLE's 1-4 MiB, well under the node's 4 MiB message limit."""

_DTYPES = {"float64": torch.float64, "float32": torch.float32}

WHOLE = "whole"
PARTIAL = "partial"
REDUCED = "reduced"
KEPT = "kept"
_KINDS = {
    WHOLE: job_pb2.ContributionHeader.WHOLE,
    PARTIAL: job_pb2.ContributionHeader.PARTIAL,
    REDUCED: job_pb2.ContributionHeader.REDUCED,
    KEPT: job_pb2.ContributionHeader.KEPT,
}
_KIND_NAMES = {number: name for name, number in _KINDS.items()}


class ContributionError(ValueError):
    """A contribution stream that is malformed or not what this stage expects (one sentence)."""


@dataclass(frozen=True)
class KeptHop:
    """One microbatch of a kept running sum (bounded replay, docs/design.md 4.9): its neighbours
    at the sender (`gwtf.recovery.Hops`; "" for none) and, on the last stage, its loss and the
    path it took, which the keeper reports in the dead sender's place if it adopts the sum."""

    microbatch: int
    upstream: str = ""
    downstream: str = ""
    loss: float = 0.0
    path: tuple[str, ...] = ()

    def to_pb(self) -> job_pb2.KeptHop:
        return job_pb2.KeptHop(microbatch=self.microbatch, upstream=self.upstream,
                               downstream=self.downstream, loss=self.loss, path=self.path)

    @staticmethod
    def from_pb(pb: job_pb2.KeptHop) -> KeptHop:
        """Checked: names of at most 200 characters, a finite loss (ContributionError)."""
        names = (pb.upstream, pb.downstream, *pb.path)
        if any(len(name) > 200 for name in names) or len(pb.path) > 1024:
            raise ContributionError("a kept microbatch names a node id longer than 200 chars")
        if not math.isfinite(pb.loss):
            raise ContributionError(f"kept microbatch {pb.microbatch} has loss {pb.loss}")
        return KeptHop(pb.microbatch, pb.upstream, pb.downstream, pb.loss, tuple(pb.path))


@dataclass(frozen=True)
class ContributionHeader:
    sender: str
    job_id: str
    iteration: int
    stage: int
    microbatches: tuple[int, ...]
    dtype: str
    numel: int
    round: int = 0
    attempt: int = 0
    """The iteration's round and the commit attempt the sums are for: a replica keeps the sums
    of each attempt apart, so that a rerun of the commit never mixes in stale ones."""
    kind: str = WHOLE
    """WHOLE (the sender's whole vector), PARTIAL (a piece of the receiver's slice of the
    sender's sums) or REDUCED (the sender's slice summed over the stage):
    gwtf.node.worker.slices."""
    offset: int = 0
    """Where the `numel` values carried start in the whole vector (0 for WHOLE)."""
    slice_lo: int = 0
    slice_hi: int = 0
    """PARTIAL: the receiver's slice, which the sender's pieces must cover once this stream is
    in; REDUCED: the sender's slice, the values carried."""
    basis: str = ""
    """REDUCED: the digest of the (member, microbatch ids) summed (gwtf.node.worker.slices.basis);
    `microbatches` is then their union."""
    hops: tuple[KeptHop, ...] = ()
    """KEPT (a shipment to the sender's keeper): the sender's records of each microbatch."""


def flatten(sums: Mapping[str, Tensor], names: Sequence[str], dtype: torch.dtype) -> Tensor:
    """The sums of `names`, in that order, as one contiguous vector (empty when no sums)."""
    if not sums:
        return torch.empty(0, dtype=dtype)
    return torch.cat([sums[name].reshape(-1).to(dtype) for name in names])


def unflatten(flat: Tensor, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """Split `flatten`'s vector back by name (sorted names, as flatten got them): views."""
    out: dict[str, Tensor] = {}
    offset = 0
    for name in sorted(shapes):
        shape = shapes[name]
        size = 1
        for dim in shape:
            size *= dim
        out[name] = flat[offset : offset + size].view(shape)
        offset += size
    if offset != flat.numel():
        raise ContributionError(f"{flat.numel()} gradient values do not fit {offset} parameters")
    return out


def _header_to_pb(header: ContributionHeader) -> job_pb2.ContributionHeader:
    return job_pb2.ContributionHeader(
        sender=header.sender,
        job_id=header.job_id,
        iteration=header.iteration,
        stage=header.stage,
        microbatches=header.microbatches,
        dtype=header.dtype,
        numel=header.numel,
        round=header.round,
        attempt=header.attempt,
        kind=_KINDS[header.kind],
        offset=header.offset,
        slice_lo=header.slice_lo,
        slice_hi=header.slice_hi,
        basis=header.basis,
        hops=[hop.to_pb() for hop in header.hops],
    )


def encode(
    header: ContributionHeader, flat: Tensor, *, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[job_pb2.ContributionChunk]:
    """The chunks of one contribution: the header, then the vector's bytes."""
    data = flat.detach().contiguous().view(torch.uint8).numpy().data
    yield job_pb2.ContributionChunk(seq=0, header=_header_to_pb(header))
    for seq, (payload,) in enumerate(pieces([data], chunk_bytes, at_least_one=False), start=1):
        yield job_pb2.ContributionChunk(seq=seq, payload=payload.tobytes())


Expect = Callable[[ContributionHeader], int]
"""Checks a header (raises ContributionError, or the node's Refusal) and returns the number of
elements a contribution of that header must have."""


class ContributionAssembler:
    """One incoming contribution stream, checked chunk by chunk."""

    def __init__(self, expect: Expect) -> None:
        self._expect = expect
        self._in = Incoming(ContributionError, stream="contribution stream",
                            chunk="contribution chunk")
        self.header: ContributionHeader | None = None
        self._buffer: Tensor | None = None
        self._view: memoryview | None = None

    @property
    def received_bytes(self) -> int:
        return self._in.received

    def add(self, chunk: job_pb2.ContributionChunk) -> None:
        if self._in.next(chunk.seq, chunk.HasField("header")):
            self._start(chunk.header)
        payload = chunk.payload
        if not payload:
            return
        at = self._in.take(len(payload))
        assert self._view is not None  # bytes fit: the header declared some
        self._view[at : at + len(payload)] = payload

    def _start(self, pb: job_pb2.ContributionHeader) -> None:
        dtype = _DTYPES.get(pb.dtype)
        if dtype is None:
            raise ContributionError(
                f"contribution dtype {pb.dtype[:20]!r} is not one of {', '.join(_DTYPES)}"
            )
        if len(set(pb.microbatches)) != len(pb.microbatches):
            raise ContributionError("the contribution lists a microbatch twice")
        header = ContributionHeader(
            sender=pb.sender,
            job_id=pb.job_id,
            iteration=pb.iteration,
            stage=pb.stage,
            microbatches=tuple(pb.microbatches),
            dtype=pb.dtype,
            numel=pb.numel,
            round=pb.round,
            attempt=pb.attempt,
            kind=_KIND_NAMES.get(pb.kind, WHOLE),
            offset=pb.offset,
            slice_lo=pb.slice_lo,
            slice_hi=pb.slice_hi,
            basis=pb.basis[:64],
            hops=tuple(KeptHop.from_pb(hop) for hop in pb.hops),
        )
        if {hop.microbatch for hop in header.hops} - set(header.microbatches):
            raise ContributionError("the contribution's hops name a microbatch it does not hold")
        if pb.kind not in _KIND_NAMES:
            raise ContributionError(f"contribution kind {pb.kind} is not known here")
        expected = self._expect(header) if header.microbatches else 0
        if header.numel != expected:
            raise ContributionError(
                f"the contribution of {header.sender} has {header.numel} values, "
                f"{expected} are expected"
            )
        self.header = header
        self._buffer = torch.empty(expected, dtype=dtype)
        self._in.total = expected * self._buffer.element_size()
        if expected:
            self._view = self._buffer.view(torch.uint8).numpy().data

    def finish(self, *, allow_non_finite: bool = False) -> tuple[ContributionHeader, Tensor]:
        self._in.finish()
        if self.header is None or self._buffer is None:
            raise ContributionError("the contribution stream ended before its header")
        if (
            not allow_non_finite
            and self._buffer.numel()
            and not bool(torch.isfinite(self._buffer).all())
        ):
            raise ContributionError(f"the contribution of {self.header.sender} holds NaN or inf")
        return self.header, self._buffer
