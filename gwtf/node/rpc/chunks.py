"""Chunked streams (docs/design.md 3.2): how a node cuts what it sends into numbered chunks and
checks the chunks it receives, for its three streams: a microbatch's tensors
(`gwtf.node.dataplane.tensors`), a replica's gradient sums (`gwtf.node.dataplane.gradsync`) and a
stage's state (`gwtf.node.jobs.transfer`). Each stream keeps its own messages, so the wire is what
it was; only the cutting and the checking are shared.

    pieces    the payload of each chunk of buffers sent back to back: views of at most
              `chunk_bytes` in all (the last chunk less), copied by nobody
    Incoming  one stream coming in: each chunk's number is the next one, only chunk 0 carries
              the header, the payload fits the bytes the header declared, and all of them came;
              a problem is `error(one line)`, the stream's own exception
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

__all__ = ["Incoming", "pieces"]


def pieces(
    buffers: Sequence[memoryview], chunk_bytes: int, *, at_least_one: bool = True
) -> Iterator[list[memoryview]]:
    """The payload of each chunk: views into `buffers`, `chunk_bytes` in all per chunk but the
    last; for no bytes at all, one empty chunk when `at_least_one` (a stream whose first chunk
    carries the header), else none."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    pending: list[memoryview] = []
    pending_bytes = 0
    sent = False
    for buffer in buffers:
        offset = 0
        while offset < buffer.nbytes:
            take = min(chunk_bytes - pending_bytes, buffer.nbytes - offset)
            pending.append(buffer[offset : offset + take])
            pending_bytes += take
            offset += take
            if pending_bytes == chunk_bytes:
                yield pending
                sent = True
                pending, pending_bytes = [], 0
    if pending or (at_least_one and not sent):
        yield pending


class Incoming:
    """The order and the size of one chunked stream coming in (see the module docstring).

    `stream` names the stream and `chunk` its chunks in the messages: "the {stream} carries
    more than the N bytes its header declares", "{chunk} 3 arrived where chunk 2 was
    expected"."""

    def __init__(
        self, error: Callable[[str], Exception], *, stream: str = "stream", chunk: str = "chunk"
    ) -> None:
        self._error = error
        self._stream = stream
        self._chunk = chunk
        self._seq = 0
        self.received = 0
        """Payload bytes counted so far."""
        self.total = 0
        """Payload bytes the header declared (0 until it came)."""

    @property
    def started(self) -> bool:
        """Chunk 0 came."""
        return self._seq > 0

    def next(self, seq: int, header: bool | None = None) -> bool:
        """Chunk `seq` came: it must be the next one and, when `header` says whether it carries
        one, carry the header if and only if it is chunk 0. True for chunk 0."""
        if seq != self._seq:
            raise self._error(
                f"{self._chunk} {seq} arrived where chunk {self._seq} was expected"
                " (lost, repeated or reordered)"
            )
        self._seq += 1
        if header is not None and header != (seq == 0):
            raise self._error(
                f"the {self._stream}'s first chunk has no header" if seq == 0
                else f"{self._chunk} {seq} carries a second header"
            )
        return seq == 0

    def take(self, nbytes: int) -> int:
        """`nbytes` more of payload came: where they go (the bytes received before them)."""
        at = self.received
        if at + nbytes > self.total:
            raise self._error(
                f"the {self._stream} carries more than the {self.total} bytes its header declares"
            )
        self.received = at + nbytes
        return at

    def finish(self) -> None:
        """The stream ended: every declared byte must have come."""
        if not self.started:
            raise self._error(f"the {self._stream} ended before its header")
        if self.received != self.total:
            raise self._error(
                f"the {self._stream} ended after {self.received} of its {self.total} bytes"
            )
