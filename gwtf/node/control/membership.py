"""Who is in the swarm, and who has died: the member table and its failure detector (pure).

Membership is gossip-style (van Renesse, Minsky and Hayden, "A gossip-style failure detection
service", Middleware 1998), with the dissemination of SWIM (Das, Gupta and Motivala, DSN 2002):
every member increments its own heartbeat counter every period and push-pulls with a few peers,
but a message carries a bounded list of entries, never the whole table (docs/design.md 3.4):
- the sender's own entry (its heartbeat: direct evidence that it lives);
- the recent changes (a new member or incarnation, a verdict), each sent about
  `RETRANSMIT * log2(n)` times, newest first, so that it reaches everyone in O(log n) periods;
- to a ring neighbour it watches, the fresh entries of the others it watches (their heartbeats).
A node's bytes per period are then O(calls x list), whatever the size of the swarm. Each message
also carries a digest of the live incarnations; when two nodes' digests differ and neither is
spreading a change (a change that did not reach someone), the receiver answers with its whole
table (anti-entropy), so every node still learns every member.

Watching: a node times out only the `watch` members next to it on a ring ordered by a hash of the
ids (half after it, half before it; everyone when the swarm is that small), and calls two of
them every period. The relation is symmetric, so a watched member is heard from directly (and
through the neighbours they share) every period or two, and every member has `watch` watchers.
The others' deaths reach this node as gossiped verdicts. A member newly watched (the ring
changed) is counted as heard from when the watching starts.

An entry is one incarnation (`epoch`) of one node id. Merge rules, so that any order of gossip
gives the same table: a larger epoch replaces a smaller one (the old incarnation is gone); within
an epoch DEAD and LEFT are final and win over ALIVE, and the larger heartbeat wins.

Failure detector, two pieces of evidence, for the watched members:
- silence: no heartbeat progress for `failure_timeout_s` declares a member dead;
- a refused call: after half the timeout of silence the node calls the member directly (a
  push-pull gossip); if the connection is refused (UNAVAILABLE: no process listens there), the
  member is declared dead at once. A call that merely times out proves nothing (a slow link, a
  loaded machine) and the full timeout applies. For a member it does not watch, a node has no
  measure of silence: two refused calls in different periods (the second one its own) declare.
Silence is counted only while this node was listening. When its own checks come late (its process
was starved of CPU or paused: a loaded or sleeping machine), the time it was away is not held
against the others: their last progress moves forward by as much. Without this, a machine that
stalls for longer than the timeout wakes up and declares every member dead at once (seen when
every process on a 2-core machine stalled for 3 s), and the swarm loses all its jobs' state to
false suspicions. A member that really died in the stall is declared that much later.
A verdict is gossiped as a recent change, so every member learns it within a few periods of the
first one. A member that hears of its own death (a false suspicion) comes back as a new
incarnation.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import IntEnum

import numpy as np

from gwtf.flow.compression import uplink_capacity
from gwtf.flow.linkreports import LinkReport
from gwtf.flow.topology import access_capacity

__all__ = [
    "Gossip",
    "MemberEvent",
    "MemberInfo",
    "Membership",
    "State",
    "member_capacity",
    "own_share_gbps",
    "relay_share_gbps",
]


def member_capacity(
    compute_s: float, stage: int, uplink_gbps: float, num_stages: int, activation_bytes: int,
    boundary_bytes: tuple[int, ...] | None = None, relay_gbps: float = 0.0,
) -> float:
    """A member's capacity in microbatches/s: its compute, and the uplink its operator declared
    (`--uplink-mbps`; 0: not said, no bound), which every microbatch crosses once per
    neighbouring stage (gwtf.flow.topology.access_capacity, as the simulator's), with the bytes
    of a job's compression plan where one holds (`boundary_bytes`, docs/design.md 2.15). A
    relayed member is also bound by its share of its relay's uplink (`relay_gbps`, from
    `relay_share_gbps`; 0: none), which carries what comes to it: the activation from the stage
    above and the gradient from the stage below, the same boundaries' bytes (3.11)."""

    def access(gbps: float) -> float:
        if gbps <= 0:
            return math.inf
        if boundary_bytes is not None:
            return uplink_capacity(gbps, stage, boundary_bytes)
        return access_capacity(gbps, stage, num_stages, activation_bytes)

    return min(1.0 / compute_s, access(uplink_gbps), access(relay_gbps))


