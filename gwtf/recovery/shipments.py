"""Bounded replay (docs/design.md 4.9): when a node ships its partial gradient sum, and to whom.

Rule 3 replays every microbatch whose gradient a dead node had accumulated, up to the whole
iteration's share of a thin stage. To bound that, a node of stage `s` ships the *running* sum of
its gradient (everything it accumulated in the iteration, adopted sums included) to one live
peer of stage `s`, its keeper, whenever `replay_bound` microbatches are not covered by its last
shipment (`ship_due`). A crash then costs at most `replay_bound` microbatches of replay, plus
those accumulated while a shipment was on the wire.

Why the running sum and not the sum since the last shipment: each shipment is the same size (one
gradient tensor of the stage) either way, but a running sum replaces the last one, so a keeper
holds one tensor per sender, a sender whose keeper dies is whole again after one shipment to a
new keeper, and no chain of deltas must all survive.

A stage with a single live node has no peer: nothing is shipped (`pick_keeper` returns None) and
rule 3 applies in full, as before. `replay_bound = 0` turns shipping off.

**The adaptive bound** (`REPLAY_AUTO`, the default; `ship_interval`). A shipment is a
checkpoint of the node's part of the iteration, and choosing how often to take one is Young's
checkpoint-interval problem (J. W. Young, "A first order approximation to the optimum checkpoint
interval", CACM 17(9), 1974). Shipping every `k` microbatches costs, per second, `r / k`
shipments of `delta` seconds each, where `r` is the node's microbatch rate and `delta` the time
a shipment holds up the node's own data plane: its upload time (`bytes / rate` of the path to
the keeper) times the share of that time the sender's uplink and the keeper's downlink would
otherwise carry activations and gradients (`contention`, 0 where the path is the sender's and
keeper's alone). A death, at rate `h` per second, replays on average `k / 2` microbatches of
`c` seconds each (the stage's compute and the resend of the microbatch's inputs). The total
`r delta / k + h k c / 2` is least at

    k* = sqrt(2 r delta / (h c)),

so the node ships once `k*` microbatches are uncovered. On a link-bound node with a low hazard
`k*` exceeds what the node accumulates in an iteration and it never ships; where the path to the
keeper carries nothing else (`delta = 0`) it ships as soon as the last shipment has landed.
`h` comes from the deaths the node has seen in the swarm (`HazardEstimate`).

Pure: no I/O, no clock; the caller sends, the ledger records (`Ledger.shipped`, `Ledger.kept`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gwtf.recovery.ledger import Ledger, MicrobatchId

__all__ = [
    "DEFAULT_REPLAY_BOUND", "REPLAY_AUTO", "HazardEstimate", "ShipCost", "best_cover",
    "RECHECK", "pick_keeper", "recheck_at", "replay_bound", "ship_due", "ship_interval",
]

REPLAY_AUTO = -1
"""`replay_bound` value for the adaptive bound (`ship_interval`)."""

DEFAULT_REPLAY_BOUND = REPLAY_AUTO
"""The bound when a scenario does not say (0: off, N: every N microbatches). Adaptive: a fixed
bound chosen on swarms whose links are their own (16) made home swarms, where a 300 MB sum
queues ahead of the activations on a 20-100 Mbit/s uplink, 2x slower (docs/design.md 4.9)."""

RECHECK = 4
"""Microbatches after which a node that decided not to ship yet evaluates the rule again, so
that deaths and rates seen within an iteration count (`recheck_at`)."""

PRIOR_DEATHS = 1.0
PRIOR_EXPOSURE_S = 86_400.0
"""Before any death is seen, `HazardEstimate` assumes one death per day of node time: a low
hazard (a day is well beyond every churn trace in simulations/ and the shortest spot-instance
lifetimes of the Bamboo trace), so a node ships on evidence of churn, not on the prior; one
death is weight enough for the evidence to take over within the first deaths."""


def replay_bound(value: int | str, robust: bool = False) -> int:
    """A job's `replay_bound` key as this module reads it: N, 0 (off) or `REPLAY_AUTO` for
    "auto". Off for a robust aggregation: its screen judges each replica's own vector, which an
    adopted sum would change (docs/design.md 4.7 and 4.9)."""
    if robust:
        return 0
    return REPLAY_AUTO if value == "auto" else int(value)


def ship_due(ledger: Ledger, bound: float) -> bool:
    """Should the node of `ledger` ship its running sum now? `bound`: microbatches between
    shipments (fixed, or `ship_interval`'s; <= 0: never)."""
    return bound > 0 and ledger.unshipped() >= bound


def recheck_at(interval: float, unshipped: int) -> float:
    """How many unshipped contributions a node that chose not to ship at `unshipped` (with
    `ship_interval`'s `interval`) waits for before it asks again: the interval, and at most
    `RECHECK` more microbatches (inf when it would never ship and nothing changes)."""
    due = math.ceil(interval) if math.isfinite(interval) else math.inf
    return min(due, unshipped + RECHECK)


@dataclass(frozen=True)
class ShipCost:
    """What `ship_interval` weighs, as the sender estimates it."""

    upload_s: float
    """Seconds the running sum takes on the path to the keeper."""
    contention: float
    """Share of that time the sender's uplink and the keeper's downlink carry data-plane sends
    (activations, gradients) that the shipment would delay: 0 to 2 (one per end)."""
    rate: float
    """Microbatches per second the sender accumulates."""
    replay_s: float
    """Seconds one replayed microbatch costs: the stage's compute and the resend of its
    inputs."""
    hazard: float
    """Deaths per second of the sender."""
    copy_s: float = 0.0
    """Seconds the sender's compute thread spends copying its sum into one vector to send: a
    delay to its data plane whatever the link (the node measures it; the simulator, whose
    nodes' compute is their stage work only, leaves it at 0)."""


def ship_interval(cost: ShipCost) -> float:
    """Microbatches between shipments that cost least (Young's interval, module doc): at
    least 1; `math.inf` (never) when the node is never expected to die or a replay costs
    nothing."""
    if cost.hazard <= 0 or cost.replay_s <= 0 or cost.rate <= 0:
        return math.inf
    delay = cost.upload_s * cost.contention + cost.copy_s
    return max(1.0, math.sqrt(2 * cost.rate * delay / (cost.hazard * cost.replay_s)))


class HazardEstimate:
    """Deaths per node-second in a swarm, from what was seen: `(deaths + PRIOR_DEATHS) /
    (node-seconds + PRIOR_EXPOSURE_S)`. The caller reports how many nodes are in the job
    whenever that changes (`census`) and each death it notices (`death`); time is the
    caller's clock (`now` arguments), never read here."""

    __slots__ = ("deaths", "_exposure_s", "_count", "_since")

    def __init__(self) -> None:
        self.deaths = 0
        self._exposure_s = 0.0
        self._count = 0
        self._since = 0.0

    def census(self, now: float, count: int) -> None:
        """From `now` on, `count` nodes are in the job."""
        self._exposure_s += self._count * max(0.0, now - self._since)
        self._count = count
        self._since = max(self._since, now)

    def death(self) -> None:
        self.deaths += 1

    def exposure_s(self, now: float) -> float:
        return self._exposure_s + self._count * max(0.0, now - self._since)

    def rate(self, now: float) -> float:
        """Deaths per second of one node."""
        return (self.deaths + PRIOR_DEATHS) / (self.exposure_s(now) + PRIOR_EXPOSURE_S)


def pick_keeper(
    sender: str, peers: Mapping[str, float], current: str | None = None
) -> str | None:
    """The stage peer that keeps `sender`'s sums: `current` while it is still a live peer (a
    switch would leave the old keeper holding a stale sum for nothing), else the peer with the
    highest score (the caller's: e.g. bandwidth from the sender), ties by the smaller id. None
    when the stage has no other live node. `peers`: live stage peers and their scores."""
    candidates = {p: score for p, score in peers.items() if p != sender}
    if current is not None and current in candidates:
        return current
    if not candidates:
        return None
    return min(candidates, key=lambda p: (-candidates[p], p))


def best_cover(
    dead: str, keepers: Mapping[str, frozenset[MicrobatchId]]
) -> tuple[str | None, frozenset[MicrobatchId]]:
    """Which live keeper's sum for `dead` to use: the one covering most microbatches (ties by
    the smaller id). `keepers`: each live stage peer of `dead` and what it holds for it (empty
    when nothing). Returns `(None, frozenset())` when nobody holds anything."""
    held = {k: mbs for k, mbs in keepers.items() if mbs and k != dead}
    if not held:
        return None, frozenset()
    keeper = min(held, key=lambda k: (-len(held[k]), k))
    return keeper, held[keeper]
