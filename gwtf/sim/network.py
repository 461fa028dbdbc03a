"""The simulated network (docs/design.md 5.2): the links between locations, each node's own
access link, and the queues of what is being sent.

Two models of bandwidth, which a scenario chooses (`[nodes] uplink_gbps` / `downlink_gbps`):

- **pair** (no access links given): every pair of nodes has the whole matrix link between their
  locations to itself, as between datacenter machines whose NICs are far faster than the WAN
  path. A node sending to three peers at once sends at three full link rates.
- **access** (access links given): a node's sends also share its uplink, and what it receives
  shares its downlink, as on a home connection. A send from a to b moves at
  `min(pair link, a's uplink, b's downlink)` and waits for what a already queued on its uplink
  and b on its downlink (first come, first served, which gives each node the same total rate as
  fair sharing would).

Latency is the pair link's one-way delay (RTT / 2) in both models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gwtf.flow.topology import LinkSpec
from gwtf.sim.scenario import NodeInfo

__all__ = ["Network", "two_phase_commit_s"]


class Network:
    """Links of the scenario, changed by the trace's link rows, and the send queues."""

    def __init__(self, links: Mapping[frozenset[str], LinkSpec], intra: LinkSpec) -> None:
        self.links: dict[frozenset[str], LinkSpec] = dict(links)
        self.intra = intra
        self._pipe: dict[tuple[str, str], float] = {}
        self._up: dict[str, float] = {}
        self._down: dict[str, float] = {}

    def link(self, a: NodeInfo, b: NodeInfo) -> LinkSpec | None:
        """The location link between `a` and `b` (None: no route between their locations)."""
        if a.location == b.location:
            return self.intra
        return self.links.get(frozenset((a.location, b.location)))

    def gbps(self, a: NodeInfo, b: NodeInfo) -> float:
        """The rate of one send from `a` to `b` alone on their links, Gbit/s."""
        link = self.link(a, b) or self.intra
        return min(link.bandwidth_gbps, a.uplink_gbps, b.downlink_gbps)

    def one_way(self, a: NodeInfo, b: NodeInfo, nbytes: float) -> float:
        """Seconds for `nbytes` from `a` to `b` on idle links."""
        link = self.link(a, b) or self.intra
        return link.rtt_ms / 2000 + nbytes * 8 / (self.gbps(a, b) * 1e9)

    def transfer(self, now: float, a: NodeInfo, b: NodeInfo, nbytes: float) -> float:
        """Arrival time of `nbytes` sent at `now` from `a` to `b`, behind the pair's earlier
        sends and, where the nodes have access links, behind `a`'s uplink and `b`'s downlink
        queues."""
        link = self.link(a, b) or self.intra
        key = (a.id, b.id)
        start = max(now, self._pipe.get(key, 0.0))
        shared_up = math.isfinite(a.uplink_gbps)
        shared_down = math.isfinite(b.downlink_gbps)
        if shared_up:
            start = max(start, self._up.get(a.id, 0.0))
        if shared_down:
            start = max(start, self._down.get(b.id, 0.0))
        end = start + nbytes * 8 / (min(link.bandwidth_gbps, a.uplink_gbps,
                                        b.downlink_gbps) * 1e9)
        self._pipe[key] = end
        if shared_up:
            self._up[a.id] = end
        if shared_down:
            self._down[b.id] = end
        return end + link.rtt_ms / 2000


def two_phase_commit_s(
    network: Network,
    coordinator: NodeInfo,
    holders: Sequence[NodeInfo],
    stages: Sequence[Sequence[NodeInfo]],
    sum_bytes: Sequence[float],
    message_bytes: float,
) -> float:
    """Seconds from the last microbatch finishing at a holder to every holder injecting again,
    by the node's commit (docs/design.md 3.7): the holders' reports reach the `coordinator`;
    its commit order reaches every member; the replicas of each stage exchange their gradient
    sums (`sum_bytes[s]` each); their `prepared` reports reach the coordinator; its step order
    reaches every member. Five one-way legs, each as long as its slowest message, on idle links.
    """
    members = [m for stage in stages for m in stage]

    def out(nbytes: float) -> float:
        return max((network.one_way(coordinator, m, nbytes) for m in members), default=0.0)

    def back(senders: Sequence[NodeInfo]) -> float:
        return max((network.one_way(m, coordinator, message_bytes) for m in senders), default=0.0)

    def exchange(stage: Sequence[NodeInfo], nbytes: float) -> float:
        """Every replica sends its sum to every other one at once: in parallel on pair links,
        one after the other through a shared uplink (the access model)."""
        slowest = 0.0
        for a in stage:
            peers = [b for b in stage if b.id != a.id]
            if not peers:
                continue
            latency = max((network.link(a, b) or network.intra).rtt_ms / 2000 for b in peers)
            sends = [nbytes * 8 / (network.gbps(a, b) * 1e9) for b in peers]
            serial = sum(sends) if math.isfinite(a.uplink_gbps) else max(sends)
            slowest = max(slowest, latency + serial)
        return slowest

    sums = max((exchange(stage, sum_bytes[s]) for s, stage in enumerate(stages)), default=0.0)
    return back(holders) + out(message_bytes) + sums + back(members) + out(message_bytes)
