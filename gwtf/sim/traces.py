"""Churn traces: readers for the two file formats, and a seeded generator.

CSV format (docs/design.md 5), one event per line, an optional header line starting with `time_s`::

    time_s,event,node[,stage][,location][,uplink_gbps]      event: join | leave | crash
    time_s,link,LOC_A:LOC_B,rtt_ms,bandwidth_gbps
    time_s,speed,node,factor

`stage`, `location` and the machine's access uplink are optional on a join (the scenario
assigns what is missing: the uplink from `[nodes] uplink_gbps`, or none); a `link`
row sets the link between two locations from that time on; a `speed` row makes the machine
`node` take `factor` times its normal compute time from then on (1: back to normal), whether it
is in the swarm then or joins later (docs/design.md 2.13, 5). Blank lines and lines starting with
`#` are skipped.

Bamboo format (uclasystem/bamboo `traces/*.csv`)::

    time_ms,event,node        event: add | remove

An `add` is a join and a `remove` an abrupt preemption (a crash, no goodbye).

Every problem is a `TraceError` naming the file and the line.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import numpy as np

__all__ = [
    "TraceError",
    "TraceEvent",
    "generate_churn",
    "generate_stragglers",
    "read_bamboo_trace",
    "read_csv_trace",
    "read_trace",
]

KINDS = ("join", "leave", "crash", "link", "speed")


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One churn event. For `link`, `node` is "LOC_A:LOC_B" and rtt_ms / bandwidth_gbps are set."""

    time_s: float
    kind: str
    node: str
    stage: int | None = None
    location: str | None = None
    rtt_ms: float | None = None
    bandwidth_gbps: float | None = None
    factor: float | None = None
    """`speed`: the machine's compute time over its normal one from now on."""
    uplink_gbps: float | None = None
    """`join`: the machine's own access uplink (None: drawn from the scenario's list)."""

    @property
    def link_pair(self) -> tuple[str, str]:
        a, _, b = self.node.partition(":")
        return a, b


def _rows(path: str | PathLike[str]) -> list[tuple[int, list[str]]]:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TraceError(f"cannot read trace {str(path)!r}: {reason}") from None
    out = []
    for lineno, row in enumerate(rows, start=1):
        cells = [c.strip() for c in row]
        if not cells or all(not c for c in cells) or cells[0].startswith("#"):
            continue
        out.append((lineno, cells))
    return out


