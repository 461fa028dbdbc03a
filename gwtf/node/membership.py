"""Who is in the swarm, and who has died: the member table and its failure detector (pure).

Membership is gossip-style (van Renesse, Minsky and Hayden, "A gossip-style failure detection
service", Middleware 1998): every member increments its own heartbeat counter every period and
pushes its table to a few peers, who answer with theirs (push-pull). Heartbeats therefore reach
everyone in about log(n) periods, and each node sends O(fanout) calls per period whatever the
size of the swarm (the table grows with it, the call rate does not).

An entry is one incarnation (`epoch`) of one node id. Merge rules, so that any order of gossip
gives the same table: a larger epoch replaces a smaller one (the old incarnation is gone); within
an epoch DEAD and LEFT are final and win over ALIVE, and the larger heartbeat wins.

Failure detector, two pieces of evidence:
- silence: no heartbeat progress for `failure_timeout_s` declares a member dead;
- a refused call: after half the timeout of silence the node calls the member directly (a
  push-pull gossip); if the connection is refused (UNAVAILABLE: no process listens there), the
  member is declared dead at once. A call that merely times out proves nothing (a slow link, a
  loaded machine) and the full timeout applies.
Silence is counted only while this node was listening. When its own checks come late (its process
was starved of CPU or paused: a loaded or sleeping machine), the time it was away is not held
against the others: their last progress moves forward by as much. Without this, a machine that
stalls for longer than the timeout wakes up and declares every member dead at once (seen when
every process on a 2-core machine stalled for 3 s), and the swarm loses all its jobs' state to
false suspicions. A member that really died in the stall is declared that much later.
A verdict is gossiped like any entry, so every member learns it within a few periods of the first
one. A member that hears of its own death (a false suspicion) comes back as a new incarnation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np

__all__ = ["MemberEvent", "MemberInfo", "Membership", "State"]


class State(IntEnum):
    """Same numbers as the wire's MemberState."""

    ALIVE = 1
    DEAD = 2
    LEFT = 3


@dataclass(frozen=True, slots=True)
class MemberInfo:
    id: str
    address: str
    stage: int
    location: str
    compute_s: float
    capacity: float
    epoch: int
    heartbeat: int = 0
    state: State = State.ALIVE

    @property
    def alive(self) -> bool:
        return self.state == State.ALIVE


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """`kind` is "alive" (a new incarnation is known), "dead" or "left"."""

    kind: str
    member: MemberInfo
    reason: str = ""


class _Entry:
    __slots__ = ("info", "progress_at", "departed_at", "pinged_at")

    def __init__(self, info: MemberInfo, now: float) -> None:
        self.info = info
        self.progress_at = now
        self.departed_at: float | None = None if info.alive else now
        self.pinged_at: float | None = None


