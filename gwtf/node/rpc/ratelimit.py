"""How often one peer may call a node (`--rate-limit N`): a token bucket per peer.

A node on a public address must not let one peer, broken or hostile, take all of its event loop.
Every call takes a token from its peer's bucket before any handler runs; a call that finds the
bucket empty ends RESOURCE_EXHAUSTED with one line, and nothing it sent is read. A stream counts
as one call, however many chunks it carries.

Who is "one peer": the key is the pair (host of the TCP peer address, node id the caller names
in its metadata, `gwtf-node`, empty for clients).
- The host is the one thing a caller cannot choose (it completed a TCP handshake from there).
  Keying on the host alone would lump every node of a local cluster (all 127.0.0.1) into one
  bucket, and every volunteer behind one NAT.
- The named id tells those apart, but a caller can name any id it likes (a token or a
  certificate says "a member of this swarm", not which one: every member's certificate names the
  swarm). With the host in the key, naming another node's id cannot drain that node's bucket
  from elsewhere; and a caller that names a new id for every call is bounded by a second bucket
  per host, `HOST_SHARE` times the per-peer rate.
Nodes name themselves on their unary calls (gwtf.node.rpc.transport), not on their streams
(microbatches, state transfers), so the streams from one host share its unnamed bucket with
its clients' calls: tens of streams per second in a training job, far below the limit.
The token check runs before this one, so a stranger without the token is refused there and
cannot spend a member's tokens either.

Buckets of quiet peers are forgotten (least recently used beyond `MAX_PEERS`); a forgotten peer
comes back with a full bucket, which the host bucket bounds.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from gwtf.node.rpc.security import guarded
from gwtf.node.rpc.transport import CALLER_NODE

__all__ = [
    "BURST_S",
    "DEFAULT_RATE",
    "HOST_SHARE",
    "RateLimit",
    "RateLimitInterceptor",
    "RateLimiter",
    "TokenBucket",
    "peer_host",
]

DEFAULT_RATE = 1000.0
"""Calls per second per peer. A node's own traffic to one peer is tens of calls per second
(gossip, probes, flow exchanges, microbatches), more while the flows converge: an 8-node,
4-stage local swarm converging from a cold start was refused some calls at a limit of 20 per
second (and took twice as long to settle), none at 100. A thousand leaves ten times that, and
is below what floods a node's event loop (one node answers one to two thousand cheap calls
per second on this 2-core machine: `python -m benchmarks load`)."""
BURST_S = 2.0
"""A bucket holds this many seconds of calls: a peer that was stalled (a loaded machine, a
garbage collection) may catch up at once."""
HOST_SHARE = 16
"""The bucket of a whole host holds this many peers' worth: the nodes of a local cluster, or a
volunteer's machines behind one NAT, each at its own rate."""
MAX_PEERS = 4096
"""Buckets kept; the least recently used are forgotten beyond this (a bound on memory that
a caller naming new ids could otherwise grow)."""


class TokenBucket:
    """`rate` tokens per second up to `burst`; starts full. Time is given, never read."""

    __slots__ = ("burst", "rate", "_tokens", "_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, now: float) -> bool:
        """One token if there is one (True), else nothing taken (False)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass(frozen=True)
class RateLimit:
    """Calls per second per peer and the burst; rate 0: no limit."""

    rate: float = DEFAULT_RATE
    burst: float | None = None
    """Default: `BURST_S` seconds of calls (at least one)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise ValueError(f"the rate limit must be a number of calls per second >= 0, "
                             f"got {self.rate!r}")  # fmt: skip
        if self.burst is not None and not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError(f"the burst must be a number of calls >= 1, got {self.burst!r}")

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    @property
    def capacity(self) -> float:
        return self.burst if self.burst is not None else max(1.0, self.rate * BURST_S)


class RateLimiter:
    """One bucket per (host, named id) and one per host; `allow` takes from both."""

    def __init__(
        self,
        limit: RateLimit,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_peers: int = MAX_PEERS,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._max_peers = max_peers
        self._peers: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()
        self._hosts: OrderedDict[str, TokenBucket] = OrderedDict()
        self.refused = 0
        """Calls refused since the start (the node's `gwtf_requests_refused{reason="rate"}`)."""

    def _bucket(self, table: OrderedDict[Any, TokenBucket], key: Any, share: int,
                now: float) -> TokenBucket:  # fmt: skip
        bucket = table.get(key)
        if bucket is None:
            bucket = TokenBucket(self.limit.rate * share, self.limit.capacity * share, now)
            table[key] = bucket
            if len(table) > self._max_peers:
                table.popitem(last=False)
        else:
            table.move_to_end(key)
        return bucket

    def allow(self, host: str, caller: str = "") -> bool:
        """Whether a call from `caller` at `host` may go on (counted in `refused` if not)."""
        now = self._clock()
        # The peer's own bucket first: a peer over its limit spends nothing of its host's.
        if self._bucket(self._peers, (host, caller), 1, now).take(now) and self._bucket(
            self._hosts, host, HOST_SHARE, now
        ).take(now):
            return True
        self.refused += 1
        return False


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string: "ipv4:10.0.0.2:5000" -> "10.0.0.2",
    "ipv6:[::1]:5000" -> "::1"; anything else (a unix socket) as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] if rest.startswith("[") else rest
        return host.strip("[]")
    return peer


class RateLimitInterceptor(aio.ServerInterceptor):
    """Ends RESOURCE_EXHAUSTED every call over its peer's rate, before the handler runs."""

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler  # an unknown method, which grpc answers UNIMPLEMENTED
        caller = ""
        for key, value in details.invocation_metadata or ():
            if key == CALLER_NODE:
                caller = value if isinstance(value, str) else bytes(value).decode(errors="replace")
                break
        return _limited(handler, self._limiter, caller[:128])


def _limited(
    handler: grpc.RpcMethodHandler, limiter: RateLimiter, caller: str
) -> grpc.RpcMethodHandler:
    """`handler`, behind a take from the caller's bucket (the peer address is only known once
    the call runs, from its context)."""
    rate = limiter.limit.rate

    async def check(context: aio.ServicerContext) -> None:
        if not limiter.allow(peer_host(context.peer()), caller):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rate limit: more than {rate:g} calls per second from this peer; slow down",
            )

    return guarded(handler, check)
