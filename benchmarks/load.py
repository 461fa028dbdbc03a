"""`python -m benchmarks load [--quick]`: one node under many concurrent clients.

A real `gwtf node` process (stage 0 of a new 2-stage swarm, `--no-train`) on loopback, and 1,
8, 32 and 128 concurrent clients in this process, each with its own channel (its own HTTP/2
connection), each sending calls back to back for a fixed window:

    health       `grpc.health.v1.Health/Check`: the cheapest call, acknowledged by SERVING
    echo 64 KiB  `gwtf.v1.Probe/Echo` carrying 64 KiB, acknowledged by the node's count of the
                 bytes it received and the nonce: a small microbatch's size (the data plane
                 itself only serves during a job)
    microbatch   one tiny-gpt activation (float32 [8, 64, 64], 128 KiB) sent with `tensors.send`
                 to the node's real data plane (`tensors.DataPlaneServicer`, `TensorLimits()`,
                 the tensor's spec as a stage expects it) served in a separate receiver process
                 built as `Node.start` builds a node's server (its server options and
                 interceptors; no rate limit, as the capacity node): the node process serves the
                 data plane only during a job. Acknowledged only when `send` returned AND the
                 receiver's handler (`take`) got that microbatch exactly once, its per-sender
                 sequence number in the tag and a CRC-32 of its bytes matching what was sent

Per level: calls per second (ratio against 1 client, measured in the same run: the levels and
kinds take turns, round after round, and each figure is the median over rounds), p50 and p99
latency of the acknowledged calls, and the account of every call sent: acknowledged, refused
(RESOURCE_EXHAUSTED), failed with another status, lost (sent - acknowledged - refused - failed:
a call that never ended within a minute after the window; must be 0).

The capacity node runs with `--rate-limit 0`, since all these clients are one peer to it
(127.0.0.1, no node id). A second node with `--rate-limit 20` shows refusals under a flood: 32
clients, the accepted rate against the limit, and every refused call answered.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import torch
import uvloop
from grpc import aio

from benchmarks.report import machine, write_section
from gwtf.node.dataplane import tensors
from gwtf.node.dataplane.tensors import MicrobatchTag, TensorLimits, TensorSpec
from gwtf.node.rpc.security import Credentials, add_port, open_channel
from gwtf.node.rpc.transport import MalformedRequestInterceptor, channel_options, server_options
from gwtf.train import resolve_job
from gwtf.v1 import health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc

LEVELS = (1, 8, 32, 128)
MICROBATCH = "microbatch"
KINDS = ("health", "echo 64 KiB", MICROBATCH)
ECHO_BYTES = 64 * 1024
_TINY = resolve_job("tiny-gpt")
ACTIVATION_SHAPE = (_TINY.microbatch_size, _TINY.model.seq_len, _TINY.model.width)
"""One tiny-gpt activation, float32 [B, T, width]: what `gwtf.train.activation_bytes` counts."""
ACTIVATION_NAME = "activation"  # the name a stage's `expect` accepts on a forward
LIMITED_RATE = 20
LIMITED_CLIENTS = 32
DRAIN_S = 60.0  # how long after the window a call may still end before it counts as lost
REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the node


class NodeProcess:
    """`gwtf node` on 127.0.0.1, port 0; its address from its "listening on" line."""

    def __init__(self, log: Path, *flags: str) -> None:
        argv = [sys.executable, "-m", "gwtf", "node", "--stage", "0", "--stages", "2",
                "--port", "0", "--compute-s", "0.1", "--no-train", "--log-level", "warning",
                *flags]  # fmt: skip
        with open(log, "w", encoding="utf-8") as err:
            self._popen = subprocess.Popen(
                argv, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )  # fmt: skip
        assert self._popen.stdout is not None
        self.address = ""
        for line in self._popen.stdout:  # the node prints this line once in its swarm
            match = re.search(r"listening on (\S+)", line)
            if match:
                self.address = match.group(1)
                break
        if not self.address:
            raise RuntimeError(f"the node did not start: {log.read_text()[-500:]}")

    @property
    def alive(self) -> bool:
        return self._popen.poll() is None

    def cpu_s(self) -> float:
        """CPU seconds the node has used (user + system), from /proc; NaN elsewhere."""
        return _cpu_s(self._popen.pid)

    def close(self) -> None:
        if self.alive:
            self._popen.send_signal(signal.SIGTERM)
        try:
            self._popen.wait(15)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait(5)


def _cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has used (user + system), from /proc; NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- the data plane

Key = tuple[str, int]
"""A microbatch's sender and its sequence number (the tag's `microbatch`)."""


def _checksum(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.contiguous().numpy())


def _receiver(pipe: Connection) -> None:
    """The node's data plane alone, built as `Node.start` builds a node's server with
    `--rate-limit 0` and no token or TLS: server options, the malformed-request check, the
    servicer with the node's `TensorLimits()` and a stage's `expect` for the activation.
    `take` records what it got, per window (the tag's job id): {(sender, seq): [CRC-32...]}.
    Asked ("take", job) it answers that window's record (and forgets it); "stop" ends it."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    records: dict[str, dict[Key, list[int]]] = {}
    spec = TensorSpec(torch.float32, ACTIVATION_SHAPE)

    def expect(tag: MicrobatchTag, name: str) -> TensorSpec | None:
        return spec if name == ACTIVATION_NAME and tag.direction == "forward" else None

    async def take(tag: MicrobatchTag, received: dict[str, torch.Tensor]) -> None:
        window = records.setdefault(tag.job_id, {})
        window.setdefault((tag.sender, tag.microbatch), []).append(
            _checksum(received[ACTIVATION_NAME])
        )

    async def main() -> None:
        server = aio.server(options=server_options(), interceptors=[MalformedRequestInterceptor()])
        tensors.add_DataPlaneServicer_to_server(
            tensors.DataPlaneServicer(take, TensorLimits(), expect), server
        )
        port = add_port(server, "127.0.0.1:0", Credentials())
        await server.start()
        pipe.send(port)
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, pipe.recv)
            if message == "stop":
                break
            pipe.send(records.pop(message[1], {}))
        await server.stop(grace=None)

    uvloop.run(main())


