"""The per-peer rate limit (gwtf.node.rpc.ratelimit): the token bucket and the limiter's keys, with
an injected clock; and the interceptor on a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc import aio

from gwtf.node.rpc.ratelimit import (
    HOST_SHARE,
    RateLimit,
    RateLimiter,
    RateLimitInterceptor,
    TokenBucket,
    peer_host,
)
from gwtf.node.rpc.server import ProbeServicer
from gwtf.node.rpc.transport import CALLER_NODE
from gwtf.v1 import node_pb2, node_pb2_grpc


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=5.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(6)] == [True] * 5 + [False]
    assert not bucket.take(0.05)  # half a token
    assert bucket.take(0.1)  # one token a tenth of a second later
    assert not bucket.take(0.1)
    # A long pause refills to the burst, no further.
    assert sum(bucket.take(100.0) for _ in range(20)) == 5


def test_a_bucket_does_not_go_back_in_time() -> None:
    bucket = TokenBucket(rate=10.0, burst=1.0, now=5.0)
    assert bucket.take(5.0)
    assert not bucket.take(4.0)  # an earlier time adds nothing
    assert bucket.take(5.25)


def test_over_a_long_run_a_peer_gets_the_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimit(rate=50.0, burst=10.0), clock)
    allowed = 0
    for _ in range(10_000):  # 1000 calls per second for 10 s
        clock.now += 0.001
        allowed += limiter.allow("10.0.0.1", "a")
    assert 500 <= allowed <= 511  # 50 per second, plus the first burst
    assert limiter.refused == 10_000 - allowed


def test_peers_are_told_apart_by_host_and_named_id() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimit(rate=1.0, burst=2.0), clock)
    assert limiter.allow("127.0.0.1", "a") and limiter.allow("127.0.0.1", "a")
    assert not limiter.allow("127.0.0.1", "a")
    # Another node of the same local cluster, a client, the same id from elsewhere: their own.
    assert limiter.allow("127.0.0.1", "b")
    assert limiter.allow("127.0.0.1", "")
    assert limiter.allow("10.0.0.9", "a")
    assert limiter.refused == 1


def test_naming_a_new_id_for_every_call_meets_the_host_bucket() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimit(rate=1.0, burst=2.0), clock)
    allowed = sum(limiter.allow("10.0.0.1", f"id-{i}") for i in range(1000))
    assert allowed == 2 * HOST_SHARE
    # ...and another host is not affected.
    assert limiter.allow("10.0.0.2", "id-0")


def test_quiet_peers_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimit(rate=1.0, burst=1.0), clock, max_peers=3)
    for i in range(10):
        assert limiter.allow(f"10.0.0.{i}", "x")
    assert len(limiter._peers) == 3 and len(limiter._hosts) == 3


def test_a_limit_must_be_a_rate() -> None:
    assert not RateLimit(0).enabled
    assert RateLimit(10).capacity == 20 and RateLimit(0.1).capacity == 1
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="rate limit"):
            RateLimit(bad)
    with pytest.raises(ValueError, match="burst"):
        RateLimit(10, burst=0.5)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:[2001:db8::7]:80", "2001:db8::7"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


class CountingProbe(ProbeServicer):
    def __init__(self) -> None:
        self.seen = 0

    async def Echo(self, request: Any, context: aio.ServicerContext) -> Any:
        self.seen += 1
        return await super().Echo(request, context)


def test_the_interceptor_refuses_a_greedy_peer_and_serves_a_polite_one() -> None:
    async def main() -> None:
        # A clock that stands still: no refill between the calls, however slow they are.
        limiter = RateLimiter(RateLimit(rate=1.0, burst=5.0), clock=lambda: 100.0)
        server = aio.server(interceptors=[RateLimitInterceptor(limiter)])
        probe = CountingProbe()
        node_pb2_grpc.add_ProbeServicer_to_server(probe, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = node_pb2_grpc.ProbeStub(channel)
                codes = []
                for _ in range(20):
                    try:
                        await stub.Echo(node_pb2.EchoRequest(nonce=1), timeout=5,
                                        metadata=((CALLER_NODE, "greedy"),))  # fmt: skip
                        codes.append(grpc.StatusCode.OK)
                    except aio.AioRpcError as err:
                        codes.append(err.code())
                        assert "rate limit" in (err.details() or "")
                assert codes.count(grpc.StatusCode.OK) == 5  # the burst
                assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
                # The refused calls never reached the servicer.
                assert probe.seen == codes.count(grpc.StatusCode.OK)
                assert limiter.refused == codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
                reply = await stub.Echo(node_pb2.EchoRequest(nonce=7), timeout=5,
                                        metadata=((CALLER_NODE, "polite"),))  # fmt: skip
                assert reply.nonce == 7
        finally:
            await server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 30))
