"""Cost estimates the simulation and its policies share: a typical hop of an activation, and a
stage's ring all-reduce at commit (docs/design.md 5)."""

from __future__ import annotations

import math
import statistics

from gwtf.sim.entities import SimNode
from gwtf.sim.network import Network
from gwtf.sim.scenario import Scenario

__all__ = ["allreduce_s", "hop_estimate"]


def hop_estimate(sc: Scenario) -> float:
    """A typical hop of an activation: the median link, at the median machine's access link
    where nodes have them (a home uplink, not the WAN path, is then what a microbatch waits
    for, and it decides how long memory slots stay taken); a compressed plan's median boundary
    bytes."""
    act = statistics.median(sc.boundary_bytes) if sc.boundary_bytes else sc.activation_bytes
    infos = sc.nodes.values()
    access = min(statistics.median(i.uplink_gbps for i in infos),
                 statistics.median(i.downlink_gbps for i in infos)) if infos else math.inf
    values = [link.rtt_ms / 2000 + act * 8 / (min(link.bandwidth_gbps, access) * 1e9)
              for link in sc.links.values()]
    return statistics.median(values) if values else sc.intra.rtt_ms / 2000


def allreduce_s(sc: Scenario, network: Network, members: list[SimNode]) -> float:
    """Seconds of a ring all-reduce of one stage's gradients among `members`, at the
    slowest ring link's rate (access links included)."""
    n = len(members)
    if n <= 1:
        return 0.0
    nbytes = sc.params_per_stage[members[0].stage] * sc.grad_bytes_per_param
    worst_bw = math.inf
    worst_lat = 0.0
    ring = sorted(members, key=lambda m: (m.location, m.id))
    for a, b in zip(ring, ring[1:] + ring[:1], strict=False):
        link = network.link(a.info, b.info) or sc.intra
        worst_bw = min(worst_bw, network.gbps(a.info, b.info))
        worst_lat = max(worst_lat, link.rtt_ms / 2000)
    return 2 * (n - 1) / n * nbytes * 8 / (worst_bw * 1e9) + 2 * (n - 1) * worst_lat
