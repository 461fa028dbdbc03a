"""gRPC plumbing: channel and server options, one reused channel per peer, the emulated WAN.

- Keepalive is set on both ends consistently: clients ping an idle connection every 20 s and
  give up after 10 s without an answer; servers accept pings every 10 s (the server must allow at
  least the client's rate, or it answers GOAWAY "too_many_pings"). Reconnect backoff is capped
  at 2 s, because a peer that restarts on the same address must be reachable again quickly.
- Message sizes are explicit: `MAX_MESSAGE_BYTES` both ways (grpc answers RESOURCE_EXHAUSTED
  above it, before any handler runs).
- `grpc.so_reuseport` is off, so a port already in use is an error, not a silent second server.
- Emulated WAN (docs/design.md 3): a client interceptor holds each request, and a server interceptor
  each reply, for `WanEmulator.delay` before it leaves; callers name themselves and their
  location in metadata, so the server knows which link a reply takes.
- Emulated partitions (docs/design.md 3.6): a request that would arrive while its link is cut
  (`WanEmulator.cut`: when it leaves, or when its delay is over) is dropped, whatever the kind
  of call: the caller waits out its deadline and gets DEADLINE_EXCEEDED, as from a path that
  loses every packet (a call with no deadline: UNAVAILABLE once keepalive would have given up).
  A reply, or a reply stream's message, to a caller across a cut is never sent: the server's
  handler waits until the caller's deadline cancels it. Streams' own delays are taken by their
  senders before the call (gwtf.node.control.peers), so a stream is checked when its call starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from gwtf.node.config import MAX_MESSAGE_BYTES
from gwtf.node.rpc.security import Credentials, open_channel
from gwtf.node.rpc.wan import WanEmulator
from gwtf.v1 import data_pb2_grpc, flow_pb2_grpc, health_pb2_grpc, job_pb2_grpc, node_pb2_grpc

__all__ = [
    "DROPPED",
    "CALLER_LOCATION",
    "CALLER_NODE",
    "UNDELAYED",
    "ChannelPool",
    "MalformedRequestInterceptor",
    "Stubs",
    "WanServerInterceptor",
    "channel_options",
    "is_refused",
    "server_options",
]

CALLER_NODE = "gwtf-node"
CALLER_LOCATION = "gwtf-location"
LOST = "gwtf-lost"
"""Metadata key of a reply-stream request that an emulated partition dropped (see
`_CutReplyStreams`)."""
UNDELAYED = "gwtf-undelayed"
"""Metadata key of the calibration probes that the emulated WAN lets through at once."""

DROPPED = "the emulated WAN dropped the message: its link is cut by a partition"
"""The details of a call dropped by an emulated partition."""

KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
MIN_PING_INTERVAL_MS = 10_000  # the server's floor: at most the client's KEEPALIVE_TIME_MS


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def server_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.so_reuseport", 0),
    ]


def is_refused(err: BaseException) -> bool:
    """A call failed because nothing answers at the address (connection refused or reset):
    evidence of a dead process, unlike a deadline, which a slow link also causes."""
    return isinstance(err, aio.AioRpcError) and err.code() == grpc.StatusCode.UNAVAILABLE


async def _dropped(timeout: float | None) -> Any:
    """What a caller whose request an emulated partition dropped sees: nothing until its
    deadline, then DEADLINE_EXCEEDED (no deadline: keepalive's verdict, UNAVAILABLE)."""
    if timeout is None:
        await asyncio.sleep((KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000)
        code = grpc.StatusCode.UNAVAILABLE
    else:
        await asyncio.sleep(timeout)
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    raise aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=DROPPED)


async def _never_sent() -> None:
    """A reply across a cut link: held until the caller's deadline cancels the handler."""
    await asyncio.Event().wait()


class _WanCaller:
    """What the client interceptors share: who calls, from where, over which emulated WAN."""

    def __init__(
        self, me: str, location: str, wan: WanEmulator | None, peer: Callable[[], tuple[str, str]]
    ) -> None:
        self._meta = ((CALLER_NODE, me), (CALLER_LOCATION, location))
        self._wan = wan
        self._peer = peer

    def _cut(self) -> bool:
        return self._wan is not None and self._wan.cut(self._peer()[1])

    def _located(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        """A stream's call names the caller's location only (so that the callee's partitions
        can cut its replies), not the caller: streams share their host's rate-limit bucket
        (gwtf.node.rpc.ratelimit)."""
        metadata = aio.Metadata(self._meta[1])
        if details.metadata:
            for key, value in details.metadata:
                metadata.add(key, value)
        return aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _CutReplyStreams(_WanCaller, aio.UnaryStreamClientInterceptor):
    """Drops a reply-stream call (a state transfer) across a cut link."""

    async def intercept_unary_stream(
        self,
        continuation: Callable[[Any, Any], Awaitable[Any]],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        if self._wan is None:
            return await continuation(client_call_details, request)
        details = self._located(client_call_details)
        if self._cut():
            # grpc cannot end a reply-stream call from its first interceptor, so the request
            # goes out marked as lost: the callee's interceptor runs no handler for it and
            # sends nothing, and the call ends at its deadline like any dropped one.
            assert details.metadata is not None
            details.metadata.add(LOST, "1")
        return await continuation(details, request)


class _CutRequestStreams(_WanCaller, aio.StreamUnaryClientInterceptor):
    """Drops a request-stream call (a microbatch, gradient sums, a snapshot) across a cut
    link (its delay its sender took already)."""

    async def intercept_stream_unary(
        self,
        continuation: Callable[[Any, Any], Awaitable[Any]],
        client_call_details: aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        if self._wan is None:
            return await continuation(client_call_details, request_iterator)
        if self._cut():
            return await _dropped(client_call_details.timeout)
        return await continuation(self._located(client_call_details), request_iterator)


class _WanClientInterceptor(_WanCaller, aio.UnaryUnaryClientInterceptor):
    """Names the caller in metadata and, with an emulated WAN, holds each request for the
    link's delay (taken out of the call's deadline, which covers the whole trip), or drops it
    while a partition cuts the link. (grpc takes one interceptor object per kind of call.)"""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[Any, Any], Awaitable[Any]],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        details = client_call_details
        metadata = aio.Metadata(*self._meta)
        if details.metadata:
            for key, value in details.metadata:
                metadata.add(key, value)
        timeout = details.timeout
        if self._wan is not None and UNDELAYED not in metadata:
            peer_id, location = self._peer()
            if self._wan.cut(location):
                return await _dropped(timeout)
            delay = self._wan.delay(peer_id, location, request.ByteSize())
            if delay > 0:
                await asyncio.sleep(delay)
                if timeout is not None:
                    timeout = max(timeout - delay, 0.001)
                if self._wan.cut(location):  # cut while the request was on its way
                    return await _dropped(timeout)
        details = aio.ClientCallDetails(
            details.method, timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(details, request)


class _Malformed:
    """What a request that does not parse becomes, instead of an exception inside grpc."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class MalformedRequestInterceptor(aio.ServerInterceptor):
    """A request that does not parse is answered INVALID_ARGUMENT with one line, rather than
    grpc's UNKNOWN and a traceback in the node's log; the node goes on serving."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        method = handler_call_details.method

        def deserialize(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as err:  # DecodeError, or whatever a broken message raises
                return _Malformed(err)

        async def reject(context: aio.ServicerContext) -> None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {method}"
            )

        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def checked_unary(request: Any, context: aio.ServicerContext) -> Any:
                if isinstance(request, _Malformed):
                    await reject(context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                checked_unary,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            stream = handler.unary_stream

            async def checked_stream(request: Any, context: aio.ServicerContext) -> Any:
                if isinstance(request, _Malformed):
                    await reject(context)
                async for reply in stream(request, context):
                    yield reply

            return grpc.unary_stream_rpc_method_handler(
                checked_stream,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        async def checked_requests(
            requests: AsyncIterator[Any], context: aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await reject(context)
                yield request

        if handler.stream_unary is not None:
            streamed = handler.stream_unary

            async def checked_client_stream(
                requests: AsyncIterator[Any], context: aio.ServicerContext
            ) -> Any:
                return await streamed(checked_requests(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(
                checked_client_stream,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            both = handler.stream_stream

            async def checked_both(
                requests: AsyncIterator[Any], context: aio.ServicerContext
            ) -> AsyncIterator[Any]:
                async for reply in both(checked_requests(requests, context), context):
                    yield reply

            return grpc.stream_stream_rpc_method_handler(
                checked_both,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        return handler


class WanServerInterceptor(aio.ServerInterceptor):
    """Holds each unary reply for the delay of the link back to the caller; sends no reply (nor
    message of a reply stream) while a partition cuts that link."""

    def __init__(self, wan: WanEmulator) -> None:
        self._wan = wan

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        meta = dict(handler_call_details.invocation_metadata or ())
        caller = str(meta.get(CALLER_NODE, ""))
        location = str(meta.get(CALLER_LOCATION, ""))
        if not location or UNDELAYED in meta:
            return handler
        wan = self._wan
        if handler.unary_stream is not None:
            streaming = handler.unary_stream
            lost = LOST in meta

            async def cut_stream(request: Any, context: aio.ServicerContext) -> Any:
                if lost:
                    await _never_sent()
                async for reply in streaming(request, context):
                    if wan.cut(location):
                        await _never_sent()
                    yield reply

            return grpc.unary_stream_rpc_method_handler(
                cut_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            streamed = handler.stream_unary

            async def cut_ack(requests: AsyncIterator[Any], context: aio.ServicerContext) -> Any:
                reply = await streamed(requests, context)
                if wan.cut(location):
                    await _never_sent()
                return reply

            return grpc.stream_unary_rpc_method_handler(
                cut_ack,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is None:
            return handler
        behaviour = handler.unary_unary

        async def delayed(request: Any, context: aio.ServicerContext) -> Any:
            reply = await behaviour(request, context)
            if wan.cut(location):
                await _never_sent()
            delay = wan.delay(caller, location, reply.ByteSize())
            if delay > 0:
                await asyncio.sleep(delay)
                if wan.cut(location):
                    await _never_sent()
            return reply

        return grpc.unary_unary_rpc_method_handler(
            delayed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@dataclass(frozen=True)
class Stubs:
    membership: node_pb2_grpc.MembershipStub
    probe: node_pb2_grpc.ProbeStub
    flow: flow_pb2_grpc.FlowStub
    status: node_pb2_grpc.StatusStub
    health: health_pb2_grpc.HealthStub
    jobs: job_pb2_grpc.JobServiceStub
    data: data_pb2_grpc.DataPlaneStub
    relay: node_pb2_grpc.RelayStub
    channel: aio.Channel
    """The channel itself, for stubs built elsewhere (gwtf.node.dataplane.tensors.DataPlaneStub)."""


class ChannelPool:
    """One channel per peer address, created on first use and reused for every call."""

    def __init__(
        self,
        me: str,
        location: str,
        wan: WanEmulator | None,
        credentials: Credentials | None = None,
    ) -> None:
        self._me = me
        self._credentials = credentials or Credentials()
        self._location = location
        self._wan = wan
        self._channels: dict[str, tuple[aio.Channel, Stubs]] = {}
        self._peers: dict[str, tuple[str, str]] = {}

    def rename(self, me: str) -> None:
        self._me = me

    def stubs(self, address: str, peer_id: str = "", location: str = "") -> Stubs:
        """The stubs of the channel to `address`; `peer_id` and `location` name the peer for
        the emulated WAN (unknown, as for a bootstrap address: no delay)."""
        if peer_id:
            self._peers[address] = (peer_id, location)
        found = self._channels.get(address)
        if found is not None:
            return found[1]
        def peer() -> tuple[str, str]:
            return self._peers.get(address, ("", ""))

        interceptors = [
            kind(self._me, self._location, self._wan, peer)
            for kind in (_WanClientInterceptor, _CutReplyStreams, _CutRequestStreams)
        ]
        channel = open_channel(
            address, self._credentials, options=channel_options(), interceptors=interceptors
        )
        stubs = Stubs(
            membership=node_pb2_grpc.MembershipStub(channel),
            probe=node_pb2_grpc.ProbeStub(channel),
            flow=flow_pb2_grpc.FlowStub(channel),
            status=node_pb2_grpc.StatusStub(channel),
            health=health_pb2_grpc.HealthStub(channel),
            jobs=job_pb2_grpc.JobServiceStub(channel),
            data=data_pb2_grpc.DataPlaneStub(channel),
            relay=node_pb2_grpc.RelayStub(channel),
            channel=channel,
        )
        self._channels[address] = (channel, stubs)
        return stubs

    async def close(self, address: str) -> None:
        found = self._channels.pop(address, None)
        self._peers.pop(address, None)
        if found is not None:
            await found[0].close(grace=None)

    async def close_all(self) -> None:
        for address in list(self._channels):
            await self.close(address)
