"""What the benchmarks that run real node processes share: a progress line, a node log line's
time, and submitting a job while the swarm is still forming."""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gwtf.train import JobConfig

__all__ = ["log", "log_time", "submit_when_formed"]


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
