"""`gwtf launch`: a local swarm of node processes, stopped together.

Node `i` of `N` gets stage `i // ceil(N / S)`-like spreading (as `gwtf.flow.generate.geo10`:
`N // S` per stage, the remainder one each to the first stages), a location round-robin over the
link matrix's (none without one), and a compute time `--compute-s / speed` with the speed of a
GPU drawn (seeded) from gwtf/data/gpu_train_throughput.csv, so that the swarm is heterogeneous
as a volunteer one is. The first node creates the swarm; the others join through it.

With `--churn TRACE` it then replays a churn trace on the swarm (`gwtf.local.churn`): SIGKILL on a
crash, SIGTERM on a leave, a new node process on a join, at the trace's times scaled by
`--time-scale`, each printed as it happens.

Children run in their own session (Ctrl-C in the terminal reaches only this process, which then
stops them by pid: SIGTERM, so they leave gracefully, then SIGKILL after a grace period) and, on
Linux, die with it if it is killed (PR_SET_PDEATHSIG, which each node asks for itself: see
`die_with_launcher`). Their logs go to one file each.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from gwtf.flow.topology import TopologyError, load_link_matrix
from gwtf.local.plan import NodePlan

if TYPE_CHECKING:
    from gwtf.local.churn import ChurnAction

__all__ = ["LAUNCHER_ENV", "NodePlan", "child_env", "die_with_launcher", "plan_nodes", "run_launch"]

START_TIMEOUT_S = 120.0
"""How long a node may take to print its address (a loaded machine starts Python slowly)."""
STOP_GRACE_S = 10.0
"""How long nodes get to leave gracefully after SIGTERM before SIGKILL."""

_LISTENING = re.compile(r"listening on (\S+)")
_METRICS = re.compile(r"metrics on (\S+)")


def _locations(path: str) -> list[str]:
    """The matrix's locations in the order they first appear in the file (TopologyError if the
    file is malformed)."""
    names = {name for pair in load_link_matrix(path) for name in pair}
    order: dict[str, None] = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for row in list(csv.reader(handle))[1:]:
            for name in (cell.strip() for cell in row[:2]):
                if name in names:
                    order.setdefault(name, None)
    return list(order)


def plan_nodes(
    n_nodes: int, n_stages: int, *, locations: list[str], base_compute_s: float, seed: int
) -> list[NodePlan]:
    """Who runs where: stages, locations and compute times of a local swarm."""
    from gwtf.flow.generate import gpu_speeds

    if n_stages < 2:
        raise ValueError(f"a swarm needs at least 2 stages, got {n_stages}")
    if n_nodes < n_stages:
        raise ValueError(f"{n_nodes} nodes cannot fill {n_stages} stages; give --nodes >= stages")
    rng = np.random.default_rng(seed)
    speeds = gpu_speeds()
    per_stage, extra = divmod(n_nodes, n_stages)
    width = len(str(per_stage))
    plans: list[NodePlan] = []
    for stage in range(n_stages):
        for index in range(per_stage + (1 if stage < extra else 0)):
            _, speed = speeds[int(rng.integers(len(speeds)))]
            location = locations[len(plans) % len(locations)] if locations else ""
            plans.append(
                NodePlan(f"s{stage}n{index:0{width}d}", stage, location, base_compute_s / speed)
            )
    return plans


LAUNCHER_ENV = "GWTF_LAUNCHER_PID"
"""Set by a launcher in its nodes' environment: its pid, which the node dies with."""


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a node this process starts and wants to die with it."""
    return {**os.environ, LAUNCHER_ENV: str(os.getpid()), **extra}


def die_with_launcher() -> None:
    """In a node whose environment names its launcher: SIGTERM this process when the launcher
    dies (Linux; elsewhere nothing). Called first thing by `gwtf node`.

    The node asks for it itself rather than in a `preexec_fn` of the launcher's Popen: that
    runs Python in the forked child before exec, so gRPC's fork handlers run there too, and
    with channels open in the launcher (the demo's live view, a test's client) gRPC's poller
    in the child can die on a closed epoll descriptor (grpc/grpc#43055) before the node even
    starts. Without a preexec_fn, Popen uses vfork, which runs no fork handlers.
    """
    launcher = os.environ.pop(LAUNCHER_ENV, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(launcher):  # it died before the request: do what it would have done
        os.kill(os.getpid(), signal.SIGTERM)


class _Cluster:
    def __init__(self, log_dir: Path, *, metrics: bool = False) -> None:
        self.log_dir = log_dir
        self.want_metrics = metrics
        """The nodes serve metrics: wait for each one's URL too (printed right after its
        address)."""
        self.metrics: dict[int, str] = {}
        self.procs: list[tuple[NodePlan, subprocess.Popen[str]]] = []
        self._logs: list[IO[Any]] = []
        self._lines: queue.Queue[tuple[int, str | None]] = queue.Queue()

    def start(self, plan: NodePlan, argv: list[str]) -> int:
        log = open(self.log_dir / f"{plan.id}.log", "w", encoding="utf-8")  # noqa: SIM115
        self._logs.append(log)
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=child_env(),
        )
        index = len(self.procs)
        self.procs.append((plan, proc))
        threading.Thread(target=self._read, args=(index, proc), daemon=True).start()
        return index

    def _read(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put((index, line))
        self._lines.put((index, None))

    def wait_addresses(self, indices: set[int], deadline: float) -> dict[int, str]:
        """The address each node prints (and its metrics URL, into `metrics`, when it serves
        them); RuntimeError naming the first that fails."""
        found: dict[int, str] = {}

        def pending() -> bool:
            return len(found) < len(indices) or (
                self.want_metrics and not indices <= set(self.metrics)
            )

        while pending():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [self.procs[i][0].id for i in sorted(indices - set(found))]
                raise RuntimeError(f"nodes {', '.join(missing)} did not start within "
                                   f"{START_TIMEOUT_S:g} s")
            try:
                index, line = self._lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if index not in indices:
                continue
            if line is None:
                plan, proc = self.procs[index]
                proc.wait()
                raise RuntimeError(
                    f"node {plan.id} exited with code {proc.returncode}: {self.last_log(index)}"
                )
            self._note(index, line, found)
        return found

    def _note(self, index: int, line: str, found: dict[int, str]) -> None:
        match = _LISTENING.search(line)
        if match:
            found[index] = match.group(1)
        match = _METRICS.search(line)
        if match:
            self.metrics[index] = match.group(1)

    def poll_addresses(self) -> tuple[dict[int, str], list[int]]:
        """Without waiting: the addresses printed since the last call, and the nodes whose
        output ended (they exited)."""
        found: dict[int, str] = {}
        ended: list[int] = []
        while True:
            try:
                index, line = self._lines.get_nowait()
            except queue.Empty:
                return found, ended
            if line is None:
                ended.append(index)
                continue
            self._note(index, line, found)

    def signal(self, index: int, signum: int) -> None:
        proc = self.procs[index][1]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    def last_log(self, index: int) -> str:
        plan = self.procs[index][0]
        with contextlib.suppress(OSError):
            lines = (self.log_dir / f"{plan.id}.log").read_text().strip().splitlines()
            if lines:
                return lines[-1]
        return "(no output)"

    def stop(self) -> None:
        """SIGTERM every live child, wait, SIGKILL what is left: no process stays behind."""
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self._logs:
            log.close()


def _node_argv(plan: NodePlan, args: argparse.Namespace, port: int, index: int = 0) -> list[str]:
    """The command line of node `plan`, the `index`-th process of the cluster."""
    argv = [
        sys.executable, "-m", "gwtf", "node",
        "--stage", str(plan.stage),
        "--id", plan.id,
        "--host", args.host,
        "--port", str(port),
        "--compute-s", repr(plan.compute_s),
        "--heartbeat-s", repr(args.heartbeat_s),
        "--failure-timeout-s", repr(args.failure_timeout_s),
    ]  # fmt: skip
    if plan.location:
        argv += ["--location", plan.location, "--link-matrix", args.link_matrix]
    for flag in ("token_file", "tls_cert", "tls_key", "tls_ca"):
        value = getattr(args, flag, None)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), os.path.abspath(value)]
    argv += ["--memory-slots", str(args.memory_slots)]
    if args.emulate_compute:
        argv.append("--emulate-compute")
    if args.no_train:
        argv.append("--no-train")
    # The nodes share this machine's cores: one torch thread each (the reference's bits too).
    argv += ["--threads", "1"]
    for flag in ("device", "precision"):
        value = getattr(args, flag, None)
        if value is not None:
            argv += ["--" + flag, value]
    # Observability, as the user asked for it of the launch: node i serves metrics on P + i.
    metrics_port = getattr(args, "metrics_port", None)
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
    if getattr(args, "log_json", False):
        argv.append("--log-json")
    log_level = getattr(args, "log_level", None)
    if log_level is not None:
        argv += ["--log-level", log_level]
    return argv


def run_launch(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    try:
        locations = _locations(args.link_matrix) if args.link_matrix else []
        plans = plan_nodes(
            args.nodes,
            args.stages,
            locations=locations,
            base_compute_s=args.compute_s,
            seed=args.seed,
        )
        churn = _plan_churn(args, plans, locations)
    except (TopologyError, ValueError) as err:
        print(f"gwtf launch: {err}", file=sys.stderr)
        return 2
    if args.base_port and args.base_port + len(plans) - 1 > 65535:
        print(f"gwtf launch: ports {args.base_port}.. exceed 65535", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="gwtf-launch-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = _Cluster(log_dir, metrics=args.metrics_port is not None)
    try:
        return _run(cluster, plans, args, stop, churn)
    except RuntimeError as err:
        print(f"gwtf launch: {err} (logs in {log_dir})", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _plan_churn(
    args: argparse.Namespace, plans: list[NodePlan], locations: list[str]
) -> list[ChurnAction]:
    """The churn trace's actions on this swarm (none without --churn); ChurnError if it
    cannot be replayed."""
    if not getattr(args, "churn", None):
        return []
    from gwtf.local.churn import load_churn, plan_churn

    events = load_churn(args.churn, args.churn_format)
    return plan_churn(
        events,
        plans,
        num_stages=args.stages,
        locations=locations,
        base_compute_s=args.compute_s,
        time_scale=args.time_scale,
        seed=args.seed + 1,
    )


def _run(
    cluster: _Cluster,
    plans: list[NodePlan],
    args: argparse.Namespace,
    stop: threading.Event,
    churn: list[ChurnAction],
) -> int:
    def port(i: int) -> int:
        return args.base_port + i if args.base_port else 0

    first = _node_argv(plans[0], args, port(0), 0) + ["--stages", str(args.stages)]
    if args.activation_bytes is not None:
        first += ["--activation-bytes", str(args.activation_bytes)]
    cluster.start(plans[0], first)
    bootstrap = cluster.wait_addresses({0}, time.monotonic() + START_TIMEOUT_S)[0]
    rest = {
        cluster.start(plan, _node_argv(plan, args, port(i), i) + ["--bootstrap", bootstrap])
        for i, plan in enumerate(plans[1:], start=1)
    }
    addresses = {0: bootstrap, **cluster.wait_addresses(rest, time.monotonic() + START_TIMEOUT_S)}
    nodes = [
        {
            "id": plan.id,
            "address": addresses[i],
            "stage": plan.stage,
            "location": plan.location,
            "compute_s": plan.compute_s,
            "pid": cluster.procs[i][1].pid,
            **({"metrics": cluster.metrics[i]} if i in cluster.metrics else {}),
        }
        for i, plan in enumerate(plans)
    ]
    if args.json:
        print(json.dumps({"nodes": nodes, "log_dir": str(cluster.log_dir)}), flush=True)
    else:
        print(f"gwtf launch: {len(nodes)} nodes in {args.stages} stages, logs in "
              f"{cluster.log_dir}; Ctrl-C stops them all")
        for n in nodes:
            print(f"  {n['id']:<8} {n['address']:<22} stage {n['stage']:<3} "
                  f"{n['location'] or '-':<12} compute {n['compute_s']:.4f} s  pid {n['pid']}"
                  + (f"  metrics {n['metrics']}" if "metrics" in n else ""))
        print(f"  gwtf status --to {bootstrap}", flush=True)
    replay = _Replay(cluster, addresses, churn, args)
    reported: set[int] = set()
    while not stop.wait(replay.wait_s()):
        replay.step()
        for i, (plan, proc) in enumerate(cluster.procs):
            if i not in reported and i not in replay.stopped and proc.poll() is not None:
                reported.add(i)
                print(f"gwtf launch: node {plan.id} exited with code {proc.returncode}",
                      file=sys.stderr, flush=True)
    print("gwtf launch: stopping the nodes", file=sys.stderr, flush=True)
    if churn:
        replay.summary()
    return 0


class _Replay:
    """Carries out a churn trace's actions at their times (`gwtf.local.churn`)."""

    def __init__(
        self,
        cluster: _Cluster,
        addresses: dict[int, str],
        actions: list[ChurnAction],
        args: argparse.Namespace,
    ) -> None:
        self.cluster = cluster
        self.addresses = dict(addresses)
        self.actions = actions
        self.args = args
        self.json_lines = bool(args.json)
        self.next = 0
        self.start = time.monotonic()
        self.index = {plan.id: i for i, (plan, _) in enumerate(cluster.procs)}
        self.stopped: set[int] = set()  # killed or terminated on purpose
        self.counts = {"join": 0, "crash": 0, "leave": 0}

    def wait_s(self) -> float:
        if self.next >= len(self.actions):
            return 0.5
        due = self.start + self.actions[self.next].at_s - time.monotonic()
        return min(0.5, max(0.0, due))

    def step(self) -> None:
        found, _ = self.cluster.poll_addresses()
        for i, address in found.items():
            self.addresses[i] = address
            self._say("listening", self.cluster.procs[i][0].id, address=address)
        now = time.monotonic() - self.start
        while self.next < len(self.actions) and self.actions[self.next].at_s <= now:
            self._do(self.actions[self.next])
            self.next += 1

    def _do(self, action: ChurnAction) -> None:
        self.counts[action.kind] += 1
        if action.kind == "join":
            assert action.plan is not None
            live = [
                self.addresses[i]
                for i in self.index.values()
                if i in self.addresses and self.cluster.procs[i][1].poll() is None
            ]
            if not live:
                self._say("skipped", action.node, reason="no live node to join through")
                return
            argv = _node_argv(action.plan, self.args, 0, len(self.cluster.procs)) + [
                "--bootstrap", *live[:3]
            ]
            i = self.cluster.start(action.plan, argv)
            self.index[action.node] = i
            self._say("join", action.node, stage=action.plan.stage, trace_s=action.trace_s)
            return
        i = self.index[action.node]
        self.stopped.add(i)
        self.addresses.pop(i, None)
        self.cluster.signal(i, signal.SIGKILL if action.kind == "crash" else signal.SIGTERM)
        self._say(action.kind, action.node, stage=self.cluster.procs[i][0].stage,
                  trace_s=action.trace_s)

    def _say(self, event: str, node: str, **fields: object) -> None:
        t = time.monotonic() - self.start
        if self.json_lines:
            print(json.dumps({"event": event, "node": node, "t": round(t, 3), **fields}),
                  flush=True)
        else:
            extra = " ".join(f"{k} {v}" for k, v in fields.items())
            print(f"gwtf launch: {t:8.2f} s  {event:<9} {node} {extra}".rstrip(), flush=True)

    def summary(self) -> None:
        done = self.next == len(self.actions)
        fields = {**self.counts, "trace_events": len(self.actions), "replayed_all": done}
        if self.json_lines:
            print(json.dumps({"churn": fields}), flush=True)
        else:
            print("gwtf launch: churn replayed: " + ", ".join(f"{k} {v}" for k, v in
                                                              fields.items()), flush=True)
