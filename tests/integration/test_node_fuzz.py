"""Fuzzing a live node: random bytes and random well-formed messages at every RPC of every gwtf
service, for a bounded number of calls. The node must answer each with a status (never crash,
never log a traceback), keep serving, and its swarm must come back to the same converged flows.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster import LocalSwarm, wait_for
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from grpc import aio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gwtf.v1 as v1
from gwtf.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.integration

TIMEOUT_S = 60
CALLS_PER_METHOD = 25
# A status is an answer; only a dropped connection or a hung call would be a failure.
ANSWERS = set(grpc.StatusCode) - {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def service_files() -> list[FileDescriptor]:
    import importlib
    import pkgutil

    files = []
    for info in pkgutil.iter_modules(v1.__path__):
        if info.name.endswith("_pb2"):
            files.append(importlib.import_module(f"gwtf.v1.{info.name}").DESCRIPTOR)
    return files


def methods() -> list[tuple[str, Descriptor, bool, bool]]:
    """(path, request type, client streaming, server streaming) of every RPC."""
    found = []
    for file in service_files():
        for service in file.services_by_name.values():
            for m in service.methods:
                found.append((f"/{service.full_name}/{m.name}", m.input_type,
                              m.client_streaming, m.server_streaming))  # fmt: skip
    return found


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def scalar(field: FieldDescriptor, draw: Any) -> Any:
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        edge = st.sampled_from([low, high, 0, 1, -1 if low < 0 else 2])
        return draw(st.one_of(edge, st.integers(low, high)))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        edge = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308])
        return draw(st.one_of(edge, st.floats(allow_nan=True, allow_infinity=True, width=32)))
    if kind == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if kind == FieldDescriptor.TYPE_STRING:
        return draw(st.one_of(st.text(max_size=20), st.just("x" * 5000), st.just("")))
    if kind == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(max_size=256))
    raise AssertionError(f"unhandled field type {kind}")


def fill(descriptor: Descriptor, draw: Any, depth: int = 0) -> Any:
    """A random message of `descriptor`: each field set or not, repeated ones 0-4 long."""
    message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        nested = field.type == FieldDescriptor.TYPE_MESSAGE
        if nested and depth >= 3:
            continue
        repeated = field.is_repeated
        count = draw(st.integers(0, 4)) if repeated else 1
        for _ in range(count):
            if nested:
                value = fill(field.message_type, draw, depth + 1)
                if repeated:
                    getattr(message, field.name).add().CopyFrom(value)
                else:
                    getattr(message, field.name).CopyFrom(value)
            elif repeated:
                getattr(message, field.name).append(scalar(field, draw))
            else:
                setattr(message, field.name, scalar(field, draw))
    return message


async def call(channel: aio.Channel, path: str, client_stream: bool, server_stream: bool,
               payloads: list[bytes]) -> grpc.StatusCode:  # fmt: skip
    ident = lambda b: b  # noqa: E731 - raw bytes both ways
    try:
        if client_stream and server_stream:
            stream = channel.stream_stream(path, ident, ident)(iter(payloads), timeout=10)
            async for _ in stream:
                pass
        elif client_stream:
            await channel.stream_unary(path, ident, ident)(iter(payloads), timeout=10)
        elif server_stream:
            stream = channel.unary_stream(path, ident, ident)(payloads[0], timeout=2)
            async for _ in stream:
                pass
        else:
            await channel.unary_unary(path, ident, ident)(payloads[0], timeout=10)
    except aio.AioRpcError as err:
        if server_stream and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return grpc.StatusCode.OK  # a Watch stays open: it answered and went on
        return err.code()
    return grpc.StatusCode.OK


def fuzz_method(
    address: str,
    path: str,
    request: Descriptor,
    client_stream: bool,
    server_stream: bool,
    seen: dict[str, set[grpc.StatusCode]],
) -> None:
    @settings(max_examples=CALLS_PER_METHOD, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(data=st.data(), raw=st.booleans())
    def one(data: Any, raw: bool) -> None:
        count = data.draw(st.integers(1, 3)) if client_stream else 1
        if raw:
            payloads = [data.draw(st.binary(max_size=512)) for _ in range(count)]
        else:
            payloads = [fill(request, data.draw).SerializeToString() for _ in range(count)]

        async def go() -> grpc.StatusCode:
            async with aio.insecure_channel(address) as channel:
                return await call(channel, path, client_stream, server_stream, payloads)

        code = asyncio.run(go())
        seen.setdefault(path, set()).add(code)
        assert code in ANSWERS, (path, code, payloads[:1])

    one()


def fuzz(address: str) -> dict[str, set[grpc.StatusCode]]:
    seen: dict[str, set[grpc.StatusCode]] = {}
    for path, request, client_stream, server_stream in methods():
        fuzz_method(address, path, request, client_stream, server_stream, seen)
    return seen


def serving(address: str) -> bool:
    async def check() -> bool:
        async with aio.insecure_channel(address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            return reply.status == health_pb2.HealthCheckResponse.SERVING

    return asyncio.run(check())


def test_a_fuzzed_node_keeps_serving_and_routing(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path) as swarm:
        swarm.start([("f0", 0, 0.05), ("f1", 1, 0.05), ("g1", 1, 0.08)], num_stages=2)
        members = {"f0", "f1", "g1"}
        before = wait_for(lambda: swarm.settled(members, 2), TIMEOUT_S, "the swarm to settle")
        target = swarm.procs["f0"]
        seen = fuzz(target.address)
        assert len(seen) >= 10, sorted(seen)  # every RPC of every service was reached
        assert target.alive and serving(target.address)
        # Whatever random members the fuzzer's gossip made up are declared dead in time; the
        # real ones route as before.
        after = wait_for(lambda: swarm.settled(members, 2), 4 * TIMEOUT_S,
                         "the swarm to settle again after the fuzzing")  # fmt: skip
        assert after["flow_value_units"] == before["flow_value_units"]
    log = target.log.read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 200:][:3000]
