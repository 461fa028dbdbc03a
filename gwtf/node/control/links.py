"""Link estimates and the parameters of the arcs a node owns.

Each arc `u -> v` has one owner, its tail `u`: the tail measures the link, computes capacity and
cost with the formulas of `gwtf.flow.topology` (docs/design.md 2) and announces them to the head, so
that both ends run the state machine with the very same integers. Two probes of a link never
agree exactly, so the tail gives the arc new parameters (a new generation, updated in place:
only the flow they no longer allow is re-routed) only when they move materially (`changed`),
never on every probe.

Estimates. The RTT is the minimum of the recent samples, as BBR takes it for a TCP path:
queueing and a busy event loop only ever add to a sample. The bandwidth comes from probe pairs:
an empty echo and then one carrying `n` bytes, back to back, so that both see the same load;
one sample is `n / (t_full - t_empty)`, and the estimate is the median of the recent samples.
Not the maximum: on a machine shared by many processes a stall can hit the empty probe alone,
and the difference then says "terabits"; a median of five shrugs off such a sample either way.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from gwtf.flow.topology import cap_to_units, cost_to_units

__all__ = ["ArcParamsSpec", "LinkEstimate", "arc_params", "changed", "ring_params"]



@dataclass(frozen=True, slots=True)
class ArcParamsSpec:
    """What the tail announces: the measured link and the integers both ends use."""

    cap: int
    cost: int
    rtt_ms: float
    bandwidth_gbps: float


def arc_params(
    tail_compute_s: float,
    head_compute_s: float,
    rtt_ms: float,
    bandwidth_gbps: float,
    activation_bytes: int,
) -> ArcParamsSpec:
    """Capacity and cost units of an arc, exactly as `Topology` computes them for a link of
    `rtt_ms` and `bandwidth_gbps` between nodes of these compute times (a test checks it)."""
    act = activation_bytes
    capacity = bandwidth_gbps * 1e9 / 8 / act
    cost = (tail_compute_s + head_compute_s) / 2 + rtt_ms / 2000 + act * 8 / (bandwidth_gbps * 1e9)
    return ArcParamsSpec(cap_to_units(capacity), cost_to_units(cost), rtt_ms, bandwidth_gbps)


def ring_params(tail_capacity: float, head_capacity: float) -> ArcParamsSpec:
    """A ring return arc (last stage -> data holder): `min` of the two node capacities, as
    `gwtf.flow.relax.bus.node_views` gives it; its cost is set by the state machine (-M)."""
    return ArcParamsSpec(
        min(cap_to_units(tail_capacity), cap_to_units(head_capacity)), 0, 0.0, 0.0
    )


def changed(old: ArcParamsSpec, new: ArcParamsSpec, *, cost_rel: float, cap_rel: float) -> bool:
    """Whether `new` differs from the announced `old` enough to update the arc: its cost by
    more than the fraction `cost_rel`, or its capacity by more than the factor `1 + cap_rel`."""
    if abs(new.cost - old.cost) > cost_rel * max(old.cost, 1):
        return True
    low, high = sorted((max(old.cap, 1), max(new.cap, 1)))
    return high > (1 + cap_rel) * low


class LinkEstimate:
    """Recent probe samples of one link and the estimates drawn from them."""

    def __init__(self, rtt_window: int, bandwidth_window: int) -> None:
        self._rtt: deque[float] = deque(maxlen=rtt_window)
        self._bw: deque[float] = deque(maxlen=bandwidth_window)
        self.probes = 0
        """RTT samples taken in all (the window keeps the last few)."""

    def add_rtt(self, seconds: float) -> None:
        self._rtt.append(seconds)
        self.probes += 1

    def add_transfer(self, nbytes: int, seconds: float, empty_seconds: float) -> bool:
        """A probe pair: `nbytes` answered in `seconds`, an empty probe just before in
        `empty_seconds`. False (and nothing kept) when the pair is meaningless: the full probe
        was not the slower one."""
        extra = seconds - empty_seconds
        if extra <= 0:
            return False
        self._bw.append(nbytes * 8 / extra)
        return True

    @property
    def rtt_s(self) -> float | None:
        return min(self._rtt) if self._rtt else None

    @property
    def rtt_ms(self) -> float | None:
        rtt = self.rtt_s
        return None if rtt is None else rtt * 1000

    @property
    def bandwidth_gbps(self) -> float | None:
        return statistics.median(self._bw) / 1e9 if self._bw else None

    @property
    def samples(self) -> tuple[int, int]:
        return len(self._rtt), len(self._bw)