def _number(where: str, key: str, text: str, *, positive: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {key} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a number >= 0"
        raise TraceError(f"{where}: {key} must be {need}, got {text!r}")
    return value


def read_csv_trace(path: str | PathLike[str]) -> list[TraceEvent]:
    """Read a trace in the CSV format of the module doc, sorted by time (stable)."""
    name = str(path)
    events: list[TraceEvent] = []
    for lineno, cells in _rows(path):
        where = f"trace {name!r} line {lineno}"
        if cells[0] == "time_s":
            continue
        if len(cells) < 3:
            raise TraceError(f"{where}: expected time_s,event,node[,stage][,location]")
        time_s = _number(where, "time_s", cells[0])
        kind = cells[1].lower()
        if kind not in KINDS:
            raise TraceError(f"{where}: event must be one of {', '.join(KINDS)}, got {cells[1]!r}")
        node = cells[2]
        if not node:
            raise TraceError(f"{where}: the node (or LOC_A:LOC_B for a link) is empty")
        if kind == "link":
            a, sep, b = node.partition(":")
            if not sep or not a or not b or a == b or len(cells) != 5:
                raise TraceError(
                    f"{where}: a link row is time_s,link,LOC_A:LOC_B,rtt_ms,bandwidth_gbps"
                )
            rtt = _number(where, "rtt_ms", cells[3])
            bw = _number(where, "bandwidth_gbps", cells[4], positive=True)
            events.append(TraceEvent(time_s, kind, node, rtt_ms=rtt, bandwidth_gbps=bw))
            continue
        if kind == "speed":
            if len(cells) != 4:
                raise TraceError(f"{where}: a speed row is time_s,speed,node,factor")
            factor = _number(where, "factor", cells[3], positive=True)
            events.append(TraceEvent(time_s, kind, node, factor=factor))
            continue
        if len(cells) > 6:
            raise TraceError(f"{where}: expected at most 6 fields, got {len(cells)}")
        stage = None
        if len(cells) >= 4 and cells[3]:
            if not cells[3].isdigit():
                raise TraceError(f"{where}: stage must be an integer >= 0, got {cells[3]!r}")
            stage = int(cells[3])
        location = cells[4] if len(cells) >= 5 and cells[4] else None
        uplink = (_number(where, "uplink_gbps", cells[5], positive=True)
                  if len(cells) == 6 and cells[5] else None)
        if kind != "join" and (stage is not None or location is not None or uplink is not None):
            raise TraceError(f"{where}: only a join row may give a stage, a location or an uplink")
        events.append(TraceEvent(time_s, kind, node, stage, location, uplink_gbps=uplink))
    events.sort(key=lambda e: e.time_s)
    return events


def read_bamboo_trace(path: str | PathLike[str]) -> list[TraceEvent]:
    """Read a Bamboo spot trace (`time_ms,add|remove,node`): add -> join, remove -> crash."""
    name = str(path)
    events: list[TraceEvent] = []
    for lineno, cells in _rows(path):
        where = f"trace {name!r} line {lineno}"
        if cells[0] == "time_ms":
            continue
        if len(cells) != 3:
            raise TraceError(
                f"{where}: expected 3 fields time_ms,add|remove,node, got {len(cells)}"
            )
        time_ms = _number(where, "time_ms", cells[0])
        kind = {"add": "join", "remove": "crash"}.get(cells[1].lower())
        if kind is None:
            raise TraceError(f"{where}: event must be add or remove, got {cells[1]!r}")
        if not cells[2]:
            raise TraceError(f"{where}: the node is empty")
        events.append(TraceEvent(time_ms / 1000.0, kind, cells[2]))
    events.sort(key=lambda e: e.time_s)
    return events


def read_trace(path: str | PathLike[str], fmt: str) -> list[TraceEvent]:
    """Read `path` as `fmt` ("csv" or "bamboo") and check that joins and departures make sense."""
    if fmt == "csv":
        events = read_csv_trace(path)
    elif fmt == "bamboo":
        events = read_bamboo_trace(path)
    else:
        raise TraceError(f"trace {str(path)!r}: unknown format {fmt!r}; use csv or bamboo")
    alive: set[str] = set()
    for event in events:
        if event.kind == "join":
            if event.node in alive:
                raise TraceError(
                    f"trace {Path(path).name!r}: node {event.node!r} joins at "
                    f"{event.time_s:g} s while already alive"
                )
            alive.add(event.node)
        elif event.kind in ("leave", "crash"):
            if event.node not in alive:
                raise TraceError(
                    f"trace {Path(path).name!r}: node {event.node!r} {event.kind}es at "
                    f"{event.time_s:g} s but is not alive"
                )
            alive.discard(event.node)
    return events


def generate_churn(
    rng: np.random.Generator,
    *,
    initial: Sequence[str],
    duration_s: float,
    join_rate_per_h: float,
    session_mean_s: float,
    distribution: str = "exponential",
    leave_fraction: float = 0.0,
    prefix: str = "g",
) -> list[TraceEvent]:
    """A churn trace: Poisson joins, each node (the initial ones too) living for a session drawn
    from `distribution` ("exponential", or "lognormal" with sigma 1 and the given mean) and then
    crashing, or leaving gracefully with probability `leave_fraction`."""
    if distribution not in ("exponential", "lognormal"):
        raise ValueError(f"unknown session distribution {distribution!r}")

    def session() -> float:
        if distribution == "exponential":
            return float(rng.exponential(session_mean_s))
        sigma = 1.0
        mu = math.log(session_mean_s) - sigma**2 / 2
        return float(rng.lognormal(mu, sigma))

    events: list[TraceEvent] = []

    def depart(node: str, start: float) -> None:
        end = start + session()
        if end < duration_s:
            kind = "leave" if rng.random() < leave_fraction else "crash"
            events.append(TraceEvent(end, kind, node))

    for node in initial:
        depart(node, 0.0)
    t = 0.0
    count = 0
    rate = join_rate_per_h / 3600.0
    while rate > 0:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration_s:
            break
        node = f"{prefix}{count}"
        count += 1
        events.append(TraceEvent(t, "join", node))
        depart(node, t)
    events.sort(key=lambda e: (e.time_s, e.kind != "join"))
    return events


def generate_stragglers(
    rng: np.random.Generator,
    *,
    nodes: Sequence[str],
    duration_s: float,
    episodes_per_node_h: float,
    slowdowns: Sequence[tuple[float, float, float]],
    median_s: float,
    sigma: float,
    min_s: float,
    max_s: float,
) -> list[TraceEvent]:
    """Slow episodes of each machine in `nodes` over `duration_s` (docs/design.md 5, *Drift*):
    a Poisson process of `episodes_per_node_h` per machine and hour, one episode at a time; each
    slows the machine by a factor drawn from `slowdowns` (bins `(low, high, weight)`: a bin by
    weight, then log-uniform inside it) for a log-normal time of median `median_s` and shape
    `sigma`, clipped to `[min_s, max_s]`; a `speed` row at its start and one of factor 1 at its
    end. Machines are drawn in the order given, so the same seed gives the same episodes."""
    if episodes_per_node_h <= 0 or not nodes:
        return []
    weights = np.array([w for _, _, w in slowdowns], dtype=float)
    if not slowdowns or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("slowdowns need at least one bin of positive weight")
    for low, high, _ in slowdowns:
        if not 0 < low <= high:
            raise ValueError(f"a slowdown bin needs 0 < low <= high, got {low}, {high}")
    if not 0 < min_s <= median_s <= max_s or sigma < 0:
        raise ValueError("episodes need 0 < min_s <= median_s <= max_s and sigma >= 0")
    probs = weights / weights.sum()
    rate = episodes_per_node_h / 3600.0
    events: list[TraceEvent] = []
    for node in nodes:
        t = float(rng.exponential(1.0 / rate))
        while t < duration_s:
            low, high, _ = slowdowns[int(rng.choice(len(slowdowns), p=probs))]
            factor = float(math.exp(rng.uniform(math.log(low), math.log(high))))
            length = min(max(float(rng.lognormal(math.log(median_s), sigma)), min_s), max_s)
            events.append(TraceEvent(t, "speed", node, factor=factor))
            if t + length < duration_s:
                events.append(TraceEvent(t + length, "speed", node, factor=1.0))
            t += length + float(rng.exponential(1.0 / rate))
    events.sort(key=lambda e: e.time_s)
    return events