class Receiver:
    """The receiver process and the pipe to it."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_receiver, args=(child,), daemon=True)
        self._process.start()
        if not self._pipe.poll(120):
            self.close()
            raise RuntimeError("the receiver process did not start in 120 s")
        self.address = f"127.0.0.1:{self._pipe.recv()}"

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def cpu_s(self) -> float:
        return _cpu_s(self._process.pid or 0)

    async def taken(self, job: str) -> dict[Key, list[int]]:
        """What `take` got in window `job`."""
        self._pipe.send(("take", job))
        loop = asyncio.get_running_loop()
        found: dict[Key, list[int]] = await loop.run_in_executor(None, self._pipe.recv)
        return found

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._pipe.send("stop")
            except OSError:
                pass
        self._process.join(15)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


@dataclass(frozen=True)
class Account:
    """Sent microbatches against what the receiver's handler got."""

    taken: int  # microbatches the handler got, duplicates included
    verified: int  # send returned, and taken exactly once with the bytes sent
    missing: int  # send returned, never taken
    duplicated: int  # taken more than once (any microbatch)
    corrupt: int  # taken with other bytes than were sent
    unacknowledged: int  # taken, but its send ended with an error or never ended
    unknown: int  # taken, never sent
    returned_bad: int  # send returned, taken but more than once or with other bytes

    @property
    def unverified(self) -> int:
        """Sends that returned but are not verified: each one counts as failed."""
        return self.missing + self.returned_bad


def reconcile(
    expected: Mapping[Key, int], returned: set[Key], taken: Mapping[Key, list[int]]
) -> Account:
    """`expected`: the CRC-32 of every microbatch sent; `returned`: those whose `send`
    returned; `taken`: the CRC-32s the receiver's handler got, per microbatch."""
    verified = missing = returned_bad = 0
    for key in returned:
        got = taken.get(key, [])
        if not got:
            missing += 1
        elif len(got) == 1 and got[0] == expected[key]:
            verified += 1
        else:
            returned_bad += 1
    duplicated = sum(1 for got in taken.values() if len(got) > 1)
    corrupt = sum(
        1 for key, got in taken.items() if key in expected and any(c != expected[key] for c in got)
    )
    unacknowledged = sum(1 for key in taken if key in expected and key not in returned)
    unknown = sum(1 for key in taken if key not in expected)
    taken_all = sum(len(got) for got in taken.values())
    return Account(
        taken_all, verified, missing, duplicated, corrupt, unacknowledged, unknown, returned_bad
    )


# --------------------------------------------------------------------------- the clients


