"""What the benchmarks that run real node processes share: a progress line, a node log line's
time, gossip rates between two status snapshots, and submitting a job while the swarm is still
forming, and starting nodes in network namespaces."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gwtf.train import JobConfig

__all__ = [
    "alternate",
    "gossip_rates",
    "log",
    "log_time",
    "start_in_hosts",
    "submit_when_formed",
]

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def log_time(text: str) -> float:
    """A node log line's time (local wall clock, milliseconds) as epoch seconds."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def submit_when_formed(address: str, job: JobConfig, wait_s: float = 120.0) -> str:
    """Submit `job` to the node at `address`, again every second while the swarm is still
    forming (a submission is refused until every stage has a live node); the job's id."""
    from gwtf.client import GwtfClient

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return GwtfClient(address, timeout_s=60).submit(job)
        except Exception:  # the swarm is still forming
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def gossip_rates(
    first: Mapping[str, dict[str, Any] | None], last: Mapping[str, dict[str, Any] | None],
) -> tuple[list[float], list[float]]:
    """Per node, gossip bytes and calls sent per second between two status snapshots (each
    node's own view, `swarm=False`), over its own uptime."""
    rates, calls = [], []
    for node_id, a in first.items():
        b = last[node_id]
        assert a is not None and b is not None
        na, nb = a["nodes"][0], b["nodes"][0]
        dt_s = nb["uptime_s"] - na["uptime_s"]
        rates.append((nb["gossip_bytes_sent"] - na["gossip_bytes_sent"]) / dt_s)
        calls.append((nb["gossip_calls_sent"] - na["gossip_calls_sent"]) / dt_s)
    return rates, calls


def start_in_hosts(
    hosts: Any, nodes: Sequence[tuple[str, int, float]], compute_s: float, stages: int,
    activation_bytes: int, log_dir: Path,
) -> dict[str, str]:
    """Start `gwtf node` for each (id, stage, uplink Mbit/s) inside its namespace of `hosts`
    (`gwtf.local.netns.Hosts`), compute emulated at `compute_s`, the uplink declared; the first
    creates the swarm, the others join through it. Each node's address once it listens (what
    it prints: a relayed node's is its relay's port)."""
    addresses: dict[str, str] = {}
    for node, stage, mbps in nodes:
        argv = [
            sys.executable, "-m", "gwtf", "node", "--id", node, "--stage", str(stage),
            "--host", hosts.address(node), "--port", "0",
            "--compute-s", str(compute_s), "--emulate-compute", "--uplink-mbps", str(mbps),
            "--device", "cpu", "--threads", "1",
        ]  # fmt: skip
        if not addresses:
            argv += ["--stages", str(stages), "--activation-bytes", str(activation_bytes)]
        else:
            argv += ["--bootstrap", next(iter(addresses.values()))]
        said = log_dir / f"{node}.out"
        with open(log_dir / f"{node}.log", "w", encoding="utf-8") as err, \
                open(said, "w", encoding="utf-8") as out:  # fmt: skip
            proc = hosts.popen(node, argv, cwd=REPO, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + 120
        while node not in addresses:
            text = said.read_text(encoding="utf-8")
            if "listening on" in text:
                addresses[node] = text.split("listening on ")[1].split()[0]
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{node} did not start: see {log_dir / (node + '.log')}")
            else:
                time.sleep(0.2)
    return addresses


def alternate(
    prefix: str, pairs: int, one_run: Callable[[bool, Path], dict[str, Any]],
) -> list[dict[str, Any]]:
    """`pairs` pairs of runs, each pair `one_run(False, log_dir)` then `one_run(True, ...)` on a
    fresh swarm, alternated so that a machine's drift falls on both alike; every run's logs in
    a folder of its own under a temporary one (removed after)."""
    import tempfile

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=f"gwtf-{prefix}-") as tmp:
        for pair in range(pairs):
            for which in (False, True):
                log_dir = Path(tmp) / f"{pair}-{'on' if which else 'off'}"
                log_dir.mkdir()
                runs.append(one_run(which, log_dir))
    return runs
