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

Pure: no I/O, no clock; the caller sends, the ledger records (`Ledger.shipped`, `Ledger.kept`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gwtf.recovery.ledger import Ledger, MicrobatchId

__all__ = ["DEFAULT_REPLAY_BOUND", "best_cover", "pick_keeper", "ship_due"]

DEFAULT_REPLAY_BOUND = 16
"""Microbatches between shipments when a scenario does not say (0: off). Chosen on the measured
trade-off (docs/design.md 4.9): the replay it saves hardly changes from 1 to 16, the bytes halve
with every doubling."""


def ship_due(ledger: Ledger, bound: int) -> bool:
    """Should the node of `ledger` ship its running sum now? (`bound` <= 0: never.)"""
    return bound > 0 and ledger.unshipped() >= bound


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
