"""The membership side of a node's control plane (docs/design.md 3.3, 3.4, 3.9): heartbeats and
gossip, the failure detector's verdicts, coming back after a false death, the `Membership`
calls of peers, and telling every member when this node leaves.

The member table itself is gwtf.node.control.membership (pure); this module does its I/O and decides
what a change means for the rest of the node, in one order: the flows first (no more routing to
a dead member), then the metrics, then the job runtime, so that nothing the job reports about a
member is ahead of what the rest of the node says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from grpc import aio

from gwtf.node.control.flowcontrol import FlowControl
from gwtf.node.control.membership import Gossip, MemberEvent, MemberInfo
from gwtf.node.control.peers import Peers
from gwtf.node.errors import IdTaken, Mismatch, Stranger
from gwtf.node.rpc.codec import (
    InvalidMessage,
    check_name,
    member_from_pb,
    member_to_pb,
    members_from_pb,
    swarm_to_pb,
)
from gwtf.node.rpc.transport import is_refused
from gwtf.node.state import NodeState
from gwtf.node.status import StatusReport
from gwtf.v1 import node_pb2

__all__ = ["RECONNECT_S", "MembershipControl"]

RECONNECT_S = 1.0
"""How often a node also gossips with one member it holds dead (`Membership.reconnect_target`):
a partition's two sides each take the other for dead and stop calling it, so without these
calls they would never hear of each other again once it heals. A truly dead member's address
refuses the call at once (or it times out in the background)."""

MemberDown = Callable[[MemberInfo, str], None]
"""What the job runtime hears of a member that is gone: the member, and "left" or "died"."""


class MembershipControl:
    """Heartbeats, gossip and membership changes of one node."""

    def __init__(
        self,
        state: NodeState,
        peers: Peers,
        flows: FlowControl,
        status: StatusReport,
        member_down: MemberDown,
        member_up: Callable[[MemberInfo], None] | None = None,
    ) -> None:
        """`member_up`: what the job runtime hears of a member that is alive (anew)."""
        self._state = state
        self._peers = peers
        self._flows = flows
        self._status = status
        self._member_down = member_down
        self._member_up = member_up

    def start(self) -> None:
        """The node entered its swarm: heartbeats begin."""
        self._state.members.forget_news()
        self._state.spawn(self._heartbeat_loop(), "heartbeat")

    # ================================================================== changes

    def on_events(self, events: Iterable[MemberEvent]) -> None:
        """React to membership changes: arcs in and out of the flow state machine, the metrics,
        then the jobs. The order is the guarantee: the flows stop routing to a dead member and
        the metrics show its death before the job acts on it, so nothing the job reports about
        a member is ahead of what the rest of the node says."""
        state = self._state
        stats = state.stats
        events = list(events)
        if events:
            # Any change anywhere may call for price moves here, and lets this node ask for a
            # rescale (FlowNode.note_change), as the in-process bus does on every node.
            state.driver.note_change()
        down: list[MemberEvent] = []
        up: list[MemberInfo] = []
        for event in events:
            m = event.member
            if event.kind == "links":
                self._flows.links_changed(m)
                continue
            if event.kind == "alive":
                up.append(m)
                stats.joins += 1
                state.log.info(
                    "member %s alive (stage %d, %s%s): %s",
                    m.id,
                    m.stage,
                    m.address,
                    f", {m.location}" if m.location else "",
                    event.reason,
                )
                self._flows.member_up(m)
                continue
            if event.kind == "left":
                stats.leaves += 1
            else:
                stats.deaths += 1
            verb = "left" if event.kind == "left" else "declared dead"
            state.log.warning("member %s (stage %d) %s: %s", m.id, m.stage, verb, event.reason)
            self._flows.member_down(m)
            down.append(event)
        if events:
            self._status.publish_metrics()
        for event in down:
            self._member_down(event.member, "left" if event.kind == "left" else "died")
        if self._member_up is not None:
            for m in up:
                self._member_up(m)
        self._flows.after_change()

    def refused(self, member: MemberInfo) -> None:
        """A call to `member` was refused outright (nothing listens there): evidence for the
        failure detector, whichever part of the node made the call."""
        self.on_events(self._state.members.refused(member.id, member.epoch))

    def hear_verdicts(self, infos: list[MemberInfo]) -> None:
        """Verdicts (dead or left) another node acted on, merged as gossip is."""
        self.on_events(self._state.members.merge(i for i in infos if not i.alive))

    # ================================================================== heartbeats

    async def _heartbeat_loop(self) -> None:
        state = self._state
        config = state.config
        reconnect_at = time.monotonic() + RECONNECT_S
        while True:
            self._status.publish_metrics()
            await asyncio.sleep(config.heartbeat_s)
            members = state.members
            members.beat()
            events, to_ping = members.check()
            self.on_events(events)
            if members.declared_dead:
                self._reincarnate()
                continue
            targets = members.targets(config.gossip_fanout)
            calls = {m.id: m for m in targets}
            for m in (*members.watch_targets(), *to_ping):
                calls.setdefault(m.id, m)
            if time.monotonic() >= reconnect_at:
                reconnect_at = time.monotonic() + RECONNECT_S
                dead = members.reconnect_target()
                if dead is not None:
                    calls.setdefault(dead.id, dead)
            for m in calls.values():
                state.spawn(self._gossip_with(m), "gossip")
            if self._peers.wan is not None:
                for m in targets:
                    state.spawn(self._calibrate(m), "calibrate")

    async def _calibrate(self, member: MemberInfo) -> None:
        wan = self._peers.wan
        assert wan is not None
        rtt = await self._flows.echo(member, undelayed=True)
        if rtt is not None:
            wan.calibrate(rtt)

    async def _gossip_with(self, member: MemberInfo) -> None:
        state = self._state
        gossip = state.members.outgoing(member.id)
        request = node_pb2.GossipRequest(
            swarm_id=state.swarm.swarm_id,
            sender=state.node_id,
            members=[member_to_pb(m) for m in gossip.members],
            view=gossip.view,
            spreading=gossip.spreading,
        )
        state.stats.gossip_bytes += request.ByteSize()
        state.stats.gossip_calls += 1
        try:
            reply = await self._peers.stubs(member).membership.Gossip(
                request, timeout=state.config.rpc_timeout_s
            )
        except aio.AioRpcError as err:
            if is_refused(err):
                self.refused(member)
            return
        try:
            infos = members_from_pb(reply.members, state.swarm.num_stages)
        except InvalidMessage as err:
            state.log.warning("member %s sent invalid gossip: %s", member.id, err)
            return
        self.on_events(state.members.merge(infos))

    def _reincarnate(self) -> None:
        """Gossip says this incarnation is dead (a false suspicion): come back as a new one."""
        state = self._state
        old = state.members.me
        epoch = max(time.time_ns(), old.epoch + 1)
        state.log.warning("declared dead by the swarm; coming back as incarnation %d", epoch)
        self._flows.prober.stop_all()
        self._peers.reset()
        state.members.reincarnate(epoch)
        self._flows.new_incarnation()
        self.on_events([MemberEvent("alive", m, "re-linked") for m in state.members.alive()])

    # ================================================================== leaving

    async def leave(self) -> None:
        """Tell every live member that this node leaves (each call bounded by
        `leave_timeout_s`; a member that is not told learns it from gossip)."""
        state = self._state
        members = state.members.alive()
        me = state.members.me
        request = node_pb2.LeaveRequest(id=me.id, epoch=me.epoch)
        results = await asyncio.gather(
            *(
                self._peers.stubs(m).membership.Leave(
                    request, timeout=state.config.leave_timeout_s
                )
                for m in members
            ),
            return_exceptions=True,
        )
        told = sum(1 for r in results if not isinstance(r, BaseException))
        state.log.info("left the swarm: told %d of %d members", told, len(members))

    # ================================================================== membership calls

    def _check_swarm(self, swarm_id: str) -> None:
        swarm = self._state.swarm
        if swarm_id != swarm.swarm_id:
            raise Stranger(
                f"this node belongs to swarm {swarm.swarm_id}, not {swarm_id[:60]!r}",
            )

    def on_config(self, request: node_pb2.ConfigRequest) -> node_pb2.ConfigReply:
        self._state.require_ready()
        self._check_joinable_stage(request.stage)
        return node_pb2.ConfigReply(swarm=swarm_to_pb(self._state.swarm))

    def _check_joinable_stage(self, stage: int) -> None:
        num_stages = self._state.swarm.num_stages
        if stage >= num_stages:
            raise Mismatch(
                f"stage {stage} is outside this swarm's stages 0..{num_stages - 1}",
            )

    def on_join(self, request: node_pb2.JoinRequest) -> node_pb2.JoinReply:
        state = self._state
        state.require_ready()
        self._check_joinable_stage(request.member.stage)
        joiner = member_from_pb(request.member, state.swarm.num_stages)
        if not joiner.alive:
            raise InvalidMessage("a joiner must be alive")
        current = state.members.get(joiner.id)
        if current is not None and current.alive and current.address != joiner.address:
            raise IdTaken(
                f"id {joiner.id!r} is taken by a live member at {current.address}; "
                "choose another --id",
            )
        if current is not None and current.epoch >= joiner.epoch:
            raise IdTaken(
                f"an incarnation of {joiner.id!r} as recent as this one is known (is this "
                "machine's clock behind?); choose another --id",
            )
        if joiner.id == state.node_id:
            raise IdTaken(f"id {joiner.id!r} is this node's")
        self.on_events(state.members.merge([joiner]))
        driver = state.driver
        return node_pb2.JoinReply(
            swarm=swarm_to_pb(state.swarm),
            members=[member_to_pb(m) for m in state.members.digest()],
            round=driver.round,
            tightens=driver.tightens,
            final=driver.node.final,
        )

    def on_leave(self, request: node_pb2.LeaveRequest) -> node_pb2.LeaveReply:
        self._state.require_ready()
        self.on_events(self._state.members.leave(request.id, request.epoch))
        return node_pb2.LeaveReply()

    def on_gossip(self, request: node_pb2.GossipRequest) -> node_pb2.GossipReply:
        state = self._state
        state.require_ready()
        self._check_swarm(request.swarm_id)
        check_name("gossip sender", request.sender)
        infos = members_from_pb(request.members, state.swarm.num_stages)
        events, answer = state.members.incoming(
            request.sender, Gossip(tuple(infos), request.view, request.spreading)
        )
        self.on_events(events)
        reply = node_pb2.GossipReply(members=[member_to_pb(m) for m in answer.members])
        state.stats.gossip_bytes += reply.ByteSize()
        return reply
