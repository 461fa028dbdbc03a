"""One node in this process, real gRPC on loopback: health checking, and bad peers.

A peer sending malformed, oversized or invalid messages gets a gRPC error for that call, and the
node keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from gwtf.node.config import MAX_MESSAGE_BYTES, NodeConfig
from gwtf.node.node import Node, NodeSettings
from gwtf.v1 import flow_pb2, health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc


def run(test: Callable[[Node, aio.Channel], Awaitable[None]]) -> None:
    async def main() -> None:
        settings = NodeSettings(stage=0, node_id="solo", num_stages=2, compute_s=0.1)
        node = Node(settings, NodeConfig())
        await node.start()
        await node.enter_swarm()
        try:
            async with aio.insecure_channel(node.address) as channel:
                await test(node, channel)
        finally:
            await node.leave()
            await node.close()

    asyncio.run(asyncio.wait_for(main(), 60))


async def expect_code(code: grpc.StatusCode, call: Awaitable[Any]) -> str:
    with pytest.raises(aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


async def still_serving(channel: aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    status = await node_pb2_grpc.StatusStub(channel).Get(node_pb2.StatusRequest(), timeout=5)
    assert status.node == "solo" and status.swarm.num_stages == 2


def test_health_checking_is_the_standard_service() -> None:
    async def check(node: Node, channel: aio.Channel) -> None:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "gwtf.v1.Flow", "gwtf.v1.Membership"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await expect_code(
            grpc.StatusCode.NOT_FOUND,
            health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5),
        )
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()

    run(check)


def test_server_reflection_lists_every_service_and_describes_them() -> None:
    # What grpcurl does: list the services, then fetch the file that defines one.
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def reflect(node: Node, channel: aio.Channel) -> None:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask(**kw: str) -> Any:
            call = stub.ServerReflectionInfo(timeout=5)
            await call.write(reflection_pb2.ServerReflectionRequest(**kw))
            await call.done_writing()
            reply = await call.read()
            call.cancel()
            return reply

        listed = await ask(list_services="")
        names = {s.name for s in listed.list_services_response.service}
        assert {"gwtf.v1.Membership", "gwtf.v1.Flow", "gwtf.v1.JobService", "gwtf.v1.Status",
                "gwtf.v1.Probe", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= names, names
        described = await ask(file_containing_symbol="gwtf.v1.JobService")
        files = described.file_descriptor_response.file_descriptor_proto
        assert files and any(b"JobService" in f for f in files)

    run(reflect)


def test_malformed_and_oversized_messages_fail_alone() -> None:
    async def check(node: Node, channel: aio.Channel) -> None:
        raw = channel.unary_unary("/gwtf.v1.Flow/Exchange")
        details = await expect_code(
            grpc.StatusCode.INVALID_ARGUMENT, raw(b"\xff\xff\xff garbage", timeout=5)
        )
        assert details == "malformed request to /gwtf.v1.Flow/Exchange"
        echo = node_pb2_grpc.ProbeStub(channel).Echo
        huge = node_pb2.EchoRequest(payload=bytes(MAX_MESSAGE_BYTES + 1))
        await expect_code(grpc.StatusCode.RESOURCE_EXHAUSTED, echo(huge, timeout=10))
        await still_serving(channel)

    run(check)


def test_invalid_messages_are_refused_with_a_reason() -> None:
    async def check(node: Node, channel: aio.Channel) -> None:
        flow = flow_pb2_grpc_stub(channel)
        misaddressed = flow_pb2.FlowBatch(
            sender="x", messages=[flow_pb2.FlowMessage(sender="x", receiver="someone-else")]
        )
        details = await expect_code(
            grpc.StatusCode.INVALID_ARGUMENT, flow.Exchange(misaddressed, timeout=5)
        )
        assert "someone-else" in details
        forged = flow_pb2.FlowBatch(
            sender="x", arcs=[flow_pb2.ArcParams(tail="y", head="solo", gen=1)]
        )
        await expect_code(grpc.StatusCode.INVALID_ARGUMENT, flow.Exchange(forged, timeout=5))
        # An arc from a tail this node does not know: refused in the ack, not fatal.
        unknown = flow_pb2.FlowBatch(
            sender="x",
            arcs=[flow_pb2.ArcParams(tail="x", head="solo", head_epoch=1, gen=1, cap=5)],
        )
        ack = await flow.Exchange(unknown, timeout=5)
        assert not ack.ok and "x" in ack.error

        membership = node_pb2_grpc.MembershipStub(channel)
        bad = node_pb2.Member(id="m", address="h:1", stage=0, compute_s=math.nan, capacity=1,
                              epoch=1, state=1)
        gossip = node_pb2.GossipRequest(swarm_id=node.swarm.swarm_id, sender="m", members=[bad])
        await expect_code(grpc.StatusCode.INVALID_ARGUMENT, membership.Gossip(gossip, timeout=5))
        nameless = node_pb2.GossipRequest(swarm_id=node.swarm.swarm_id, sender="", view=7)
        details = await expect_code(
            grpc.StatusCode.INVALID_ARGUMENT, membership.Gossip(nameless, timeout=5)
        )
        assert "sender" in details
        # A well-formed call whose digest differs while nobody spreads news: the whole table.
        peer = node_pb2.Member(id="m", address="h:1", stage=0, compute_s=1, capacity=1,
                               epoch=1, state=1)  # fmt: skip
        hello = node_pb2.GossipRequest(swarm_id=node.swarm.swarm_id, sender="m", view=7)
        reply = await membership.Gossip(hello, timeout=5)
        assert [m.id for m in reply.members] == ["solo"]
        told = node_pb2.GossipRequest(swarm_id=node.swarm.swarm_id, sender="m", members=[peer])
        reply = await membership.Gossip(told, timeout=5)  # news now: "solo" spreads m's arrival
        assert {m.id for m in reply.members} == {"solo", "m"}
        stranger = node_pb2.GossipRequest(swarm_id="another", sender="m")
        await expect_code(
            grpc.StatusCode.FAILED_PRECONDITION, membership.Gossip(stranger, timeout=5)
        )
        long_id = node_pb2.Member(id="m" * 1000, address="h:1", stage=0, compute_s=1,
                                  capacity=1, epoch=1, state=1)
        await expect_code(
            grpc.StatusCode.INVALID_ARGUMENT,
            membership.Join(node_pb2.JoinRequest(member=long_id), timeout=5),
        )
        await still_serving(channel)

    run(check)


def test_phase_commands_are_checked_before_they_move_anything() -> None:
    async def check(node: Node, channel: aio.Channel) -> None:
        flow = flow_pb2_grpc_stub(channel)
        state = (node.driver.round, node.driver.tightens)
        stranger = flow_pb2.PhaseCommand(coordinator="nobody", round=0, tightens=1)
        details = await expect_code(
            grpc.StatusCode.FAILED_PRECONDITION, flow.Phase(stranger, timeout=5)
        )
        assert "not a live member" in details
        # A phase count no scaling has would be that many tighten calls on the event loop.
        endless = flow_pb2.PhaseCommand(coordinator="solo", round=0, tightens=2**32 - 1)
        details = await expect_code(
            grpc.StatusCode.INVALID_ARGUMENT, flow.Phase(endless, timeout=5)
        )
        assert "a scaling has" in details
        far = flow_pb2.PhaseCommand(coordinator="solo", round=2**63, tightens=0)
        await expect_code(grpc.StatusCode.INVALID_ARGUMENT, flow.Phase(far, timeout=5))
        assert (node.driver.round, node.driver.tightens) == state
        await still_serving(channel)

    run(check)


def test_a_stage_outside_the_swarm_is_refused_with_the_range() -> None:
    async def check(node: Node, channel: aio.Channel) -> None:
        membership = node_pb2_grpc.MembershipStub(channel)
        details = await expect_code(
            grpc.StatusCode.FAILED_PRECONDITION,
            membership.Config(node_pb2.ConfigRequest(stage=5), timeout=5),
        )
        assert "0..1" in details
        joiner = node_pb2.Member(id="j", address="h:1", stage=7, compute_s=1, capacity=1,
                                 epoch=1, state=1)
        await expect_code(
            grpc.StatusCode.FAILED_PRECONDITION,
            membership.Join(node_pb2.JoinRequest(member=joiner), timeout=5),
        )
        taken = node_pb2.Member(id="solo", address="h:1", stage=1, compute_s=1, capacity=1,
                                epoch=1, state=1)
        await expect_code(
            grpc.StatusCode.ALREADY_EXISTS,
            membership.Join(node_pb2.JoinRequest(member=taken), timeout=5),
        )
        await still_serving(channel)

    run(check)


def flow_pb2_grpc_stub(channel: aio.Channel) -> Any:
    from gwtf.v1 import flow_pb2_grpc

    return flow_pb2_grpc.FlowStub(channel)


def test_every_rpc_of_a_table_driven_service_has_exactly_one_row() -> None:
    from gwtf.node.rpc.server import TABLES

    for name, (module, table) in TABLES.items():
        service = module.DESCRIPTOR.services_by_name[name.rsplit(".", 1)[1]]
        assert {m.name for m in service.methods} == set(table), name
