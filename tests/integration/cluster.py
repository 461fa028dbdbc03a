"""A local swarm of real `gwtf node` processes for the integration tests and benchmarks.

Nodes bind port 0 and report their address; crashes are SIGKILL; every wait polls a condition
with a deadline. `LocalSwarm.close()` (a context manager exit) kills whatever is left.
"""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gwtf.client import StatusError, fetch_status, status_json
from gwtf.flow.oracle import solve_oracle
from gwtf.flow.topology import LinkSpec, NodeSpec, Topology
from gwtf.local.launch import child_env
from gwtf.local.netns import Hosts

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"listening on (\S+) \(stage (\d+)")

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Poll `condition` until it returns something truthy; AssertionError after the deadline."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class Proc:
    id: str
    stage: int
    """The stage it was given, or -1 for `--stage auto` until it says which it took."""
    popen: subprocess.Popen[str]
    log: Path
    address: str = ""
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


class LocalSwarm:
    """Node processes on 127.0.0.1 sharing one log directory."""

    def __init__(
        self,
        log_dir: Path,
        *,
        heartbeat_s: float = 0.25,
        failure_timeout_s: float = 3.0,
        extra: tuple[str, ...] = (),
        train: bool = False,
        python: str = sys.executable,
        cwd: Path = REPO,
        hosts: Hosts | None = None,
        homes: Path | None = None,
    ) -> None:
        """`python` and `cwd`: the interpreter that runs the nodes and where (by default this
        one, in the repository: the gwtf under test). `hosts`: each node in the network
        namespace of its id, bound to its address there, as on its own machine. `homes`: each
        node in its own folder under it, `homes/<id>`, with its own cache (`GWTF_CACHE`) and
        home, sharing no file with the others or with this process."""
        self.log_dir = log_dir
        self.python = python
        self.cwd = cwd
        self.hosts = hosts
        self.homes = homes
        self.heartbeat_s = heartbeat_s
        self.failure_timeout_s = failure_timeout_s
        # Nodes that train load torch at start (seconds each); the control-plane tests do not.
        self.extra = extra if train else (*extra, "--no-train")
        self.procs: dict[str, Proc] = {}
        self.bootstrap = ""

    # ---------------------------------------------------------------- processes

    def spawn(self, node_id: str, stage: int | None, compute_s: float, *args: str) -> Proc:
        """A node at `stage`, or with no --stage (None: it chooses, `--stage auto`)."""
        argv = [
            self.python, "-m", "gwtf", "node",
            "--id", node_id,
            *(("--stage", str(stage)) if stage is not None else ()),
            "--port", "0",
            "--compute-s", repr(compute_s),
            "--heartbeat-s", repr(self.heartbeat_s),
            "--failure-timeout-s", repr(self.failure_timeout_s),
            # The reference's device and thread count: swarms are compared with it bit for bit.
            "--device", "cpu", "--threads", "1",
            *self.extra,
            *args,
        ]  # fmt: skip
        if self.bootstrap and "--bootstrap" not in args:
            argv += ["--bootstrap", self.bootstrap]
        cwd, env = self.cwd, child_env(PYTHONUNBUFFERED="1")
        if self.hosts is not None:
            argv = [*self.hosts.exec_prefix(node_id), *argv, "--host", self.hosts.address(node_id)]
        if self.homes is not None:
            cwd = self.homes / node_id
            cwd.mkdir(parents=True, exist_ok=True)
            env.update(GWTF_CACHE=str(cwd / "cache"), HOME=str(cwd))
        log = self.log_dir / f"{node_id}.log"
        incarnation = 1
        while log.exists():  # the same id started again: keep the earlier log
            incarnation += 1
            log = self.log_dir / f"{node_id}.{incarnation}.log"
        handle = open(log, "w", encoding="utf-8")  # noqa: SIM115
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=handle,
            text=True,
            # If this process dies without cleaning up (a killed test run), so do its nodes.
            env=env,
        )
        handle.close()
        proc = Proc(node_id, -1 if stage is None else stage, popen, log)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        self.procs[node_id] = proc
        return proc

    @staticmethod
    def _read(proc: Proc) -> None:
        assert proc.popen.stdout is not None
        for line in proc.popen.stdout:
            proc.lines.put(line)
        proc.lines.put(None)

    def wait_listening(self, *procs: Proc, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            while not proc.address:
                try:
                    line = proc.lines.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    raise AssertionError(f"{proc.id} did not start: {self.tail(proc)}") from None
                if line is None:
                    raise AssertionError(f"{proc.id} exited: {self.tail(proc)}")
                match = _LISTENING.search(line)
                if match:
                    proc.address = match.group(1)
                    proc.stage = int(match.group(2))  # the one it took, if it chose

    def start(
        self, nodes: list[tuple[str, int, float]], num_stages: int, *swarm_args: str
    ) -> None:
        """Start a swarm: the first node creates it (with `swarm_args`, e.g. the activation
        size), the others join through it."""
        first_id, first_stage, first_c = nodes[0]
        first = self.spawn(first_id, first_stage, first_c, "--stages", str(num_stages),
                           *swarm_args)  # fmt: skip
        self.wait_listening(first)
        self.bootstrap = first.address
        rest = [self.spawn(i, s, c) for i, s, c in nodes[1:]]
        self.wait_listening(*rest)

    def join(self, node_id: str, stage: int | None, compute_s: float, *args: str) -> Proc:
        proc = self.spawn(node_id, stage, compute_s, *args)
        self.wait_listening(proc)
        return proc

    def kill(self, node_id: str) -> float:
        """SIGKILL: a crash. Returns the time of the kill (time.monotonic)."""
        proc = self.procs[node_id]
        at = time.monotonic()  # before the signal: this process may be descheduled after it
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)
        return at

    def terminate(self, node_id: str) -> float:
        """SIGTERM: a graceful leave. Returns the time of the signal, read just before it: read
        after, a test process descheduled for a few milliseconds on a loaded machine put it after
        the other nodes' logged verdicts, which the leave test then did not count."""
        proc = self.procs[node_id]
        at = time.monotonic()
        proc.popen.send_signal(signal.SIGTERM)
        return at

    def live(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.alive]

    def wait_formed(self, timeout_s: float = 60.0) -> None:
        """Until every live node knows exactly the live nodes (a joiner learns them by gossip)."""

        def formed() -> bool:
            everyone = {p.id for p in self.live()}
            for proc in self.live():
                view = self.status(proc.id, swarm=False)
                if view is None or {m["id"] for m in view["members"] if m["alive"]} != everyone:
                    return False
            return True

        wait_for(formed, timeout_s, "every node to know every live member")

    def tail(self, proc: Proc, lines: int = 3) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(proc.log.read_text().strip().splitlines()[-lines:])
        return ""

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.alive:
                proc.popen.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- views

    def status(self, node_id: str | None = None, *, swarm: bool = True) -> dict[str, Any] | None:
        """`gwtf status --json` of a live node (the first live one by default), None if it
        does not answer."""
        proc = self.procs[node_id] if node_id else self.live()[0]
        try:
            return status_json(fetch_status(proc.address, timeout_s=5.0, swarm=swarm))
        except StatusError:
            return None

    def settled(self, expect_members: set[str], expect_arcs: int) -> dict[str, Any] | None:
        """The swarm view once every expected member reports final and quiet, every node sees
        exactly `expect_members` alive, all `expect_arcs` pipeline arcs exist, and the flow value
        equals the oracle's for the topology the nodes measured; else None."""
        asked = next((p.id for p in self.live() if p.id in expect_members), None)
        view = self.status(asked) if asked is not None else None
        if view is None or not view["converged"]:
            return None
        alive = {m["id"] for m in view["members"] if m["alive"]}
        if alive != expect_members or {n["id"] for n in view["nodes"]} != expect_members:
            return None
        if len(view["arcs"]) != expect_arcs:
            return None
        for node in self.live():
            if node.id not in expect_members:
                continue  # leaving
            local = self.status(node.id, swarm=False)
            if local is None:
                return None
            seen = {m["id"] for m in local["members"] if m["alive"]}
            if seen != expect_members:
                return None
        if view["flow_value_units"] != oracle_value(view):
            return None
        return view


