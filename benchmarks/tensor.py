"""`python -m benchmarks tensor [--quick]`: the tensor data plane on loopback (issue 5).

(a) Transfer: one tensor of 1, 4, 16 and 64 MiB sent with `gwtf.node.dataplane.tensors.send` to a
    `DataPlaneServicer` in another process (the receiver assembles and checks it, as a node
    does), against a plain TCP socket carrying the same bytes to the same process (a length
    prefix, `recv_into` a fresh buffer, a one-byte acknowledgement), measured in turn in the
    same run. Throughput is bytes / median time from the first byte out to the acknowledgement.
(b) What was tried: the same transfers with other chunk sizes, through protobuf messages
    instead of pre-serialised wire bytes, with a 16 MiB flow-control window instead of gRPC's
    default, as one message per tensor (what a unary call would send), and gRPC alone (the
    bytes as bytes messages, counted and dropped: no codec, no tensor).
(c) Per-hop overhead: a small microbatch (a 4 x 128 x 4 float32 activation, 8 KiB) sent and
    acknowledged, p50 and p99, against a socket round trip of the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import grpc
import torch
import uvloop
from grpc import aio

from benchmarks.report import machine, write_section
from gwtf.node.dataplane import tensors
from gwtf.node.dataplane.tensors import CHUNK_BYTES, MicrobatchTag, TensorLimits
from gwtf.node.rpc.transport import channel_options, server_options
from gwtf.v1 import data_pb2_grpc

MIB = 2**20
SIZES_MIB = (1, 4, 16, 64)
TARGET_RATIO = 0.5
TARGET_GBPS = 1.0
SMALL_SHAPE = (4, 128, 4)
TAG = MicrobatchTag("bench", 0, 0, "forward", "sender", ("sender",))

# gRPC's default per-stream receive window is 64 KiB; a larger one lets a large tensor flow
# without waiting for window updates. Set on both ends (it is the receiver's that counts).
LOOKAHEAD = ("grpc.http2.lookahead_bytes", 16 * MIB)
# Room for one message per 64 MiB tensor (the "one message" variant).
BIG_MESSAGES = [
    ("grpc.max_send_message_length", 80 * MIB),
    ("grpc.max_receive_message_length", 80 * MIB),
]


Options = list[tuple[str, Any]]


def _with(options: Options, extra: Sequence[tuple[str, Any]]) -> Options:
    """`options` with `extra` in place of any option of the same name."""
    names = {name for name, _ in extra}
    return [o for o in options if o[0] not in names] + list(extra)


@dataclass(frozen=True)
class Variant:
    """One way of sending: over which receiver (server options), which stub, what chunks."""

    name: str
    receiver: str  # "node": the node's options today; "tuned": with LOOKAHEAD and BIG_MESSAGES
    # "wire": pre-serialised chunks (tensors.DataPlaneStub, tensors' registration);
    # "protobuf": DataChunk messages (the generated stub and registration);
    # "grpc": no data plane at all, the tensor's bytes as bytes messages to a handler that
    # only counts them: what gRPC itself costs, the ceiling of any codec on top of it.
    mode: str
    chunk_bytes: int | None  # None: the whole tensor in one message
    lookahead: bool = False  # the sender's channel also gets LOOKAHEAD


CHOSEN = Variant("wire bytes, 1 MiB chunks", "node", "wire", CHUNK_BYTES)
VARIANTS = (
    CHOSEN,
    Variant("protobuf messages, 1 MiB chunks", "node", "protobuf", CHUNK_BYTES),
    Variant("wire bytes, 256 KiB chunks", "node", "wire", 256 * 1024),
    # The largest chunk under the node's 4 MiB message limit, with room for a full header.
    Variant("wire bytes, 2.9 MiB chunks", "node", "wire", 3 * MIB - 100 * 1024),
    Variant("gRPC alone: 1 MiB bytes messages, no codec", "node", "grpc", CHUNK_BYTES),
    Variant("wire bytes, 1 MiB chunks, lookahead 16 MiB", "tuned", "wire", CHUNK_BYTES, True),
    Variant("wire bytes, 16 MiB chunks, lookahead 16 MiB", "tuned", "wire", 16 * MIB, True),
    Variant("wire bytes, one message per tensor, lookahead", "tuned", "wire", None, True),
)
RAW_METHOD = "/gwtf.bench.Raw/Send"
RECEIVERS = {
    "node": server_options(),
    "tuned": _with(server_options(), [LOOKAHEAD, *BIG_MESSAGES]),
}


# --------------------------------------------------------------------------- receiver process


def _socket_server(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_socket_echo, args=(conn,), daemon=True).start()


def _socket_echo(conn: socket.socket) -> None:
    """Reads length-prefixed blobs into fresh buffers (as the data plane allocates a fresh
    tensor per microbatch) and acknowledges each with one byte."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = bytearray(8)
    with conn:
        while conn.recv_into(head, 8, socket.MSG_WAITALL) == 8:
            (size,) = struct.unpack("<Q", head)
            buffer = torch.empty(size, dtype=torch.uint8).numpy().data
            done = 0
            while done < size:
                got = conn.recv_into(buffer[done:], size - done)
                if got == 0:
                    return
                done += got
            conn.sendall(b"\x01")


