"""LocalRoute: one node's routing by local solves on its membership view (docs/design.md 2.12).

Pure and deterministic, clock injected: the node (gwtf.node.control.flowcontrol) feeds it the
records of its live members and the deaths it detects, and asks it for its out-rates.

- *View.* The records of the live members (`NodeSpec`: id, stage, location, compute_s,
  capacity), the location links (measured ones over the matrix, `gwtf.flow.linkreports`) and
  the arcs their tails report blocked. A new view starts a quiet spell; once the view has not
  changed for `quiet_s`, `solve()` solves it (`localsolve.solve_members`: the answer depends
  only on the records, so every node with the same view computes the same flows; balanced,
  `gwtf.flow.balance`, so that no node of a wide stage is loaded to its capacity) and the node
  switches to it. A burst of joins costs one solve; nodes that learn of a death a little apart
  still switch within about `quiet_s` of each other. A view that keeps changing is solved at
  the latest `max_wait_s` (ten quiet spells by default) after it first differed from the one
  solved: without the bound, a swarm whose views change more often than every `quiet_s` never
  solves at all (seen with 64 processes whose first reports of explored peers, each a record
  revision, came faster than once a second; heavy churn at scale could do the same).
- *Repair.* A next hop that dies is repaired at once, before any solve (`gossip.repair`): what
  this node sent it is re-split over its other next-stage peers by their residual capacity in
  the solution it holds. Local: it needs only that solution. A member that is gone (it died or
  left, or its record in the view is now of another stage: it moved) is struck from the
  solution held as well, next hop or not, so that a later repair never re-splits a share onto
  it: repairs of two deaths one after the other would otherwise hand the second's share back to
  the first, or to a node that now holds another stage.
- *Consistency.* A node uses only its own out-arcs of its own solution. Two nodes whose views
  differ for a moment (a death or a join that reached one first) may route by two solutions
  that do not fit; the data plane's memory slots hold back a sender whose next hop is full
  (docs/design.md 3.7), so a mismatch costs throughput for that moment, never correctness.
- *No solution* while a stage has no live member: the routes are empty and the node routes by
  capacities (docs/design.md 2.8).

Two drivers feed it the same way: the node (gwtf.node.control.routing, over its member table and
wall time) and the simulator (gwtf.sim.routing.localrouting, over simulated gossip and time). What a
driver adds is only when the records reach it and when it calls `solve()`; a solve's answer is
`solve_members` of the view either way (`solver` lets the simulator share one solve among the
nodes whose views are equal, since the answer depends only on the records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gwtf.flow.balance import JOB_OBJECTIVE, Balance
from gwtf.flow.gossip import repair, without_node
from gwtf.flow.linkreports import SiteLinks
from gwtf.flow.localsolve import HUB_SLACK, LinkTerms, link_terms, solve_members
from gwtf.flow.topology import LinkSpec, Members, NodeSpec

__all__ = ["MAX_WAIT_QUIETS", "LocalRoute", "OutArc", "PendingSolve", "Solver", "solver"]

MAX_WAIT_QUIETS = 10
"""The longest a changed view waits for its solve, in quiet spells (`LocalRoute.max_wait_s`).
Ten keeps the batching of a burst of joins (each a change within a quiet spell of the last)
and bounds how stale the routes of a swarm whose views never rest can get."""

Solver = Callable[[Members], Mapping[tuple[str, str], int]]
"""The flows of a view's records: `solve_members` (`solver`), or the same answer cached."""


def solver(
    hub_slack: float | None = HUB_SLACK, balance: Balance = JOB_OBJECTIVE
) -> Solver:
    """`solve_members` with `hub_slack` and `balance`, as a `Solver`."""

    def solve(members: Members) -> Mapping[tuple[str, str], int]:
        return solve_members(members, hub_slack=hub_slack, balance=balance).flows

    return solve


@dataclass(frozen=True, slots=True)
class PendingSolve:
    """A view taken for solving (`LocalRoute.begin_solve`): what a solve reads, immutable."""

    key: tuple[object, ...]
    members: Members
    complete: bool
    """Every stage has a member and this node is one of them: else no flows, no solution."""
    waited_s: float


@dataclass(frozen=True, slots=True)
class OutArc:
    """An arc this node is the tail of in its view: the link it is routed by, and its flow."""

    peer: str
    head_compute_s: float
    link: LinkSpec
    terms: LinkTerms
    flow: int


