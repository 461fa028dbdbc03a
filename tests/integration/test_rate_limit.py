"""The per-peer rate limit on a real node process: a peer that calls too fast is refused with
RESOURCE_EXHAUSTED, every one of its calls answered; a well-behaved peer is served meanwhile;
the node stays up and counts the refusals in its metrics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cluster import REPO, LocalSwarm, wait_for
from grpc import aio
from test_node_observe import scrape

from gwtf.node.rpc.transport import CALLER_NODE
from gwtf.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.integration

TIMEOUT_S = 60
RATE = 20  # calls per second per peer; the burst is two seconds' worth
GREEDY_CALLS = 400


async def flood_and_trickle(
    address: str,
) -> tuple[dict[grpc.StatusCode, int], list[str], float]:
    """`GREEDY_CALLS` health checks at once from "greedy", while "polite" checks every 0.2 s;
    the greedy calls' status codes, the polite calls' failures, and the seconds from the first
    greedy call out to the last one's end."""
    request = health_pb2.HealthCheckRequest()
    codes: dict[grpc.StatusCode, int] = {}
    polite_failures: list[str] = []
    async with aio.insecure_channel(address) as greedy, aio.insecure_channel(address) as polite:
        greedy_stub = health_pb2_grpc.HealthStub(greedy)
        polite_stub = health_pb2_grpc.HealthStub(polite)

        async def one() -> None:
            try:
                await greedy_stub.Check(request, timeout=30, metadata=((CALLER_NODE, "greedy"),))
                code = grpc.StatusCode.OK
            except aio.AioRpcError as err:
                code = err.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "rate limit" in (err.details() or ""), err.details()
            codes[code] = codes.get(code, 0) + 1

        async def trickle(done: asyncio.Event) -> None:
            while not done.is_set():
                try:
                    reply = await polite_stub.Check(
                        request, timeout=10, metadata=((CALLER_NODE, "polite"),)
                    )
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                except aio.AioRpcError as err:
                    polite_failures.append(f"{err.code().name}: {err.details()}")
                await asyncio.sleep(0.2)

        done = asyncio.Event()
        polite_task = asyncio.ensure_future(trickle(done))
        start = time.monotonic()
        for wave in range(3):  # three waves, so the flood spans the polite peer's calls
            if wave:
                await asyncio.sleep(0.3)
            await asyncio.gather(*(one() for _ in range(GREEDY_CALLS // 3)))
        elapsed = time.monotonic() - start
        done.set()
        await polite_task
    return codes, polite_failures, elapsed


def test_a_peer_over_the_rate_is_refused_and_a_polite_one_served(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path) as swarm:
        node = swarm.spawn("solo", 0, 0.05, "--stages", "2", "--rate-limit", str(RATE),
                           "--metrics-port", "0")  # fmt: skip
        swarm.wait_listening(node)
        match = re.search(r"metrics on (http://\S+)", node.lines.get(timeout=TIMEOUT_S) or "")
        assert match
        codes, polite_failures, elapsed = asyncio.run(
            asyncio.wait_for(flood_and_trickle(node.address), TIMEOUT_S)
        )
        sent = GREEDY_CALLS // 3 * 3
        refused = codes.get(grpc.StatusCode.RESOURCE_EXHAUSTED, 0)
        served = codes.get(grpc.StatusCode.OK, 0)
        # Every call answered: served or refused, nothing else, nothing lost.
        assert served + refused == sent, codes
        # The greedy peer got its burst (its bucket started full) and no more than the limit
        # allows over the time its calls took; the rest was refused.
        assert 2 * RATE <= served <= 2 * RATE + RATE * elapsed + 1, (codes, elapsed)
        assert refused > 0, codes
        assert polite_failures == []
        # The node is up, answers, and counts what it refused.
        assert node.alive
        assert swarm.status("solo", swarm=False) is not None

        def counted() -> float | None:
            value = scrape(match.group(1)).get('gwtf_requests_refused_total{reason="rate"}')
            return value if value == refused else None

        wait_for(counted, TIMEOUT_S, f"the metrics to count {refused} refusals", interval_s=0.5)


@pytest.mark.parametrize("bad", ["-1", "fast", "inf"])
def test_a_bad_rate_limit_is_one_line(bad: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gwtf", "node", "--stage", "0", "--stages", "2",
         "--rate-limit", bad],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rate-limit" in lines[0] and "calls per second" in lines[0], (
        result.stderr
    )