async def _count(request_iterator: Any, context: aio.ServicerContext) -> bytes:
    received = 0
    async for message in request_iterator:
        received += len(message)
    return str(received).encode()


def _receiver(pipe: Connection, options: list[tuple[str, Any]]) -> None:
    """The receiving node: a gRPC server serving the data plane through the wire-bytes
    registration (and the bytes counter of mode "grpc"), another through the generated
    protobuf one, and a plain socket server."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

    async def main() -> None:
        async def take(tag: MicrobatchTag, received: dict[str, torch.Tensor]) -> None:
            return None

        servers = []
        ports = {}
        for wire in (True, False):
            server = aio.server(options=options)
            servicer = tensors.DataPlaneServicer(take, TensorLimits())
            if wire:
                tensors.add_DataPlaneServicer_to_server(servicer, server)
                raw = {"Send": grpc.stream_unary_rpc_method_handler(_count)}
                server.add_generic_rpc_handlers(
                    (grpc.method_handlers_generic_handler("gwtf.bench.Raw", raw),)
                )
            else:
                data_pb2_grpc.add_DataPlaneServicer_to_server(servicer, server)
            ports[wire] = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
        listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=_socket_server, args=(listener,), daemon=True).start()
        pipe.send((ports[True], ports[False], listener.getsockname()[1]))
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # until told to stop
        for server in servers:
            await server.stop(grace=None)

    uvloop.run(main())


class Receiver:
    def __init__(self, options: list[tuple[str, Any]]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_receiver, args=(child, options), daemon=True)
        self._process.start()
        if not self._pipe.poll(120):
            raise RuntimeError("the receiver process did not start in 120 s")
        self.wire_port, self.protobuf_port, self.socket_port = self._pipe.recv()

    def close(self) -> None:
        self._pipe.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


# --------------------------------------------------------------------------- sender


class SocketSender:
    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trip(self, data: memoryview) -> float:
        start = time.perf_counter()
        self._sock.sendall(struct.pack("<Q", data.nbytes))
        self._sock.sendall(data)
        if self._sock.recv(1) != b"\x01":
            raise RuntimeError("the socket receiver went away")
        return time.perf_counter() - start

    def close(self) -> None:
        self._sock.close()


class GrpcSender:
    def __init__(self, variant: Variant, receiver: Receiver) -> None:
        options = channel_options()
        if variant.receiver == "tuned":
            options = _with(options, BIG_MESSAGES)
        if variant.lookahead:
            options = _with(options, [LOOKAHEAD])
        port = receiver.protobuf_port if variant.mode == "protobuf" else receiver.wire_port
        self._channel = aio.insecure_channel(f"127.0.0.1:{port}", options=options)
        self._stub: Any = (
            data_pb2_grpc.DataPlaneStub(self._channel)
            if variant.mode == "protobuf"
            else tensors.DataPlaneStub(self._channel)
        )
        self._raw = self._channel.stream_unary(RAW_METHOD) if variant.mode == "grpc" else None
        self._chunk_bytes = variant.chunk_bytes

    async def round_trip(self, tensor: torch.Tensor) -> float:
        chunk = self._chunk_bytes or tensor.nbytes + 4096
        start = time.perf_counter()
        if self._raw is not None:
            data = tensor.view(-1).view(torch.uint8).numpy().data
            parts = (data[i : i + chunk].tobytes() for i in range(0, data.nbytes, chunk))
            if int(await self._raw(parts, timeout=60)) != data.nbytes:
                raise RuntimeError("the bytes counter lost bytes")
        else:
            await tensors.send(self._stub, TAG, {"x": tensor}, timeout=60, chunk_bytes=chunk)
        return time.perf_counter() - start

    async def close(self) -> None:
        await self._channel.close()


def _payload(size: int) -> tuple[torch.Tensor, memoryview]:
    tensor = torch.randn(size // 4, generator=torch.Generator().manual_seed(size))
    return tensor, tensor.view(torch.uint8).numpy().data


@dataclass
class Transfer:
    variant: str
    size_mib: int
    grpc_s: list[float]
    socket_s: list[float]

    def gbps(self, times: list[float]) -> float:
        return self.size_mib * MIB / statistics.median(times) / 1e9

    @property
    def grpc_gbps(self) -> float:
        return self.gbps(self.grpc_s)

    @property
    def socket_gbps(self) -> float:
        return self.gbps(self.socket_s)

    @property
    def ratio(self) -> float:
        return statistics.median(self.socket_s) / statistics.median(self.grpc_s)


def _reps(size_mib: int, quick: bool) -> int:
    if quick:
        return 3
    return 9 if size_mib >= 16 else 21


async def measure_transfers(
    variants: Sequence[Variant],
    receivers: dict[str, Receiver],
    quick: bool,
    log: Callable[[str], None],
) -> list[Transfer]:
    """Each variant, with the socket to its receiver process just before it, in turn, for
    every size (after one warm-up each): every row sees the same moments of the machine."""
    socks = {name: SocketSender(r.socket_port) for name, r in receivers.items()}
    senders = [GrpcSender(v, receivers[v.receiver]) for v in variants]
    results = []
    try:
        for size_mib in SIZES_MIB:
            tensor, data = _payload(size_mib * MIB)
            found = [Transfer(v.name, size_mib, [], []) for v in variants]
            for rep in range(_reps(size_mib, quick) + 1):
                for variant, sender, transfer in zip(variants, senders, found, strict=True):
                    socket_s = socks[variant.receiver].round_trip(data)
                    grpc_s = await sender.round_trip(tensor)
                    if rep:  # the first is a warm-up
                        transfer.socket_s.append(socket_s)
                        transfer.grpc_s.append(grpc_s)
            for transfer in found:
                log(
                    f"{transfer.variant}, {size_mib} MiB: {transfer.grpc_gbps:.2f} GB/s, "
                    f"socket {transfer.socket_gbps:.2f} GB/s"
                )
            results += found
    finally:
        for sock in socks.values():
            sock.close()
        for sender in senders:
            await sender.close()
    return results


@dataclass
class Latency:
    name: str
    grpc_s: list[float]
    socket_s: list[float]


def _pct(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_latency(
    variants: Sequence[Variant], receivers: dict[str, Receiver], calls: int
) -> list[Latency]:
    tensor = torch.randn(SMALL_SHAPE)
    data = tensor.view(torch.uint8).numpy().data
    socks = {name: SocketSender(r.socket_port) for name, r in receivers.items()}
    senders = [GrpcSender(v, receivers[v.receiver]) for v in variants]
    found = [Latency(v.name, [], []) for v in variants]
    try:
        for rep in range(calls + 20):
            for variant, sender, latency in zip(variants, senders, found, strict=True):
                socket_s = socks[variant.receiver].round_trip(data)
                grpc_s = await sender.round_trip(tensor)
                if rep >= 20:
                    latency.socket_s.append(socket_s)
                    latency.grpc_s.append(grpc_s)
    finally:
        for sock in socks.values():
            sock.close()
        for sender in senders:
            await sender.close()
    return found


# --------------------------------------------------------------------------- report


def collect(quick: bool, log: Callable[[str], None]) -> tuple[list[Transfer], list[Latency]]:
    variants = [v for v in VARIANTS if not quick or v in (CHOSEN, VARIANTS[1])]
    receivers: dict[str, Receiver] = {}
    try:
        for name in sorted({v.receiver for v in variants}):
            receivers[name] = Receiver(RECEIVERS[name])
        log(f"{len(variants)} variants, {len(receivers)} receiver processes")
        transfers = uvloop.run(measure_transfers(variants, receivers, quick, log))
        small = [v for v in variants if v.chunk_bytes is not None]
        latencies = uvloop.run(measure_latency(small, receivers, 50 if quick else 500))
    finally:
        for receiver in receivers.values():
            receiver.close()
    return transfers, latencies


def report(transfers: list[Transfer], latencies: list[Latency], command: str) -> str:
    chosen = [t for t in transfers if t.variant == CHOSEN.name]
    large = [t for t in chosen if t.size_mib >= 16]
    met_ratio = all(t.ratio >= TARGET_RATIO for t in large)
    met_gbps = all(t.grpc_gbps >= TARGET_GBPS for t in large)
    lines = [
        "## Tensor data plane: gRPC vs a plain TCP socket on loopback (`python -m benchmarks "
        "tensor`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}` on {machine()}. The machine is "
        "shared: another engineer's test runs use the same 2 cores, so absolute figures move "
        "from run to run; every ratio compares the two transports measured in turn in the same "
        "run, on the same receiver process. Sender: `gwtf.node.dataplane.tensors.send` (one "
        "float32 tensor, uvloop); receiver: `DataPlaneServicer` in another process (assembles the "
        "tensor and checks it, NaN/inf included, as a node does). Socket: length prefix, "
        "`recv_into` a fresh buffer, a one-byte acknowledgement. Throughput = bytes / median "
        f"time to the acknowledgement. Chosen configuration: chunks of {CHUNK_BYTES // 1024} KiB "
        "sent as wire bytes (`tensors.DataPlaneStub`, `tensors.add_DataPlaneServicer_to_server`) "
        "over the node's own channel and server options (`gwtf.node.rpc.transport`).",
        "",
        "| size | gRPC GB/s | socket GB/s | gRPC / socket |",
        "|---|---|---|---|",
    ]
    for t in chosen:
        lines.append(
            f"| {t.size_mib} MiB | {t.grpc_gbps:.2f} | {t.socket_gbps:.2f} | {t.ratio:.2f} |"
        )
    lines += [
        "",
        f"Targets for large tensors (16 and 64 MiB): gRPC / socket >= {TARGET_RATIO} "
        f"({'met' if met_ratio else 'missed'}), >= {TARGET_GBPS:.0f} GB/s "
        f"({'met' if met_gbps else 'missed'}).",
        "",
        "What was tried (same run, every variant measured in turn, each right after a socket "
        "transfer to the same receiver process; \"node\" options are `gwtf.node.rpc.transport`'s, "
        "4 MiB messages; the lookahead rows go to a second receiver process with "
        "`grpc.http2.lookahead_bytes` = 16 MiB and 80 MiB messages; \"gRPC alone\" counts and "
        "drops the bytes, so it allocates no tensor and checks nothing):",
        "",
        "| variant | " + " | ".join(f"{s} MiB GB/s (ratio)" for s in SIZES_MIB) + " |",
        "|---|" + "---|" * len(SIZES_MIB),
    ]
    for variant in VARIANTS:
        rows = {t.size_mib: t for t in transfers if t.variant == variant.name}
        if not rows:
            continue
        cells = [
            f"{rows[s].grpc_gbps:.2f} ({rows[s].ratio:.2f})" if s in rows else "n/a"
            for s in SIZES_MIB
        ]
        lines.append(f"| {variant.name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Per-hop overhead, one {'x'.join(map(str, SMALL_SHAPE))} float32 microbatch "
        f"({torch.Size(SMALL_SHAPE).numel() * 4 // 1024} KiB), sent and acknowledged, "
        f"{len(latencies[0].grpc_s) if latencies else 0} calls:",
        "",
        "| variant | gRPC p50 ms | gRPC p99 ms | socket p50 ms | socket p99 ms | p50 overhead ms |",
        "|---|---|---|---|---|---|",
    ]
    for lat in latencies:
        g50, g99 = _pct(lat.grpc_s, 0.5) * 1e3, _pct(lat.grpc_s, 0.99) * 1e3
        s50, s99 = _pct(lat.socket_s, 0.5) * 1e3, _pct(lat.socket_s, 0.99) * 1e3
        lines.append(
            f"| {lat.name} | {g50:.2f} | {g99:.2f} | {s50:.3f} | {s99:.3f} | {g50 - s50:.2f} |"
        )
    return "\n".join(lines)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(quick: bool = False) -> str:
    """Every part (`--quick`: the chosen and the protobuf variants, few repetitions), into
    section `tensor` of RESULTS.md."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    transfers, latencies = collect(quick, _log)
    command = "python -m benchmarks tensor" + (" --quick" if quick else "")
    text = report(transfers, latencies, command)
    write_section("tensor", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tensor")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    transfers, latencies = collect(args.quick, _log)
    text = report(transfers, latencies, "python -m benchmarks.tensor " + " ".join(sys.argv[1:]))
    print(text)
    if args.write:
        write_section("tensor", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
