"""The node's one retry policy (docs/design.md 3.10): how long to wait before calling again, which
failures are worth another call, and which peers are held off for a while.

    Backoff   exponential: `first_s`, then `factor` times the last wait, capped at `max_s`,
              each wait shortened by up to `jitter` of itself (a fraction, 0 by default: no
              loop of the node draws one today, so its timing stays what tests and the design
              rely on); the draw comes from the generator its caller passes (the node's seeded
              `NodeState.rng`), never a hidden one, so the same seed waits the same
    TRANSIENT the codes a call is retried on when only transient failures are: the callee did
              not answer (UNAVAILABLE) or not in time (DEADLINE_EXCEEDED)
    FINAL     the codes a resend would meet again (a bug or a mismatch, never a transient):
              INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, UNIMPLEMENTED
    BanList   peers whose calls failed, each banned until its ban expires; consecutive failures
              lengthen the ban along a Backoff, a success lifts it

The code of a local call that was refused (this node is the callee, e.g. it coordinates the job
it reports to) is the one the RPC edge would have sent (`gwtf.node.rpc.edge.status`), so a caller
retries the local call and the remote one alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import grpc
import numpy as np
from grpc import aio

from gwtf.node.errors import Refusal
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.node.rpc.edge import status

__all__ = [
    "FINAL", "TRANSIENT", "BanList", "Backoff", "Rng", "code_of", "is_final", "is_transient",
]

Code = grpc.StatusCode

TRANSIENT = frozenset({Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED})
FINAL = frozenset({
    Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.NOT_FOUND, Code.UNIMPLEMENTED,
})

Rng: TypeAlias = np.random.Generator | random.Random
"""A seeded generator a jittered wait draws from (`random()`: uniform on [0, 1))."""


@dataclass(frozen=True)
class Backoff:
    """Waits between the calls of one retried operation; see the module docstring."""

    first_s: float
    max_s: float = math.inf
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.first_s < 0 or self.max_s < 0 or self.factor < 1:
            raise ValueError(f"a backoff needs first_s, max_s >= 0 and factor >= 1: {self}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"a backoff's jitter is a fraction in [0, 1): {self.jitter}")

    def delay(self, retry: int, rng: Rng | None = None) -> float:
        """The wait before retry number `retry` (0: the first retry, after the first failure);
        a backoff with jitter draws it from `rng`, which its caller must then pass."""
        try:
            wait = float(min(self.max_s, self.first_s * self.factor ** max(0, retry)))
        except OverflowError:  # a peer that failed for hours: long since at the cap
            wait = self.max_s
        if self.jitter:
            if rng is None:
                raise ValueError(f"a backoff with jitter needs a seeded generator: {self}")
            wait *= 1.0 - self.jitter * float(rng.random())
        return wait


def code_of(err: BaseException) -> grpc.StatusCode | None:
    """The status a failed call ended with: the callee's for a gRPC call, the RPC edge's for a
    local call this node refused; None for anything else."""
    if isinstance(err, aio.AioRpcError):
        return err.code()
    if isinstance(err, Refusal | InvalidMessage):
        return status(err)[0]
    return None


def is_transient(err: BaseException) -> bool:
    """The call may pass if made again as it was (the callee did not answer, or not in time)."""
    return code_of(err) in TRANSIENT


def is_final(err: BaseException) -> bool:
    """The callee will refuse the same call again: retrying it is pointless."""
    return code_of(err) in FINAL


class BanList:
    """Peers held off after failed calls, each until its ban expires (`clock` seconds): the first
    failure bans a peer for `backoff.delay(0)`, each further one before a success for the next
    delay, and a success lifts the ban (the next failure starts again from the first). A
    backoff with jitter draws from `rng`, the caller's seeded generator."""

    def __init__(
        self, backoff: Backoff, clock: Callable[[], float], rng: Rng | None = None
    ) -> None:
        if backoff.jitter and rng is None:
            raise ValueError(f"a backoff with jitter needs a seeded generator: {backoff}")
        self.backoff = backoff
        self._clock = clock
        self._rng = rng
        self._bans: dict[str, tuple[float, int]] = {}  # peer -> (until, failures in a row)

    def banned(self, peer: str, now: float | None = None) -> bool:
        """A call to `peer` failed and its ban is not over at `now` (default: the clock's)."""
        ban = self._bans.get(peer)
        return ban is not None and ban[0] > (self._clock() if now is None else now)

    def ban(self, peer: str) -> float:
        """A call to `peer` failed: ban it; returns the ban's length."""
        _, failures = self._bans.get(peer, (0.0, 0))
        delay = self.backoff.delay(failures, self._rng)
        self._bans[peer] = (self._clock() + delay, failures + 1)
        return delay

    def lift(self, peer: str) -> None:
        """A call to `peer` succeeded: no ban, and the next failure starts from the first delay."""
        self._bans.pop(peer, None)

    def clear(self) -> None:
        self._bans.clear()

    def __contains__(self, peer: object) -> bool:
        return isinstance(peer, str) and self.banned(peer)
