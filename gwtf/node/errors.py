"""The node's refusals: a call it will not serve, with the gRPC status the caller gets; and
`NodeError`, a problem the user must fix before the node can run.

Domain code (the job runtime, the data plane) raises `Refusal` with the code and one sentence;
the servicers (`gwtf.node.server`) turn it into the call's status at the RPC edge, so no domain
module needs the servicers. A malformed message is `gwtf.node.codec.InvalidMessage` instead
(INVALID_ARGUMENT).
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio

__all__ = ["DRAIN_BYTES", "NodeError", "Refusal", "drain"]


class NodeError(Exception):
    """A problem the user must fix (one sentence), with the exit code it deserves."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Refusal(Exception):
    """The node refuses a call for a reason the caller must act on."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# A refused client stream is read to its end, up to this many more bytes, before the refusal is
# sent. grpc's aio client that is still writing chunks when the call ends reports INTERNAL
# ("Failed execute_batch") in place of the receiver's status (3 streams in 200 on loopback),
# and the sender then retries a stream that can never pass instead of reporting it. The bytes
# were already on their way; past the cap (more than any activation here) the sender may see
# INTERNAL.
DRAIN_BYTES = 64 * 2**20


async def drain(request_iterator: Any) -> None:
    """Reads and discards what is left of a client stream the servicer is about to refuse."""
    seen = 0
    try:
        async for chunk in request_iterator:
            seen += len(chunk) if isinstance(chunk, bytes) else chunk.ByteSize()
            if seen > DRAIN_BYTES:
                return
    except aio.AbortError:
        raise  # the stream's own check refused a chunk: that refusal is the call's status
    except Exception:  # a chunk that does not parse ends the drain, not the refusal
        return
