"""Stage snapshots and rollbacks (docs/design.md 4.6), pure: which iterations are snapshotted,
who sends a stage's snapshot, and which snapshot a wiped stage is restored from.

A snapshot is a stage's weights and optimizer state at an iteration boundary. Every node keeps
its own stage's state of its latest *periodic* boundary in memory (`periodic`: the job's first
iteration and every multiple of `every`); one replica of each stage (`sends`: the smallest live
id) sends it to a keeper of another stage. A *thin* stage (at most `thin` live replicas) sends
its state after every step as well, so a stage that loses its last replicas at once usually
loses nothing. When it does lose an iteration's state (every replica of a stage that was not
thin dies at once), the keeper's snapshot is older than the iteration in progress: the swarm
rolls back to the stage's periodic snapshot, which every other node can restore from its own
memory (`restore_point`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

__all__ = ["SnapshotPolicy", "restore_point", "snapshot_sender"]


@dataclass(frozen=True)
class SnapshotPolicy:
    """`every`: the periodic snapshots' interval, iterations; `thin`: a stage with at most this
    many live replicas is snapshotted after every step (gwtf.train.job explains the defaults)."""

    every: int
    thin: int
    start: int = 0
    """The job's first iteration (a resumed job's is its checkpoint's)."""

    def periodic(self, iteration: int) -> bool:
        """Is the boundary before `iteration` a periodic snapshot (kept by every node)?"""
        return iteration == self.start or iteration % self.every == 0

    def last_periodic(self, iteration: int) -> int:
        """The latest periodic boundary at or before `iteration`."""
        return max(self.start, iteration - iteration % self.every)

    def is_thin(self, live_replicas: int) -> bool:
        return live_replicas <= self.thin

    def due(self, iteration: int, live_replicas: int) -> bool:
        """Is the state at the start of `iteration` sent to the keeper?"""
        return self.periodic(iteration) or self.is_thin(live_replicas)


def snapshot_sender(
    participants: Mapping[str, int],
    departed: Collection[str],
    stage: int,
    alive: Callable[[str], bool],
) -> tuple[str, int]:
    """(the replica of `stage` that sends its snapshots: the smallest live id, "" if none; how
    many live replicas the stage has). Two replicas that disagree for a moment both send: the
    keeper keeps the newest, no harm done."""
    live = sorted(p for p, s in participants.items()
                  if s == stage and p not in departed and alive(p))
    return (live[0] if live else ""), len(live)


def restore_point(
    policy: SnapshotPolicy, current: int, kept: Collection[int]
) -> int | None:
    """The iteration a wiped stage is restored at, given the iterations of the snapshots its
    keeper holds: the iteration in progress if one is of it (nothing is lost), else the latest
    periodic boundary if one is of it (every other stage holds its own state of that boundary:
    the swarm rolls back to it), else None (the job cannot go on)."""
    if current in kept:
        return current
    boundary = policy.last_periodic(current)
    return boundary if boundary in kept else None
