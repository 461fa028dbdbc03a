"""Local routing on a node (docs/design.md 2.12): its `LocalRoute` fed from the member table.

- the view: the records of the live members (this node's included), from the member table of
  gwtf.node.membership; without a link matrix every member is put at one site joined by the
  intra-location link, as placement does (2.11);
- the solve loop: a solve once the view has been quiet for `route_quiet_s`;
- a dead next hop: repaired at once (`LocalRoute.lost`), before the member table's change is
  solved;
- probes: only on the arcs that carry this node's flow, started and stopped as the solution
  changes (every next-stage member would be O(N^2/S) probes in the swarm, for links it does not
  use).

gwtf.node.flows creates it when the swarm routes locally and hands it the membership changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gwtf.flow.localroute import LocalRoute, OutArc
from gwtf.flow.topology import DEFAULT_INTRA, NodeSpec
from gwtf.node.entry import ONE_SITE
from gwtf.node.links import ArcParamsSpec, arc_params
from gwtf.node.membership import MemberInfo
from gwtf.node.prober import LinkProber
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
        self.route = LocalRoute(
            state.node_id,
            swarm.num_stages,
            swarm.activation_bytes,
            state.settings.links or {},
            DEFAULT_INTRA,
            quiet_s=state.config.route_quiet_s,
            clock=state.clock,
        )
        # Set at every change of the view, for the solve loop.
        self._view_changed = asyncio.Event()

    def start(self) -> None:
        self.update_view()
        self._state.spawn(self._solve_loop(), "solves")

    def update_view(self) -> None:
        hops = self.route.routes()
        if self.route.set_view(self._records()):
            if self.route.routes() != hops:
                # A next hop's record is gone or now of another stage (it moved): repaired.
                self._state.log.info("routes: a next hop left the next stage, its share "
                                     "re-split at once: next hops %s",
                                     self.route.routes() or "none")
                self._probe_next_hops()
            self._view_changed.set()

    def member_down(self, member: MemberInfo) -> None:
        """`member` died or left: repair at once if it was a next hop, then a new view."""
        if self.route.member_gone(member.id, self._records()):
            self._state.log.info(
                "routes: next hop %s is gone, its share re-split at once: next hops %s",
                member.id,
                self.route.routes() or "none",
            )
            self._probe_next_hops()
        self._view_changed.set()

    def _records(self) -> list[NodeSpec]:
        members = self._state.members
        matrix = self._state.settings.links is not None
        return [
            NodeSpec(m.id, m.stage, m.compute_s, (m.location if matrix else "") or ONE_SITE,
                     m.capacity)
            for m in (members.me, *members.alive())
        ]  # fmt: skip

    def _probe_next_hops(self) -> None:
        hops = set(self.route.routes())
        for peer in self._prober.probing() - hops:
            self._prober.stop(peer)
        for peer in sorted(hops - self._prober.probing()):
            member = self._state.member(peer)
            if member is not None:
                self._start_link(member)

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
            if route.solve():
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
