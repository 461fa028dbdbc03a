"""The RPC edge: the one table from the node's refusals to gRPC status codes, and the drain of a
refused client stream (docs/design.md 3.2).

Domain code raises a `gwtf.node.errors.Refusal` subclass, an `InvalidMessage`, or a
`ContributionError`/`TensorError` (a stream that fails a check); the servicers
(`gwtf.node.rpc.server`, the data plane's in `gwtf.node.dataplane.tensors`) end the call with
`status(err)`. A local call that is refused (this node coordinates the job it reports to) reads its
status from the same table, so a retry policy treats it as the remote one (`gwtf.node.rpc.retry`).
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio

from gwtf.node.errors import (
    Busy,
    CannotRun,
    IdTaken,
    InvalidOrder,
    Mismatch,
    NotHeld,
    NotParticipant,
    NotReady,
    Refusal,
    StaleIteration,
    Stranger,
    Superseded,
    UnknownJob,
    WrongState,
)
from gwtf.node.rpc.codec import InvalidMessage

__all__ = ["DRAIN_BYTES", "STATUS", "drain", "status"]

Code = grpc.StatusCode

STATUS: dict[type[Exception], grpc.StatusCode] = {
    NotReady: Code.UNAVAILABLE,  # the caller retries (gwtf.node.rpc.retry.TRANSIENT)
    Busy: Code.RESOURCE_EXHAUSTED,  # the sender waits, or sends to another replica
    NotParticipant: Code.FAILED_PRECONDITION,
    WrongState: Code.FAILED_PRECONDITION,
    NotHeld: Code.FAILED_PRECONDITION,
    StaleIteration: Code.FAILED_PRECONDITION,
    Mismatch: Code.FAILED_PRECONDITION,
    Stranger: Code.FAILED_PRECONDITION,
    CannotRun: Code.FAILED_PRECONDITION,
    InvalidOrder: Code.INVALID_ARGUMENT,
    InvalidMessage: Code.INVALID_ARGUMENT,
    UnknownJob: Code.NOT_FOUND,
    IdTaken: Code.ALREADY_EXISTS,
    Superseded: Code.ABORTED,
}
"""Refusal class -> the status its call ends with. FAILED_PRECONDITION, INVALID_ARGUMENT and
NOT_FOUND are final to every sender (`gwtf.node.rpc.retry.FINAL`); UNAVAILABLE is transient."""


def status(err: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and the one-line message a call refused with `err` ends with: by the table
    (the nearest class in `err`'s ancestry); anything else that reaches the edge as a check's
    failure is INVALID_ARGUMENT."""
    message = err.message if isinstance(err, Refusal) else str(err)
    for cls in type(err).__mro__:
        code = STATUS.get(cls)
        if code is not None:
            return code, message
    return Code.INVALID_ARGUMENT, message


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