@dataclass
class Window:
    """One window of one kind at one level."""

    kind: str
    clients: int
    seconds: float
    sent: int = 0
    acked: int = 0
    refused: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    latency_s: list[float] = field(default_factory=list)
    refusal_s: list[float] = field(default_factory=list)
    job: str = ""  # microbatch: the window's job id in every tag
    expected: dict[Key, int] = field(default_factory=dict)  # microbatch: CRC-32 of each sent
    returned: set[Key] = field(default_factory=set)  # microbatch: sends that returned
    account: Account | None = None  # microbatch: against what the receiver took
    elapsed: float = float("nan")  # from the first call out to the last call's end
    node_cpu: float = float("nan")  # cores the node used over the window
    client_cpu: float = float("nan")  # cores this (client) process used

    @property
    def lost(self) -> int:
        return self.sent - self.acked - self.refused - sum(self.failed.values())

    @property
    def rate(self) -> float:
        return self.acked / self.elapsed


class Client:
    """One channel to the node and the calls of each kind on it."""

    def __init__(self, address: str, data_address: str = "", name: str = "c") -> None:
        self.channel = open_channel(address, Credentials(), options=channel_options())
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._probe = node_pb2_grpc.ProbeStub(self.channel)
        self._nonce = 0
        self.name = name
        self.data_channel = (
            open_channel(data_address, Credentials(), options=channel_options())
            if data_address
            else None
        )
        self._data = tensors.DataPlaneStub(self.data_channel) if self.data_channel else None
        self._base = torch.randn(
            ACTIVATION_SHAPE, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))
        )
        self._seq = 0

    async def close(self) -> None:
        await self.channel.close()
        if self.data_channel is not None:
            await self.data_channel.close()

    async def call(self, kind: str, window: Window | None = None) -> bool:
        """One call; whether the reply acknowledges it (AioRpcError if it ends with a status).
        A microbatch is only acknowledged for now: `reconcile` verifies it after the window."""
        if kind == MICROBATCH:
            assert self._data is not None and window is not None
            self._seq += 1
            activation = self._base + float(self._seq)  # another microbatch each time
            key = (self.name, self._seq)
            window.expected[key] = _checksum(activation)
            tag = MicrobatchTag(window.job, 0, self._seq, "forward", self.name, (self.name,))
            await tensors.send(self._data, tag, {ACTIVATION_NAME: activation}, timeout=30)
            window.returned.add(key)
            return True
        if kind == "health":
            reply: Any = await self._health.Check(health_pb2.HealthCheckRequest(), timeout=30)
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
        self._nonce += 1
        request = node_pb2.EchoRequest(nonce=self._nonce, payload=bytes(ECHO_BYTES))
        reply = await self._probe.Echo(request, timeout=30)
        return bool(reply.nonce == self._nonce and reply.received_bytes == ECHO_BYTES)


async def _drive(client: Client, window: Window, deadline: float) -> None:
    while time.perf_counter() < deadline:
        window.sent += 1
        start = time.perf_counter()
        try:
            acknowledged = await client.call(window.kind, window)
        except tensors.TensorError:  # the receiver acknowledged another byte count
            window.failed["wrong reply"] = window.failed.get("wrong reply", 0) + 1
            continue
        except aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                window.refused += 1
                window.refusal_s.append(time.perf_counter() - start)
            else:
                window.failed[err.code().name] = window.failed.get(err.code().name, 0) + 1
            continue
        if acknowledged:
            window.acked += 1
            window.latency_s.append(time.perf_counter() - start)
        else:
            window.failed["wrong reply"] = window.failed.get("wrong reply", 0) + 1


async def measure(
    clients: list[Client], kind: str, seconds: float, node_cpu: Callable[[], float], job: str = ""
) -> Window:
    window = Window(kind, len(clients), seconds, job=job)
    cpu0, mine0, start = node_cpu(), time.process_time(), time.perf_counter()
    deadline = start + seconds
    tasks = [asyncio.ensure_future(_drive(c, window, deadline)) for c in clients]
    _, pending = await asyncio.wait(tasks, timeout=seconds + DRAIN_S)
    elapsed = window.elapsed = time.perf_counter() - start
    window.node_cpu = (node_cpu() - cpu0) / elapsed
    window.client_cpu = (time.process_time() - mine0) / elapsed
    for task in pending:  # its call in flight stays unaccounted for: lost
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return window


async def verify(window: Window, receiver: Receiver) -> None:
    """A microbatch window's account against what the receiver took: acknowledged = verified;
    a send that returned unverified counts as failed."""
    account = window.account = reconcile(
        window.expected, window.returned, await receiver.taken(window.job)
    )
    window.acked = account.verified
    if account.unverified:
        window.failed["unverified"] = account.unverified