def own_share_gbps(me: MemberInfo, others: Iterable[MemberInfo]) -> float:
    """The share of its own declared uplink a member counts on for its own traffic while it
    relays for others (docs/design.md 3.11): an even share with each member it relays, whose
    inbound traffic that uplink carries too (`relay_share_gbps` is theirs); all of it when it
    relays for none."""
    relayed = sum(1 for m in others if m.relay == me.id)
    return me.uplink_gbps / (1 + relayed) if me.uplink_gbps > 0 else me.uplink_gbps


def relay_share_gbps(me: MemberInfo, others: Iterable[MemberInfo]) -> float:
    """The share of its relay's declared uplink a relayed member can count on (0: not relayed,
    or the relay declared no uplink): an even share between the relay's own traffic and each
    member it relays, as their records say now. An estimate: the relay's own traffic and the
    others' take what the flows give them, not an even share."""
    if not me.relay:
        return 0.0
    others = list(others)
    relay = next((m for m in others if m.id == me.relay), None)
    if relay is None or relay.uplink_gbps <= 0:
        return 0.0
    carried = 1 + sum(1 for m in others if m.relay == me.relay and m.id != me.id)
    return relay.uplink_gbps / (carried + 1)


WATCH = 6
"""Members each node watches (times out): enough that a member is still watched when several of
its watchers die with it, few enough that their heartbeats fit in every message to one of them."""

WATCH_CALLS = 2
"""Watched members called per period, round-robin: each is then heard from directly every
`WATCH / (2 * WATCH_CALLS)` periods (both ends call), well inside half the failure timeout."""

PIGGYBACK = 8
"""Most recent changes in one message: bounds its size whatever happens in the swarm."""

RETRANSMIT = 3
"""A change is sent `RETRANSMIT * log2(n + 2)` times by each node that learns it (SWIM's lambda):
enough that every member hears it with high probability; anti-entropy catches the rest."""


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
    links: tuple[LinkReport, ...] = ()
    """Links this member measured to other sites, where they differ from what routing would
    otherwise take (gwtf.flow.linkreports, docs/design.md 2.12)."""
    blocked: tuple[str, ...] = ()
    """Next-stage members this member cannot reach although they live: blocked arcs."""
    revision: int = 0
    """Bumped by the member whenever its links, blocked arcs or pace change, within an epoch."""
    movable: bool = False
    """The job coordinator may move it to another stage (docs/design.md 2.11): it chose its
    stage and moves are not turned off. A pinned node (or one that does not say) never moves."""
    uplink_gbps: float = 0.0
    """Its access uplink as its operator declared it (0: not said): its stage's snapshots go out
    from the replica with the fastest (`gwtf.job.snapshots.snapshot_sender`)."""
    relay: str = ""
    """The member that relays calls to it (it cannot be dialled at its own address; `address`
    is then a port of the relay's, docs/design.md 3.11); empty: dialled directly."""

    @property
    def alive(self) -> bool:
        return self.state == State.ALIVE


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """`kind` is "alive" (a new incarnation is known), "links" (a member's measured links,
    blocked arcs or pace changed), "dead" or "left"."""

    kind: str
    member: MemberInfo
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Gossip:
    """One gossip message either way: the entries, the sender's digest (`view_hash`) and
    whether the sender is still spreading changes."""

    members: tuple[MemberInfo, ...]
    view: int
    spreading: bool


