"""What an operator sees of a node: its logs (text or JSON lines) and Prometheus metrics.

Logs: one line per event on stderr, each with the node and its stage (`NodeLog`); job events
carry `job`, `iteration` and, about a microbatch, `microbatch` too (`extra=job_event(...)`).
`--log-json` writes the same records as JSON objects, one per line, for a log shipper. Events
that happen per microbatch (a forward or backward done) are logged at debug level only.

Metrics (`--metrics-port P`): the standard text exposition on http://HOST:P/metrics, served by
prometheus_client's HTTP server in a thread. The asyncio loop owns the node's state, so the
scraping thread never reads it: the loop publishes a `NodeStatus` snapshot (the very message
`gwtf status` shows) once per heartbeat and at every membership change, before the rest of the
node acts on the change (so a job's count of a dead participant is never ahead of the node's count
of deaths), and the collector turns the latest snapshot into metric families at scrape time.
Counters are the node's own cumulative counters, so a scrape between two snapshots sees values at
most one heartbeat old, never a torn state. Other parts of the node
add families through `add_source`: the job runtime's are `JobMetrics`, counters and gauges that
the loop updates and the scraping thread reads under one lock (each update is a dict write).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JOB_FAMILIES",
    "LOG_FORMAT",
    "JobMetrics",
    "JsonFormatter",
    "NodeLog",
    "NodeMetrics",
    "configure_logging",
    "job_event",
]

LOG_FORMAT = "%(asctime)s %(levelname)s node=%(node)s stage=%(stage)s %(message)s"
# Attributes every LogRecord has: what is not among them came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class NodeLog(logging.LoggerAdapter[logging.Logger]):
    """The node's logger: its node id and stage on every record, merged with a call's own
    `extra=` (the standard adapter replaces a call's `extra` with its own, losing the ids)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def job_event(job_id: str, iteration: int, microbatch: int | None = None) -> dict[str, Any]:
    """The `extra=` of a job event: the job, the iteration and, if any, the microbatch."""
    fields: dict[str, Any] = {"job": job_id, "iteration": iteration}
    if microbatch is not None:
        fields["microbatch"] = microbatch
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and every `extra=` field
    (node, stage, iteration, microbatch, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, *, json_lines: bool = False) -> None:
    """Root logging to stderr: `LOG_FORMAT` text, or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(LOG_FORMAT, defaults={"node": "-", "stage": "-"}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


Source = Callable[[], Iterable[Any]]
"""A callable returning prometheus_client metric families (read at scrape time, any thread)."""


class NodeMetrics:
    """The node's Prometheus collector: control-plane families from the latest published
    `NodeStatus`, plus whatever the added sources yield."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: Any = None  # node_pb2.NodeStatus
        self._events: dict[str, int] = {}
        self._sources: list[Source] = []
        self.port: int | None = None

    def publish(self, status: Any, events: dict[str, int]) -> None:
        """Called by the event loop: the node's current status and event counters."""
        with self._lock:
            self._status = status
            self._events = dict(events)

    def add_source(self, source: Source) -> None:
        with self._lock:
            self._sources.append(source)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP exposition on `port` (0: a free one); the port it listens on."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        server, _ = start_http_server(port, addr=host, registry=registry)
        self.port = int(server.server_address[1])
        return self.port

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            status, events, sources = self._status, dict(self._events), list(self._sources)
        if status is not None:
            me = status.member
            info = GaugeMetricFamily(
                "gwtf_node_info", "This node: id, stage, location (value 1)",
                labels=["node", "stage", "location"],
            )  # fmt: skip
            info.add_metric([me.id, str(me.stage), me.location or "-"], 1)
            yield info
            yield GaugeMetricFamily(
                "gwtf_capacity_microbatches_per_second",
                "The capacity this node announces (1 / compute seconds per microbatch)",
                value=me.capacity,
            )
            yield GaugeMetricFamily(
                "gwtf_compute_seconds_per_microbatch",
                "Measured (or stated) compute time of this node's stage per microbatch",
                value=me.compute_s,
            )
            yield GaugeMetricFamily(
                "gwtf_flow_through_microbatches_per_second",
                "Flow the routing sends through this node",
                value=status.throughput / 1e6,
            )
            yield GaugeMetricFamily(
                "gwtf_flow_converged",
                "1 when this node's flow state machine is at the final epsilon and quiet",
                value=1.0 if status.final and status.quiet else 0.0,
            )
            arcs = [a for a in status.arcs if not a.ring]
            flow = GaugeMetricFamily(
                "gwtf_arc_flow_microbatches_per_second",
                "Flow on each arc this node is the tail of", labels=["dst"],
            )  # fmt: skip
            rtt = GaugeMetricFamily(
                "gwtf_link_rtt_seconds",
                "Measured round trip to each next-stage peer", labels=["dst"],
            )  # fmt: skip
            bandwidth = GaugeMetricFamily(
                "gwtf_link_bandwidth_bytes_per_second",
                "Measured bandwidth to each next-stage peer", labels=["dst"],
            )  # fmt: skip
            for arc in arcs:
                flow.add_metric([arc.dst], arc.flow / 1e6)
                rtt.add_metric([arc.dst], arc.measured_rtt_ms / 1e3)
                bandwidth.add_metric([arc.dst], arc.measured_bandwidth_gbps * 1e9 / 8)
            yield flow
            yield rtt
            yield bandwidth
            for name, value, doc in (
                ("gwtf_flow_messages_sent", status.flow_messages_sent, "Flow messages sent"),
                ("gwtf_flow_messages_received", status.flow_messages_received,
                 "Flow messages received and merged"),
                ("gwtf_flow_calls_sent", status.flow_batches_sent, "Flow Exchange calls sent"),
                ("gwtf_gossip_bytes_sent", status.gossip_bytes_sent,
                 "Membership gossip bytes sent (requests and replies)"),
                ("gwtf_gossip_calls_sent", status.gossip_calls_sent, "Gossip calls sent"),
            ):  # fmt: skip
                yield CounterMetricFamily(name, doc, value=value)
            yield GaugeMetricFamily("gwtf_uptime_seconds", "Seconds since the node started",
                                    value=status.uptime_s)  # fmt: skip
        members = GaugeMetricFamily("gwtf_members", "Members this node sees, by state",
                                    labels=["state"])  # fmt: skip
        members.add_metric(["alive"], events.get("alive_members", 0))
        members.add_metric(["departed"], events.get("departed_members", 0))
        yield members
        yield CounterMetricFamily("gwtf_crashes_detected", "Members this node declared dead",
                                  value=events.get("deaths", 0))  # fmt: skip
        yield CounterMetricFamily("gwtf_leaves_seen", "Members that left gracefully",
                                  value=events.get("leaves", 0))  # fmt: skip
        yield CounterMetricFamily("gwtf_joins_seen", "Members seen joining (or coming back)",
                                  value=events.get("joins", 0))  # fmt: skip
        for source in sources:
            yield from source()


@dataclass(frozen=True)
class _Family:
    kind: str
    """counter, gauge or histogram"""
    help: str
    label: str = ""
    """The one label besides `job`, if any, and the values it takes."""
    values: tuple[str, ...] = ()


JOB_FAMILIES: dict[str, _Family] = {
    "gwtf_job_microbatches_received": _Family(
        "counter", "Microbatches this node took from a peer on the data plane (forward: "
        "activation and labels, backward: gradient); resends included",
        "direction", ("forward", "backward"),
    ),
    "gwtf_job_microbatches_sent": _Family(
        "counter", "Microbatches a peer took from this node on the data plane; resends included",
        "direction", ("forward", "backward"),
    ),
    "gwtf_job_bytes_sent": _Family(
        "counter", "Tensor payload bytes this node sent: microbatches (forward, backward), "
        "gradient sums to its stage's replicas at commits, and running sums to its keeper",
        "kind", ("forward", "backward", "gradient_sums", "kept_sums"),
    ),
    "gwtf_job_bytes_received": _Family(
        "counter", "Tensor payload bytes this node took: microbatches (forward, backward), "
        "gradient sums from its stage's replicas at commits, and running sums it keeps",
        "kind", ("forward", "backward", "gradient_sums", "kept_sums"),
    ),
    "gwtf_job_queue_depth": _Family(
        "gauge", "Work items waiting for this node's compute thread (microbatch forwards and "
        "backwards, commit work)",
    ),
    "gwtf_job_compute_seconds": _Family(
        "histogram", "Seconds the compute thread spent per item (with --emulate-compute's "
        "padding): forward, backward, loss (the last stage's forward and backward), commit",
        "kind", ("forward", "backward", "loss", "commit"),
    ),
    "gwtf_job_reroutes": _Family(
        "counter", "Microbatches this node resent to a replacement of a dead node, by rule of "
        "docs/design.md 4", "rule", ("resend", "recompute", "replay"),
    ),
    "gwtf_job_kept_sums": _Family(
        "counter", "Bounded replay (docs/design.md 4.9): running gradient sums this node "
        "shipped to its keeper and that landed, took from its stage peers, and adopted from a "
        "dead peer in its place", "event", ("shipped", "kept", "adopted"),
    ),
    "gwtf_job_replays": _Family(
        "counter", "A dead node's stage work redone here: forwards recomputed (rule 2), "
        "forward and backward replayed (rule 3)", "rule", ("recompute", "replay"),
    ),
    "gwtf_job_dropped_microbatches": _Family(
        "counter", "Microbatches dropped (rule 4) from the iterations this node committed",
    ),
    "gwtf_job_microbatches_trained": _Family(
        "counter", "Microbatches in the iterations this node committed",
    ),
    "gwtf_job_iterations_committed": _Family(
        "counter", "Iterations this node's stage stepped",
    ),
    "gwtf_job_iteration": _Family("gauge", "The iteration this node works on"),
    "gwtf_job_loss": _Family("gauge", "Mean loss of the last iteration this node committed"),
    "gwtf_job_commit_seconds": _Family(
        "histogram", "Seconds of the commit here: prepare (from the order to the gradient sums "
        "exchanged with the stage's replicas), step (from the order to the optimizer stepped)",
        "phase", ("prepare", "step"),
    ),
    "gwtf_job_restarts": _Family("counter", "Times an iteration started over here"),
    "gwtf_job_participants_down": _Family(
        "counter", "Participants of the job this node saw crash or leave", "how",
        ("crashed", "left"),
    ),
}
"""The job runtime's metric families: name -> type, help, and the label besides `job`."""

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0)  # fmt: skip
"""Upper bounds of the histograms' buckets (+Inf implied): a tiny CPU stage's microbatch takes a
few ms, a real stage's up to seconds, a commit on a WAN tens of seconds."""

