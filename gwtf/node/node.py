"""Node: one gwtf process; builds its parts, wires them, and runs its lifecycle (docs/design.md 3).

    node = Node(settings, NodeConfig())
    port = await node.start()        # bind (port 0: a free one), NodeError if it cannot
    await node.enter_swarm()         # create a swarm, or join one through a bootstrap node
    await stop_event.wait()          # heartbeats, probes, flow messages, phases run meanwhile
    await node.leave()               # graceful: tell every member, then stop serving
    await node.close()

Everything runs on one event loop (uvloop in `gwtf node`); the state machines are called only
from it, between awaits, so they need no locks. Tasks, each bounded by deadlines:

- heartbeat: every `heartbeat_s`, increment the heartbeat, gossip with `gossip_fanout` members,
  apply the failure detector, and call silent members directly (gwtf.node.control.membercontrol);
- links: one task per arc this node owns as its tail (gwtf.node.control.prober, from
gwtf.node.control.flowcontrol);
- sends: one task per `Exchange` call, up to `max_inflight` per peer, retried with backoff
  (gwtf.node.control.flowcontrol, gwtf.node.control.peers, gwtf.node.control.driver);
- phases: the coordinator's waves and the members' nudges (gwtf.node.control.phasecoordinator);
- ticks: only in the uncoordinated `quiet_s` mode.

The parts, each holding the one `NodeState` (who the node is, its swarm, members and driver):

    peers    Peers: one channel per peer, the emulated WAN, the flow sends' backoff
    entry    SwarmEntry: creating or joining the swarm
    flows    FlowControl: arcs, sends, phases; host of the prober and the coordinator
    status   StatusReport: `Status.Get` and the metrics snapshot
    control  MembershipControl: heartbeats, gossip, what a membership change means
    jobs     JobManager: the job runtime (gwtf.node.jobs.manager)

The Node is what the servicers (gwtf.node.rpc.server) and the job runtime (gwtf.node.jobs.host)
call: each of its methods hands the call to the part that does it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

from grpc import aio

from gwtf.flow.topology import LinkSpec
from gwtf.node.config import NodeConfig, SwarmSettings
from gwtf.node.control.driver import FlowDriver
from gwtf.node.control.entry import SwarmEntry
from gwtf.node.control.flowcontrol import FlowControl
from gwtf.node.control.membercontrol import MembershipControl
from gwtf.node.control.membership import MemberEvent, MemberInfo, Membership
from gwtf.node.control.peers import Peers
from gwtf.node.errors import NodeError
from gwtf.node.faults import Fault
from gwtf.node.jobs.manager import JobManager
from gwtf.node.observe import NodeMetrics
from gwtf.node.rpc.ratelimit import RateLimiter, RateLimitInterceptor
from gwtf.node.rpc.relay import DIAL_TIMEOUT_S, RelayClient, RelayServer
from gwtf.node.rpc.security import TokenServerInterceptor, add_port
from gwtf.node.rpc.server import HealthServicer, add_servicers
from gwtf.node.rpc.transport import (
    MalformedRequestInterceptor,
    Stubs,
    WanServerInterceptor,
    server_options,
)
from gwtf.node.settings import NodeSettings
from gwtf.node.stalls import AVAILABILITY_WINDOW_S, StallWatch
from gwtf.node.state import NodeState
from gwtf.node.status import StatusReport
from gwtf.v1 import flow_pb2, node_pb2

__all__ = ["Node", "NodeError", "NodeSettings"]


def _advertised(host: str, advertise: str | None, port: int) -> str:
    """HOST:PORT that peers dial (an IPv6 literal in brackets)."""
    if advertise:
        host = advertise
    elif host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class Node:
    """One gwtf node: a gRPC server, a member of one swarm, one flow state machine."""

    def __init__(
        self,
        settings: NodeSettings,
        config: NodeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._state = state = NodeState(settings, config, clock)
        self._health = HealthServicer()
        self.metrics = NodeMetrics()
        self.limiter = RateLimiter(settings.rate_limit, clock)
        self._server: aio.Server | None = None
        self.port = 0
        self._peers = Peers(settings, config, clock)
        self._stalls = StallWatch()
        """Stretches the process did not run at all (a machine busy with something else)."""
        # A refused call is evidence for the failure detector whichever part made it: the flows
        # report it through the node, whose membership control is built after them.
        self._flows = FlowControl(state, self._peers, self.refused)
        self.relay = RelayServer(
            settings.host, self._dialable, lambda: self.node_id, self._relayable,
            settings.relay_limits, lambda: self.log, config.heartbeat_s,
        )
        """What this node carries for members that cannot be dialled (docs/design.md 3.11)."""
        self._status = StatusReport(state, self._peers, self._flows, self.metrics, self.limiter,
                                    self.relay)  # fmt: skip
        self.jobs = JobManager(self)
        self.metrics.add_source(self.jobs.metrics.collect)
        self._control = MembershipControl(
            state, self._peers, self._flows, self._status, self.jobs.on_member_down,
            self.jobs.on_member_up,
        )
        self._entry = SwarmEntry(state, self._peers, self.jobs, self._flows.new_driver)
        self.relocation: tuple[int, str] | None = None
        """(stage, what to log): the job coordinator moved this node (`move_to`)."""
        self.relocating = asyncio.Event()
        self.relayed: RelayClient | None = None
        """Its own attachment to a relay, when members cannot dial it."""

    @property
    def settings(self) -> NodeSettings:
        """The node's settings: those it was given until it entered its swarm, then with the
        stage it chose if it was given none (`--stage auto`, gwtf.node.control.entry)."""
        return self._state.settings

    # ================================================================== lifecycle

    async def start(self) -> int:
        """Bind and start serving (calls are refused until the node is in a swarm)."""
        creds = self.settings.credentials
        interceptors: list[aio.ServerInterceptor] = []
        if creds.token is not None:
            # First: a stranger's call is refused before anything else looks at it.
            interceptors.append(TokenServerInterceptor(creds.token, self._status.token_refused))
        if self.settings.rate_limit.enabled:
            # After the token: a stranger cannot spend a member's calls.
            interceptors.append(RateLimitInterceptor(self.limiter))
        interceptors.append(MalformedRequestInterceptor())
        if self._peers.wan is not None:
            interceptors.append(WanServerInterceptor(self._peers.wan))
        server = aio.server(options=server_options(), interceptors=interceptors)
        add_servicers(server, self, self._health, self.relay)
        host = self.settings.host
        bind = f"[{host}]" if ":" in host else host
        try:
            port = add_port(server, f"{bind}:{self.settings.port}", creds)
        except RuntimeError:
            port = 0
        if port == 0:
            raise NodeError(
                f"cannot listen on {host}:{self.settings.port}: the port is in use or the "
                "address is not this machine's; choose another --port (0 picks a free one)"
            )
        if self.settings.metrics_port is not None:
            try:
                self.metrics.serve(self.settings.metrics_port, host)
            except OSError as err:
                await server.stop(None)
                raise NodeError(
                    f"cannot serve metrics on {host}:{self.settings.metrics_port}: "
                    f"{err.strerror or err}; choose another --metrics-port (0 picks a free one)"
                ) from None
        await server.start()
        self._stalls.start()
        self._server = server
        self.port = port
        state = self._state
        state.identify(_advertised(host, self.settings.advertise, port))
        self._peers.open(state.node_id)
        state.spawn(self._peers.watch_schedule(self.log), "partition schedule")
        return port

    async def enter_swarm(self) -> None:
        """Create a swarm (no bootstrap) or join one; NodeError if that is impossible."""
        state = self._state
        joined_via = await self._entry.enter()
        if joined_via and await self._needs_relay(joined_via):
            await self._attach(joined_via)
        state.ready = True
        self._health.set_serving(True)
        self._control.on_events(
            [MemberEvent("alive", m, "known at start") for m in state.members.alive()]
        )
        self._control.start()
        self._flows.start()
        if self.relayed is not None:
            self._flows.relayed()
        if joined_via:
            state.spawn(self.jobs.learn_jobs(joined_via), "learn jobs")
        self._flows.after_change()

    # ================================================================== relays (3.11)

    def _dialable(self) -> str:
        """Its address if members can dial it there, else "" (it is relayed itself)."""
        return "" if self.relayed is not None else self.address

    def _relayable(self, node_id: str, epoch: int) -> bool:
        """Whether this node relays for that incarnation: a live member of its swarm."""
        member = self._state.members.get(node_id) if self._state.in_swarm else None
        return member is not None and member.alive and member.epoch == epoch

    async def _needs_relay(self, via: str) -> bool:
        """Whether members cannot dial it (`--relay`): "auto" asks the member it joined
        through to dial back at its address."""
        mode = self.settings.relay
        if mode != "auto":
            return mode == "always"
        try:
            reply = await self._peers.stubs_at(via).relay.DialBack(
                node_pb2.DialBackRequest(address=self.address),
                timeout=DIAL_TIMEOUT_S + self.config.rpc_timeout_s,
            )
        except aio.AioRpcError as err:
            self.log.warning("could not ask %s to dial back (%s): taken as reachable", via,
                             err.details() or err.code().name)  # fmt: skip
            return False
        if not reply.reachable:
            self.log.info("members cannot dial %s (%s): relayed", self.address, reply.detail)
        return not reply.reachable

    async def _attach(self, via: str) -> None:
        """Keep an attachment at a relay (gwtf.node.rpc.relay); NodeError if none takes it
        within the failure detector's time."""
        state = self._state
        host = self.settings.host
        local = f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{self.port}"
        if host in ("::", "[::]"):
            local = f"[::1]:{self.port}"
        client = RelayClient(self.node_id, lambda: state.members.me.epoch, local,
                             self._relay_candidates, self._announce_relay,
                             lambda: self.log)  # fmt: skip
        self.relayed = client
        state.spawn(client.run(), "relay attachment")
        try:
            await asyncio.wait_for(client.attached.wait(), self.config.failure_timeout_s * 2)
        except TimeoutError:
            raise NodeError(
                f"members cannot dial {self.address} and no member relays for it (joined "
                f"through {via}): forward the port and give --advertise, or --relay never to "
                "join as it is", 1,
            ) from None

    async def _relay_candidates(self) -> list[tuple[str, str, Any]]:
        """Members that can relay for it (dialled directly), those relaying for the fewest
        members first (their records say), then the nearest by an Echo's round trip; at most
        eight are measured."""
        me = self.node_id
        live = self.live_members()
        load: dict[str, int] = {}
        for m in live:
            if m.relay:
                load[m.relay] = load.get(m.relay, 0) + 1
        members = sorted((m for m in live if not m.relay and m.id != me),
                         key=lambda m: (load.get(m.id, 0), m.id))[:8]  # fmt: skip

        async def rtt(member: MemberInfo) -> float:
            start = time.monotonic()
            try:
                await self.stubs(member).probe.Echo(node_pb2.EchoRequest(nonce=1),
                                                    timeout=DIAL_TIMEOUT_S)  # fmt: skip
            except aio.AioRpcError:
                return float("inf")
            return time.monotonic() - start

        times = await asyncio.gather(*(rtt(m) for m in members))
        ranked = sorted((load.get(m.id, 0), t, m.id, m)
                        for t, m in zip(times, members, strict=True) if t < 1e9)  # fmt: skip
        return [(m.id, m.address, self.stubs(m).relay) for _, _, _, m in ranked]

    def _announce_relay(self, address: str, relay: str) -> None:
        self._state.address = address
        self._state.members.set_address(address, relay)
        if self._state.ready:
            self._flows.relayed()

    async def leave(self) -> None:
        """Graceful leave (docs/design.md 3.9): let the iteration in progress step here, stop
        working, tell every live member, stop serving new work."""
        state = self._state
        if state.stopping:
            return
        if state.ready:
            await self.jobs.drain()
        state.stopping = True
        self._health.set_serving(False)
        await state.cancel_tasks()
        if not state.ready or not state.in_swarm:
            return
        await self._control.leave()

    async def close(self) -> None:
        state = self._state
        state.stopping = True
        self._stalls.stop()
        await state.cancel_tasks()
        await self.jobs.close()
        if self._server is not None:
            await self._server.stop(self.config.shutdown_grace_s)
        await self._peers.close()

    # ================================================================== who and where

    @property
    def node_id(self) -> str:
        return self._state.node_id

    @node_id.setter
    def node_id(self, node_id: str) -> None:
        self._state.node_id = node_id

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return self._state.log

    @log.setter
    def log(self, log: logging.LoggerAdapter[logging.Logger]) -> None:
        self._state.log = log

    @property
    def address(self) -> str:
        """HOST:PORT that peers dial ("" until the node listens)."""
        return self._state.address

    @property
    def swarm(self) -> SwarmSettings:
        return self._state.swarm

    @property
    def members(self) -> Membership:
        return self._state.members

    @property
    def driver(self) -> FlowDriver:
        return self._state.driver

    # ================================================================== what servicers call

    def require_ready(self) -> None:
        """Refuses a call (UNAVAILABLE) until the node is in a swarm, and once it leaves."""
        self._state.require_ready()

    def on_config(self, request: node_pb2.ConfigRequest) -> node_pb2.ConfigReply:
        return self._control.on_config(request)

    def on_join(self, request: node_pb2.JoinRequest) -> node_pb2.JoinReply:
        return self._control.on_join(request)

    def on_leave(self, request: node_pb2.LeaveRequest) -> node_pb2.LeaveReply:
        return self._control.on_leave(request)

    def on_gossip(self, request: node_pb2.GossipRequest) -> node_pb2.GossipReply:
        return self._control.on_gossip(request)

    def on_exchange(self, request: flow_pb2.FlowBatch) -> flow_pb2.FlowAck:
        return self._flows.on_exchange(request)

    def on_phase(self, request: flow_pb2.PhaseCommand) -> flow_pb2.PhaseReport:
        return self._flows.on_phase(request)

    def on_nudge(self, request: flow_pb2.NudgeRequest) -> None:
        self._flows.on_nudge(request)

    async def on_status(self, request: node_pb2.StatusRequest) -> node_pb2.StatusReply:
        return await self._status.on_status(request)

    # ================================================================== what jobs need

    def own_stage(self) -> int:
        return self.members.me.stage

    def num_stages(self) -> int:
        return self.swarm.num_stages

    def live_members(self) -> list[MemberInfo]:
        """The live members other than this node."""
        return self.members.alive()

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member `node_id` (this node included), None if not alive here."""
        return self._state.member(node_id)

    def known_member(self, node_id: str) -> MemberInfo | None:
        return self.members.get(node_id)

    def stubs(self, member: MemberInfo) -> Stubs:
        """The stubs of `member` at the address its record gives now (a relayed member moves
        when its relay dies, docs/design.md 3.11; a caller may hold an older record)."""
        current = self._state.members.get(member.id) if self._state.in_swarm else None
        if current is not None and current.epoch == member.epoch:
            member = current
        return self._peers.stubs(member)

    def stubs_at(self, address: str) -> Stubs:
        return self._peers.stubs_at(address)

    def refused(self, member: MemberInfo) -> None:
        self._control.refused(member)

    def hear_verdicts(self, infos: list[MemberInfo]) -> None:
        self._control.hear_verdicts(infos)

    def wan_delay(self, member: MemberInfo, nbytes: int, *, bulk: bool = False) -> float:
        return self._peers.wan_delay(member, nbytes, bulk=bulk)

    def link(self, a: MemberInfo, b: MemberInfo) -> LinkSpec | None:
        return self._peers.link(a, b)

    def settled(self) -> bool:
        return self._flows.settled()

    def activation_bytes(self) -> int:
        return self.swarm.activation_bytes

    def routing(self) -> str:
        return self.swarm.routing

    def compress(self, codecs: tuple[str, ...] | None) -> None:
        self._flows.compress(codecs)

    def move_to(self, stage: int, note: str) -> None:
        """The job coordinator moved this node to `stage` (docs/design.md 2.11): whoever runs
        the node (`gwtf node`) leaves the swarm and starts a new incarnation there
        (`next_settings`)."""
        if self.relocation is None:
            self.relocation = (stage, note)
            self.relocating.set()

    def next_settings(self) -> NodeSettings:
        """The settings of this node's new incarnation at the stage it moves to: the same id
        and port, its stage chosen by placement (so still movable), joining through the live
        members it knows (then its own bootstrap addresses), and no metrics server of its own
        (the first incarnation's keeps the port)."""
        assert self.relocation is not None, "after move_to"
        s = self.settings
        live = [m.address for m in sorted(self.live_members(), key=lambda m: m.id)]
        bootstrap = tuple(dict.fromkeys(
            a for a in (*live, *s.bootstrap) if a and a != self.address
        ))
        return dataclasses.replace(
            s, stage=self.relocation[0], placed=True, port=self.port, node_id=self.node_id,
            bootstrap=bootstrap, metrics_port=None,
        )

    def routes(self) -> dict[str, int]:
        return self._flows.routes()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._state.spawn(coro, name)

    @property
    def memory_slots(self) -> int:
        return self.settings.memory_slots

    @property
    def trains(self) -> bool:
        return self.settings.train

    @property
    def emulate_compute_s(self) -> float | None:
        """What emulated compute pads a microbatch to: the compute time the node entered with,
        not the pace it measures since (which the padding itself would feed)."""
        if not self.settings.emulate_compute:
            return None
        pace = self._state.pace
        return pace.declared_s if pace is not None else self.members.me.compute_s

    def observe_compute(self, kind: str, started: float, ended: float,
                        device_s: float | None = None) -> None:
        """A compute item of the job's stage ran from `started` to `ended` (monotonic clock):
        a sample of the node's pace (gwtf.flow.pace), less what of it the process was stalled
        (or `device_s`, an emulated device's time for it), with the share of the recent time
        the process ran."""
        pace = self._state.pace
        if pace is None:
            return
        running = (max(0.0, ended - started - self._stalls.stalled_between(started, ended))
                   if device_s is None else device_s)
        pace.set_availability(self._stalls.availability(AVAILABILITY_WINDOW_S))
        local = self._flows.local
        if local is not None:
            local.observe_compute(kind, running)
        else:
            pace.observe(kind, running)

    def live_pace_s(self) -> float:
        """Seconds per microbatch this node measures now (its record's until it has measured):
        what its data plane tells senders (gwtf.job.nexthop.live_weights)."""
        pace = self._state.pace
        if pace is None or not self.settings.live_pace:
            return 0.0
        pace.set_availability(self._stalls.availability(AVAILABILITY_WINDOW_S))
        return pace.live_s()

    @property
    def fault(self) -> Fault | None:
        return self.settings.fault
