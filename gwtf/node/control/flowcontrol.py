"""The flow side of a node's control plane: its flow state machine wired to its peers
(docs/design.md 2.7, 3.5).

- arcs: a member of the next stage gets a link task (gwtf.node.control.prober), which creates
  the arc once measured; a member of stage 0 seen from the last stage gets a ring arc at once; a
  member that dies or leaves loses both;
- sends: after anything touched the driver, one `Exchange` call per peer with something queued
  (gwtf.node.control.driver), held back after a failure (gwtf.node.control.peers); the reply is
  the ack;
- phases: the host of the phase coordinator (gwtf.node.control.phasecoordinator), and in the
  uncoordinated `quiet_s` mode the ticks that tighten on their own.

That is the relaxation (`--routing relax`). With local routing (the default, docs/design.md
2.12) none of it runs: the node keeps the records of its live members in a `LocalRoute`,
solves them once they have been quiet for `route_quiet_s`, repairs a dead next hop at once, and
routes by its own out-arcs of the result; no flow message is sent (gwtf.node.control.routing). The
routing takes its links from what the members measured and put in their records, and from the
location matrix where no one did; the probes run on the arcs that carry this node's flow and a
few explored ones, and what they measure is in its status.

`FlowControl` is the host of the prober and of the coordinator: it knows how to call a member
and what an arc is. What the membership means for the arcs is decided in
gwtf.node.control.membercontrol, which calls `member_up` and `member_down`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from grpc import aio

from gwtf.flow.relax.decentralized import FlowConfig
from gwtf.flow.topology import cap_to_units
from gwtf.node.control.driver import ArcAnnounce, FlowDriver, Outgoing
from gwtf.node.control.links import ArcParamsSpec, LinkEstimate, arc_params, ring_params
from gwtf.node.control.membership import MemberInfo
from gwtf.node.control.peers import Peers
from gwtf.node.control.phasecoordinator import PhaseCoordinator
from gwtf.node.control.phases import Command, PhaseReportData
from gwtf.node.control.prober import LinkProber
from gwtf.node.control.routing import LocalRouting
from gwtf.node.errors import InvalidOrder, Stranger
from gwtf.node.rpc.codec import (
    InvalidMessage,
    arc_to_pb,
    batch_from_pb,
    flow_message_to_pb,
    report_from_pb,
    report_to_pb,
)
from gwtf.node.rpc.transport import UNDELAYED, is_refused
from gwtf.node.state import NodeState
from gwtf.v1 import flow_pb2, node_pb2

__all__ = ["MAX_ROUND_AHEAD", "FlowControl", "max_phases"]

MAX_ROUND_AHEAD = 16
"""How far ahead of a member's scaling round a coordinator's command may be."""


def max_phases(config: FlowConfig) -> int:
    """Phases of one scaling: eps_start tightened by eps_factor down to eps_final (+1 spare)."""
    phases, eps = 0, config.eps_start
    while eps > config.eps_final:
        eps = max(config.eps_final, eps // config.eps_factor)
        phases += 1
    return phases + 1


class FlowControl:
    """The flow driver's arcs, sends and phases on one node. `refused` is the node's failure
    detector: a call refused outright (nothing listens there) is evidence of a death."""

    def __init__(
        self, state: NodeState, peers: Peers, refused: Callable[[MemberInfo], None]
    ) -> None:
        self._state = state
        self._peers = peers
        self._refused = refused
        self.prober = LinkProber(self, state.config, state.clock, state.spawn)
        self._phases: PhaseCoordinator | None = None
        self._was_quiet = False
        self._swarm_scaling = True
        # Set at every change, for the tick loop (`quiet_s` mode) to look at the driver again.
        self._changed = asyncio.Event()
        self._local: LocalRouting | None = None

    @property
    def node_id(self) -> str:
        return self._state.node_id

    @property
    def local(self) -> LocalRouting | None:
        """This node's local routing (None: the swarm routes by the relaxation)."""
        state = self._state
        if self._local is None and state.swarm.routing in ("local", "swarm"):
            self._local = LocalRouting(state, self.prober, self._start_link)
        return self._local

    def new_driver(
        self, me: MemberInfo, *, warm: bool, round_: int, tightens: int
    ) -> FlowDriver:
        """A flow state machine for this incarnation `me`, entering the swarm's phase: warm at
        the final epsilon, `round_` and `tightens` as the swarm is."""
        swarm = self._state.swarm
        return FlowDriver(
            me.id,
            me.stage,
            swarm.num_stages,
            cap_to_units(me.capacity),
            swarm.flow,
            self._state.clock,
            epoch=me.epoch,
            warm=warm,
            round_=round_,
            tightens=tightens if not warm else 0,
            max_inflight=self._state.config.max_inflight,
        )

    def new_incarnation(self) -> None:
        """This node came back as a new incarnation (gwtf.node.control.membercontrol): a new state
        machine, at the phase the old one had reached. Sends still in flight for the old one are
        dropped when they return."""
        previous = self._state.driver
        self._state.driver = self.new_driver(
            self._state.members.me,
            warm=previous.node.final,
            round_=previous.round,
            tightens=previous.tightens,
        )

    def start(self) -> None:
        """The node entered its swarm: the phase coordinator runs, and the ticks in `quiet_s`
        mode; with local routing, the solve loop instead."""
        state = self._state
        if self.local is not None:
            self.local.start()
            return
        quiet_s = state.swarm.flow.quiet_s
        self._phases = PhaseCoordinator(
            self,
            num_stages=state.swarm.num_stages,
            coordinated=quiet_s is None,
            config=state.config,
            clock=state.clock,
            log=state.log,
        )
        state.spawn(self._phases.run(), "phases")
        if quiet_s is not None:
            state.spawn(self._tick_loop(), "ticks")

    # ================================================================== arcs

    def member_up(self, member: MemberInfo) -> None:
        """A member is alive: the arc this node owns to it, if any (measured first, but for the
        ring's return arcs, which need no probes)."""
        me = self._state.members.me
        last = self._state.swarm.num_stages - 1
        if self.local is not None:
            self.local.update_view()
            return
        if me.stage == last and member.stage == 0:
            params = ring_params(me.capacity, member.capacity)
            self._state.driver.own_arc(member.id, member.epoch, params, ring=True)
        elif member.stage == me.stage + 1 and me.stage != last:
            self._start_link(member)

    def links_changed(self, member: MemberInfo) -> None:
        """A member's record has new measured links or blocked arcs (local routing only)."""
        if self.local is not None:
            self.local.update_view()

    def member_down(self, member: MemberInfo) -> None:
        """A member died or left: no more probes, arcs or queued messages for it."""
        self.prober.stop(member.id)
        self._state.driver.drop_peer(member.id)
        self._peers.forget(member.id)
        if self.local is not None:
            self.local.member_down(member)

    def _start_link(self, member: MemberInfo) -> None:
        if not self._peers.linked(member):
            self._state.log.warning(
                "no link from %s to %s in the matrix: no arc to %s",
                self._state.settings.location,
                member.location,
                member.id,
            )
            return
        self.prober.start(member)

    # ------------------------------------------------------------------ what the prober needs

    async def echo(
        self, member: MemberInfo, payload: bytes = b"", *, undelayed: bool = False
    ) -> float | None:
        """One probe's round trip in seconds, None if it failed. `undelayed`: through the
        local stack only (the emulated WAN lets it through at once), to calibrate the WAN."""
        state = self._state
        assert state.rng is not None
        request = node_pb2.EchoRequest(
            sender=state.node_id, nonce=int(state.rng.integers(2**63)), payload=payload
        )
        metadata = ((UNDELAYED, "1"),) if undelayed else None
        # At the address its record gives now: a relayed member moves when its relay dies
        # (docs/design.md 3.11), and a prober holds the record it started with.
        member = state.members.get(member.id) or member
        start = time.perf_counter()
        try:
            await self._peers.stubs(member).probe.Echo(
                request, timeout=state.config.rpc_timeout_s, metadata=metadata
            )
        except aio.AioRpcError as err:
            if is_refused(err):
                self._refused(member)
            return None
        return time.perf_counter() - start

    def is_alive(self, member: MemberInfo) -> bool:
        return self._state.members.is_alive(member.id, member.epoch)

    def announced(self, peer: str) -> ArcParamsSpec | None:
        if self.local is not None:
            return self.local.announced(peer)
        owned = self._state.driver.owned.get(peer)
        return owned.params if owned is not None else None

    def reachable(self, member: MemberInfo, ok: bool) -> None:
        """The probes to live `member` have failed for a failure timeout (`ok` False), or got
        through again: local routing blocks the arc, or unblocks it."""
        if self.local is not None:
            self.local.reachable(member, ok)

    def settled(self) -> bool:
        """Not in the middle of a scaling: a re-measured arc waits until the phases are over.
        Re-created mid-scaling, it restarts the scaling (gwtf.node.control.phases); at the final
        epsilon the state machines absorb it locally unless it moves the bottleneck. Local
        routing: a solution is held (repaired or not), so jobs route by it."""
        if self.local is not None:
            return self.local.route.has_solution
        return self._state.driver.node.final and not self._swarm_scaling

    def params(self, member: MemberInfo, estimate: LinkEstimate) -> ArcParamsSpec:
        rtt_ms, bw = estimate.rtt_ms, estimate.bandwidth_gbps
        assert rtt_ms is not None and bw is not None
        me = self._state.members.me
        return arc_params(
            me.compute_s, member.compute_s, rtt_ms, bw, self._state.swarm.activation_bytes
        )

    def create_arc(self, member: MemberInfo, estimate: LinkEstimate, reason: str) -> None:
        params = self.params(member, estimate)
        if self.local is not None:
            self._state.log.debug(
                "link %s->%s %s: rtt %.2f ms, %.3f Gbit/s", self._state.node_id, member.id,
                reason, params.rtt_ms, params.bandwidth_gbps,
            )  # fmt: skip
            self.local.measured(member)
            return
        driver = self._state.driver
        driver.own_arc(member.id, member.epoch, params, ring=False)
        self._state.log.info(
            "arc %s->%s %s: rtt %.2f ms, %.3f Gbit/s, cap %d, cost %d (gen %d)",
            self._state.node_id,
            member.id,
            reason,
            params.rtt_ms,
            params.bandwidth_gbps,
            params.cap,
            params.cost,
            driver.owned[member.id].gen,
        )
        self.after_change()

    def relayed(self) -> None:
        """This node's relay changed (docs/design.md 3.11): the local routing restates its
        capacity with its share of the relay's uplink; the relaxation keeps it."""
        if self.local is not None:
            self.local.relayed()

    def compress(self, codecs: tuple[str, ...] | None) -> None:
        """A job's compression plan (one codec per boundary; None: none) prices the local
        routing's arcs (docs/design.md 2.15); the relaxation keeps the swarm's bytes."""
        if self.local is None:
            return
        from gwtf.flow.compression import boundary_sizes

        sizes = None
        if codecs is not None and any(c != "none" for c in codecs):
            sizes = boundary_sizes(self._state.swarm.activation_bytes, codecs)
        self.local.compress(sizes)

    def routes(self) -> dict[str, int]:
        """Flow units to each next-stage peer: what the data plane splits microbatches by."""
        local = self.local
        return local.route.routes() if local is not None else self._state.driver.routes()

    # ================================================================== flow messages

    def _nudge(self) -> None:
        if self._phases is not None:
            self._phases.nudge()

    def quiet(self) -> bool:
        """Nothing to send or measure here (a wave of the phase detection counts on it); local
        routing: the view held is the one solved."""
        if self.local is not None:
            return self.local.route.quiet
        return self._state.driver.quiet() and not self.prober.measuring

    def after_change(self) -> None:
        """After anything touched the driver: start senders, and nudge the coordinator when
        this node has just become quiet while the swarm is still scaling."""
        state = self._state
        if not state.serving:
            return
        driver = state.driver
        self._send_ready()
        quiet = self.quiet()
        if quiet and not self._was_quiet and (self._swarm_scaling or not driver.node.final):
            self._nudge()
        if driver.node.wants_rescale():
            self._nudge()
        self._was_quiet = quiet
        self._changed.set()

    def _send_ready(self) -> None:
        """Start a call for every peer with something queued and room for another call in
        flight (and not backing off after a failure)."""
        driver = self._state.driver
        now = self._state.clock()
        for peer in driver.ready_peers():
            if self._peers.backing_off(peer, now):
                continue
            out = driver.take(peer)
            if out is not None:
                self._state.spawn(self._send(driver, out), "send")

    def _back_off(self, peer: str) -> None:
        delay = self._peers.back_off(peer)
        asyncio.get_running_loop().call_later(delay, self.after_change)

    async def _send(self, driver: FlowDriver, out: Outgoing) -> None:
        """One `Exchange` call; its reply is the acknowledgement (see gwtf.node.control.driver)."""
        state = self._state
        member = state.members.get(out.peer)
        if member is None or not member.alive:
            driver.failed(out)
            return
        request = flow_pb2.FlowBatch(
            messages=[flow_message_to_pb(m) for m in out.messages],
            arcs=[arc_to_pb(a) for a in out.arcs],
            sender=state.node_id,
            sender_epoch=driver.epoch,
        )
        try:
            ack = await self._peers.stubs(member).flow.Exchange(
                request, timeout=state.config.rpc_timeout_s
            )
        except aio.AioRpcError as err:
            driver.failed(out)
            if is_refused(err):
                self._refused(member)
            self._back_off(out.peer)
            return
        except asyncio.CancelledError:
            driver.failed(out)
            raise
        if driver is not state.driver:
            return  # this node came back as a new incarnation meanwhile
        driver.delivered(out, accepted=ack.ok)
        if ack.ok:
            self._peers.succeeded(out.peer)
        else:
            state.log.debug("%s refused an arc: %s", out.peer, ack.error)
            self._back_off(out.peer)
        self.after_change()

    def on_exchange(self, request: flow_pb2.FlowBatch) -> flow_pb2.FlowAck:
        self._state.require_ready()
        driver = self._state.driver
        arcs, messages = batch_from_pb(request, self._state.node_id)
        errors = []
        for ann in arcs:
            problem = self._check_announce(ann)
            if problem:
                errors.append(problem)
            else:
                driver.accept_arc(ann)
        if messages:
            driver.receive(messages)
        self.after_change()
        return flow_pb2.FlowAck(ok=not errors, error="; ".join(errors))

    def _check_announce(self, ann: ArcAnnounce) -> str:
        state = self._state
        if ann.head_epoch != state.driver.epoch:
            return f"arc {ann.tail}->{ann.head} is for another incarnation of {ann.head}"
        tail = state.members.get(ann.tail)
        if tail is None or not tail.alive or tail.epoch != ann.tail_epoch:
            return f"{ann.tail} (incarnation {ann.tail_epoch}) is not a live member here yet"
        stage, last = state.settings.stage, state.swarm.num_stages - 1
        if not (tail.stage + 1 == stage or (tail.stage == last and stage == 0)):
            return f"no arc from stage {tail.stage} to stage {stage}"
        return ""

    # ================================================================== phases

    def live_members(self) -> list[MemberInfo]:
        return self._state.members.alive()

    def own_stage(self) -> int:
        return self._state.members.me.stage

    def wants_rescale(self) -> bool:
        return self._state.driver.node.wants_rescale()

    def phase_state(self) -> tuple[int, int]:
        driver = self._state.driver
        return driver.round, driver.tightens

    async def nudge_coordinator(self, coordinator: MemberInfo) -> None:
        state = self._state
        request = flow_pb2.NudgeRequest(sender=state.node_id, wants_rescale=self.wants_rescale())
        with contextlib.suppress(aio.AioRpcError):
            await self._peers.stubs(coordinator).flow.Nudge(
                request, timeout=state.config.rpc_timeout_s
            )

    async def call_phase(self, member: MemberInfo, command: Command) -> PhaseReportData | None:
        state = self._state
        request = flow_pb2.PhaseCommand(
            coordinator=state.node_id,
            round=command.round,
            tightens=command.tightens,
            scaling=command.scaling,
        )
        try:
            reply = await self._peers.stubs(member).flow.Phase(
                request, timeout=state.config.rpc_timeout_s
            )
            report = report_from_pb(reply)
        except aio.AioRpcError as err:
            if is_refused(err):
                self._refused(member)
            return None
        except InvalidMessage:
            return None
        if report.id != member.id or report.epoch != member.epoch:
            return None
        return report

    def on_nudge(self, request: flow_pb2.NudgeRequest) -> None:
        if self._state.serving and self._phases is not None:
            self._phases.nudged()

    def on_phase(self, request: flow_pb2.PhaseCommand) -> flow_pb2.PhaseReport:
        state = self._state
        state.require_ready()
        # Checked before anything moves: a command names a live member as its coordinator, at
        # most the phases a scaling has (each one is a tighten call: a huge count from a bad
        # peer would hold the event loop), and a round at most a few ahead of this node's (a
        # member that missed waves sees a small jump; a far one would desynchronise it).
        if request.coordinator != state.node_id and not any(
            m.id == request.coordinator for m in state.members.alive()
        ):
            raise Stranger(
                f"phase command from {request.coordinator[:40]!r}, not a live member",
            )
        limit = max_phases(state.swarm.flow)
        if request.tightens > limit:
            raise InvalidOrder(
                f"phase command ends {request.tightens} phases; a scaling has {limit}",
            )
        if request.round > state.driver.round + MAX_ROUND_AHEAD:
            raise InvalidOrder(
                f"phase command for round {request.round}, this node is in round "
                f"{state.driver.round}",
            )
        command = Command(request.round, request.tightens, request.scaling)
        return report_to_pb(self.apply_command(command))

    def apply_command(self, command: Command) -> PhaseReportData:
        state = self._state
        driver = state.driver
        before = (driver.round, driver.tightens)
        driver.apply(command.round, command.tightens)
        after = (driver.round, driver.tightens)
        if after != before:
            if after[0] != before[0]:
                state.log.info("rescale: round %d", after[0])
            state.log.debug("phase %d of round %d (eps %d)", after[1], after[0], driver.node.eps)
        self._swarm_scaling = command.scaling
        self.after_change()
        return driver.report(
            measuring=bool(self.prober.measuring), view=state.members.view_hash()
        )

    async def _tick_loop(self) -> None:
        """`quiet_s` mode: each node tightens on its own after a quiet spell."""
        state = self._state
        while True:
            due = state.driver.next_tick()
            if due is None:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), state.config.idle_tick_s)
                continue
            await asyncio.sleep(max(0.0, due - state.clock()))
            state.driver.tick()
            self.after_change()
