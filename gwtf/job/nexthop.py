"""Next hops: the node's outgoing flows turned into a sequence of peers (docs/design.md 2), pure.

The flow says how many microbatches per second go from this node to each next-stage peer
(`FlowDriver.routes()`, in integer flow units). A node turns those rates into next hops by smooth
weighted round-robin (the algorithm of nginx's upstream balancer): every pick adds each peer's
weight to its running credit, takes the peer with the most credit (ties: the smallest id) and
takes the total weight off it. Over any window of `W = sum(weights)` picks each peer is chosen
exactly its weight's number of times, and the picks of different peers are interleaved as evenly
as the weights allow (weights 2:1 give a, b, a, a, b, a, not a, a, b), so the split over any short
window follows the rates, and the same weights always give the same sequence.

Weights come from the flows once they are settled (the swarm ended its scaling), and before
that, or when the flows give this node no way out (its inflow is zero in the flow but a sender
chose it anyway), from the peers' capacities: a sensible split that needs no agreement.

Between two solves a sender does not wait on a straggler (`live_weights`, docs/design.md 2.13):
every receiver tells, in each acknowledgement, the seconds per microbatch it measures now; a
peer that runs slower than the pace its weight was solved for gets its share cut by as much,
so one slow node costs its own share, not the pipeline's, before the flows move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

__all__ = ["LIVE_SLACK", "SmoothRoundRobin", "live_weights", "next_hop_weights"]

CAPACITY_SCALE = 1000
"""Capacity-proportional weights are capacities (microbatches/s) in thousandths, at least 1."""

LIVE_SLACK = 1.2
"""A peer's share is cut only when it runs this much slower than its record says: below that,
measurement noise (tens of percent on a shared machine) would jitter every sender's sequence
for nothing, and the flows' headroom absorbs it."""

LIVE_SCALE = 1000
"""Every weight is scaled by this before the cuts (`live_weights`)."""


def next_hop_weights(
    routes: Mapping[str, int],
    capacities: Mapping[str, float],
    *,
    settled: bool,
) -> tuple[dict[str, int], str]:
    """The weights of the candidates (`capacities`: the live next-stage peers that take part,
    with their capacities) and where they came from: "flows" or "capacity".

    The flows are used when they are settled and send something to a candidate; flows to a
    peer that is not a candidate (it died, or does not take part in the job) are ignored.
    """
    if settled:
        flows = {peer: units for peer, units in routes.items() if units > 0 and peer in capacities}
        if flows:
            return flows, "flows"
    weights = {
        peer: max(1, round(capacity * CAPACITY_SCALE))
        for peer, capacity in capacities.items()
        if capacity > 0
    }
    return weights, "capacity"


def live_weights(
    weights: Mapping[str, int],
    solved_s: Mapping[str, float],
    live_s: Mapping[str, float],
) -> dict[str, int]:
    """`weights` with the share of each peer that runs slower than it was solved for cut by as
    much: `weight * solved / live` where `live > LIVE_SLACK * solved` (`solved_s`: the pace in
    the peer's record, what the flows were solved with; `live_s`: what the peer said last).

    Every weight is scaled by `LIVE_SCALE` first, cut or not: smooth round-robin picks the same
    sequence from weights all scaled alike (every credit scales with them), so a swarm with no
    straggler picks exactly as before, and a cut of a small weight keeps its proportion. A share
    is never raised: a peer faster than its record gets more once its record says so and the
    flows move (gwtf.flow.pace). A cut peer keeps a weight of at least 1: it still gets the odd
    microbatch, and so goes on telling its pace.
    """
    out: dict[str, int] = {}
    for peer, weight in weights.items():
        solved, live = solved_s.get(peer, 0.0), live_s.get(peer, 0.0)
        if weight > 0 and solved > 0 and live > LIVE_SLACK * solved:
            out[peer] = max(1, round(weight * LIVE_SCALE * solved / live))
        else:
            out[peer] = weight * LIVE_SCALE
    return out


class SmoothRoundRobin:
    """Smooth weighted round-robin over weights that may change between picks.

    A peer's credit survives a change of weights (so a small change does not restart the
    sequence); the credit of a peer that leaves the weights is forgotten.

    Ties go to the smallest id, or, for a chooser with an `owner` (a sender: the node whose next
    hops these are), to the peer first in that owner's own order (a hash of both ids). Senders
    with the same weights would otherwise all start at, and go round in, the same order: every
    stage-s node sends its first microbatch of an iteration to the same stage-s+1 node, which
    queues while its peers wait (measured in the simulator: a homogeneous swarm 2.7% slower).
    """

    def __init__(self, owner: str | None = None) -> None:
        self._credit: dict[str, int] = {}
        self._owner = owner
        self._keys: dict[str, tuple[int, str]] = {}

    def _key(self, peer: str) -> tuple[int, str]:
        key = self._keys.get(peer)
        if key is None:
            rank = 0 if self._owner is None else int.from_bytes(hashlib.blake2b(
                f"{self._owner}/{peer}".encode(), digest_size=8).digest(), "big")
            key = self._keys[peer] = (rank, peer)
        return key

    def pick(self, weights: Mapping[str, int], exclude: Collection[str] = ()) -> str | None:
        """The next peer, None when no peer has a positive weight outside `exclude`."""
        for peer in [p for p in self._credit if weights.get(p, 0) <= 0]:
            del self._credit[peer]
            self._keys.pop(peer, None)
        candidates = sorted((p for p, w in weights.items() if w > 0 and p not in exclude),
                            key=self._key)
        if not candidates:
            return None
        total = 0
        for peer in candidates:
            self._credit[peer] = self._credit.get(peer, 0) + weights[peer]
            total += weights[peer]
        best = candidates[0]
        for peer in candidates[1:]:
            if self._credit[peer] > self._credit[best]:
                best = peer
        self._credit[best] -= total
        return best
