"""The gRPC services of a node: thin, each a table (`TABLES`) with one row per RPC that names the
`Node`'s handler; the RPC's shape and message types come from the service's descriptor, and one
function per shape (`_unary`, `_streaming`) turns a row into a grpc handler.

A malformed message (it does not parse: grpc answers INTERNAL before we see it; too big:
RESOURCE_EXHAUSTED) or an invalid one (`InvalidMessage`: INVALID_ARGUMENT) fails that call alone;
the node keeps serving. A refusal the node decides (wrong stage, another swarm) is one of the
`Refusal` classes (gwtf.node.errors); its status code comes from the one table at the RPC edge
(`gwtf.node.rpc.edge.STATUS`, docs/design.md 3.2).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, Protocol

import grpc
from grpc import aio

from gwtf.node.errors import Refusal
from gwtf.node.jobs.manager import JobManager
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.node.rpc.edge import drain, status
from gwtf.v1 import (
    data_pb2,
    flow_pb2,
    health_pb2,
    health_pb2_grpc,
    job_pb2,
    node_pb2,
    node_pb2_grpc,
)


class Node(Protocol):
    """What the servicers call on their node (gwtf.node.node.Node): the node's own handlers and
    its job manager. Servicers stay thin: each call goes to one of these."""

    jobs: JobManager

    def require_ready(self) -> None: ...

    def on_config(self, request: node_pb2.ConfigRequest) -> node_pb2.ConfigReply: ...

    def on_join(self, request: node_pb2.JoinRequest) -> node_pb2.JoinReply: ...

    def on_leave(self, request: node_pb2.LeaveRequest) -> node_pb2.LeaveReply: ...

    def on_gossip(self, request: node_pb2.GossipRequest) -> node_pb2.GossipReply: ...

    def on_exchange(self, request: flow_pb2.FlowBatch) -> flow_pb2.FlowAck: ...

    def on_phase(self, request: flow_pb2.PhaseCommand) -> flow_pb2.PhaseReport: ...

    def on_nudge(self, request: flow_pb2.NudgeRequest) -> None: ...

    async def on_status(self, request: node_pb2.StatusRequest) -> node_pb2.StatusReply: ...

__all__ = ["HealthServicer", "add_servicers"]

Serving = health_pb2.HealthCheckResponse.ServingStatus

SERVICES = (
    "gwtf.v1.Membership",
    "gwtf.v1.Probe",
    "gwtf.v1.Flow",
    "gwtf.v1.Status",
    "gwtf.v1.JobService",
    "gwtf.v1.DataPlane",
    "gwtf.v1.Relay",
)


async def _fail(context: aio.ServicerContext, err: Exception) -> NoReturn:
    code, message = status(err)
    await context.abort(code, message)
    raise AssertionError("abort returned")  # pragma: no cover


class ProbeServicer(node_pb2_grpc.ProbeServicer):
    async def Echo(
        self, request: node_pb2.EchoRequest, context: aio.ServicerContext
    ) -> node_pb2.EchoReply:
        return node_pb2.EchoReply(nonce=request.nonce, received_bytes=len(request.payload))


# ------------------------------------------------------------------ the services, as tables

Call = Callable[[Node, Any], Any]
"""What an RPC does with its request (or its request stream): returns the reply, an awaitable
of it, or, for a server-streaming RPC, an async iterator of replies."""
Raw = Callable[[Node, Any, aio.ServicerContext], Awaitable[Any]]
"""An RPC that handles its own stream and errors (Contribute)."""


@dataclass(frozen=True)
class Rpc:
    """One row of a service's table: the node's handler, and whether the node must have joined
    its swarm first (`require_ready`). `InvalidMessage` and `Refusal` from the handler become the
    call's status (`gwtf.node.rpc.edge.status`); anything else is a bug and fails the call as
    UNKNOWN, as grpc does."""

    call: Call
    ready: bool = False


MEMBERSHIP: Mapping[str, Rpc] = {
    "Config": Rpc(lambda n, r: n.on_config(r)),
    "Join": Rpc(lambda n, r: n.on_join(r)),
    "Leave": Rpc(lambda n, r: n.on_leave(r)),
    "Gossip": Rpc(lambda n, r: n.on_gossip(r)),
}
FLOW: Mapping[str, Rpc] = {
    "Exchange": Rpc(lambda n, r: n.on_exchange(r)),
    "Phase": Rpc(lambda n, r: n.on_phase(r)),
    "Nudge": Rpc(lambda n, r: _nudge(n, r)),
}
STATUS: Mapping[str, Rpc] = {"Get": Rpc(lambda n, r: n.on_status(r))}


def _nudge(node: Node, request: flow_pb2.NudgeRequest) -> flow_pb2.NudgeReply:
    node.on_nudge(request)
    return flow_pb2.NudgeReply()


async def _contribute(
    node: Node, request_iterator: AsyncIterator[job_pb2.ContributionChunk],
    context: aio.ServicerContext,
) -> job_pb2.ContributionAck:
    """A stage peer's gradient contribution (gwtf.node.dataplane.gradsync), assembled as it
    streams."""
    jobs = node.jobs
    if not jobs.loaded:
        await drain(request_iterator)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no job runs here")
    # torch is loaded once a job runs here.
    from gwtf.node.dataplane.gradsync import ContributionAssembler, ContributionError

    assembler = ContributionAssembler(jobs.contribution_expect)
    complete = False
    reading = True
    try:
        async for chunk in request_iterator:
            assembler.add(chunk)
        reading = False
        screened = assembler.header is not None and jobs.screens(assembler.header.job_id)
        header, flat = assembler.finish(allow_non_finite=screened)
        complete = jobs.on_contribution(header, flat)
    except (ContributionError, InvalidMessage, Refusal) as err:
        if reading:
            await drain(request_iterator)
        await _fail(context, err)
    return job_pb2.ContributionAck(received_bytes=assembler.received_bytes, complete=complete)


JOBS: Mapping[str, Rpc | Raw] = {
    # The client's calls.
    "Submit": Rpc(lambda n, r: n.jobs.submit(r), ready=True),
    "Watch": Rpc(lambda n, r: n.jobs.watch(r)),
    "List": Rpc(lambda n, r: n.jobs.list_jobs()),
    "Cancel": Rpc(lambda n, r: n.jobs.cancel(r)),
    # Between nodes: set-up, the iteration and its commit, recovery, entry, state.
    "Prepare": Rpc(lambda n, r: n.jobs.prepare(r), ready=True),
    "Start": Rpc(lambda n, r: n.jobs.start(r), ready=True),
    "Done": Rpc(lambda n, r: n.jobs.done(r)),
    "Commit": Rpc(lambda n, r: n.jobs.commit(r)),
    "Committed": Rpc(lambda n, r: n.jobs.committed(r)),
    "Progress": Rpc(lambda n, r: n.jobs.on_progress(r)),
    "Fail": Rpc(lambda n, r: n.jobs.on_fail(r)),
    "Prepared": Rpc(lambda n, r: n.jobs.prepared(r)),
    "Step": Rpc(lambda n, r: n.jobs.step(r)),
    "Report": Rpc(lambda n, r: n.jobs.report(r)),
    "Recover": Rpc(lambda n, r: n.jobs.recover(r)),
    "Keep": Rpc(lambda n, r: n.jobs.keep(r)),
    "Redirect": Rpc(lambda n, r: n.jobs.redirect(r)),
    "Replayed": Rpc(lambda n, r: n.jobs.replayed(r)),
    "Restart": Rpc(lambda n, r: n.jobs.restart(r)),
    "Sync": Rpc(lambda n, r: n.jobs.sync(r)),
    "Enter": Rpc(lambda n, r: n.jobs.enter(r)),
    "Admit": Rpc(lambda n, r: n.jobs.admit(r)),
    "FetchWeights": Rpc(lambda n, r: n.jobs.fetch_weights(r)),
    "FetchState": Rpc(lambda n, r: n.jobs.fetch_state(r)),
    "FetchSteps": Rpc(lambda n, r: n.jobs.fetch_steps(r)),
    "Backup": Rpc(lambda n, r: n.jobs.backup(r)),
    "Resume": Rpc(lambda n, r: n.jobs.resume(r)),
    "Contribute": _contribute,
}

TABLES: Mapping[str, tuple[ModuleType, Mapping[str, Rpc | Raw]]] = {
    "gwtf.v1.Membership": (node_pb2, MEMBERSHIP),
    "gwtf.v1.Flow": (flow_pb2, FLOW),
    "gwtf.v1.Status": (node_pb2, STATUS),
    "gwtf.v1.JobService": (job_pb2, JOBS),
}
"""Each table-driven service by full name: the module of its messages, and one row per RPC
(a test checks every RPC of the service has a row and every row an RPC)."""


def _unary(node: Node, rpc: Rpc) -> Callable[[Any, aio.ServicerContext], Awaitable[Any]]:
    async def handle(request: Any, context: aio.ServicerContext) -> Any:
        try:
            if rpc.ready:
                node.require_ready()
            reply = rpc.call(node, request)
            return await reply if inspect.isawaitable(reply) else reply
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    return handle


def _streaming(node: Node, rpc: Rpc) -> Callable[[Any, aio.ServicerContext], AsyncIterator[Any]]:
    async def handle(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            if rpc.ready:
                node.require_ready()
            async for reply in rpc.call(node, request):
                yield reply
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    return handle


def service_handler(name: str, node: Node) -> grpc.GenericRpcHandler:
    """The service `name` of `TABLES` served by `node`: each RPC's shape and message types from
    the service's descriptor, its handling from its row."""
    module, table = TABLES[name]
    service = module.DESCRIPTOR.services_by_name[name.rsplit(".", 1)[1]]
    handlers = {}
    for method in service.methods:
        row = table[method.name]
        reader = getattr(module, method.input_type.name).FromString
        writer = getattr(module, method.output_type.name).SerializeToString
        make = (grpc.stream_unary_rpc_method_handler if method.client_streaming
                else grpc.unary_unary_rpc_method_handler)
        handle: Callable[[Any, aio.ServicerContext], Any]
        if not isinstance(row, Rpc):
            handle = functools.partial(row, node)
        elif method.server_streaming:
            make, handle = grpc.unary_stream_rpc_method_handler, _streaming(node, row)
        else:
            handle = _unary(node, row)
        handlers[method.name] = make(handle, request_deserializer=reader,
                                     response_serializer=writer)
    return grpc.method_handlers_generic_handler(name, handlers)


