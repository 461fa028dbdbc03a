"""`python -m benchmarks security [--quick]`: what the token, mutual TLS and the rate limit cost.

Five node servers on loopback, in one receiver process, each built as `Node.start` builds a
node's (the node's server options, its interceptor chain in the node's order: token, rate
limit, malformed-request check; `security.add_port` with TLS when configured), serving the
health service and the tensor data plane (`tensors.DataPlaneServicer`, which assembles and
checks every tensor as a node does):

    plain           no token, no TLS, no rate limit
    rate limit      the default limit (`ratelimit.DEFAULT_RATE` calls per second per peer)
    token           a shared token, checked on every call
    mutual TLS      certificates made with the openssl command line in a temporary folder
    all three       token + mutual TLS + rate limit: what a node on a public address runs

The sender (this process) opens one channel to each with `security.open_channel`, as a node's
channel pool does, and measures in turn, one call to each server per round, so that every
configuration sees the same moments of a shared machine:

(a) unary latency: one health check (`grpc.health.v1.Health/Check`), p50 and p99;
(b) tensor throughput: one float32 tensor of 16 (and 64) MiB sent with `tensors.send`.

Every figure is also a ratio against `plain` measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import uvloop
from grpc import aio

from benchmarks.report import machine, write_section
from gwtf.node.dataplane import tensors
from gwtf.node.dataplane.tensors import MicrobatchTag, TensorLimits
from gwtf.node.rpc.ratelimit import RateLimit, RateLimiter, RateLimitInterceptor
from gwtf.node.rpc.security import (
    TLS_TARGET_NAME,
    Credentials,
    TokenServerInterceptor,
    add_port,
    open_channel,
)
from gwtf.node.rpc.server import HealthServicer
from gwtf.node.rpc.transport import MalformedRequestInterceptor, channel_options, server_options
from gwtf.v1 import health_pb2, health_pb2_grpc

MIB = 2**20
TOKEN = "b3c1f0e9d8a7b6c5d4e3f2a1b0c9d8e7"
TAG = MicrobatchTag("bench", 0, 0, "forward", "sender", ("sender",))


@dataclass(frozen=True)
class Config:
    name: str
    token: bool
    tls: bool
    rate_limit: bool


CONFIGS = (
    Config("plain", False, False, False),
    Config("rate limit", False, False, True),
    Config("token", True, False, False),
    Config("mutual TLS", False, True, False),
    Config("all three", True, True, True),
)


# --------------------------------------------------------------------------- certificates


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path) -> tuple[bytes, bytes, bytes]:
    """(certificate, key, CA certificate) of one member of a new swarm CA, as the integration
    tests make them (`tests/integration/pki.py`): EC P-256, the swarm's name as subjectAltName.
    Every end presents this one certificate (the CA is the identity)."""
    ca_key, ca_cert = folder / "ca.key", folder / "ca.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
             "-subj", "/CN=bench swarm CA")  # fmt: skip
    key, csr, cert, ext = (folder / n for n in ("m.key", "m.csr", "m.pem", "m.ext"))
    ext.write_text(f"subjectAltName=DNS:{TLS_TARGET_NAME}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={TLS_TARGET_NAME}")  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return cert.read_bytes(), key.read_bytes(), ca_cert.read_bytes()


def credentials(config: Config, pki: tuple[bytes, bytes, bytes]) -> Credentials:
    cert, key, ca = pki if config.tls else (None, None, None)
    return Credentials(TOKEN if config.token else None, cert, key, ca)


# --------------------------------------------------------------------------- receiver process


def _receiver(pipe: Connection, pki: tuple[bytes, bytes, bytes]) -> None:
    """One server per configuration, in this process's one event loop."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

    async def main() -> None:
        async def take(tag: MicrobatchTag, received: dict[str, torch.Tensor]) -> None:
            return None

        servers, ports, limiters = [], [], []
        for config in CONFIGS:
            creds = credentials(config, pki)
            limiter = RateLimiter(RateLimit())
            chain: list[aio.ServerInterceptor] = []  # Node.start's order
            if creds.token is not None:
                chain.append(TokenServerInterceptor(creds.token))
            if config.rate_limit:
                chain.append(RateLimitInterceptor(limiter))
            chain.append(MalformedRequestInterceptor())
            server = aio.server(options=server_options(), interceptors=chain)
            health = HealthServicer()
            health.set_serving(True)
            health_pb2_grpc.add_HealthServicer_to_server(health, server)
            tensors.add_DataPlaneServicer_to_server(
                tensors.DataPlaneServicer(take, TensorLimits()), server
            )
            ports.append(add_port(server, "127.0.0.1:0", creds))
            await server.start()
            servers.append(server)
            limiters.append(limiter)
        pipe.send(ports)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # until told to stop
        pipe.send([limiter.refused for limiter in limiters])
        for server in servers:
            await server.stop(grace=None)

    uvloop.run(main())


# --------------------------------------------------------------------------- measurement


@dataclass
class Measured:
    config: Config
    latency_s: list[float] = field(default_factory=list)
    transfer_s: dict[int, list[float]] = field(default_factory=dict)
    refused: int = 0


