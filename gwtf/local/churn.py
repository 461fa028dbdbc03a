"""Churn replay for `gwtf launch --churn TRACE`: which process to kill or start, and when (pure).

A trace (the CSV of docs/design.md 5, or the Bamboo spot format; readers in `gwtf.sim.traces`, the
ones the simulator uses) names its nodes in its own way. `plan_churn` binds those names to the
processes of a local swarm, once, before anything runs, so that every mistake in the trace is one
line at start-up rather than a surprise half-way through a replay:

- A trace name equal to a launched node's id is that node.
- The other names that join at time 0 are the trace's initial swarm: they take the launched nodes
  that no name claimed, in order (the Bamboo p3 trace's `node1`..`node18` become the 18 nodes of
  `--nodes 18`). A trace that starts more nodes at time 0 than were launched is refused.
- A later join starts a new node process under the trace's name: on the stage the row gives, or
  else on the stage with the fewest live nodes then (the lowest on a tie), which is where a
  volunteer swarm would put a newcomer; a location round-robin over the matrix's; a GPU drawn
  from the same table as the launched nodes (`plan_nodes`). A name that comes back after it
  crashed or left is a new process with the same id (the swarm tells incarnations apart by epoch).
- `crash` is SIGKILL (no goodbye, as a preempted spot instance) and `leave` SIGTERM (the node
  leaves gracefully). Link rows cannot be replayed: the emulated matrix is fixed per process.

Times are scaled by `time_scale` (wall seconds per trace second): the p3 trace spans 11.4 hours,
`--time-scale 0.01` replays it in 7 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gwtf.local.plan import NodePlan
from gwtf.node.rpc.codec import InvalidMessage, check_name
from gwtf.sim.traces import TraceError, TraceEvent, read_bamboo_trace, read_csv_trace

__all__ = ["ChurnAction", "ChurnError", "load_churn", "plan_churn", "trace_format"]


class ChurnError(ValueError):
    """The trace cannot be replayed on this swarm; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class ChurnAction:
    """One thing to do to the local swarm, `at_s` wall seconds after the replay starts."""

    at_s: float
    kind: str  # "join" (start a process), "crash" (SIGKILL) or "leave" (SIGTERM)
    node: str  # the process's node id
    plan: NodePlan | None = None  # for a join: what to start
    trace_s: float = 0.0  # the event's time in the trace


def trace_format(path: str) -> str:
    """"bamboo" when the file's header is Bamboo's (`time_ms,...`), else "csv"."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline()
    except (OSError, UnicodeDecodeError) as err:
        raise ChurnError(f"cannot read trace {path!r}: {err}") from None
    return "bamboo" if first.strip().lower().startswith("time_ms") else "csv"


def load_churn(path: str, fmt: str | None = None) -> list[TraceEvent]:
    """Read a trace in `fmt` (None: from its header); ChurnError if it cannot be read."""
    fmt = fmt or trace_format(path)
    try:
        return read_bamboo_trace(path) if fmt == "bamboo" else read_csv_trace(path)
    except TraceError as err:
        raise ChurnError(str(err)) from None


def plan_churn(
    events: list[TraceEvent],
    initial: list[NodePlan],
    *,
    num_stages: int,
    locations: list[str],
    base_compute_s: float,
    time_scale: float = 1.0,
    seed: int = 0,
) -> list[ChurnAction]:
    """Bind the trace's names to processes and turn its events into actions (module doc)."""
    from gwtf.flow.generate import gpu_speeds

    if not time_scale > 0:
        raise ChurnError(f"--time-scale must be positive, got {time_scale}")
    launched = {p.id: p for p in initial}
    alive: dict[str, int] = {p.id: p.stage for p in initial}  # process id -> stage
    bound: dict[str, str] = {}  # trace name -> process id
    free = [p.id for p in initial]
    for event in events:
        if event.kind != "link" and event.node in launched:
            bound.setdefault(event.node, event.node)
    for name in bound:
        free.remove(name)
    rng = np.random.default_rng(seed)
    speeds = gpu_speeds()
    actions: list[ChurnAction] = []
    joined = 0
    for event in events:
        where = f"trace event at {event.time_s:g} s ({event.kind} {event.node})"
        if event.kind == "link":
            raise ChurnError(f"{where}: link changes cannot be replayed on a local swarm (the "
                             "emulated matrix is fixed per process); use gwtf simulate for them")
        if event.stage is not None and event.stage >= num_stages:
            raise ChurnError(
                f"{where}: stage {event.stage} is outside the swarm's 0..{num_stages - 1}"
            )
        name = event.node
        if event.kind == "join" and event.time_s == 0 and name not in bound:
            if not free:
                raise ChurnError(
                    f"{where}: the trace starts more nodes at time 0 than the {len(initial)} "
                    "launched; give --nodes >= that many"
                )
            bound[name] = free.pop(0)
            continue  # it is one of the launched nodes, already running
        if event.kind == "join" and event.time_s == 0 and bound[name] in alive:
            continue  # a launched node named by its own id
        pid = bound.get(name, name)
        if event.kind == "join":
            if pid in alive:
                raise ChurnError(f"{where}: node {name!r} is already alive")
            try:
                check_name("node id", pid)
            except InvalidMessage as err:
                raise ChurnError(f"{where}: {err}") from None
            stage = event.stage
            if stage is None:
                counts = [0] * num_stages
                for s in alive.values():
                    counts[s] += 1
                stage = counts.index(min(counts))
            if event.location is not None and locations and event.location not in locations:
                raise ChurnError(f"{where}: location {event.location!r} is not in the matrix")
            location = event.location or (
                locations[(len(initial) + joined) % len(locations)] if locations else ""
            )
            _, speed = speeds[int(rng.integers(len(speeds)))]
            plan = NodePlan(pid, stage, location, base_compute_s / speed)
            bound[name] = pid
            alive[pid] = stage
            joined += 1
            actions.append(ChurnAction(event.time_s * time_scale, "join", pid, plan, event.time_s))
        else:
            if pid not in alive:
                raise ChurnError(f"{where}: node {name!r} is not alive then")
            del alive[pid]
            actions.append(ChurnAction(event.time_s * time_scale, event.kind, pid, None,
                                       event.time_s))
    return actions