def add_data_plane(server: aio.Server, node: Node) -> None:
    """The data plane (gwtf.node.dataplane.tensors), served from the start but built only when a job
    arrives (it needs torch): until then a microbatch is refused. Chunks reach it as wire
    bytes, which is what gwtf.node.dataplane.tensors' servicer reads fastest."""

    async def send(request_iterator: Any, context: aio.ServicerContext) -> data_pb2.DataAck:
        servicer = node.jobs.data_servicer()
        if servicer is None:
            await drain(request_iterator)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no job runs here")
        reply: data_pb2.DataAck = await servicer.Send(request_iterator, context)
        return reply

    handlers = {
        "Send": grpc.stream_unary_rpc_method_handler(
            send,
            request_deserializer=None,
            response_serializer=data_pb2.DataAck.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gwtf.v1.DataPlane", handlers),)
    )


class HealthServicer(health_pb2_grpc.HealthServicer):
    """The standard health service: "" (the whole node) and each gwtf service by name."""

    def __init__(self) -> None:
        self._status = Serving.NOT_SERVING
        self._changed = asyncio.Event()

    def set_serving(self, serving: bool) -> None:
        status = Serving.SERVING if serving else Serving.NOT_SERVING
        if status != self._status:
            self._status = status
            self._changed.set()
            self._changed = asyncio.Event()

    def _of(self, service: str) -> health_pb2.HealthCheckResponse.ServingStatus:
        if service and service not in SERVICES:
            return Serving.SERVICE_UNKNOWN
        return self._status

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._of(request.service)
        if status == Serving.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        while True:
            changed = self._changed
            yield health_pb2.HealthCheckResponse(status=self._of(request.service))
            await changed.wait()


def add_servicers(server: aio.Server, node: Node, health: HealthServicer,
                  relay: node_pb2_grpc.RelayServicer) -> None:  # fmt: skip
    server.add_generic_rpc_handlers(tuple(service_handler(name, node) for name in TABLES))
    node_pb2_grpc.add_ProbeServicer_to_server(ProbeServicer(), server)
    node_pb2_grpc.add_RelayServicer_to_server(relay, server)
    add_data_plane(server, node)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    # Server reflection, so that generic tools (grpcurl, grpcui) list and call the services.
    from grpc_reflection.v1alpha import reflection

    names = [
        service.full_name
        for module in (node_pb2, flow_pb2, job_pb2, data_pb2, health_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
    ]
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)
