"""What a node tells about itself (docs/design.md 3.10): its `Status.Get` answer, and the
snapshot its metrics thread reads.

`local_status` is the very message `gwtf status` shows and the metrics are made of
(gwtf.node.observe): the node's member entry, its flow state machine, the arcs it owns with what
its probes measured, and its counters. The metrics thread never reads the loop's state: the loop
hands it a fresh snapshot each heartbeat and at each membership change (`publish_metrics`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from gwtf.node.control.flowcontrol import FlowControl
from gwtf.node.control.peers import Peers
from gwtf.node.control.prober import LinkProber
from gwtf.node.control.routing import LocalRouting
from gwtf.node.observe import NodeMetrics
from gwtf.node.rpc.codec import member_to_pb, swarm_to_pb
from gwtf.node.rpc.ratelimit import RateLimiter
from gwtf.node.rpc.relay import RelayServer
from gwtf.node.state import NodeState
from gwtf.v1 import node_pb2

__all__ = ["StatusReport"]


class StatusReport:
    """A node's status and metrics snapshot; it counts the calls its token check refused."""

    def __init__(
        self,
        state: NodeState,
        peers: Peers,
        flows: FlowControl,
        metrics: NodeMetrics,
        limiter: RateLimiter,
        relay: RelayServer,
    ) -> None:
        self._state = state
        self._peers = peers
        self._flows = flows
        self._metrics = metrics
        self._limiter = limiter
        self._relay = relay
        self._token_refusals = 0
        # What the metrics thread reads: a copy made on the loop, replaced whole.
        self._refusals: dict[str, int] = {}
        self._relayed: tuple[int, int, int] = (0, 0, 0)
        metrics.add_source(self._refusal_metrics)
        metrics.add_source(self._relay_metrics)

    def token_refused(self) -> None:
        """A call without the swarm's token was refused (gwtf.node.rpc.security)."""
        self._token_refusals += 1

    def _refusal_metrics(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "gwtf_requests_refused", "Calls refused before any handler ran, by reason",
            labels=["reason"],
        )  # fmt: skip
        refusals = self._refusals
        for reason in ("rate", "token"):
            family.add_metric([reason], refusals.get(reason, 0))
        yield family

    def _relay_metrics(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        carried, peers, refused = self._relayed
        yield CounterMetricFamily("gwtf_relay_bytes", "Bytes carried for members this node "
                                  "relays, both ways", value=carried)  # fmt: skip
        yield GaugeMetricFamily("gwtf_relay_peers", "Members this node relays for now",
                                value=peers)  # fmt: skip
        yield CounterMetricFamily("gwtf_relay_refused", "Attachments refused (not a member, "
                                  "or over --relay-peers)", value=refused)  # fmt: skip

    def publish_metrics(self) -> None:
        """Hand the metrics thread a fresh snapshot (it never reads the loop's state)."""
        state = self._state
        if self._metrics.port is None or not state.in_swarm:
            return
        self._refusals = {"rate": self._limiter.refused, "token": self._token_refusals}
        relay = self._relay
        self._relayed = (relay.relayed_bytes(), len(relay.relayed()), relay.refused)
        stats = state.stats
        self._metrics.publish(
            self.local_status(),
            {
                "deaths": stats.deaths,
                "leaves": stats.leaves,
                "joins": stats.joins,
                "alive_members": len(state.members.alive()) + 1,
                "departed_members": len(state.members.departed()),
            },
        )

    def local_status(self) -> node_pb2.NodeStatus:
        state = self._state
        driver = state.driver
        prober = self._flows.prober
        wan = self._peers.wan
        routes = driver.routes()
        status = node_pb2.NodeStatus(
            member=member_to_pb(state.members.me),
            round=driver.round,
            tightens=driver.tightens,
            final=driver.node.final,
            quiet=self._flows.quiet(),
            eps=driver.node.eps,
            throughput=driver.throughput(),
            flow_messages_sent=driver.messages_sent,
            flow_batches_sent=driver.batches_sent,
            gossip_bytes_sent=state.stats.gossip_bytes,
            gossip_calls_sent=state.stats.gossip_calls,
            uptime_s=time.monotonic() - state.stats.started,
            departed=[m.id for m in state.members.departed()],
            wan_stack_rtt_ms=wan.stack_rtt_s * 1000 if wan is not None else 0.0,
            busy=driver.busy_reasons()
            + (
                ["measuring " + ",".join(sorted(prober.measuring))]
                if prober.measuring
                else []
            ),
            flow_messages_received=driver.messages_received,
            flow_messages_emitted=driver.messages_emitted,
            routing=state.swarm.routing,
            relayed_bytes=self._relay.relayed(),
        )
        local = self._flows.local
        if local is not None:
            self._local_status(status, local)
            return status
        for peer, arc in sorted(driver.owned.items()):
            measured = _measured(prober, peer)
            status.arcs.append(
                node_pb2.ArcStatus(
                    src=state.node_id,
                    dst=peer,
                    flow=0 if arc.ring else routes.get(peer, 0),
                    cap=arc.params.cap,
                    cost=arc.params.cost,
                    gen=arc.gen,
                    rtt_ms=arc.params.rtt_ms,
                    bandwidth_gbps=arc.params.bandwidth_gbps,
                    ring=arc.ring,
                    measured_rtt_ms=measured[0],
                    measured_bandwidth_gbps=measured[1],
                    rtt_probes=measured[2],
                )
            )
        return status

    def _local_status(self, status: node_pb2.NodeStatus, local: LocalRouting) -> None:
        """Local routing (docs/design.md 2.12): final once a solution is held, quiet once the
        view held is the one solved; the arcs are those of the view, with the link the routing
        takes them by and what the probes measured."""
        route = local.route
        status.final = route.has_solution
        status.throughput = route.throughput()
        status.solves = route.solves
        status.view_changes = route.view_changes
        status.repairs = route.repairs
        status.last_solve_s = route.last_solve_s
        status.solve_waited_s = route.waited_s
        status.message_delay_s = route.message_delay_s()
        prober = self._flows.prober
        for arc in local.arcs():
            params = local.params(arc)
            measured = _measured(prober, arc.peer)
            status.arcs.append(
                node_pb2.ArcStatus(
                    src=self._state.node_id,
                    dst=arc.peer,
                    flow=arc.flow,
                    cap=params.cap,
                    cost=params.cost,
                    gen=route.solves,
                    rtt_ms=params.rtt_ms,
                    bandwidth_gbps=params.bandwidth_gbps,
                    ring=False,
                    measured_rtt_ms=measured[0],
                    measured_bandwidth_gbps=measured[1],
                    rtt_probes=measured[2],
                )
            )

    async def on_status(self, request: node_pb2.StatusRequest) -> node_pb2.StatusReply:
        """This node's status, and with `request.swarm` every live member's (each asked with
        `status_timeout_s`; one that does not answer is listed as unreachable)."""
        state = self._state
        reply = node_pb2.StatusReply(node=state.node_id)
        if not state.ready or not state.in_swarm:
            return reply
        reply.swarm.CopyFrom(swarm_to_pb(state.swarm))
        members = state.members.alive()
        reply.members.extend(
            member_to_pb(m) for m in (state.members.me, *members, *state.members.departed())
        )
        reply.nodes.append(self.local_status())
        if request.swarm:
            ask = node_pb2.StatusRequest(swarm=False)
            results = await asyncio.gather(
                *(self._peers.stubs(m).status.Get(ask, timeout=state.config.status_timeout_s)
                  for m in members),
                return_exceptions=True,
            )
            for member, result in zip(members, results, strict=True):
                if isinstance(result, BaseException) or not result.nodes:
                    reply.unreachable.append(member.id)
                else:
                    reply.nodes.append(result.nodes[0])
        return reply


def _measured(prober: LinkProber, peer: str) -> tuple[float, float, int]:
    """What the probes measured of the link to `peer`: round trip (ms), bandwidth (Gbit/s) and
    the number of probes; zeros before the first."""
    estimate = prober.estimates.get(peer)
    if estimate is None:
        return (0.0, 0.0, 0)
    return (estimate.rtt_ms or 0.0, estimate.bandwidth_gbps or 0.0, estimate.probes)