class _Entry:
    __slots__ = ("info", "progress_at", "departed_at", "pinged_at", "doubted_at")

    def __init__(self, info: MemberInfo, now: float) -> None:
        self.info = info
        self.progress_at = now
        self.departed_at: float | None = None if info.alive else now
        self.pinged_at: float | None = None
        self.doubted_at: int | None = None
        """The check count when a call to this unwatched member was first refused."""


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
        watch: int = WATCH,
        piggyback: int = PIGGYBACK,
    ) -> None:
        if watch < 2 or piggyback < 1:
            raise ValueError("watch must be >= 2 and piggyback >= 1")
        self._me = me
        self._clock = clock
        self.failure_timeout_s = failure_timeout_s
        self.ping_interval_s = ping_interval_s
        self.tombstone_s = tombstone_s
        self.watch = watch
        self.piggyback = piggyback
        self._rng = rng
        self._entries: dict[str, _Entry] = {}
        self._cycle: list[str] = []
        self._watch_cycle: list[str] = []
        self._rumours: dict[str, int] = {}
        """Recent changes still to send: node id -> sends left (its current entry is sent)."""
        self._version = 0
        """Bumped whenever the live incarnations change: the cached ring and digest are stale."""
        self._cached_at = -1
        self._watched: frozenset[str] = frozenset()
        self._view = 0
        self._checks = 0
        self._doubt_checks = max(1, round(failure_timeout_s / ping_interval_s))
        """A first refusal older than a failure timeout (in checks) is forgotten."""
        self._checked_at = clock()  # listening from now: a stall before the first check counts too
        self.declared_dead = False
        """Set when gossip says this incarnation is dead: it must come back as a new one."""
        self._reconnects = 0

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
        self._spread(self._me.id)

    def set_links(self, links: tuple[LinkReport, ...], blocked: tuple[str, ...]) -> bool:
        """This node's measured links and blocked arcs; a change is a new revision of its
        record, spread as news. True if they changed."""
        if links == self._me.links and blocked == self._me.blocked:
            return False
        self._me = replace(self._me, links=links, blocked=blocked, revision=self._me.revision + 1)
        self._spread(self._me.id)
        return True

    def set_pace(self, compute_s: float, capacity: float) -> bool:
        """This node's measured pace (gwtf.flow.pace): its compute time and its capacity with
        it (`member_capacity`), a new revision of its record, spread as news. True if it
        changed."""
        if compute_s == self._me.compute_s:
            return False
        self._me = replace(
            self._me, compute_s=compute_s, capacity=capacity, revision=self._me.revision + 1,
        )
        self._spread(self._me.id)
        return True

    def set_address(self, address: str, relay: str) -> bool:
        """Where members dial this node changed (a relay took it on, or replaced a relay that
        died: docs/design.md 3.11): a new revision of its record, spread as news. True if it
        changed."""
        if (address, relay) == (self._me.address, self._me.relay):
            return False
        self._me = replace(self._me, address=address, relay=relay,
                           revision=self._me.revision + 1)  # fmt: skip
        self._spread(self._me.id)
        return True

    def set_capacity(self, capacity: float) -> bool:
        """This node's capacity changed at the same pace (a job's compression plan changed
        what its uplink carries): a new revision of its record, spread as news. True if it
        changed."""
        if capacity == self._me.capacity:
            return False
        self._me = replace(self._me, capacity=capacity, revision=self._me.revision + 1)
        self._spread(self._me.id)
        return True

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

    def reconnect_target(self) -> MemberInfo | None:
        """A member this node holds dead (not one that left), to call now and then, round-robin
        over the tombstones: nobody gossips with the dead, so after a partition heals this is
        how its two sides hear of each other again, each then learning from the other's table
        that it was declared dead, and coming back as a new incarnation."""
        dead = [e.info for _, e in sorted(self._entries.items()) if e.info.state == State.DEAD]
        if not dead:
            return None
        self._reconnects += 1
        return dead[self._reconnects % len(dead)]

    def is_alive(self, node_id: str, epoch: int) -> bool:
        info = self.get(node_id)
        return info is not None and info.alive and info.epoch == epoch

    def silence(self, node_id: str) -> float | None:
        entry = self._entries.get(node_id)
        return None if entry is None else self._clock() - entry.progress_at

    def view_hash(self) -> int:
        """A 64-bit digest of the live incarnations and their record revisions (this node
        included): two members with the same hash see the same swarm, measured links too."""
        self._refresh()
        return self._view

    def watched(self) -> list[MemberInfo]:
        """The live members this node times out (its ring neighbours), by id."""
        self._refresh()
        return [self._entries[i].info for i in sorted(self._watched)]

    @property
    def spreading(self) -> bool:
        """Recent changes are still being sent: digests may differ without a divergence."""
        return bool(self._rumours)

    def digest(self) -> list[MemberInfo]:
        """The whole table, as a joiner or an anti-entropy exchange receives it: this node, the
        live members and the departed.

        A watched member silent for half the timeout is left out, so that a crashed node's last
        entry stops spreading and cannot be believed again after its tombstone is forgotten."""
        self._refresh()
        now = self._clock()
        fresh = self.failure_timeout_s / 2
        out = [self._me]
        for node_id, entry in sorted(self._entries.items()):
            if (
                not entry.info.alive
                or node_id not in self._watched
                or now - entry.progress_at < fresh
            ):
                out.append(entry.info)
        return out

    def targets(self, count: int) -> list[MemberInfo]:
        """The next `count` gossip partners: round-robin over a shuffled list of the live
        members, reshuffled every round, so that every member is reached every n/count periods
        and none is picked twice in a row by chance."""
        return self._round_robin(self._cycle, {m.id: m for m in self.alive()}, count)

    def watch_targets(self, count: int = WATCH_CALLS) -> list[MemberInfo]:
        """The next `count` watched members to call, round-robin as `targets`."""
        return self._round_robin(self._watch_cycle, {m.id: m for m in self.watched()}, count)

    def _round_robin(
        self, cycle: list[str], live: dict[str, MemberInfo], count: int
    ) -> list[MemberInfo]:
        out: list[MemberInfo] = []
        while len(out) < min(count, len(live)):
            if not cycle:
                ids = sorted(live)
                order = [ids[i] for i in self._rng.permutation(len(ids)).tolist()]
                taken = {m.id for m in out}
                # Those already picked this time go last (the list is popped from its end).
                cycle[:] = [i for i in order if i in taken] + [i for i in order if i not in taken]
            node_id = cycle.pop()
            if node_id in live and all(m.id != node_id for m in out):
                out.append(live[node_id])
        return out

    # ------------------------------------------------------------------ gossip

    def outgoing(self, partner: str) -> Gossip:
        """What to send `partner` (a call or a reply): this node, the recent changes, and, if
        the partner is watched, the fresh entries of the other watched members."""
        self._refresh()
        now = self._clock()
        out = {self._me.id: self._me}
        for node_id in sorted(self._rumours, key=lambda i: (-self._rumours[i], i)):
            if len(out) > self.piggyback:
                break
            info = self.get(node_id)
            left = self._rumours[node_id] - 1
            if info is None or left <= 0:
                del self._rumours[node_id]
            else:
                self._rumours[node_id] = left
            if info is not None:
                out[node_id] = info
        if partner in self._watched:
            fresh = self.failure_timeout_s / 2
            for node_id in sorted(self._watched):
                entry = self._entries[node_id]
                if node_id != partner and now - entry.progress_at < fresh:
                    out.setdefault(node_id, entry.info)
        return Gossip(tuple(out.values()), self.view_hash(), self.spreading)

    def incoming(self, sender: str, gossip: Gossip) -> tuple[list[MemberEvent], Gossip]:
        """Merge what `sender` sent; the changes, and the answer: the whole table when the two
        digests still differ and neither node is spreading a change (something did not reach
        one of them), otherwise the bounded list."""
        events = self.merge(gossip.members)
        if gossip.view != self.view_hash() and not gossip.spreading and not self.spreading:
            return events, Gossip(tuple(self.digest()), self._view, False)
        return events, self.outgoing(sender)

    def forget_news(self) -> None:
        """Nothing to spread: the table a node starts with (its join reply) is news to it, not
        to the swarm, which learns of the joiner from the node that let it in."""
        self._rumours.clear()

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
                elif not old.alive:
                    self._spread(info.id)  # a newer verdict: no event here, news elsewhere
                continue
            if not old.alive:
                continue  # dead and left are final within an epoch
            if not info.alive:
                entry.info = replace(old, state=info.state)
                entry.departed_at = now
                kind = "left" if info.state == State.LEFT else "dead"
                events.append(MemberEvent(kind, entry.info, "reported by gossip"))
                continue
            if info.revision > old.revision:
                entry.info = replace(
                    entry.info, links=info.links, blocked=info.blocked, revision=info.revision,
                    compute_s=info.compute_s, capacity=info.capacity, address=info.address,
                    relay=info.relay,
                )
                events.append(MemberEvent("links", entry.info, "re-measured links or pace"))
            if info.heartbeat > old.heartbeat:
                entry.info = replace(entry.info, heartbeat=info.heartbeat)
                entry.progress_at = now
                entry.pinged_at = None
                entry.doubted_at = None
        return self._changed(events)

    def leave(self, node_id: str, epoch: int) -> list[MemberEvent]:
        """`node_id` said goodbye."""
        entry = self._entries.get(node_id)
        if entry is None or entry.info.epoch != epoch or not entry.info.alive:
            return []
        entry.info = replace(entry.info, state=State.LEFT)
        entry.departed_at = self._clock()
        return self._changed([MemberEvent("left", entry.info, "said goodbye")])

    def check(self) -> tuple[list[MemberEvent], list[MemberInfo]]:
        """Apply the timeout to the watched members: those now declared dead, and the silent
        ones to call directly (half the timeout without progress, at most once per ping
        interval)."""
        self._refresh()
        now = self._clock()
        # Checks come every ping interval; beyond a second one, this node was not listening.
        away = now - self._checked_at - self.ping_interval_s
        if away > self.ping_interval_s:
            for entry in self._entries.values():
                entry.progress_at = min(now, entry.progress_at + away)
        self._checked_at = now
        self._checks += 1
        events: list[MemberEvent] = []
        to_ping: list[MemberInfo] = []
        for node_id, entry in sorted(self._entries.items()):
            info = entry.info
            if not info.alive:
                if entry.departed_at is not None and now - entry.departed_at > self.tombstone_s:
                    del self._entries[node_id]
                    self._rumours.pop(node_id, None)
                continue
            if node_id not in self._watched:
                if entry.doubted_at is not None and entry.pinged_at is None:
                    entry.pinged_at = now  # a refused call to confirm with a call of ours
                    to_ping.append(info)
                continue
            silence = now - entry.progress_at
            if silence >= self.failure_timeout_s:
                events.append(self._declare(entry, f"no heartbeat for {silence:.2f} s"))
            elif silence >= self.failure_timeout_s / 2 and (
                entry.pinged_at is None or now - entry.pinged_at >= self.ping_interval_s
            ):
                entry.pinged_at = now
                to_ping.append(info)
        return self._changed(events), to_ping

    def refused(self, node_id: str, epoch: int) -> list[MemberEvent]:
        """A direct call to `node_id` was refused. Declares it dead when it has also been
        silent for half the timeout (both pieces of evidence); otherwise changes nothing.

        This node has no measure of the silence of a member it does not watch, so there the
        second piece of evidence is a second refused call, made in a later period (the next
        `check` asks for one): one connection reset, seen by every call in flight at once, is
        not a death."""
        entry = self._entries.get(node_id)
        if entry is None or not entry.info.alive or entry.info.epoch != epoch:
            return []
        silence = self._clock() - entry.progress_at
        if silence < self.failure_timeout_s / 2:
            return []
        if node_id not in self._watched:
            if entry.doubted_at is None or self._checks - entry.doubted_at > self._doubt_checks:
                entry.doubted_at = self._checks
                entry.pinged_at = None
                return []
            if entry.doubted_at == self._checks:
                return []  # the same period's calls: one failure seen several times
            reason = "refused two calls, periods apart"
        else:
            reason = f"silent for {silence:.2f} s and refused a call"
        return self._changed([self._declare(entry, reason)])

    def _declare(self, entry: _Entry, reason: str) -> MemberEvent:
        entry.info = replace(entry.info, state=State.DEAD)
        entry.departed_at = self._clock()
        return MemberEvent("dead", entry.info, reason)

    # ------------------------------------------------------------------ bookkeeping

    def _changed(self, events: list[MemberEvent]) -> list[MemberEvent]:
        """Every change is news to spread, and may move the ring and the digest."""
        for event in events:
            self._spread(event.member.id)
        self._refresh()  # now: a member watched from its arrival is silent from then
        return events

    def _spread(self, node_id: str) -> None:
        live = sum(1 for e in self._entries.values() if e.info.alive)
        self._rumours[node_id] = RETRANSMIT * math.ceil(math.log2(live + 2))
        self._version += 1

    def _refresh(self) -> None:
        """Recompute the digest and the watched ring after a change of the live incarnations;
        a member that becomes watched counts as heard from now."""
        if self._cached_at == self._version:
            return
        self._cached_at = self._version
        live = sorted((m.id, m.epoch, m.revision) for m in (self._me, *self.alive()))
        text = "\n".join(f"{i} {e} {r}" for i, e, r in live).encode()
        self._view = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")
        others = [i for i, _, _ in live if i != self._me.id]
        if len(others) <= self.watch:
            watched = frozenset(others)
        else:
            ring = sorted((*others, self._me.id), key=_ring_position)
            at = ring.index(self._me.id)
            half = self.watch // 2
            watched = frozenset(
                ring[(at + step) % len(ring)]
                for step in (*range(1, self.watch - half + 1), *range(-half, 0))
            )
        now = self._clock()
        for node_id in watched - self._watched:
            entry = self._entries[node_id]
            entry.progress_at = max(entry.progress_at, now)
            entry.pinged_at = None
        self._watched = watched


def _ring_position(node_id: str) -> bytes:
    return hashlib.blake2b(node_id.encode(), digest_size=8).digest()
