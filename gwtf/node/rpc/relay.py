"""Relays for members that cannot be dialled (docs/design.md 3.11).

A volunteer behind a NAT can dial out but nobody can dial it. It joins as any node does (joining
is its own outbound call), then asks a member whether that member can dial it back (`DialBack`).
If not, it keeps one outbound call open at a reachable member, its relay (`Attach`): the relay
listens on a port of its own for it and announces `relay-host:port`, which becomes the relayed
node's address in its member record (with `relay` naming the relay). Every TCP connection a
peer makes to that port is carried, bytes as they come, over one `Pipe` call that the relayed
node opens back to the relay when asked, to its own gRPC server. So everything addressed to the
node reaches it (membership, probes, flows, tensors, state, the commit) with no change to any of
them: the relay carries bytes, not calls.

Why a byte tunnel rather than forwarding calls: the relay then needs to know none of the node's
services, and what crosses it is what the two ends' own gRPC connection sends: with TLS
(`--tls-*`) that is the TLS stream itself, which the relay can neither read nor alter without
the receiver's TLS refusing it; a swarm token travels inside it, checked by the receiver. Without
TLS a relay is one more router on the path, as any router on the internet is.

A relay limits what it carries: at most `max_peers` attached nodes (the next is refused with
RESOURCE_EXHAUSTED), only live members of its swarm (FAILED_PRECONDITION otherwise), and
`mbps_per_peer` each way per attached node (0: no limit), paced rather than refused. When a relay
dies its attachments' calls end; each relayed node attaches to another reachable member (the
one relaying for the fewest, then the nearest) and announces its new address as a new revision
of its record, within the failure detector's time; in-flight work to it recovers as after any
lost call.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from gwtf.v1 import node_pb2, node_pb2_grpc

__all__ = [
    "CHUNK_BYTES",
    "DIAL_TIMEOUT_S",
    "RelayClient",
    "RelayLimits",
    "RelayServer",
    "split_address",
]

CHUNK_BYTES = 64 * 1024
"""Bytes read from a socket per message: HTTP/2 frames of a gRPC connection are at most 16 KiB
by default, so a chunk carries a few of them."""
DIAL_TIMEOUT_S = 3.0
"""How long `DialBack` tries to connect: a reachable address answers a TCP connection in one
round trip, however far; a NAT drops the SYN, and this bounds the wait."""
JOIN_GRACE_HEARTBEATS = 4
"""How long, in heartbeats, `Attach` waits to hear of a caller it does not know as a member yet:
a node attaches right after joining through another member, and its record reaches this one by
gossip within a few heartbeats. A stranger is refused after it."""
PIPE_CLAIM_S = 10.0
"""How long a connection made to a relayed port waits for the relayed node's Pipe."""


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT (an IPv6 host in brackets); ValueError if it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _peer_ip(peer: str) -> str:
    """The IP of a grpc `context.peer()` ("ipv4:1.2.3.4:5", "ipv6:[::1]:5"), "" if none."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host, _, _ = rest.rpartition(":")
    return host.strip("[]")


def _addresses_of(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


@dataclass(frozen=True)
class RelayLimits:
    """What a relay carries (`gwtf node --relay-peers`, `--relay-mbps`)."""

    max_peers: int = 8
    """Nodes it relays for at once; 0: it relays for none."""
    mbps_per_peer: float = 0.0
    """Each way, per relayed node, Mbit/s; 0: no limit."""


class _Pace:
    """A token bucket of `mbps` (0: no limit), one second deep."""

    def __init__(self, mbps: float) -> None:
        self.rate = mbps * 1e6 / 8
        self.tokens = self.rate
        self.at = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


@dataclass
class _Attachment:
    node_id: str
    epoch: int
    asks: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    pace_in: _Pace = field(default_factory=lambda: _Pace(0))
    pace_out: _Pace = field(default_factory=lambda: _Pace(0))
    relayed_bytes: int = 0
    connections: set[int] = field(default_factory=set)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Waiting:
    attachment: _Attachment
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def _abort(context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> Any:
    await context.abort(code, message)


class RelayServer(node_pb2_grpc.RelayServicer):
    """The relay side: `DialBack`, `Attach` and `Pipe` (module doc). `bind` and `advertise`:
    the host this node listens on and the one peers dial it at; `me` its id; `is_member(id,
    epoch)` whether that incarnation is a live member of its swarm now."""

    def __init__(
        self,
        bind: str,
        advertise: Callable[[], str],
        me: Callable[[], str],
        is_member: Callable[[str, int], bool],
        limits: RelayLimits,
        log: Callable[[], Any],
        heartbeat_s: float = 0.5,
    ) -> None:
        self._bind = bind
        self._grace_s = JOIN_GRACE_HEARTBEATS * heartbeat_s
        self._advertise = advertise
        self._me = me
        self._is_member = is_member
        self.limits = limits
        self._log = log
        self._attached: dict[str, _Attachment] = {}
        self._waiting: dict[int, _Waiting] = {}
        self._ids = itertools.count(1)
        self.refused = 0
        """Attach calls refused (a stranger, or over the limit)."""
        self._relayed_done = 0

    # ---------------------------------------------------------------- what it shows

    def relayed(self) -> dict[str, int]:
        """Bytes carried so far for each node attached now."""
        return {a.node_id: a.relayed_bytes for a in self._attached.values()}

    def relayed_bytes(self) -> int:
        """Bytes carried so far, both ways, for every node ever attached."""
        return self._relayed_done + sum(a.relayed_bytes for a in self._attached.values())

    # ---------------------------------------------------------------- DialBack

    async def DialBack(
        self, request: node_pb2.DialBackRequest, context: aio.ServicerContext
    ) -> node_pb2.DialBackReply:
        try:
            host, port = split_address(request.address)
        except ValueError as err:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise
        caller = _peer_ip(context.peer())
        # Only the caller's own address is dialled: a member is not a port scanner for others.
        if caller and caller not in _addresses_of(host):
            return node_pb2.DialBackReply(
                reachable=False,
                detail=f"its calls come from {caller}, not from {host}: behind a NAT",
            )
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                               DIAL_TIMEOUT_S)  # fmt: skip
        except (TimeoutError, OSError) as err:
            why = getattr(err, "strerror", None) or "no answer"
            return node_pb2.DialBackReply(reachable=False,
                                          detail=f"cannot connect to {request.address}: {why}")
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return node_pb2.DialBackReply(reachable=True)

    # ---------------------------------------------------------------- Attach

    async def Attach(
        self, request: node_pb2.AttachRequest, context: aio.ServicerContext
    ) -> AsyncIterator[node_pb2.RelayEvent]:
        node_id = request.node_id
        if not self._advertise():
            self.refused += 1
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                         f"{self._me()} cannot be dialled itself: it relays for nobody")
        deadline = time.monotonic() + self._grace_s
        while not self._is_member(node_id, request.epoch) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not self._is_member(node_id, request.epoch):
            self.refused += 1
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                         f"{node_id!r} is not a live member of this swarm: relays carry only "
                         "for members")  # fmt: skip
        old = self._attached.get(node_id)
        if old is None and len(self._attached) >= self.limits.max_peers:
            self.refused += 1
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{self._me()} relays for {len(self._attached)} nodes, its limit "
                         f"(--relay-peers {self.limits.max_peers})")  # fmt: skip
        if old is not None:  # the same node again (its call broke): the new one replaces it
            old.closed.set()
        attachment = _Attachment(node_id, request.epoch,
                                 pace_in=_Pace(self.limits.mbps_per_peer),
                                 pace_out=_Pace(self.limits.mbps_per_peer))  # fmt: skip
        self._attached[node_id] = attachment

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connected(attachment, reader, writer)

        server = await asyncio.start_server(connected, self._bind, 0)
        port = server.sockets[0].getsockname()[1]
        host, _ = split_address(self._advertise())
        host = f"[{host}]" if ":" in host else host
        self._log().info("relaying for %s at %s:%d", node_id, host, port)
        try:
            yield node_pb2.RelayEvent(address=f"{host}:{port}", relay=self._me())
            while not attachment.closed.is_set():
                ask = asyncio.ensure_future(attachment.asks.get())
                closed = asyncio.ensure_future(attachment.closed.wait())
                await asyncio.wait((ask, closed), return_when=asyncio.FIRST_COMPLETED)
                closed.cancel()
                if not ask.done():
                    ask.cancel()
                    break
                yield node_pb2.RelayEvent(connection=ask.result())
        finally:
            attachment.closed.set()
            server.close()
            for cid in list(attachment.connections):
                waiting = self._waiting.pop(cid, None)
                if waiting is not None:
                    waiting.writer.close()
            if self._attached.get(node_id) is attachment:
                del self._attached[node_id]
            self._relayed_done += attachment.relayed_bytes
            self._log().info("stopped relaying for %s", node_id)

    async def _connected(self, attachment: _Attachment, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:  # fmt: skip
        if attachment.closed.is_set():
            writer.close()
            return
        cid = next(self._ids)
        waiting = _Waiting(attachment, reader, writer)
        self._waiting[cid] = waiting
        attachment.connections.add(cid)
        attachment.asks.put_nowait(cid)
        try:
            await asyncio.wait_for(waiting.claimed.wait(), PIPE_CLAIM_S)
            await waiting.done.wait()
        except TimeoutError:
            writer.close()
        finally:
            self._waiting.pop(cid, None)
            attachment.connections.discard(cid)

    # ---------------------------------------------------------------- Pipe

    async def Pipe(
        self, request_iterator: AsyncIterator[node_pb2.PipeChunk], context: aio.ServicerContext
    ) -> AsyncIterator[node_pb2.PipeChunk]:
        first = await anext(aiter(request_iterator), None)
        waiting = None if first is None else self._waiting.get(first.connection)
        if waiting is None or waiting.claimed.is_set():
            await _abort(context, grpc.StatusCode.NOT_FOUND,
                         "no connection of that number waits here")  # fmt: skip
            return
        waiting.claimed.set()
        attachment, reader, writer = waiting.attachment, waiting.reader, waiting.writer

        async def inward() -> None:
            # From the relayed node to the peer that connected.
            try:
                if first is not None and first.data:
                    await self._carry(attachment.pace_in, attachment, len(first.data))
                    writer.write(first.data)
                async for chunk in request_iterator:
                    await self._carry(attachment.pace_in, attachment, len(chunk.data))
                    writer.write(chunk.data)
                    await writer.drain()
            except (OSError, aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        task = asyncio.ensure_future(inward())
        try:
            while not attachment.closed.is_set():
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                await self._carry(attachment.pace_out, attachment, len(data))
                yield node_pb2.PipeChunk(data=data)
        except OSError:
            pass
        finally:
            task.cancel()
            writer.close()
            waiting.done.set()

    @staticmethod
    async def _carry(pace: _Pace, attachment: _Attachment, n: int) -> None:
        attachment.relayed_bytes += n
        await pace.take(n)


class RelayClient:
    """The relayed side (module doc): keeps an attachment at a relay, opens a Pipe to its own
    server for each connection the relay announces, and when the relay is lost attaches to the
    next. `local` is HOST:PORT of its own server; `candidates()` the reachable members to try,
    best first, each as (id, address, stub); `announce(address, relay)` is called with each new
    address."""

    def __init__(
        self,
        node_id: str,
        epoch: Callable[[], int],
        local: str,
        candidates: Callable[[], Awaitable[Sequence[tuple[str, str, node_pb2_grpc.RelayStub]]]],
        announce: Callable[[str, str], None],
        log: Callable[[], Any],
        retry_s: float = 1.0,
    ) -> None:
        self.node_id = node_id
        self._epoch = epoch
        self._local = split_address(local)
        self._candidates = candidates
        self._announce = announce
        self._log = log
        self._retry_s = retry_s
        self.relay = ""
        self.attached = asyncio.Event()
        self._pipes: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Attach, and attach again whenever the relay is lost, until cancelled."""
        try:
            while True:
                for relay_id, address, stub in await self._candidates():
                    await self._attach(relay_id, address, stub)
                await asyncio.sleep(self._retry_s)
        finally:
            for task in self._pipes:
                task.cancel()

    async def _attach(self, relay_id: str, address: str, stub: node_pb2_grpc.RelayStub) -> None:
        call = stub.Attach(node_pb2.AttachRequest(node_id=self.node_id, epoch=self._epoch()))
        try:
            async for event in call:
                if event.address:
                    self.relay = event.relay or relay_id
                    self._announce(event.address, self.relay)
                    self.attached.set()
                    self._log().info("relayed through %s: peers dial %s", self.relay,
                                     event.address)  # fmt: skip
                elif event.connection:
                    task = asyncio.ensure_future(self._pipe(stub, event.connection))
                    self._pipes.add(task)
                    task.add_done_callback(self._pipes.discard)
        except aio.AioRpcError as err:
            self._log().warning("relay %s at %s: %s", relay_id, address,
                                err.details() or err.code().name)  # fmt: skip
        finally:
            call.cancel()
        if self.relay == relay_id:
            self.attached.clear()
            self._log().warning("lost relay %s; attaching to another member", relay_id)

    async def _pipe(self, stub: node_pb2_grpc.RelayStub, connection: int) -> None:
        try:
            reader, writer = await asyncio.open_connection(*self._local)
        except OSError:
            return

        async def outward() -> AsyncIterator[node_pb2.PipeChunk]:
            yield node_pb2.PipeChunk(connection=connection)
            while True:
                try:
                    data = await reader.read(CHUNK_BYTES)
                except OSError:
                    return
                if not data:
                    return
                yield node_pb2.PipeChunk(data=data)

        call = stub.Pipe(outward())
        try:
            async for chunk in call:
                writer.write(chunk.data)
                await writer.drain()
        except (aio.AioRpcError, OSError):
            pass
        finally:
            call.cancel()
            writer.close()
