"""What the benchmarks that run real node processes share: a progress line, a node log line's
time, gossip rates between two status snapshots, and submitting a job while the swarm is still
forming."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gwtf.train import JobConfig

__all__ = ["gossip_rates", "log", "log_time", "submit_when_formed"]


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
