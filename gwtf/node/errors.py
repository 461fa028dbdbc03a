"""The node's refusals: a call it will not serve, with the gRPC status the caller gets.

Domain code (the job runtime, the data plane) raises `Refusal` with the code and one sentence;
the servicers (`gwtf.node.server`) turn it into the call's status at the RPC edge, so no domain
module needs the servicers. A malformed message is `gwtf.node.codec.InvalidMessage` instead
(INVALID_ARGUMENT).
"""

from __future__ import annotations

import grpc

__all__ = ["Refusal"]


class Refusal(Exception):
    """The node refuses a call for a reason the caller must act on."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
