"""`wait` rides out a node that drops its Watch stream for a moment, and says so when it stays
away (a real gRPC server on loopback standing in for the node's job service)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from gwtf.client import WATCH_RETRIES, AsyncGwtfClient, ClientError
from gwtf.v1 import job_pb2, job_pb2_grpc


class Flaky(job_pb2_grpc.JobServiceServicer):
    """Drops the first `drops` Watch calls (UNAVAILABLE), then says the job completed."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.calls = 0

    async def Watch(self, request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        self.calls += 1
        if self.calls <= self.drops:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the stream was dropped")
        yield job_pb2.JobProgress(job_id=request.job_id, state=job_pb2.JOB_STATE_COMPLETED,
                                  iterations=1, iterations_completed=1)


async def _wait(drops: int) -> tuple[Flaky, Any]:
    server = aio.server()
    flaky = Flaky(drops)
    job_pb2_grpc.add_JobServiceServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncGwtfClient(f"127.0.0.1:{port}", timeout_s=10) as client:
            try:
                return flaky, await client.wait("job-1", timeout_s=30)
            except ClientError as err:
                return flaky, err
    finally:
        await server.stop(None)


def test_a_dropped_watch_stream_is_called_again() -> None:
    flaky, result = asyncio.run(_wait(2))
    assert not isinstance(result, ClientError), result
    assert result.state == "completed" and flaky.calls == 3


def test_a_node_that_stays_away_is_reported_unreachable() -> None:
    flaky, result = asyncio.run(_wait(WATCH_RETRIES + 1))
    assert isinstance(result, ClientError) and "cannot reach" in str(result), result
    assert flaky.calls == WATCH_RETRIES + 1

