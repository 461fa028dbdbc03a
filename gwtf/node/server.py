"""The gRPC servicers of a node: thin, they check and convert, then call the `Node`.

A malformed message (it does not parse: grpc answers INTERNAL before we see it; too big:
RESOURCE_EXHAUSTED) or an invalid one (`InvalidMessage`: INVALID_ARGUMENT) fails that call alone;
the node keeps serving. A refusal the node decides (wrong stage, another swarm) is one of the
`Refusal` classes (gwtf.node.errors); its status code comes from the one table at the RPC edge
(`gwtf.node.rpcedge.STATUS`, docs/design.md 3.2).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol

import grpc
from grpc import aio

from gwtf.node.codec import InvalidMessage
from gwtf.node.errors import Refusal
from gwtf.node.jobs import JobManager
from gwtf.node.rpcedge import drain, status
from gwtf.v1 import (
    data_pb2,
    flow_pb2,
    flow_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
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
)


async def _fail(context: aio.ServicerContext, err: Exception) -> NoReturn:
    code, message = status(err)
    await context.abort(code, message)
    raise AssertionError("abort returned")  # pragma: no cover


class MembershipServicer(node_pb2_grpc.MembershipServicer):
    def __init__(self, node: Node) -> None:
        self._node = node

    async def Config(
        self, request: node_pb2.ConfigRequest, context: aio.ServicerContext
    ) -> node_pb2.ConfigReply:
        try:
            return self._node.on_config(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Join(
        self, request: node_pb2.JoinRequest, context: aio.ServicerContext
    ) -> node_pb2.JoinReply:
        try:
            return self._node.on_join(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Leave(
        self, request: node_pb2.LeaveRequest, context: aio.ServicerContext
    ) -> node_pb2.LeaveReply:
        try:
            return self._node.on_leave(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Gossip(
        self, request: node_pb2.GossipRequest, context: aio.ServicerContext
    ) -> node_pb2.GossipReply:
        try:
            return self._node.on_gossip(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)


class ProbeServicer(node_pb2_grpc.ProbeServicer):
    async def Echo(
        self, request: node_pb2.EchoRequest, context: aio.ServicerContext
    ) -> node_pb2.EchoReply:
        return node_pb2.EchoReply(nonce=request.nonce, received_bytes=len(request.payload))


class FlowServicer(flow_pb2_grpc.FlowServicer):
    def __init__(self, node: Node) -> None:
        self._node = node

    async def Exchange(
        self, request: flow_pb2.FlowBatch, context: aio.ServicerContext
    ) -> flow_pb2.FlowAck:
        try:
            return self._node.on_exchange(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Phase(
        self, request: flow_pb2.PhaseCommand, context: aio.ServicerContext
    ) -> flow_pb2.PhaseReport:
        try:
            return self._node.on_phase(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Nudge(
        self, request: flow_pb2.NudgeRequest, context: aio.ServicerContext
    ) -> flow_pb2.NudgeReply:
        self._node.on_nudge(request)
        return flow_pb2.NudgeReply()


class StatusServicer(node_pb2_grpc.StatusServicer):
    def __init__(self, node: Node) -> None:
        self._node = node

    async def Get(
        self, request: node_pb2.StatusRequest, context: aio.ServicerContext
    ) -> node_pb2.StatusReply:
        return await self._node.on_status(request)


class JobServicer(job_pb2_grpc.JobServiceServicer):
    """Training jobs (gwtf.node.jobs): the client's calls and the calls between nodes."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def Submit(
        self, request: job_pb2.SubmitRequest, context: aio.ServicerContext
    ) -> job_pb2.SubmitReply:
        try:
            self._node.require_ready()
            return await self._node.jobs.submit(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Watch(
        self, request: job_pb2.WatchRequest, context: aio.ServicerContext
    ) -> AsyncIterator[job_pb2.JobProgress]:
        try:
            async for progress in self._node.jobs.watch(request):
                yield progress
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def List(
        self, request: job_pb2.ListRequest, context: aio.ServicerContext
    ) -> job_pb2.ListReply:
        return self._node.jobs.list_jobs()

    async def Cancel(
        self, request: job_pb2.CancelRequest, context: aio.ServicerContext
    ) -> job_pb2.CancelReply:
        try:
            return self._node.jobs.cancel(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Prepare(
        self, request: job_pb2.PrepareRequest, context: aio.ServicerContext
    ) -> job_pb2.PrepareReply:
        try:
            self._node.require_ready()
            return await self._node.jobs.prepare(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Start(
        self, request: job_pb2.StartRequest, context: aio.ServicerContext
    ) -> job_pb2.StartReply:
        try:
            self._node.require_ready()
            return self._node.jobs.start(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Done(
        self, request: job_pb2.DoneRequest, context: aio.ServicerContext
    ) -> job_pb2.DoneReply:
        try:
            return self._node.jobs.done(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Commit(
        self, request: job_pb2.CommitRequest, context: aio.ServicerContext
    ) -> job_pb2.CommitReply:
        try:
            return self._node.jobs.commit(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Committed(
        self, request: job_pb2.CommittedRequest, context: aio.ServicerContext
    ) -> job_pb2.CommittedReply:
        try:
            return self._node.jobs.committed(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Progress(
        self, request: job_pb2.ProgressRequest, context: aio.ServicerContext
    ) -> job_pb2.ProgressReply:
        try:
            return self._node.jobs.on_progress(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Fail(
        self, request: job_pb2.FailRequest, context: aio.ServicerContext
    ) -> job_pb2.FailReply:
        try:
            return self._node.jobs.on_fail(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Prepared(
        self, request: job_pb2.PreparedRequest, context: aio.ServicerContext
    ) -> job_pb2.PreparedReply:
        try:
            return self._node.jobs.prepared(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Step(
        self, request: job_pb2.StepRequest, context: aio.ServicerContext
    ) -> job_pb2.StepReply:
        try:
            return self._node.jobs.step(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Report(
        self, request: job_pb2.ReportRequest, context: aio.ServicerContext
    ) -> job_pb2.ReportReply:
        try:
            return await self._node.jobs.report(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Recover(
        self, request: job_pb2.RecoverRequest, context: aio.ServicerContext
    ) -> job_pb2.RecoverReply:
        try:
            return self._node.jobs.recover(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Redirect(
        self, request: job_pb2.RedirectRequest, context: aio.ServicerContext
    ) -> job_pb2.RedirectReply:
        try:
            return self._node.jobs.redirect(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Replayed(
        self, request: job_pb2.ReplayedRequest, context: aio.ServicerContext
    ) -> job_pb2.ReplayedReply:
        try:
            return self._node.jobs.replayed(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Restart(
        self, request: job_pb2.RestartRequest, context: aio.ServicerContext
    ) -> job_pb2.RestartReply:
        try:
            return self._node.jobs.restart(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Sync(
        self, request: job_pb2.SyncRequest, context: aio.ServicerContext
    ) -> job_pb2.SyncReply:
        try:
            return self._node.jobs.sync(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Enter(
        self, request: job_pb2.EnterRequest, context: aio.ServicerContext
    ) -> job_pb2.EnterReply:
        try:
            return self._node.jobs.enter(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Admit(
        self, request: job_pb2.AdmitRequest, context: aio.ServicerContext
    ) -> job_pb2.AdmitReply:
        try:
            return self._node.jobs.admit(request)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def FetchWeights(
        self, request: job_pb2.WeightsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[job_pb2.StateChunk]:
        try:
            async for chunk in self._node.jobs.fetch_weights(request):
                yield chunk
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def FetchState(
        self, request: job_pb2.StateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[job_pb2.StateChunk]:
        try:
            async for chunk in self._node.jobs.fetch_state(request):
                yield chunk
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Backup(
        self, request_iterator: AsyncIterator[job_pb2.StateChunk],
        context: aio.ServicerContext,
    ) -> job_pb2.BackupAck:
        try:
            return await self._node.jobs.backup(request_iterator)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Resume(
        self, request_iterator: AsyncIterator[job_pb2.StateChunk],
        context: aio.ServicerContext,
    ) -> job_pb2.BackupAck:
        try:
            return await self._node.jobs.resume(request_iterator)
        except (InvalidMessage, Refusal) as err:
            await _fail(context, err)

    async def Contribute(
        self, request_iterator: AsyncIterator[job_pb2.ContributionChunk],
        context: aio.ServicerContext,
    ) -> job_pb2.ContributionAck:
        jobs = self._node.jobs
        if not jobs.loaded:
            await drain(request_iterator)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no job runs here")
        # torch is loaded once a job runs here.
        from gwtf.node.gradsync import ContributionAssembler, ContributionError

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


def add_data_plane(server: aio.Server, node: Node) -> None:
    """The data plane (gwtf.node.tensors), served from the start but built only when a job
    arrives (it needs torch): until then a microbatch is refused. Chunks reach it as wire
    bytes, which is what gwtf.node.tensors' servicer reads fastest."""

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


def add_servicers(server: aio.Server, node: Node, health: HealthServicer) -> None:
    node_pb2_grpc.add_MembershipServicer_to_server(MembershipServicer(node), server)
    node_pb2_grpc.add_ProbeServicer_to_server(ProbeServicer(), server)
    flow_pb2_grpc.add_FlowServicer_to_server(FlowServicer(node), server)
    node_pb2_grpc.add_StatusServicer_to_server(StatusServicer(node), server)
    job_pb2_grpc.add_JobServiceServicer_to_server(JobServicer(node), server)
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