async def _capacity(
    node: NodeProcess, receiver: Receiver, seconds: float, rounds: int, log: Callable[[str], None]
) -> list[Window]:
    clients = [Client(node.address, receiver.address, f"s{i}") for i in range(max(LEVELS))]
    try:
        await asyncio.gather(*(c.call("health") for c in clients))  # connect every channel
        await asyncio.gather(*(c.data_channel.channel_ready() for c in clients if c.data_channel))
        found = []
        for rnd in range(rounds):
            for level in LEVELS:
                for kind in KINDS:
                    if kind == MICROBATCH:
                        job = f"r{rnd}-{level}"
                        window = await measure(clients[:level], kind, seconds, receiver.cpu_s, job)
                        await verify(window, receiver)
                    else:
                        window = await measure(clients[:level], kind, seconds, node.cpu_s)
                    found.append(window)
                    log(f"round {rnd + 1}/{rounds}, {level} clients, {kind}: "
                        f"{window.rate:.0f} calls/s, {window.refused} refused, "
                        f"{sum(window.failed.values())} failed, {window.lost} lost")  # fmt: skip
        return found
    finally:
        for c in clients:
            await c.close()


async def _limited(node: NodeProcess, seconds: float) -> Window:
    clients = [Client(node.address) for _ in range(LIMITED_CLIENTS)]
    try:
        for c in clients:  # connect, one call at a time: within the burst
            await c.call("health")
        await asyncio.sleep(2.5)  # the bucket refills
        return await measure(clients, "health", seconds, node.cpu_s)
    finally:
        for c in clients:
            await c.channel.close()


def collect(quick: bool, log: Callable[[str], None]) -> tuple[list[Window], Window, bool]:
    seconds, rounds = (1.0, 2) if quick else (3.0, 5)
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-load-") as folder:
        node = NodeProcess(Path(folder) / "node.log", "--rate-limit", "0")
        receiver = None
        try:
            receiver = Receiver()
            log(f"node at {node.address}, no rate limit; data plane at {receiver.address}")
            windows = uvloop.run(_capacity(node, receiver, seconds, rounds, log))
            up = node.alive and receiver.alive
        finally:
            node.close()
            if receiver is not None:
                receiver.close()
        node = NodeProcess(Path(folder) / "limited.log", "--rate-limit", str(LIMITED_RATE))
        try:
            log(f"node at {node.address}, --rate-limit {LIMITED_RATE}")
            limited = uvloop.run(_limited(node, 2 * seconds))
            up = up and node.alive
        finally:
            node.close()
    return windows, limited, up


# --------------------------------------------------------------------------- report