class LocalRoute:
    """The routing state of one node incarnation (module doc)."""

    def __init__(
        self,
        node_id: str,
        num_stages: int,
        activation_bytes: int,
        links: Mapping[frozenset[str], LinkSpec],
        intra: LinkSpec,
        *,
        quiet_s: float,
        clock: Callable[[], float],
        max_wait_s: float | None = None,
        hub_slack: float | None = HUB_SLACK,
        balance: Balance = JOB_OBJECTIVE,
        solve: Solver | None = None,
    ) -> None:
        """`max_wait_s`: the longest a changed view waits for its solve (None:
        `MAX_WAIT_QUIETS` quiet spells). `balance`: the routing objective (docs/design.md 2.2,
        `gwtf.flow.balance`); None solves for the least cost alone. `solve`, when given,
        replaces `solver(hub_slack, balance)` (the simulator's is the same, cached)."""
        self.node_id = node_id
        self.num_stages = num_stages
        self.quiet_s = quiet_s
        self.max_wait_s = MAX_WAIT_QUIETS * quiet_s if max_wait_s is None else max_wait_s
        self._clock = clock
        self._solve = solve or solver(hub_slack, balance)
        self._activation_bytes = activation_bytes
        self._boundary_bytes: tuple[int, ...] | None = None
        """Bytes per boundary while a job's compression plan holds (docs/design.md 2.15)."""
        self._links = MappingProxyType(dict(links))
        self._intra = intra
        self._view: tuple[NodeSpec, ...] = ()
        self._view_links: Mapping[frozenset[str], LinkSpec] = self._links
        self._blocked: frozenset[tuple[str, str]] = frozenset()
        self._key: tuple[object, ...] = ((), (), frozenset(), None)
        """The view, its measured links, its blocked arcs and the boundaries' bytes: what a
        solve depends on."""
        self._changed_at = clock()
        self._unsolved_since = self._changed_at
        """Since when the view held has differed from the one solved."""
        self._solved: tuple[object, ...] | None = None
        self._members: Members | None = None
        """The records of the solution held (what a repair needs)."""
        self._plan: dict[str, dict[str, int]] = {}
        self._mine: dict[str, int] = {}
        self._through = 0
        self.has_solution = False
        """A solution of a complete swarm is held (repaired or not)."""
        self.solves = 0
        self.repairs = 0
        self.view_changes = 0
        self.last_solve_s = 0.0
        """Wall time of the last solve, by the injected clock."""
        self.waited_s = 0.0
        """Time from the last view change to the solve that answered it."""

    # ------------------------------------------------------------------ view

    def set_view(
        self,
        records: Iterable[NodeSpec],
        links: SiteLinks | None = None,
        blocked: frozenset[tuple[str, str]] = frozenset(),
    ) -> bool:
        """The live members' records (this node's included), with the links measured and the
        arcs blocked in them (`gwtf.flow.linkreports`; None: the links given at creation);
        True if the view changed."""
        view = tuple(sorted(records, key=lambda n: (n.stage, n.id)))
        key = (view, links.key() if links is not None else (), blocked, self._boundary_bytes)
        if key == self._key:
            return False
        if self._key == self._solved:
            self._unsolved_since = self._clock()
        self._key = key
        self._view = view
        self._view_links = links if links is not None else self._links
        self._blocked = blocked
        if self._members is not None:
            now = {(n.id, n.stage) for n in view}
            for gone in sorted(n.id for n in self._members.nodes
                               if n.id != self.node_id and (n.id, n.stage) not in now):
                self.lost(gone)
        self._changed_at = self._clock()
        self.view_changes += 1
        return True

    def set_boundary_bytes(self, sizes: tuple[int, ...] | None) -> bool:
        """The bytes each boundary sends per microbatch (a job's compression plan; None: the
        activation bytes everywhere): arcs are priced with them from the next solve on. True if
        they changed."""
        if sizes == self._boundary_bytes:
            return False
        self._boundary_bytes = sizes
        if self._key == self._solved:
            self._unsolved_since = self._clock()
        self._key = (*self._key[:3], sizes)
        self._changed_at = self._clock()
        self.view_changes += 1
        return True

    def due(self) -> float | None:
        """When the view will have been quiet long enough to solve, or will have waited
        `max_wait_s`; None when it is solved."""
        if self._key == self._solved:
            return None
        return min(self._changed_at + self.quiet_s, self._unsolved_since + self.max_wait_s)

    @property
    def view_size(self) -> int:
        return len(self._view)

    def message_delay_s(self) -> float:
        """The mean one-way delay between two members of the view (half the RTT of their
        link): the unit in which the node reports how fast it converged (0 for one member)."""
        where: dict[str, int] = {}
        for n in self._view:
            where[n.location] = where.get(n.location, 0) + 1
        total = pairs = 0.0
        places = sorted(where)
        for i, a in enumerate(places):
            for b in places[i:]:
                count = where[a] * (where[a] - 1) / 2 if a == b else where[a] * where[b]
                link = self._intra if a == b else self._view_links.get(frozenset((a, b)))
                if link is None or count == 0:
                    continue
                total += count * link.rtt_ms / 2000
                pairs += count
        return total / pairs if pairs else 0.0

    @property
    def quiet(self) -> bool:
        """The view held is the one solved."""
        return self._key == self._solved

    def solve(self) -> bool:
        """Solve the view if it is due; True if the routes changed to a new solution."""
        pending = self.begin_solve()
        if pending is None:
            return False
        started = self._clock()
        self.finish_solve(pending, self.compute(pending), started)
        return True

    def begin_solve(self) -> PendingSolve | None:
        """The view to solve if it is due, as an immutable snapshot (None if not due). The node
        computes it off its event loop (`compute` in a worker thread) and adopts it with
        `finish_solve`: at a few hundred members a solve takes seconds, and a node that does
        not answer for that long looks dead and measures its own stall as its links' delay."""
        due = self.due()
        now = self._clock()
        if due is None or now < due:
            return None
        view = self._view
        stages = {n.stage for n in view}
        complete = len(stages) == self.num_stages and any(n.id == self.node_id for n in view)
        return PendingSolve(self._key, self._records(view), complete, now - self._changed_at)

    def compute(self, pending: PendingSolve) -> Mapping[tuple[str, str], int] | None:
        """The flows of a pending solve (None for an incomplete swarm). Touches nothing of the
        route's state, so it may run in another thread."""
        return self._solve(pending.members) if pending.complete else None

    def finish_solve(
        self, pending: PendingSolve, flows: Mapping[tuple[str, str], int] | None, started: float
    ) -> None:
        """Adopt a computed solve. Members that left the view while it ran are struck from it
        at once (as a view change strikes them from the solution held); a view that changed
        meanwhile stays due."""
        members = pending.members
        if flows is None:
            self._members, self._plan, self._mine, self._through = members, {}, {}, 0
            self.has_solution = False
        else:
            self._adopt(members, flows)
        if pending.key != self._key:
            now = {(n.id, n.stage) for n in self._view}
            for gone in sorted(n.id for n in members.nodes
                               if n.id != self.node_id and (n.id, n.stage) not in now):
                self.lost(gone)
        self.last_solve_s = self._clock() - started
        self.waited_s = pending.waited_s
        self._solved = pending.key
        self._unsolved_since = started  # a view that changed meanwhile differs since then
        self.solves += 1

    def _records(self, view: tuple[NodeSpec, ...]) -> Members:
        return Members(
            self._activation_bytes, view, self._view_links, self._intra, self._blocked,
            self._boundary_bytes,
        )

    def _adopt(self, members: Members, flows: Mapping[tuple[str, str], int]) -> None:
        plan: dict[str, dict[str, int]] = {}
        into = 0
        for (src, dst), units in flows.items():
            if units > 0:
                plan.setdefault(src, {})[dst] = units
                if dst == self.node_id:
                    into += units
        self._members, self._plan = members, plan
        self._mine = dict(sorted(plan.get(self.node_id, {}).items()))
        me = next(n for n in members.nodes if n.id == self.node_id)
        self._through = sum(self._mine.values()) if me.stage == 0 else into
        self.has_solution = True

    def lost(self, peer: str) -> bool:
        """`peer` died or left: if it was a next hop, re-split its share at once (module doc),
        and strike it from the solution held; True if the routes changed."""
        members = self._members
        if members is None or peer == self.node_id \
                or not any(n.id == peer for n in members.nodes):
            return False
        repaired = peer in self._mine
        if repaired:
            self._mine = dict(sorted(repair(members, self._plan, self.node_id, peer).items()))
            self.repairs += 1
        # Struck whether or not it was a next hop: its capacity must not draw a later repair.
        self._members = without_node(members, peer)
        self._plan = {
            src: {dst: x for dst, x in plan.items() if dst != peer}
            for src, plan in {**self._plan, self.node_id: self._mine}.items() if src != peer
        }
        return repaired

    def member_gone(self, peer: str, records: Iterable[NodeSpec]) -> bool:
        """`peer` died or left and `records` are the live members without it: a next hop is
        repaired at once (`lost`), then the view changes (solved once quiet again); True if the
        routes changed now."""
        repaired = self.lost(peer)
        self.set_view(records)
        return repaired

    # ------------------------------------------------------------------ results

    def routes(self) -> dict[str, int]:
        """Flow units to each next-stage peer with flow (empty on the last stage)."""
        return dict(self._mine)

    def throughput(self) -> int:
        """Flow units through this node in the solution held (last stage: completes)."""
        return self._through

    def out_arcs(self) -> list[OutArc]:
        """Every arc this node is the tail of in its current view, with its flow."""
        me = next((n for n in self._view if n.id == self.node_id), None)
        if me is None:
            return []
        arcs = []
        for n in self._view:
            if n.stage != me.stage + 1 or (me.id, n.id) in self._blocked:
                continue
            link = self._intra if n.location == me.location else self._view_links.get(
                frozenset((me.location, n.location))
            )
            terms = link_terms(self._records(()), me.location, n.location, me.stage)
            if link is None or terms is None:
                continue
            arcs.append(OutArc(n.id, n.compute_s, link, terms, self._mine.get(n.id, 0)))
        return arcs