def _pct(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    ports: list[int],
    pki: tuple[bytes, bytes, bytes],
    calls: int,
    sizes_mib: tuple[int, ...],
    reps: int,
    log: Callable[[str], None],
) -> list[Measured]:
    found = [Measured(c) for c in CONFIGS]
    channels = [
        open_channel(f"127.0.0.1:{port}", credentials(c, pki), options=channel_options())
        for c, port in zip(CONFIGS, ports, strict=True)
    ]
    try:
        health = [health_pb2_grpc.HealthStub(ch) for ch in channels]
        data = [tensors.DataPlaneStub(ch) for ch in channels]
        request = health_pb2.HealthCheckRequest()
        warm_up = 50
        for rep in range(calls + warm_up):
            for stub, m in zip(health, found, strict=True):
                start = time.perf_counter()
                await stub.Check(request, timeout=10)
                if rep >= warm_up:
                    m.latency_s.append(time.perf_counter() - start)
        log(f"latency: {calls} health checks per configuration")
        for size_mib in sizes_mib:
            tensor = torch.randn(size_mib * MIB // 4, generator=torch.Generator().manual_seed(1))
            for rep in range(reps + 1):  # the first is a warm-up
                for stub, m in zip(data, found, strict=True):
                    start = time.perf_counter()
                    await tensors.send(stub, TAG, {"x": tensor}, timeout=120)
                    if rep:
                        m.transfer_s.setdefault(size_mib, []).append(time.perf_counter() - start)
            log(f"throughput: {reps} transfers of {size_mib} MiB per configuration")
    finally:
        for ch in channels:
            await ch.close()
    return found


def collect(quick: bool, log: Callable[[str], None]) -> list[Measured]:
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-pki-") as folder:
        pki = make_pki(Path(folder))
    context = multiprocessing.get_context("spawn")
    pipe, child = context.Pipe()
    process = context.Process(target=_receiver, args=(child, pki), daemon=True)
    process.start()
    try:
        if not pipe.poll(120):
            raise RuntimeError("the receiver process did not start in 120 s")
        ports = pipe.recv()
        log(f"{len(CONFIGS)} servers on ports {ports}")
        found = uvloop.run(_measure(
            ports, pki,
            calls=300 if quick else 2000,
            sizes_mib=(16,) if quick else (16, 64),
            reps=3 if quick else 9,
            log=log,
        ))  # fmt: skip
        pipe.send("stop")
        if pipe.poll(30):
            for m, refused in zip(found, pipe.recv(), strict=True):
                m.refused = refused
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
    return found


# --------------------------------------------------------------------------- report


def report(found: list[Measured], command: str) -> str:
    plain = found[0]
    p50, p99 = _pct(plain.latency_s, 0.5), _pct(plain.latency_s, 0.99)
    lines = [
        "## Security: the cost of the token, mutual TLS and the rate limit "
        "(`python -m benchmarks security`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}` on {machine()}. The machine is "
        "shared (2 cores, other engineers' tests), so absolute figures move from run to run; "
        "each ratio compares a configuration with `plain` measured in the same run, one call to "
        "each server in turn per round. Five node servers in one receiver process, each built "
        "as `Node.start` builds a node's (server options, interceptors token -> rate limit -> "
        "malformed-request check, TLS port); the sender opens its channels with "
        "`security.open_channel` as a node's channel pool does. Certificates: EC P-256, made "
        'with openssl in a temporary folder. "all three" = token + mutual TLS + the default '
        "rate limit, a node on a public address.",
        "",
        f"(a) Unary latency, one health check, {len(plain.latency_s)} calls per configuration "
        "(after 50 warm-up calls):",
        "",
        "| configuration | p50 ms | p99 ms | p50 / plain | p99 / plain |",
        "|---|---|---|---|---|",
    ]
    for m in found:
        m50, m99 = _pct(m.latency_s, 0.5), _pct(m.latency_s, 0.99)
        lines.append(f"| {m.config.name} | {m50 * 1e3:.3f} | {m99 * 1e3:.3f} | "
                     f"{m50 / p50:.2f} | {m99 / p99:.2f} |")  # fmt: skip
    sizes = sorted(plain.transfer_s)
    reps = len(plain.transfer_s[sizes[0]]) if sizes else 0
    lines += [
        "",
        f"(b) Tensor throughput, one float32 tensor sent with `tensors.send` (1 MiB chunks) and "
        f"assembled and checked by the receiver; median of {reps} transfers per size and "
        "configuration (after one warm-up):",
        "",
        "| configuration | " + " | ".join(f"{s} MiB GB/s | {s} MiB / plain" for s in sizes) + " |",
        "|---|" + "---|---|" * len(sizes),
    ]
    for m in found:
        cells = []
        for s in sizes:
            gbps = s * MIB / statistics.median(m.transfer_s[s]) / 1e9
            ratio = statistics.median(plain.transfer_s[s]) / statistics.median(m.transfer_s[s])
            cells.append(f"{gbps:.2f} | {ratio:.2f}")
        lines.append(f"| {m.config.name} | " + " | ".join(cells) + " |")
    refused = sum(m.refused for m in found)
    lines += [
        "",
        f"Calls the rate limit refused during the run: {refused}"
        + (
            " (every figure above is of served calls)."
            if refused == 0
            else ": the figures of the rate-limited rows include refusals."
        ),
    ]
    return "\n".join(lines)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(quick: bool = False) -> str:
    """Both parts (`--quick`: 300 calls, 16 MiB only, 3 transfers), into section `security`."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    found = collect(quick, _log)
    text = report(found, "python -m benchmarks security" + (" --quick" if quick else ""))
    write_section("security", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.security")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    found = collect(args.quick, _log)
    text = report(found, "python -m benchmarks.security " + " ".join(sys.argv[1:]))
    print(text)
    if args.write:
        write_section("security", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
