"""What an operator sees of a node: its logs (text or JSON lines) and Prometheus metrics.

Logs: one line per event on stderr, each with the node and its stage; events about a microbatch
carry `iteration` and `microbatch` too (pass them in `extra=`). `--log-json` writes the same
records as JSON objects, one per line, for a log shipper.

Metrics (`--metrics-port P`): the standard text exposition on http://HOST:P/metrics, served by
prometheus_client's HTTP server in a thread. The asyncio loop owns the node's state, so the
scraping thread never reads it: the loop publishes a `NodeStatus` snapshot (the very message
`gwtf status` shows) once per heartbeat, and the collector turns the latest snapshot into metric
families at scrape time. Counters are the node's own cumulative counters, so a scrape between two
snapshots sees values at most one heartbeat old, never a torn state. Other parts of the node
(the job runtime) add families through `add_source`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "LOG_FORMAT",
    "JsonFormatter",
    "NodeMetrics",
    "configure_logging",
]

LOG_FORMAT = "%(asctime)s %(levelname)s node=%(node)s stage=%(stage)s %(message)s"
# Attributes every LogRecord has: what is not among them came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


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
