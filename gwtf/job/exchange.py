"""Which exchange a stage's commit uses (docs/design.md 3.7), pure, so that the node
(gwtf.node.worker.commit) and the simulator (gwtf.sim.recovery.recovering) decide alike.

Each of the `r` replicas of a stage holds a sum of `S` bytes. Two exchanges give every replica
the stage's whole sum, bit for bit the same (`combine_contributions` and `combine_summed` add in
node-id order, elementwise):

- `WHOLE`, all to all: every replica sends its whole sum to every peer. One leg; `(r - 1) S` out
  per replica.
- `SLICES`, reduce-scatter then all-gather (gwtf.job.slicing): two legs, each `(r - 1) S / r`
  out per replica.

A leg costs, per sender `a`, the slowest one-way latency to its peers plus the longer of its
sends and its receives: its sends go in parallel over pair links, or one after the other through
a shared uplink when `a` has one (`uplink`), and its receives through a shared downlink
likewise; a leg ends with its slowest sender (the simulator's `leg_s` charges the same). So
`WHOLE` is cheaper on a first attempt whenever the latency it saves exceeds the bytes it adds:
always at `r <= 2` (the same bytes, one leg fewer), and for small sums on long links (a 400 KB
sum on inter-region links, 34-72 ms one way), while `SLICES` is for large sums on slow links
(600 MB on 20 Mbit/s home uplinks: 400 s against 1,000 s).

A rerun changes the sums: after a death the reduce-scatter and all-gather move only what the
earlier attempts did not deliver (a stage without a death sends headers only, `2 L`), while an
all-to-all attempt keeps nothing and sends every sum again (`L + X`: `L` the leg's headers
alone, `X` what its bytes add). So `choose` takes `WHOLE` only where it is *latency-bound*,
`X <= L` (and cheaper on a first attempt, which that implies for `r >= 2`): then no attempt of
it costs more than the `2 L` every attempt by slices pays. At `r = 2` on home uplinks (600 MB,
`X` of minutes) that keeps `SLICES`, whose reruns are cheap. `SLICES` on a tie, and wherever a
link between two replicas is unknown (a node without a link matrix): it never moves more
bytes. Every replica of a stage must choose the same (each waits
for the kind it chose), so the inputs are what they all know alike: the sum's size, the
attempt's members (from the commit order) and the link matrix's link between their locations,
the same matrix and locations the local routing of 2.12 already relies on. Robust aggregations
always take `WHOLE` (their screen needs whole vectors).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

__all__ = ["SLICES", "WHOLE", "Link", "choose", "exchange_s"]

WHOLE = "whole"
SLICES = "slices"

Link = tuple[float, float]
"""A pair link: one-way latency in seconds, bandwidth in Gbit/s."""

LinkOf = Callable[[str, str], "Link | None"]


def exchange_s(
    kind: str, sum_bytes: float, members: Sequence[str], link: LinkOf,
    uplink_gbps: Mapping[str, float] | None = None,
    downlink_gbps: Mapping[str, float] | None = None,
) -> float:
    """Estimated seconds of a first attempt's exchange of `kind` among `members`, each holding
    a sum of `sum_bytes`, on idle links (inf where a link is unknown)."""
    r = len(members)
    if r <= 1:
        return 0.0
    if kind == WHOLE:
        return _leg_s(sum_bytes, members, link, uplink_gbps, downlink_gbps)
    if kind == SLICES:
        return 2 * _leg_s(sum_bytes / r, members, link, uplink_gbps, downlink_gbps)
    raise ValueError(f"no exchange {kind!r}: {WHOLE!r} or {SLICES!r}")


def choose(
    sum_bytes: float, members: Sequence[str], link: LinkOf,
    uplink_gbps: Mapping[str, float] | None = None,
    downlink_gbps: Mapping[str, float] | None = None, robust: bool = False,
) -> str:
    """The exchange of a stage whose `members` (any order) each hold `sum_bytes` (module
    docstring)."""
    if sum_bytes < 0:
        raise ValueError(f"a sum of {sum_bytes} bytes")
    if robust or len(members) <= 1:
        return WHOLE
    order = sorted(members)
    whole = exchange_s(WHOLE, sum_bytes, order, link, uplink_gbps, downlink_gbps)
    slices = exchange_s(SLICES, sum_bytes, order, link, uplink_gbps, downlink_gbps)
    latency = exchange_s(WHOLE, 0.0, order, link, uplink_gbps, downlink_gbps)
    latency_bound = whole <= 2 * latency
    return WHOLE if whole < slices and latency_bound else SLICES


def _leg_s(
    nbytes: float, members: Sequence[str], link: LinkOf,
    uplink_gbps: Mapping[str, float] | None, downlink_gbps: Mapping[str, float] | None,
) -> float:
    """One leg in which every member sends `nbytes` to every other one."""
    up_of = uplink_gbps or {}
    down_of = downlink_gbps or {}
    slowest = 0.0
    for a in members:
        latency = 0.0
        sends: list[float] = []
        for b in members:
            if b == a:
                continue
            pair = link(a, b)
            if pair is None:
                return math.inf
            one_way, gbps = pair
            rate = min(gbps, up_of.get(a, math.inf), down_of.get(b, math.inf))
            latency = max(latency, one_way)
            sends.append(nbytes * 8 / (rate * 1e9))
        up = sum(sends) if math.isfinite(up_of.get(a, math.inf)) else max(sends)
        down = 0.0
        if math.isfinite(down_of.get(a, math.inf)):
            down = (len(members) - 1) * nbytes * 8 / (down_of[a] * 1e9)
        slowest = max(slowest, latency + max(up, down))
    return slowest
