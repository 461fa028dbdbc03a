"""The node's one chunked-stream helper (gwtf.node.rpc.chunks, docs/design.md 3.2): how a payload is
cut, how a stream's chunks are checked, and the state stream that uses it, on its wire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest

from gwtf.node.jobs.transfer import STATE_CHUNK_BYTES, _chunks, _read_state
from gwtf.node.rpc.chunks import Incoming, pieces
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.v1 import job_pb2


def _cut(sizes: list[int], chunk_bytes: int, at_least_one: bool = True) -> list[list[bytes]]:
    data = [bytes(range(n % 256)) * (n // 256) + bytes(range(n % 256)) for n in sizes]
    buffers = [memoryview(d) for d in data]
    chunks = list(pieces(buffers, chunk_bytes, at_least_one=at_least_one))
    joined = b"".join(bytes(v) for chunk in chunks for v in chunk)
    assert joined == b"".join(data)  # nothing lost, nothing repeated, in order
    for chunk in chunks:
        for view in chunk:
            assert any(view.obj is b.obj for b in buffers)  # views, not copies
    return [[bytes(v) for v in chunk] for chunk in chunks]


@pytest.mark.parametrize("sizes", [[10], [3, 4, 5], [8, 8], [0, 7, 0, 9], [1] * 20])
@pytest.mark.parametrize("chunk_bytes", [1, 4, 8, 100])
def test_every_chunk_carries_chunk_bytes_but_the_last(sizes: list[int], chunk_bytes: int) -> None:
    chunks = _cut(sizes, chunk_bytes)
    lengths = [sum(len(v) for v in chunk) for chunk in chunks]
    assert all(n == chunk_bytes for n in lengths[:-1])
    assert 0 < lengths[-1] <= chunk_bytes
    assert len(chunks) == -(-sum(sizes) // chunk_bytes)


def test_no_bytes_is_one_empty_chunk_or_none() -> None:
    assert _cut([], 4) == [[]]
    assert _cut([0, 0], 4) == [[]]
    assert _cut([0], 4, at_least_one=False) == []
    with pytest.raises(ValueError, match="positive"):
        list(pieces([memoryview(b"ab")], 0))


def test_a_stream_is_checked_chunk_by_chunk() -> None:
    incoming = Incoming(InvalidMessage, stream="backup", chunk="state chunk")
    with pytest.raises(InvalidMessage, match="the backup ended before its header"):
        incoming.finish()
    assert incoming.next(0, header=True)
    incoming.total = 10
    assert incoming.take(6) == 0
    assert not incoming.next(1, header=False)
    with pytest.raises(InvalidMessage, match="state chunk 3 arrived where chunk 2 was expected"):
        incoming.next(3)
    with pytest.raises(InvalidMessage, match="more than the 10 bytes its header declares"):
        incoming.take(5)
    with pytest.raises(InvalidMessage, match="the backup ended after 6 of its 10 bytes"):
        incoming.finish()
    assert incoming.take(4) == 6
    incoming.finish()
    with pytest.raises(InvalidMessage, match="the stream's first chunk has no header"):
        Incoming(InvalidMessage).next(0, header=False)
    second = Incoming(InvalidMessage)
    second.next(0, header=True)
    with pytest.raises(InvalidMessage, match="chunk 1 carries a second header"):
        second.next(1, header=True)


async def _stream(chunks: Iterable[job_pb2.StateChunk]) -> AsyncIterator[job_pb2.StateChunk]:
    for chunk in chunks:
        yield chunk


def test_a_state_streams_in_chunks_of_one_mib_and_reads_back_whole() -> None:
    data = bytes(range(256)) * (STATE_CHUNK_BYTES // 128 + 3)  # 2 MiB and 768 bytes
    chunks = list(_chunks(data, 2, 7, "job-1", "a1"))
    assert [c.seq for c in chunks] == [0, 1, 2]
    assert [len(c.payload) for c in chunks] == [STATE_CHUNK_BYTES, STATE_CHUNK_BYTES, 768]
    assert {(c.stage, c.iteration, c.total_bytes, c.job_id, c.sender) for c in chunks} == {
        (2, 7, len(data), "job-1", "a1")}
    first, back = asyncio.run(_read_state(_stream(chunks), "backup"))
    assert back == data and first.iteration == 7
    empty = list(_chunks(b"", 2, 7))
    assert [(c.seq, c.payload, c.total_bytes) for c in empty] == [(0, b"", 0)]
    assert asyncio.run(_read_state(_stream(empty), "backup"))[1] == b""


@pytest.mark.parametrize(
    ("cut", "match"),
    [
        (lambda c: c[1:], "state chunk 1 arrived where chunk 0 was expected"),
        (lambda c: c[:1] + c[2:], "state chunk 2 arrived where chunk 1 was expected"),
        (lambda c: c[:2], "the backup ended after 2 of its 5 bytes"),
        (lambda c: [*c, job_pb2.StateChunk(seq=5, payload=b"x")], "more than the 5 bytes"),
        (lambda c: [], "an empty backup"),
    ],
)
def test_a_broken_state_stream_is_refused_in_one_line(cut: object, match: str) -> None:
    chunks = [job_pb2.StateChunk(seq=i, total_bytes=5, payload=bytes([i])) for i in range(5)]
    with pytest.raises(InvalidMessage, match=match):
        asyncio.run(_read_state(_stream(cut(chunks)), "backup"))  # type: ignore[operator]