class Membership:
    """The member table of one node; `clock` gives seconds."""

    def __init__(
        self,
        me: MemberInfo,
        clock: Callable[[], float],
        *,
        failure_timeout_s: float,
        ping_interval_s: float,
        tombstone_s: float,
        rng: np.random.Generator,
    ) -> None:
        self._me = me
        self._clock = clock
        self.failure_timeout_s = failure_timeout_s
        self.ping_interval_s = ping_interval_s
        self.tombstone_s = tombstone_s
        self._rng = rng
        self._entries: dict[str, _Entry] = {}
        self._cycle: list[str] = []
        self._checked_at = clock()  # listening from now: a stall before the first check counts too
        self.declared_dead = False
        """Set when gossip says this incarnation is dead: it must come back as a new one."""

    # ------------------------------------------------------------------ self

    @property
    def me(self) -> MemberInfo:
        return self._me

    def beat(self) -> None:
        """One heartbeat period has passed: progress others can see."""
        self._me = replace(self._me, heartbeat=self._me.heartbeat + 1)

    def reincarnate(self, epoch: int) -> None:
        """Come back as a new incarnation (after a false suspicion)."""
        if epoch <= self._me.epoch:
            raise ValueError("a new incarnation needs a larger epoch")
        self._me = replace(self._me, epoch=epoch, heartbeat=0, state=State.ALIVE)
        self.declared_dead = False

    # ------------------------------------------------------------------ queries

    def get(self, node_id: str) -> MemberInfo | None:
        if node_id == self._me.id:
            return self._me
        entry = self._entries.get(node_id)
        return entry.info if entry is not None else None

    def alive(self) -> list[MemberInfo]:
        """Live members other than this node, by id."""
        return [e.info for _, e in sorted(self._entries.items()) if e.info.alive]

    def departed(self) -> list[MemberInfo]:
        return [e.info for _, e in sorted(self._entries.items()) if not e.info.alive]

    def is_alive(self, node_id: str, epoch: int) -> bool:
        info = self.get(node_id)
        return info is not None and info.alive and info.epoch == epoch

    def silence(self, node_id: str) -> float | None:
        entry = self._entries.get(node_id)
        return None if entry is None else self._clock() - entry.progress_at

    def view_hash(self) -> int:
        """A 64-bit digest of the live incarnations (this node included): two members with the
        same hash see the same swarm."""
        items = sorted((m.id, m.epoch) for m in (self._me, *self.alive()))
        text = "\n".join(f"{i} {e}" for i, e in items).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")

    def digest(self) -> list[MemberInfo]:
        """What to gossip: this node, the members heard from recently, and the departed.

        A member silent for half the timeout is left out, so that a crashed node's last entry
        stops spreading and cannot be believed again after its tombstone is forgotten."""
        now = self._clock()
        fresh = self.failure_timeout_s / 2
        out = [self._me]
        for _, entry in sorted(self._entries.items()):
            if not entry.info.alive or now - entry.progress_at < fresh:
                out.append(entry.info)
        return out

    def targets(self, count: int) -> list[MemberInfo]:
        """The next `count` gossip partners: round-robin over a shuffled list of the live
        members, reshuffled every round, so that every member is reached every n/count periods
        and none is picked twice in a row by chance."""
        live = {m.id: m for m in self.alive()}
        out: list[MemberInfo] = []
        while len(out) < min(count, len(live)):
            if not self._cycle:
                ids = sorted(live)
                order = [ids[i] for i in self._rng.permutation(len(ids)).tolist()]
                taken = {m.id for m in out}
                # Those already picked this time go last (the list is popped from its end).
                self._cycle = [i for i in order if i in taken] + [
                    i for i in order if i not in taken
                ]
            node_id = self._cycle.pop()
            if node_id in live and all(m.id != node_id for m in out):
                out.append(live[node_id])
        return out

    # ------------------------------------------------------------------ updates

    def merge(self, infos: Iterable[MemberInfo]) -> list[MemberEvent]:
        """Merge entries from gossip or a join; the events say what changed."""
        now = self._clock()
        events: list[MemberEvent] = []
        for info in infos:
            if info.id == self._me.id:
                if info.epoch == self._me.epoch and not info.alive:
                    self.declared_dead = True
                continue
            entry = self._entries.get(info.id)
            if entry is None:
                self._entries[info.id] = _Entry(info, now)
                if info.alive:
                    events.append(MemberEvent("alive", info, "joined"))
                continue
            old = entry.info
            if info.epoch < old.epoch:
                continue
            if info.epoch > old.epoch:
                if old.alive:
                    events.append(MemberEvent("dead", old, "replaced by a new incarnation"))
                self._entries[info.id] = _Entry(info, now)
                if info.alive:
                    events.append(MemberEvent("alive", info, "new incarnation"))
                continue
            if not old.alive:
                continue  # dead and left are final within an epoch
            if not info.alive:
                entry.info = replace(old, state=info.state)
                entry.departed_at = now
                kind = "left" if info.state == State.LEFT else "dead"
                events.append(MemberEvent(kind, entry.info, "reported by gossip"))
            elif info.heartbeat > old.heartbeat:
                entry.info = replace(old, heartbeat=info.heartbeat)
                entry.progress_at = now
                entry.pinged_at = None
        return events

    def leave(self, node_id: str, epoch: int) -> list[MemberEvent]:
        """`node_id` said goodbye."""
        entry = self._entries.get(node_id)
        if entry is None or entry.info.epoch != epoch or not entry.info.alive:
            return []
        entry.info = replace(entry.info, state=State.LEFT)
        entry.departed_at = self._clock()
        return [MemberEvent("left", entry.info, "said goodbye")]

    def check(self) -> tuple[list[MemberEvent], list[MemberInfo]]:
        """Apply the timeout: the members now declared dead, and the silent ones to call
        directly (half the timeout without progress, at most once per ping interval)."""
        now = self._clock()
        # Checks come every ping interval; beyond a second one, this node was not listening.
        away = now - self._checked_at - self.ping_interval_s
        if away > self.ping_interval_s:
            for entry in self._entries.values():
                entry.progress_at = min(now, entry.progress_at + away)
        self._checked_at = now
        events: list[MemberEvent] = []
        to_ping: list[MemberInfo] = []
        for node_id, entry in sorted(self._entries.items()):
            info = entry.info
            if not info.alive:
                if entry.departed_at is not None and now - entry.departed_at > self.tombstone_s:
                    del self._entries[node_id]
                continue
            silence = now - entry.progress_at
            if silence >= self.failure_timeout_s:
                events.append(self._declare(entry, f"no heartbeat for {silence:.2f} s"))
            elif silence >= self.failure_timeout_s / 2 and (
                entry.pinged_at is None or now - entry.pinged_at >= self.ping_interval_s
            ):
                entry.pinged_at = now
                to_ping.append(info)
        return events, to_ping

    def refused(self, node_id: str, epoch: int) -> list[MemberEvent]:
        """A direct call to `node_id` was refused. Declares it dead when it has also been
        silent for half the timeout (both pieces of evidence); otherwise changes nothing."""
        entry = self._entries.get(node_id)
        if entry is None or not entry.info.alive or entry.info.epoch != epoch:
            return []
        silence = self._clock() - entry.progress_at
        if silence < self.failure_timeout_s / 2:
            return []
        return [self._declare(entry, f"silent for {silence:.2f} s and refused a call")]

    def _declare(self, entry: _Entry, reason: str) -> MemberEvent:
        entry.info = replace(entry.info, state=State.DEAD)
        entry.departed_at = self._clock()
        return MemberEvent("dead", entry.info, reason)