def _pct(times: list[float], q: float) -> float:
    if not times:
        return float("nan")
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(windows: list[Window], limited: Window, up: bool, command: str) -> str:
    seconds = windows[0].seconds
    rounds = len(windows) // (len(LEVELS) * len(KINDS))
    lines = [
        "## Load: one node under many concurrent clients (`python -m benchmarks load`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}` on {machine()}. The machine is "
        "shared (2 cores, other engineers' tests), and the clients run in one process on the "
        "same 2 cores as the node, so absolute rates move from run to run and the clients' own "
        "CPU is part of every figure; each rate is also a ratio against 1 client measured in "
        f"the same run. A real `gwtf node` process (`--no-train --rate-limit 0`); each client "
        f"has its own channel and sends calls back to back for {seconds:g} s; levels and kinds "
        f"take turns, {rounds} rounds, and each rate is the median over rounds (latencies and "
        'the account are over all rounds). "echo 64 KiB": `Probe/Echo` carrying 64 KiB, '
        'acknowledged by the node\'s count of the bytes it received. "microbatch": one '
        f"tiny-gpt activation (float32 {list(ACTIVATION_SHAPE)}, "
        f"{math.prod(ACTIVATION_SHAPE) * 4 // 1024} KiB) sent with `tensors.send` to the "
        "node's data plane (`tensors.DataPlaneServicer`, `TensorLimits()`, a stage's tensor "
        "spec; it only serves in a node during a job, so here in a separate receiver process "
        "built with the node's server options and interceptors, no rate limit); one call is one "
        'microbatch, so calls/s is microbatches/s, and "node CPU" is the receiver\'s. A '
        "microbatch counts as acknowledged only when `send` returned and the receiver's handler "
        "got it exactly once (sender and sequence number in its tag) with the CRC-32 of the "
        'bytes sent; a returned send that is not is counted failed ("unverified"). '
        "Lost = sent - acknowledged - refused - failed: calls that had "
        f"not ended {DRAIN_S:g} s after the window. Node CPU and client CPU: cores each "
        "process used over the window (median over rounds; 1.00 = one core busy throughout).",
        "",
        "| kind | clients | calls/s | / 1 client | p50 ms | p99 ms | node CPU | client CPU | "
        "sent | acknowledged | refused | failed | lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lost_total = 0
    for kind in KINDS:
        base = None
        for level in LEVELS:
            these = [w for w in windows if w.kind == kind and w.clients == level]
            rate = statistics.median(w.rate for w in these)
            base = base or rate
            latency = [t for w in these for t in w.latency_s]
            sent, acked = sum(w.sent for w in these), sum(w.acked for w in these)
            refused = sum(w.refused for w in these)
            failed = sum(sum(w.failed.values()) for w in these)
            lost = sum(w.lost for w in these)
            lost_total += lost
            node_cpu = statistics.median(w.node_cpu for w in these)
            client_cpu = statistics.median(w.client_cpu for w in these)
            lines.append(
                f"| {kind} | {level} | {rate:.0f} | {rate / base:.2f} | "
                f"{_pct(latency, 0.5) * 1e3:.2f} | {_pct(latency, 0.99) * 1e3:.2f} | "
                f"{node_cpu:.2f} | {client_cpu:.2f} | {sent} | {acked} | {refused} | {failed} | "
                f"{lost} |"
            )
    failures = sorted({name for w in windows for name in w.failed})
    accounts = [w.account for w in windows if w.account is not None]
    taken = sum(a.taken for a in accounts)
    verified = sum(a.verified for a in accounts)
    bad = {
        "missing": sum(a.missing for a in accounts),
        "duplicated": sum(a.duplicated for a in accounts),
        "corrupt": sum(a.corrupt for a in accounts),
        "taken after a failed send": sum(a.unacknowledged for a in accounts),
        "never sent": sum(a.unknown for a in accounts),
    }
    bound = LIMITED_RATE * limited.elapsed + 2 * LIMITED_RATE
    lines += [
        "",
        f"Every call accounted for: {'yes' if lost_total == 0 else 'NO'} ({lost_total} lost"
        + (f"; failures: {', '.join(failures)}" if failures else "")
        + f"). The node {'stayed up' if up else 'DIED'} throughout"
        + (" (and the data plane's receiver)." if accounts else "."),
    ]
    if accounts:
        lines += [
            "",
            f"Microbatches checked against the receiver's handler: {verified} sent, returned and "
            f"taken exactly once with the bytes sent, over {len(accounts)} windows; "
            + ", ".join(f"{n} {what}" for what, n in bad.items())
            + f" (the handler took {taken} in all).",
        ]
    lines += [
        "",
        f"Under a rate limit: a node with `--rate-limit {LIMITED_RATE}` (a burst of "
        f"{2 * LIMITED_RATE}), {limited.clients} clients of one peer (same host, no node id) "
        f"calling health checks back to back for {limited.seconds:g} s: {limited.sent} sent, "
        f"{limited.acked} acknowledged ({limited.rate:.0f}/s; the limit allows at most "
        f"{bound:.0f}: the rate times the {limited.elapsed:.2f} s from the first call to the "
        f"last one's end, plus one burst: {'within' if limited.acked <= bound else 'ABOVE'} "
        "it), "
        f"{limited.refused} refused with RESOURCE_EXHAUSTED, "
        f"{sum(limited.failed.values())} failed otherwise, {limited.lost} lost. A refusal "
        f"took p50 {_pct(limited.refusal_s, 0.5) * 1e3:.2f} ms, p99 "
        f"{_pct(limited.refusal_s, 0.99) * 1e3:.2f} ms; an acknowledged call p50 "
        f"{_pct(limited.latency_s, 0.5) * 1e3:.2f} ms, p99 "
        f"{_pct(limited.latency_s, 0.99) * 1e3:.2f} ms. The node used "
        f"{limited.node_cpu:.2f} cores refusing, the clients {limited.client_cpu:.2f}.",
    ]
    return "\n".join(lines)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(quick: bool = False) -> str:
    """Capacity and the rate-limited flood (`--quick`: 1 s windows, 2 rounds), into section
    `load` of RESULTS.md."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    windows, limited, up = collect(quick, _log)
    text = report(windows, limited, up, "python -m benchmarks load" + (" --quick" if quick else ""))
    write_section("load", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    windows, limited, up = collect(args.quick, _log)
    text = report(windows, limited, up, "python -m benchmarks.load " + " ".join(sys.argv[1:]))
    print(text)
    if args.write:
        write_section("load", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
