"""Local routing on a node (docs/design.md 2.12): its `LocalRoute` fed from the member table.

- the view: the records of the live members (this node's included), from the member table of
  gwtf.node.control.membership, each at its site (its location; a node without one is a site of its
  own once a report names it or it reports, and shares one site with the others until then,
  `linkreports.solve_sites`), with the links the records' reports give
  (`gwtf.flow.linkreports.site_links`: the median of the reports per site pair, over the
  location matrix, and over the intra-location link between any two sites when the swarm has
  no matrix) and the arcs they block;
- the solve loop: a solve once the view has been quiet for `route_quiet_s`;
- a dead next hop: repaired at once (`LocalRoute.lost`), before the member table's change is
  solved;
- probes: on the arcs that carry this node's flow, on the arcs it blocked (to see them come
  back), and on `explore_peers` other next-stage members, a window that moves every `explore_s`
  (so an unused link gets measured; probing every next-stage member would be O(N^2/S) probes in
  the swarm);
- reports: after a first measurement or a lasting change (gwtf.node.control.prober), this
  node's report on the head's site is the median of its estimates of the heads there, kept in
  its record only while it differs materially from the link routing would take without it
  (`linkreports.material`); a head no probe reaches for a failure timeout is blocked.

gwtf.node.control.flowcontrol creates it when the swarm routes locally and hands it the
membership changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import statistics
from collections.abc import Callable, Mapping

from gwtf.flow.linkreports import (
    LinkReport,
    SiteLinks,
    SiteRecord,
    blocked_arcs,
    material,
    report,
    site_links,
    site_of,
    solve_sites,
)
from gwtf.flow.localroute import LocalRoute, OutArc
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, NodeSpec
from gwtf.node.control.entry import ONE_SITE
from gwtf.node.control.links import ArcParamsSpec, arc_params
from gwtf.node.control.membership import (
    MemberInfo,
    member_capacity,
    own_share_gbps,
    relay_share_gbps,
)
from gwtf.node.control.prober import LinkProber
from gwtf.node.state import NodeState

__all__ = ["LocalRouting"]


class LocalRouting:
    """The I/O side of one node's local routing."""

    def __init__(
        self, state: NodeState, prober: LinkProber, start_link: Callable[[MemberInfo], None]
    ) -> None:
        self._state = state
        self._prober = prober
        self._start_link = start_link
        swarm = state.swarm
        matrix = state.settings.links if state.settings.routing_links == "matrix" else None
        self._base: Mapping[frozenset[str], LinkSpec] = matrix or {}
        self._default: LinkSpec | None = None if matrix is not None else DEFAULT_INTRA
        """The link between two sites no one measured: none with a matrix (the matrix says
        which sites are joined), otherwise the intra-location link, as placement takes it."""
        self.route = LocalRoute(
            state.node_id,
            swarm.num_stages,
            swarm.activation_bytes,
            self._base,
            DEFAULT_INTRA,
            quiet_s=state.config.route_quiet_s,
            clock=state.clock,
        )
        self._links = SiteLinks({}, self._base, self._default)
        self.boundary_bytes: tuple[int, ...] | None = None
        """The bytes each boundary sends while a job's compression plan holds here."""
        self._reports: dict[str, LinkReport] = {}
        self._blocked: set[str] = set()
        self._explore_round = 0
        # Set at every change of the view, for the solve loop.
        self._view_changed = asyncio.Event()

    def start(self) -> None:
        self.update_view()
        self._state.spawn(self._solve_loop(), "solves")
        if self._state.config.explore_peers > 0:
            self._state.spawn(self._explore_loop(), "explore")

    def update_view(self) -> None:
        hops = self.route.routes()
        members = self._state.members
        # Whom it relays, or who relays it, may have changed with the view (3.11).
        members.set_capacity(self._capacity(members.me.compute_s))
        live = (members.me, *members.alive())
        sites = solve_sites(((m.id, m.location, m.links) for m in live), ONE_SITE)
        records = [SiteRecord(m.id, sites[m.id], m.links, m.blocked) for m in live]
        nodes = [NodeSpec(m.id, m.stage, m.compute_s, sites[m.id], m.capacity) for m in live]
        self._links = site_links(records, self._base, self._default)
        if self.route.set_view(nodes, self._links, blocked_arcs(records)):
            if self.route.routes() != hops:
                # A next hop's record is gone or now of another stage (it moved): repaired.
                self._state.log.info("routes: a next hop left the next stage, its share "
                                     "re-split at once: next hops %s",
                                     self.route.routes() or "none")
                self._probe_next_hops()
            self._view_changed.set()

    def _capacity(self, compute_s: float) -> float:
        """This node's capacity at `compute_s` (`member_capacity`): its uplink with the job's
        bytes, shared with the members it relays, and its share of its relay's uplink if it is
        relayed (docs/design.md 3.11)."""
        members, swarm = self._state.members, self._state.swarm
        me, others = members.me, members.alive()
        return member_capacity(compute_s, me.stage, own_share_gbps(me, others),
                               swarm.num_stages, swarm.activation_bytes, self.boundary_bytes,
                               relay_share_gbps(me, others))  # fmt: skip

    def relayed(self) -> None:
        """This node's relay changed: its record states what its share of the relay's uplink
        carries, so the flows send it no more than that (docs/design.md 3.11)."""
        state = self._state
        if state.members.set_capacity(self._capacity(state.members.me.compute_s)):
            state.log.info("routes: relayed by %s; capacity %.2f mb/s", state.members.me.relay,
                           state.members.me.capacity)  # fmt: skip
            self.update_view()

    def compress(self, sizes: tuple[int, ...] | None) -> None:
        """A job's compression plan holds here (`sizes`: the bytes each boundary sends per
        microbatch) or no longer (None): arcs are priced with those bytes from the next solve
        on, and this node's record states what its uplink carries of them (docs/design.md
        2.15). Every participant of the job does the same, so their solves agree."""
        if sizes == self.boundary_bytes:
            return
        self.boundary_bytes = sizes
        state = self._state
        swarm = state.swarm
        state.members.set_capacity(self._capacity(state.members.me.compute_s))
        self.route.set_boundary_bytes(sizes)
        state.log.info("routes: boundaries send %s bytes a microbatch; capacity %.2f mb/s",
                       list(sizes) if sizes else swarm.activation_bytes,
                       state.members.me.capacity)  # fmt: skip
        self.update_view()
        self._view_changed.set()

    def member_down(self, member: MemberInfo) -> None:
        """`member` died or left: repair at once if it was a next hop, then a new view."""
        self._blocked.discard(member.id)
        sites = {site_of(m.id, m.location) for m in self._state.members.alive()}
        for site in set(self._reports) - sites:
            del self._reports[site]  # no one left there to route to
        self._publish()
        if self.route.lost(member.id):
            self._state.log.info(
                "routes: next hop %s is gone, its share re-split at once: next hops %s",
                member.id,
                self.route.routes() or "none",
            )
            self._probe_next_hops()
        self.update_view()
        self._view_changed.set()

    # ------------------------------------------------------------------ probes and reports

    def _explored(self) -> list[str]:
        """The `explore_peers` next-stage members without flow from here probed now: a window
        over them in an order of their own for each node (a hash of the two ids), moved by
        one window every `explore_s`, so every link out of here is measured in turn and no
        member is explored by everyone at once."""
        k = self._state.config.explore_peers
        me = self._state.members.me
        hops = set(self.route.routes())
        others = sorted(
            (m.id for m in self._state.members.alive()
             if m.stage == me.stage + 1 and m.id not in hops),
            key=lambda peer: hashlib.blake2b(f"{me.id}>{peer}".encode(), digest_size=8).digest(),
        )  # fmt: skip
        if len(others) <= k:
            return others
        start = (self._explore_round * k) % len(others)
        return [others[(start + i) % len(others)] for i in range(k)]

    def _probe_next_hops(self) -> None:
        wanted = set(self.route.routes()) | self._blocked | set(self._explored())
        for peer in self._prober.probing() - wanted:
            self._prober.stop(peer)
        for peer in sorted(wanted - self._prober.probing()):
            member = self._state.member(peer)
            if member is not None:
                self._start_link(member)

    async def _explore_loop(self) -> None:
        while True:
            await asyncio.sleep(self._state.config.explore_s)
            self._explore_round += 1
            self._probe_next_hops()

    def measured(self, member: MemberInfo) -> None:
        """The prober measured the link to `member` (first, or a lasting change): this node's
        report on its site, kept only while it differs materially from the link routing would
        take without it (module doc)."""
        me = self._state.members.me
        here, there = site_of(me.id, me.location), site_of(member.id, member.location)
        base = self._base.get(frozenset((here, there))) or self._default
        if here == there or base is None:
            return  # one site has one intra link; sites the matrix does not join stay apart
        rtts, bws = [], []
        for peer, estimate in sorted(self._prober.estimates.items()):
            head = self._state.member(peer)
            if head is None or site_of(head.id, head.location) != there:
                continue
            if estimate.rtt_ms is not None:
                rtts.append(estimate.rtt_ms)
            bw = estimate.bandwidth_gbps
            full = estimate.samples[1] >= self._state.config.bandwidth_window
            if bw is not None and self._state.config.report_bandwidth and full:
                # A full window only: a first measurement's few pairs on a busy machine read
                # a loopback at a fifth of its speed as often as not.
                bws.append(bw)
        cfg = self._state.config

        def differs(link: LinkSpec) -> bool:
            return material(
                base,
                link,
                tail=(me.compute_s, me.capacity),
                head=(member.compute_s, member.capacity),
                activation_bytes=self._state.swarm.activation_bytes,
                cost_rel=cfg.cost_hysteresis,
                cap_rel=cfg.cap_hysteresis,
            )

        rtt = report(there, statistics.median_low(rtts), None).rtt_ms if rtts else None
        bw = report(there, None, statistics.median_low(bws)).bandwidth_gbps if bws else None
        new = report(
            there,
            rtt if rtt is not None and differs(LinkSpec(rtt, base.bandwidth_gbps)) else None,
            bw if bw is not None and differs(LinkSpec(base.rtt_ms, bw)) else None,
        )
        if new.rtt_level is None and new.bandwidth_level is None:
            self._reports.pop(there, None)
        else:
            self._reports[there] = new
        self._publish()

    def observe_compute(self, kind: str, seconds: float) -> None:
        """A compute item of this node's stage (`kind`: forward or backward) took `seconds`
        while the process ran: a sample of its pace. Once the pace is due (gwtf.flow.pace: a
        majority of the window `factor` away from the record, the hold passed) the record says it, a
        new revision spread as news, and the view changes here at once (docs/design.md 2.13)."""
        state = self._state
        pace = state.pace
        if pace is None:
            return
        pace.observe(kind, seconds)
        if not state.settings.live_pace:
            return
        due = pace.due()
        if due is None:
            return
        before = pace.published_s
        pace.publish(due)
        members = state.members
        if members.set_pace(due, self._capacity(due)):
            state.log.info(
                "pace: %.4f s per microbatch measured, the record said %.4f (spread %.0f%%, "
                "running %.0f%% of the time): record revision %d, capacity %.2f mb/s; the next "
                "change waits %.0f s at least",
                due, before, 100 * pace.spread(), 100 * pace.availability, members.me.revision,
                members.me.capacity, pace.hold_s,
            )
            self.update_view()

    def reachable(self, member: MemberInfo, ok: bool) -> None:
        """The prober found live `member` unreachable (`ok` False) or reachable again."""
        if ok:
            self._blocked.discard(member.id)
        else:
            self._blocked.add(member.id)
        self._state.log.warning(
            "link %s->%s %s", self._state.node_id, member.id,
            "is back: arc unblocked" if ok else "failed while both live: arc blocked",
        )  # fmt: skip
        self._publish()

    def _publish(self) -> None:
        """This node's reports and blocked arcs into its record (a new revision if changed)."""
        members = self._state.members
        links = tuple(sorted(self._reports.values()))
        if members.set_links(links, tuple(sorted(self._blocked))):
            self._state.log.info(
                "links: record revision %d reports %s, blocks %s",
                members.me.revision,
                ", ".join(_described(r) for r in links) or "nothing",
                ", ".join(sorted(self._blocked)) or "nothing",
            )
            self.update_view()

    async def _solve_loop(self) -> None:
        route = self.route
        clock = self._state.clock
        while True:
            due = route.due()
            wait = None if due is None else due - clock()
            if wait is None or wait > 0:
                self._view_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._view_changed.wait(), wait)
                continue
            pending = route.begin_solve()
            if pending is None:
                continue
            started = clock()
            # Off the event loop (LocalRoute.begin_solve says why); one solve at a time.
            flows = await asyncio.to_thread(route.compute, pending)
            route.finish_solve(pending, flows, started)
            self._probe_next_hops()
            delay = route.message_delay_s()
            self._state.log.info(
                "routes: solved a view of %d members in %.1f ms, %.2f s (%s message delays) "
                "after it changed: %d units through here, next hops %s",
                route.view_size,
                1000 * route.last_solve_s,
                route.waited_s,
                f"{route.waited_s / delay:.0f}" if delay > 0 else "-",
                route.throughput(),
                route.routes() or "none",
            )

    # ------------------------------------------------------------------ arcs

    def arcs(self) -> list[OutArc]:
        """Every arc this node is the tail of in its view, with its flow."""
        return self.route.out_arcs()

    def params(self, arc: OutArc) -> ArcParamsSpec:
        """The parameters of an arc, as a tail would announce them."""
        return arc_params(
            self._state.members.me.compute_s,
            arc.head_compute_s,
            arc.link.rtt_ms,
            arc.link.bandwidth_gbps,
            self._state.swarm.activation_bytes,
        )

    def announced(self, peer: str) -> ArcParamsSpec | None:
        arc = next((a for a in self.arcs() if a.peer == peer), None)
        return self.params(arc) if arc is not None else None


def _described(r: LinkReport) -> str:
    rtt = "-" if r.rtt_ms is None else f"{r.rtt_ms:.1f} ms"
    bw = "-" if r.bandwidth_gbps is None else f"{r.bandwidth_gbps:.2f} Gbit/s"
    return f"{r.site} {rtt} {bw}"