def measured_topology(view: dict[str, Any]) -> Topology:
    """The topology the nodes measured: each node its own location, each arc's link the RTT
    and bandwidth its tail announced, node capacities as announced."""
    members = {m["id"]: m for m in view["members"] if m["alive"]}
    nodes = [
        NodeSpec.make(m["id"], m["stage"], m["compute_s"], m["id"], m["capacity"])
        for m in members.values()
    ]
    links = {
        frozenset((a["src"], a["dst"])): LinkSpec(a["rtt_ms"], a["bandwidth_gbps"])
        for a in view["arcs"]
    }
    return Topology.build(view["swarm"]["activation_bytes"], nodes, links)


def oracle_value(view: dict[str, Any]) -> int:
    return solve_oracle(measured_topology(view)).flow_value_units


def pipeline_arcs(stage_sizes: list[int]) -> int:
    return sum(a * b for a, b in zip(stage_sizes, stage_sizes[1:], strict=False))


@contextlib.contextmanager
def swarm_in(tmp: Path, **kwargs: Any) -> Iterator[LocalSwarm]:
    swarm = LocalSwarm(tmp, **kwargs)
    try:
        yield swarm
    finally:
        swarm.close()


def send_as_peer(address: str, cases: list[tuple[Any, dict[str, Any]]]) -> list[tuple[Any, str]]:
    """Send each (MicrobatchTag, tensors) to the node at `address` as a peer's data plane does:
    (status code, details) of each, OK and "" for one taken."""
    import asyncio

    import grpc
    from grpc import aio

    from gwtf.node.dataplane.tensors import send
    from gwtf.v1 import data_pb2_grpc

    async def main() -> list[tuple[Any, str]]:
        out: list[tuple[Any, str]] = []
        async with aio.insecure_channel(address) as channel:
            stub = data_pb2_grpc.DataPlaneStub(channel)
            for tag, tensors in cases:
                try:
                    await send(stub, tag, tensors, timeout=10)
                    out.append((grpc.StatusCode.OK, ""))
                except aio.AioRpcError as err:
                    out.append((err.code(), err.details() or ""))
        return out

    return asyncio.run(main())
