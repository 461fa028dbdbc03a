"""`python -m benchmarks load [--quick]`: one node under many concurrent clients.

A real `gwtf node` process (stage 0 of a new 2-stage swarm, `--no-train`) on loopback, and 1,
8, 32 and 128 concurrent clients in this process, each with its own channel (its own HTTP/2
connection), each sending calls back to back for a fixed window:

    health       `grpc.health.v1.Health/Check`: the cheapest call, acknowledged by SERVING
    echo 64 KiB  `gwtf.v1.Probe/Echo` carrying 64 KiB, acknowledged by the node's count of the
                 bytes it received and the nonce: a small microbatch's size (the data plane
                 itself only serves during a job)

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
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import uvloop
from grpc import aio

from benchmarks.report import machine, write_section
from gwtf.node.security import Credentials, open_channel
from gwtf.node.transport import channel_options
from gwtf.v1 import health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc

LEVELS = (1, 8, 32, 128)
KINDS = ("health", "echo 64 KiB")
ECHO_BYTES = 64 * 1024
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
        try:
            fields = Path(f"/proc/{self._popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.alive:
            self._popen.send_signal(signal.SIGTERM)
        try:
            self._popen.wait(15)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait(5)


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

    def __init__(self, address: str) -> None:
        self.channel = open_channel(address, Credentials(), options=channel_options())
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self._probe = node_pb2_grpc.ProbeStub(self.channel)
        self._nonce = 0

    async def call(self, kind: str) -> bool:
        """One call; whether the reply acknowledges it (AioRpcError if it ends with a status)."""
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
            acknowledged = await client.call(window.kind)
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
    clients: list[Client], kind: str, seconds: float, node_cpu: Callable[[], float]
) -> Window:
    window = Window(kind, len(clients), seconds)
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


async def _capacity(
    node: NodeProcess, seconds: float, rounds: int, log: Callable[[str], None]
) -> list[Window]:
    clients = [Client(node.address) for _ in range(max(LEVELS))]
    try:
        await asyncio.gather(*(c.call("health") for c in clients))  # connect every channel
        found = []
        for rnd in range(rounds):
            for level in LEVELS:
                for kind in KINDS:
                    window = await measure(clients[:level], kind, seconds, node.cpu_s)
                    found.append(window)
                    log(f"round {rnd + 1}/{rounds}, {level} clients, {kind}: "
                        f"{window.rate:.0f} calls/s, {window.refused} refused, "
                        f"{sum(window.failed.values())} failed, {window.lost} lost")  # fmt: skip
        return found
    finally:
        for c in clients:
            await c.channel.close()


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
        try:
            log(f"node at {node.address}, no rate limit")
            windows = uvloop.run(_capacity(node, seconds, rounds, log))
            up = node.alive
        finally:
            node.close()
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
        "acknowledged by the node's count of the bytes it received (the data plane only "
        "serves during a job). Lost = sent - acknowledged - refused - failed: calls that had "
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
    bound = LIMITED_RATE * limited.elapsed + 2 * LIMITED_RATE
    lines += [
        "",
        f"Every call accounted for: {'yes' if lost_total == 0 else 'NO'} ({lost_total} lost"
        + (f"; failures: {', '.join(failures)}" if failures else "")
        + f"). The node {'stayed up' if up else 'DIED'} throughout.",
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