_Key = tuple[str, str, str]  # (family, job, label value)


class JobMetrics:
    """The job runtime's metrics on one node (`JOB_FAMILIES`), labelled by job id.

    The event loop updates them, the scraping thread reads them; both under one lock, so a
    scrape never sees half an update. Only the `MAX_JOBS` latest jobs keep series: a node that
    serves for months does not grow its exposition without bound."""

    MAX_JOBS = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: list[str] = []
        self._values: dict[_Key, float] = {}
        self._histograms: dict[_Key, list[float]] = {}
        """Per series: the count in each bucket (not cumulative), +Inf's, then sum and count."""

    def _key(self, name: str, job: str, label: str) -> _Key:
        family = JOB_FAMILIES[name]
        if label not in (family.values or ("",)):
            raise ValueError(f"{name} has no {family.label or 'label'} {label!r}")
        if job not in self._jobs:
            self._jobs.append(job)
            if len(self._jobs) > self.MAX_JOBS:
                gone = self._jobs.pop(0)
                self._values = {k: v for k, v in self._values.items() if k[1] != gone}
                self._histograms = {k: v for k, v in self._histograms.items() if k[1] != gone}
        return name, job, label

    def start(self, job: str) -> None:
        """Every series of `job` at zero: a dashboard sees a counter that never moved."""
        with self._lock:
            for name, family in JOB_FAMILIES.items():
                for label in family.values or ("",):
                    key = self._key(name, job, label)
                    if family.kind == "histogram":
                        self._histograms.setdefault(key, [0.0] * (len(SECONDS_BUCKETS) + 3))
                    else:
                        self._values.setdefault(key, 0.0)

    def count(self, name: str, job: str, label: str = "", by: float = 1.0) -> None:
        """Add `by` to a counter."""
        with self._lock:
            key = self._key(name, job, label)
            self._values[key] = self._values.get(key, 0.0) + by

    def set(self, name: str, job: str, value: float, label: str = "") -> None:
        """Set a gauge."""
        with self._lock:
            self._values[self._key(name, job, label)] = value

    def observe(self, name: str, job: str, seconds: float, label: str = "") -> None:
        """One observation of a histogram."""
        with self._lock:
            key = self._key(name, job, label)
            series = self._histograms.setdefault(key, [0.0] * (len(SECONDS_BUCKETS) + 3))
            index = next(
                (i for i, bound in enumerate(SECONDS_BUCKETS) if seconds <= bound),
                len(SECONDS_BUCKETS),
            )
            series[index] += 1
            series[-2] += seconds
            series[-1] += 1

    def collect(self) -> Iterator[Any]:
        """The families, for `NodeMetrics.add_source` (any thread)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:
            values = dict(self._values)
            histograms = {k: list(v) for k, v in self._histograms.items()}
        kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                 "histogram": HistogramMetricFamily}  # fmt: skip
        for name, family in JOB_FAMILIES.items():
            labels = ["job", family.label] if family.label else ["job"]
            out = kinds[family.kind](name, family.help, labels=labels)
            if family.kind == "histogram":
                for (n, job, label), series in sorted(histograms.items()):
                    if n != name:
                        continue
                    cumulative, buckets = 0.0, []
                    for bound, count in zip(
                        (*(f"{b:g}" for b in SECONDS_BUCKETS), "+Inf"), series, strict=False
                    ):
                        cumulative += count
                        buckets.append((bound, cumulative))
                    out.add_metric([job, label][: len(labels)], buckets, sum_value=series[-2])
            else:
                for (n, job, label), value in sorted(values.items()):
                    if n == name:
                        out.add_metric([job, label][: len(labels)], value)
            yield out
