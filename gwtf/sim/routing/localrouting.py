"""The gwtf policies' routing by local solves (`routing = "local"`, the default, as the node's
`--routing local`; docs/design.md 2.12, 5).

Every simulated node holds a `LocalRoute` (gwtf.flow.localroute), the node's own routing state,
fed the way the node's membership feeds it, in simulated time:

- *Views.* A node's view is the records (id, stage, location, `compute_s`, capacity) of the
  members it believes live, each with its incarnation; a later incarnation replaces an earlier
  one, and a death is final within its incarnation (the member table's merge rule, 3.4). A node
  that enters the job holds the records of every member then believed live (a joiner gets the
  whole table in its join reply and keeps it current while it downloads its state).
- *Spread.* A change reaches the other members by gossip (`gossip_spread`): every member calls
  `GOSSIP_FANOUT` random members every `GOSSIP_PERIOD_S`, at a phase of its own; a call carries
  what the caller knows and its answer what the callee knows (push-pull), each leg one one-way
  delay of the simulated network for `message_bytes`. A join spreads from the joiner once it
  enters the job; a crash from its `WATCH` watchers (its neighbours on a ring ordered by a hash
  of the ids), which notice it `detection_timeout_s` after it (the failure timeout); a graceful
  leave, and a placement move out of a stage, reach every member one one-way delay after it (the
  leaver calls every member, 3.9).
- *Solves.* A node solves its view once it has been quiet for `route_quiet_s`, and is busy for
  the solve's time (`solve_s`): changes that reach it meanwhile wait, as on the node, whose event
  loop the solve blocks, and the routes change at its end. On learning that a next hop died it
  repairs at once (`LocalRoute.member_gone`).
- *Paces.* A node whose measured pace reaches its record (gwtf.flow.pace, 2.13) spreads the new
  revision of its record from itself, as a join spreads; a member takes a record only from a
  newer revision of the incarnation it holds.
- *Links* are the scenario's matrix as given at the start, for every node: a link row of the
  trace changes the network, not the routes (the node routes by its `--link-matrix`, not by its
  probes, 2.10).

Every node with the same view computes the same flows (the answer depends only on the records),
so the simulation solves each distinct view once (`solver` with a cache) and charges every node
its own solve time; the routes are those of the node's own `LocalRoute` all the same.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gwtf.flow.localroute import LocalRoute, solver
from gwtf.flow.topology import Members, NodeSpec
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.simulator import Simulation

__all__ = [
    "GOSSIP_FANOUT",
    "GOSSIP_PERIOD_S",
    "SOLVE_S_PER_MEMBER",
    "WATCH",
    "LocalRouting",
    "gossip_spread",
    "solve_s",
]

GOSSIP_PERIOD_S = 0.5
"""A member's gossip period (the node's `NodeConfig.heartbeat_s`)."""
GOSSIP_FANOUT = 3
"""Random members called per period (the node's `NodeConfig.gossip_fanout`)."""
WATCH = 6
"""Watchers of each member, which notice its crash (gwtf.node.control.membership.WATCH)."""
SOLVE_S_PER_MEMBER = 2.5e-3
"""Modelled seconds of one solve per member of the view: `LocalRoute`'s solver (the balanced
objective, two solves) on geo10 views took 2.3 ms at 6 members, 9 ms at 16, 81 ms at 32, 136 ms
at 64 and 580 ms at 100 (best of five, one core of the shared 2-core development machine,
2026-11-25); the fit holds from 16 to 64 members, the sizes of the shipped scenarios. A model
rather than a measurement in the run, so that a run stays a pure function of its scenario and
seed. Measured with networkx's own solver path; the same solves run faster since
(`gwtf.flow.simplex`, docs/design.md 2.12) and the model is kept, so that results stay the same
(section `solvespeed` of benchmarks/RESULTS.md has the solve times now)."""
_CACHED_SOLVES = 256

Version = tuple[int, int]
"""A record's incarnation and its revision within it."""
Change = tuple[str, Version, NodeSpec | None]
"""A membership change: a member's id, its record's version, its record (None: it is gone)."""


def solve_s(members: int) -> float:
    """Modelled seconds a node takes to solve a view of `members` records."""
    return SOLVE_S_PER_MEMBER * members


def gossip_spread(
    start: Mapping[str, float],
    ids: Sequence[str],
    delay: Callable[[str, str], float],
    phase: Callable[[str], float],
    rng: np.random.Generator,
    *,
    period: float = GOSSIP_PERIOD_S,
    fanout: int = GOSSIP_FANOUT,
    max_periods: int = 200,
) -> dict[str, float]:
    """When each of `ids` learns a change that the members in `start` learned at the times
    given, by push-pull gossip (module doc): member `i` calls `fanout` random others at
    `phase(i) + k period`; a caller that knows passes it on (`delay(i, p)` later), a callee that
    knows when the call lands answers with it (one more delay). Calls are made in time order, so
    what a call carries is what its caller knew when it made it."""
    learned = {i: math.inf for i in ids}
    for i, at in start.items():
        if i in learned:
            learned[i] = min(learned[i], at)
    if not start or len(ids) < 2:
        return learned
    t0 = min(start.values())
    heap = []
    for i in ids:
        first = phase(i) % period
        first += math.ceil((t0 - first) / period) * period if first < t0 else 0.0
        heap.append((first, i))
    heapq.heapify(heap)
    unknown = sum(1 for at in learned.values() if math.isinf(at))
    latest = math.inf if unknown else max(learned.values())
    horizon = t0 + max_periods * period
    others = len(ids) - 1
    index = {i: n for n, i in enumerate(ids)}
    while heap:
        at, i = heapq.heappop(heap)
        if at >= latest or at > horizon:
            break
        knows = learned[i] <= at
        for draw in rng.integers(0, others, size=fanout).tolist():
            peer = ids[draw + 1 if draw >= index[i] else draw]
            leg = delay(i, peer)
            if knows:
                if at + leg < learned[peer]:
                    unknown -= math.isinf(learned[peer])
                    learned[peer] = at + leg
            elif learned[peer] <= at + leg and at + 2 * leg < learned[i]:
                unknown -= math.isinf(learned[i])
                learned[i] = at + 2 * leg
        if not unknown and math.isinf(latest):
            # Times only fall from here: a call at or after the latest changes nothing.
            latest = max(learned.values())
        heapq.heappush(heap, (at + period, i))
    # Past the horizon anti-entropy would close the gap: at the horizon, at the latest.
    return {i: min(at, horizon) for i, at in learned.items()}


def _ring_position(node_id: str) -> bytes:
    return hashlib.blake2b(node_id.encode(), digest_size=8).digest()


@dataclass
class _Member:
    """One node incarnation's routing: its `LocalRoute` and what it knows of the membership."""

    node: SimNode
    incarnation: int
    route: LocalRoute
    known: dict[str, tuple[Version, NodeSpec | None]]
    solve_at: float | None = None
    solving: bool = False
    waiting: list[Change] = field(default_factory=list)
    """Changes that reached the node during a solve."""


class LocalRouting:
    """Every node's `LocalRoute`, fed by simulated membership gossip (module doc)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink
        sc = sim.sc
        self.links = dict(sc.links)
        self.members: dict[str, _Member] = {}
        self.rng = np.random.default_rng([sim.seed, 13])
        self._solve = solver()
        self._cache: OrderedDict[tuple[NodeSpec, ...], Mapping[tuple[str, str], int]] = (
            OrderedDict()
        )
        self.solves = 0
        """Solves by the nodes (each charged its time)."""
        self.computed = 0
        """Distinct views solved (the rest came from the cache)."""
        self.repairs = 0

    # -- the pure core, shared
    def _solved(self, members: Members) -> Mapping[tuple[str, str], int]:
        key = members.nodes
        flows = self._cache.get(key)
        if flows is None:
            flows = self._solve(members)
            self.computed += 1
            self._cache[key] = flows
            if len(self._cache) > _CACHED_SOLVES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return flows

    def record(self, node: SimNode) -> NodeSpec:
        """`node`'s membership record, as the node's member table holds it."""
        return NodeSpec.make(node.id, node.stage, node.record_s, node.location,
                             self.sim.capacity(node))

    def _version(self, node: SimNode) -> Version:
        return self.sim.incarnation(node.id), node.revision

    def _new_member(self, node: SimNode) -> _Member:
        sim = self.sim
        route = LocalRoute(node.id, sim.S, sim.sc.activation_bytes, self.links, sim.sc.intra,
                           quiet_s=sim.sc.route_quiet_s, clock=sim.engine.clock,
                           solve=self._solved)
        if sim.sc.boundary_bytes:  # the job's compression plan, as the node's routing sets it
            route.set_boundary_bytes(sim.sc.boundary_bytes)
        known: dict[str, tuple[Version, NodeSpec | None]] = {
            n.id: (self._version(n), self.record(n))
            for n in sorted(sim.nodes.values(), key=lambda n: n.id) if n.active
        }
        member = _Member(node, sim.incarnation(node.id), route, known)
        self.members[node.id] = member
        route.set_view(r for _, r in known.values() if r is not None)
        self._schedule(member)
        return member

    # -- the router (GwtfPolicy's questions)
    def routes(self, node: SimNode) -> dict[str, int]:
        member = self.members.get(node.id)
        if member is None or member.node is not node:
            return {}
        return member.route.routes()

    def start(self) -> None:
        for node in sorted(self.sim.active_nodes(), key=lambda n: n.id):
            self._new_member(node)

    def activated(self, node: SimNode) -> None:
        """`node` enters the job: it holds the whole table, and its record spreads from it."""
        member = self._new_member(node)
        change: Change = (node.id, self._version(node), member.known[node.id][1])
        self._spread(change, {node.id: self.sim.engine.now})

    def record_changed(self, node: SimNode) -> None:
        """`node`'s record has a new revision (its pace): its own view at once, the others' by
        gossip from it."""
        member = self.members.get(node.id)
        if member is None or member.node is not node:
            return
        change: Change = (node.id, self._version(node), self.record(node))
        self._apply(member, change)
        self._spread(change, {node.id: self.sim.engine.now})

    def retire(self, node: SimNode, *, left: bool) -> None:
        """`node` left the job: a leave reaches every member one delay later, a crash (noticed
        now, the failure timeout after it) spreads from its watchers."""
        member = self.members.get(node.id)
        if member is None or member.node is not node:
            return
        del self.members[node.id]
        change: Change = (node.id, (member.incarnation, node.revision), None)
        now = self.sim.engine.now
        if left:
            size = self.sim.sc.message_bytes
            for other in sorted(self.members.values(), key=lambda m: m.node.id):
                at = now + self.sim.one_way(node, other.node, size)
                self.sink.emit(at, Kind.CONTROL, self._learn, (other, change))
            return
        self._spread(change, {w: now for w in self._watchers(node.id)})

    def link_changed(self, loc_a: str, loc_b: str) -> None:
        """Not seen: the nodes route by the matrix (module doc)."""

    # -- membership in time
    def _watchers(self, node_id: str) -> list[str]:
        ring = sorted({node_id, *self.members}, key=_ring_position)
        if len(ring) <= WATCH + 1:
            return [i for i in ring if i != node_id]
        at = ring.index(node_id)
        half = WATCH // 2
        return [ring[(at + k) % len(ring)] for k in (*range(-half, 0), *range(1, half + 1))]

    def _spread(self, change: Change, start: Mapping[str, float]) -> None:
        sim = self.sim
        ids = sorted(self.members)
        size = sim.sc.message_bytes
        nodes = {i: self.members[i].node for i in ids}

        def delay(a: str, b: str) -> float:
            return sim.one_way(nodes[a], nodes[b], size)

        def phase(node_id: str) -> float:
            return int.from_bytes(_ring_position(node_id)[:4], "big") / 2**32 * GOSSIP_PERIOD_S

        learned = gossip_spread(start, ids, delay, phase, self.rng)
        for node_id in ids:
            if node_id != change[0]:
                self.sink.emit(learned[node_id], Kind.CONTROL, self._learn,
                               (self.members[node_id], change))

    @returns_events
    def _learn(self, payload: tuple[_Member, Change]) -> None:
        member, change = payload
        if self.members.get(member.node.id) is member:
            self._apply(member, change)

    def _apply(self, member: _Member, change: Change) -> None:
        if member.solving:
            member.waiting.append(change)
            return
        node_id, version, record = change
        old = member.known.get(node_id)
        if old is not None:
            (held, revision), held_record = old
            if held > version[0] or (held == version[0] and (
                    held_record is None or (record is not None and revision >= version[1]))):
                return  # older news than the member holds: a death is final in its incarnation
        member.known[node_id] = (version, record)
        records = [r for _, r in member.known.values() if r is not None]
        if record is None:
            self.repairs += member.route.member_gone(node_id, records)
        else:
            member.route.set_view(records)
        self._schedule(member)

    # -- solves in time
    def _schedule(self, member: _Member) -> None:
        due = member.route.due()
        if due is None or member.solve_at == due:
            return
        member.solve_at = due
        self.sink.emit(due, Kind.TICK, self._on_due, (member, due))

    @returns_events
    def _on_due(self, payload: tuple[_Member, float]) -> None:
        member, due = payload
        if self.members.get(member.node.id) is not member or member.solve_at != due:
            return
        member.solve_at = None
        member.solving = True
        at = self.sim.engine.now + solve_s(member.route.view_size)
        self.sink.emit(at, Kind.TICK, self._on_solved, member)

    @returns_events
    def _on_solved(self, member: _Member) -> None:
        if self.members.get(member.node.id) is not member:
            return
        member.solving = False
        member.route.solve()
        self.solves += 1
        waiting, member.waiting = member.waiting, []
        for change in waiting:
            self._apply(member, change)
        self._schedule(member)
