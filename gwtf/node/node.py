"""Node: one gwtf process, the asyncio orchestration of the control plane (docs/design.md 3).

    node = Node(settings, NodeConfig())
    port = await node.start()        # bind (port 0: a free one), NodeError if it cannot
    await node.enter_swarm()         # create a swarm, or join one through a bootstrap node
    await stop_event.wait()          # heartbeats, probes, flow messages, phases run meanwhile
    await node.leave()               # graceful: tell every member, then stop serving
    await node.close()

Everything runs on one event loop (uvloop in `gwtf node`); the state machines are called only
from it, between awaits, so they need no locks. Tasks, each bounded by deadlines:

- heartbeat: every `heartbeat_s`, increment the heartbeat, gossip with `gossip_fanout` members,
  apply the failure detector, and call silent members directly (gwtf.node.membership);
- links: one task per arc this node owns as its tail (gwtf.node.prober);
- sends: one task per `Exchange` call, up to `max_inflight` per peer, retried with backoff
  (gwtf.node.driver);
- phases: the coordinator's waves and the members' nudges (gwtf.node.coordinator);
- ticks: only in the uncoordinated `quiet_s` mode.

The Node is the host of the prober and the coordinator: it knows how to reach a member (one
channel per peer, gwtf.node.transport) and what membership changes mean for the arcs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import zlib
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from grpc import aio

from gwtf.flow.decentralized import FlowConfig
from gwtf.flow.topology import cap_to_units
from gwtf.node.codec import (
    InvalidMessage,
    arc_to_pb,
    batch_from_pb,
    flow_message_to_pb,
    member_from_pb,
    member_to_pb,
    members_from_pb,
    report_from_pb,
    report_to_pb,
    swarm_from_pb,
    swarm_to_pb,
)
from gwtf.node.config import NodeConfig, SwarmSettings
from gwtf.node.coordinator import PhaseCoordinator
from gwtf.node.driver import ArcAnnounce, FlowDriver, Outgoing
from gwtf.node.errors import NodeError, Refusal
from gwtf.node.faults import Fault
from gwtf.node.jobs import JobManager
from gwtf.node.links import ArcParamsSpec, LinkEstimate, arc_params, ring_params
from gwtf.node.membership import MemberEvent, MemberInfo, Membership
from gwtf.node.observe import NodeLog, NodeMetrics
from gwtf.node.peers import Peers
from gwtf.node.phases import Command, PhaseReportData
from gwtf.node.prober import LinkProber
from gwtf.node.ratelimit import RateLimiter, RateLimitInterceptor
from gwtf.node.security import TokenServerInterceptor, add_port
from gwtf.node.server import HealthServicer, add_servicers
from gwtf.node.settings import NodeSettings
from gwtf.node.transport import (
    UNDELAYED,
    MalformedRequestInterceptor,
    Stubs,
    WanServerInterceptor,
    is_refused,
    server_options,
)
from gwtf.v1 import flow_pb2, node_pb2

__all__ = ["Node", "NodeError", "NodeSettings"]

LOG = logging.getLogger("gwtf.node")


@dataclass
class _Stats:
    gossip_bytes: int = 0
    gossip_calls: int = 0
    deaths: int = 0
    leaves: int = 0
    joins: int = 0
    started: float = field(default_factory=time.monotonic)


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
        self.settings = settings
        self.config = config
        self._clock = clock
        self.log: logging.LoggerAdapter[logging.Logger] = NodeLog(
            LOG, {"node": settings.node_id or "-", "stage": settings.stage}
        )
        self._peers = Peers(settings, config, clock)
        self._health = HealthServicer()
        self.metrics = NodeMetrics()
        self.limiter = RateLimiter(settings.rate_limit, clock)
        self._token_refusals = 0
        # What the metrics thread reads: a copy made on the loop, replaced whole.
        self._refusals: dict[str, int] = {}
        self.metrics.add_source(self._refusal_metrics)
        self._server: aio.Server | None = None
        self.node_id = settings.node_id or ""
        self.address = ""
        self.port = 0
        # Set by enter_swarm:
        self._swarm: SwarmSettings | None = None
        self._members: Membership | None = None
        self._driver: FlowDriver | None = None
        self._ready = False
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.prober = LinkProber(self, config, clock, self.spawn)
        self._was_quiet = False
        self._swarm_scaling = True
        self._phases: PhaseCoordinator | None = None
        self._changed: asyncio.Event | None = None
        self._joined_via = ""
        self._stats = _Stats()
        self._rng: np.random.Generator | None = None
        self.jobs = JobManager(self)
        self.metrics.add_source(self.jobs.metrics.collect)

    # ================================================================== lifecycle

    async def start(self) -> int:
        """Bind and start serving (calls are refused until the node is in a swarm)."""
        creds = self.settings.credentials
        interceptors: list[aio.ServerInterceptor] = []
        if creds.token is not None:
            # First: a stranger's call is refused before anything else looks at it.
            interceptors.append(TokenServerInterceptor(creds.token, self._token_refused))
        if self.settings.rate_limit.enabled:
            # After the token: a stranger cannot spend a member's calls.
            interceptors.append(RateLimitInterceptor(self.limiter))
        interceptors.append(MalformedRequestInterceptor())
        if self._peers.wan is not None:
            interceptors.append(WanServerInterceptor(self._peers.wan))
        server = aio.server(options=server_options(), interceptors=interceptors)
        add_servicers(server, self, self._health)
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
        self._server = server
        self.port = port
        self.address = _advertised(host, self.settings.advertise, port)
        if not self.node_id:
            self.node_id = self.address
        self.log = NodeLog(
            LOG, {"node": self.node_id, "stage": self.settings.stage}
        )
        self._peers.open(self.node_id)
        seed = self.settings.seed
        if seed is None:
            seed = zlib.crc32(self.node_id.encode())
        self._rng = np.random.default_rng(seed)
        self._changed = asyncio.Event()
        return port

    async def enter_swarm(self) -> None:
        """Create a swarm (no bootstrap) or join one; NodeError if that is impossible."""
        if self.settings.bootstrap:
            await self._join()
        else:
            await self._create()
        self._ready = True
        self._health.set_serving(True)
        assert self._members is not None
        self._on_events(
            [MemberEvent("alive", m, "known at start") for m in self._members.alive()]
        )
        self.spawn(self._heartbeat_loop(), "heartbeat")
        self._phases = PhaseCoordinator(
            self,
            num_stages=self.swarm.num_stages,
            coordinated=self.swarm.flow.quiet_s is None,
            config=self.config,
            clock=self._clock,
            log=self.log,
        )
        self.spawn(self._phases.run(), "phases")
        if self.swarm.flow.quiet_s is not None:
            self.spawn(self._tick_loop(), "ticks")
        if self._joined_via:
            self.spawn(self.jobs.catch_up(self._joined_via), "jobs catch-up")
        self._after_change()

    async def leave(self) -> None:
        """Graceful leave: stop working, tell every live member, stop serving new work."""
        if self._stopping:
            return
        if self._ready:
            await self.jobs.drain()
        self._stopping = True
        self._health.set_serving(False)
        await self._cancel_tasks()
        if not self._ready or self._members is None:
            return
        members = self._members.alive()
        me = self._members.me
        request = node_pb2.LeaveRequest(id=me.id, epoch=me.epoch)
        results = await asyncio.gather(
            *(
                self.stubs(m).membership.Leave(request, timeout=self.config.leave_timeout_s)
                for m in members
            ),
            return_exceptions=True,
        )
        told = sum(1 for r in results if not isinstance(r, BaseException))
        self.log.info("left the swarm: told %d of %d members", told, len(members))

    async def close(self) -> None:
        self._stopping = True
        await self._cancel_tasks()
        await self.jobs.close()
        if self._server is not None:
            await self._server.stop(self.config.shutdown_grace_s)
        await self._peers.close()

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            self.log.error("task %s failed: %r", task.get_name(), err, exc_info=err)

    # ================================================================== entering

    async def _create(self) -> None:
        s = self.settings
        if s.num_stages is None:
            raise NodeError(
                "the first node of a swarm needs --stages S (or give --bootstrap HOST:PORT "
                "to join a running swarm)",
                2,
            )
        epoch = time.time_ns()
        try:
            swarm = SwarmSettings.create(
                f"{self.node_id}@{epoch}",
                s.num_stages,
                activation_bytes=s.activation_bytes,
                max_arc_cost_s=s.max_arc_cost_s,
                min_arc_cost_s=s.min_arc_cost_s,
                quiet_s=s.quiet_s,
            )
        except ValueError as err:
            raise NodeError(f"cannot create a swarm: {err}", 2) from None
        self._check_stage(swarm)
        await self._preload()
        compute_s = await self._compute_s(swarm)
        self._setup(swarm, self._me(compute_s, epoch), warm=False, round_=0, tightens=0)
        self.log.info(
            "created swarm %s: %d stages, %d-byte activations",
            swarm.swarm_id,
            swarm.num_stages,
            swarm.activation_bytes,
        )

    async def _preload(self) -> None:
        """A node that trains loads torch here, once its swarm is known to accept it and
        before it is a member: importing torch holds the interpreter for seconds, in which a
        member would answer no heartbeat."""
        if self.settings.train:
            from gwtf.train.device import DeviceError

            s = self.settings
            try:
                await self.jobs.preload(s.device, s.precision, s.threads)
            except DeviceError as err:
                raise NodeError(str(err), 2) from None
            self.log.info("stages run on %s with %d torch thread(s)", self.jobs.placement,
                          _torch_threads())

    def _check_stage(self, swarm: SwarmSettings) -> None:
        if not 0 <= self.settings.stage < swarm.num_stages:
            raise NodeError(
                f"stage {self.settings.stage} is outside the swarm's stages "
                f"0..{swarm.num_stages - 1}; choose --stage in that range",
                2,
            )

    async def _compute_s(self, swarm: SwarmSettings) -> float:
        if self.settings.compute_s is not None:
            return self.settings.compute_s
        self.log.info("measuring compute: a warm-up of stage %d of %s", self.settings.stage,
                      self.settings.job)
        try:
            seconds = await asyncio.to_thread(
                measure_compute, self.settings.job, self.settings.stage, swarm.num_stages,
                self.jobs.placement,
            )
        except (ValueError, OSError) as err:
            raise NodeError(f"cannot measure this node's compute time: {err}", 2) from None
        self.log.info("compute: %.4f s per microbatch", seconds)
        return seconds

    def _me(self, compute_s: float, epoch: int) -> MemberInfo:
        return MemberInfo(
            id=self.node_id,
            address=self.address,
            stage=self.settings.stage,
            location=self.settings.location,
            compute_s=compute_s,
            capacity=1.0 / compute_s,
            epoch=epoch,
        )

    def _setup(
        self, swarm: SwarmSettings, me: MemberInfo, *, warm: bool, round_: int, tightens: int
    ) -> None:
        assert self._rng is not None
        self._swarm = swarm
        self._members = Membership(
            me,
            self._clock,
            failure_timeout_s=self.config.failure_timeout_s,
            ping_interval_s=self.config.heartbeat_s,
            tombstone_s=self.config.tombstone_s,
            rng=self._rng,
        )
        self._driver = self._new_driver(me, warm=warm, round_=round_, tightens=tightens)

    def _new_driver(self, me: MemberInfo, *, warm: bool, round_: int, tightens: int) -> FlowDriver:
        swarm = self.swarm
        return FlowDriver(
            me.id,
            me.stage,
            swarm.num_stages,
            cap_to_units(me.capacity),
            swarm.flow,
            self._clock,
            epoch=me.epoch,
            warm=warm,
            round_=round_,
            tightens=tightens if not warm else 0,
            max_inflight=self.config.max_inflight,
        )

    async def _join(self) -> None:
        failures: list[str] = []
        config_reply: node_pb2.ConfigReply | None = None
        via = ""
        for address in self.settings.bootstrap:
            try:
                config_reply = await self.stubs_at(address).membership.Config(
                    node_pb2.ConfigRequest(stage=self.settings.stage),
                    timeout=self.config.rpc_timeout_s,
                )
            except aio.AioRpcError as err:
                self._refused_by_bootstrap(address, err)
                failures.append(f"{address}: {_describe(err)}")
                continue
            via = address
            break
        if config_reply is None:
            raise NodeError(
                f"cannot reach the bootstrap node(s) {'; '.join(failures)}; check the address "
                "and that a gwtf node runs there",
                1,
            )
        try:
            swarm = swarm_from_pb(config_reply.swarm)
        except InvalidMessage as err:
            raise NodeError(f"the bootstrap node {via} sent an invalid swarm: {err}", 1) from None
        if self.settings.num_stages not in (None, swarm.num_stages):
            raise NodeError(
                f"the swarm at {via} has {swarm.num_stages} stages, not {self.settings.num_stages}"
                " (--stages only sets up a new swarm; leave it out to join)",
                2,
            )
        self._check_stage(swarm)
        await self._preload()
        compute_s = await self._compute_s(swarm)
        epoch = time.time_ns()
        me = self._me(compute_s, epoch)
        try:
            reply = await self.stubs_at(via).membership.Join(
                node_pb2.JoinRequest(member=member_to_pb(me)), timeout=self.config.rpc_timeout_s
            )
        except aio.AioRpcError as err:
            self._refused_by_bootstrap(via, err)
            raise NodeError(f"cannot join through {via}: {_describe(err)}", 1) from None
        try:
            members = members_from_pb(reply.members, swarm.num_stages)
        except InvalidMessage as err:
            raise NodeError(f"the bootstrap node {via} sent invalid members: {err}", 1) from None
        self._joined_via = via
        # A joiner enters at the swarm's phase: at the final epsilon if the swarm is there.
        self._setup(swarm, me, warm=reply.final, round_=reply.round, tightens=reply.tightens)
        assert self._members is not None
        self._members.merge(members)
        self.log.info(
            "joined swarm %s through %s: %d members, stage %d of %d",
            swarm.swarm_id,
            via,
            len(self._members.alive()) + 1,
            self.settings.stage,
            swarm.num_stages,
        )

    @staticmethod
    def _refused_by_bootstrap(address: str, err: aio.AioRpcError) -> None:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise NodeError(f"the swarm at {address} refused this node: {err.details()}", 2)
        if err.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.ALREADY_EXISTS,
        ):
            raise NodeError(f"the swarm at {address} refused this node: {err.details()}", 2)

    # ================================================================== accessors

    @property
    def swarm(self) -> SwarmSettings:
        assert self._swarm is not None, "not in a swarm yet"
        return self._swarm

    @property
    def members(self) -> Membership:
        assert self._members is not None, "not in a swarm yet"
        return self._members

    @property
    def driver(self) -> FlowDriver:
        assert self._driver is not None, "not in a swarm yet"
        return self._driver

    def stubs(self, member: MemberInfo) -> Stubs:
        return self._peers.stubs(member)

    def stubs_at(self, address: str) -> Stubs:
        return self._peers.stubs_at(address)

    # ================================================================== what jobs need

    def num_stages(self) -> int:
        return self.swarm.num_stages

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member `node_id` (this node included), None if not alive here."""
        if node_id == self.node_id:
            return self.members.me
        found = self.members.get(node_id)
        return found if found is not None and found.alive else None

    def known_member(self, node_id: str) -> MemberInfo | None:
        return self.members.get(node_id)

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        return self._peers.wan_delay(member, nbytes)

    def routes(self) -> dict[str, int]:
        return self.driver.routes()

    @property
    def memory_slots(self) -> int:
        return self.settings.memory_slots

    @property
    def trains(self) -> bool:
        return self.settings.train

    @property
    def emulate_compute_s(self) -> float | None:
        return self.members.me.compute_s if self.settings.emulate_compute else None

    @property
    def fault(self) -> Fault | None:
        return self.settings.fault

    def require_ready(self) -> None:
        """Refuses a peer's call (UNAVAILABLE) until the node is in a swarm, and once it leaves."""
        if not self._ready or self._stopping:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"node {self.node_id} is not serving")

    # ================================================================== membership

    def _on_events(self, events: Iterable[MemberEvent]) -> None:
        """React to membership changes: arcs in and out of the flow state machine, the metrics,
        then the jobs. The order is the guarantee: the flows stop routing to a dead member and
        the metrics show its death before the job acts on it, so nothing the job reports about
        a member is ahead of what the rest of the node says."""
        me = self.members.me
        last = self.swarm.num_stages - 1
        events = list(events)
        if events:
            # Any change anywhere may call for price moves here, and lets this node ask for a
            # rescale (FlowNode.note_change), as the in-process bus does on every node.
            self.driver.note_change()
        down: list[MemberEvent] = []
        for event in events:
            m = event.member
            if event.kind == "alive":
                self._stats.joins += 1
                self.log.info(
                    "member %s alive (stage %d, %s%s): %s",
                    m.id,
                    m.stage,
                    m.address,
                    f", {m.location}" if m.location else "",
                    event.reason,
                )
                if me.stage == last and m.stage == 0:
                    params = ring_params(me.capacity, m.capacity)
                    self.driver.own_arc(m.id, m.epoch, params, ring=True)
                elif m.stage == me.stage + 1 and me.stage != last:
                    self._start_link(m)
                continue
            if event.kind == "left":
                self._stats.leaves += 1
            else:
                self._stats.deaths += 1
            verb = "left" if event.kind == "left" else "declared dead"
            self.log.warning("member %s (stage %d) %s: %s", m.id, m.stage, verb, event.reason)
            self.prober.stop(m.id)
            self.driver.drop_peer(m.id)
            self._peers.forget(m.id)
            down.append(event)
        if events:
            self.publish_metrics()
        for event in down:
            self.jobs.on_member_down(event.member, "left" if event.kind == "left" else "died")
        self._after_change()

    def refused(self, member: MemberInfo) -> None:
        self._on_events(self.members.refused(member.id, member.epoch))

    def hear_verdicts(self, infos: list[MemberInfo]) -> None:
        self._on_events(self.members.merge(i for i in infos if not i.alive))

    def _token_refused(self) -> None:
        self._token_refusals += 1

    def _refusal_metrics(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "gwtf_requests_refused", "Calls refused before any handler ran, by reason",
            labels=["reason"],
        )  # fmt: skip
        refusals = self._refusals
        for reason in ("rate", "token"):
            family.add_metric([reason], refusals.get(reason, 0))
        yield family

    def publish_metrics(self) -> None:
        """Hand the metrics thread a fresh snapshot (it never reads the loop's state)."""
        if self.metrics.port is None or self._members is None:
            return
        self._refusals = {"rate": self.limiter.refused, "token": self._token_refusals}
        stats = self._stats
        self.metrics.publish(
            self.local_status(),
            {
                "deaths": stats.deaths,
                "leaves": stats.leaves,
                "joins": stats.joins,
                "alive_members": len(self.members.alive()) + 1,
                "departed_members": len(self.members.departed()),
            },
        )

    async def _heartbeat_loop(self) -> None:
        while True:
            self.publish_metrics()
            await asyncio.sleep(self.config.heartbeat_s)
            members = self.members
            members.beat()
            events, to_ping = members.check()
            self._on_events(events)
            if members.declared_dead:
                self._reincarnate()
                continue
            targets = members.targets(self.config.gossip_fanout)
            calls = {m.id: m for m in targets}
            for m in to_ping:
                calls.setdefault(m.id, m)
            for m in calls.values():
                self.spawn(self._gossip_with(m), "gossip")
            if self._peers.wan is not None:
                for m in targets:
                    self.spawn(self._calibrate(m), "calibrate")

    async def _calibrate(self, member: MemberInfo) -> None:
        wan = self._peers.wan
        assert wan is not None
        rtt = await self.echo(member, undelayed=True)
        if rtt is not None:
            wan.calibrate(rtt)

    async def _gossip_with(self, member: MemberInfo) -> None:
        request = node_pb2.GossipRequest(
            swarm_id=self.swarm.swarm_id,
            sender=self.node_id,
            members=[member_to_pb(m) for m in self.members.digest()],
        )
        self._stats.gossip_bytes += request.ByteSize()
        self._stats.gossip_calls += 1
        try:
            reply = await self.stubs(member).membership.Gossip(
                request, timeout=self.config.rpc_timeout_s
            )
        except aio.AioRpcError as err:
            if is_refused(err):
                self.refused(member)
            return
        try:
            infos = members_from_pb(reply.members, self.swarm.num_stages)
        except InvalidMessage as err:
            self.log.warning("member %s sent invalid gossip: %s", member.id, err)
            return
        self._on_events(self.members.merge(infos))

    def _reincarnate(self) -> None:
        """Gossip says this incarnation is dead (a false suspicion): come back as a new one."""
        old = self.members.me
        epoch = max(time.time_ns(), old.epoch + 1)
        self.log.warning("declared dead by the swarm; coming back as incarnation %d", epoch)
        self.prober.stop_all()
        self._peers.reset()
        self.members.reincarnate(epoch)
        previous = self.driver
        self._driver = self._new_driver(
            self.members.me,
            warm=previous.node.final,
            round_=previous.round,
            tightens=previous.tightens,
        )
        self._on_events([MemberEvent("alive", m, "re-linked") for m in self.members.alive()])

    # ================================================================== links

    def _start_link(self, member: MemberInfo) -> None:
        if not self._peers.linked(member):
            self.log.warning(
                "no link from %s to %s in the matrix: no arc to %s",
                self.settings.location,
                member.location,
                member.id,
            )
            return
        self.prober.start(member)

    async def echo(
        self, member: MemberInfo, payload: bytes = b"", *, undelayed: bool = False
    ) -> float | None:
        """One probe's round trip in seconds, None if it failed. `undelayed`: through the
        local stack only (the emulated WAN lets it through at once), to calibrate the WAN."""
        assert self._rng is not None
        request = node_pb2.EchoRequest(
            sender=self.node_id, nonce=int(self._rng.integers(2**63)), payload=payload
        )
        metadata = ((UNDELAYED, "1"),) if undelayed else None
        start = time.perf_counter()
        try:
            await self.stubs(member).probe.Echo(
                request, timeout=self.config.rpc_timeout_s, metadata=metadata
            )
        except aio.AioRpcError as err:
            if is_refused(err):
                self.refused(member)
            return None
        return time.perf_counter() - start

    def is_alive(self, member: MemberInfo) -> bool:
        return self.members.is_alive(member.id, member.epoch)

    def announced(self, peer: str) -> ArcParamsSpec | None:
        owned = self.driver.owned.get(peer)
        return owned.params if owned is not None else None

    def settled(self) -> bool:
        """Not in the middle of a scaling: a re-measured arc waits until the phases are over.
        Re-created mid-scaling, it restarts the scaling (gwtf.node.phases); at the final
        epsilon the state machines absorb it locally unless it moves the bottleneck."""
        return self.driver.node.final and not self._swarm_scaling

    def params(self, member: MemberInfo, estimate: LinkEstimate) -> ArcParamsSpec:
        rtt_ms, bw = estimate.rtt_ms, estimate.bandwidth_gbps
        assert rtt_ms is not None and bw is not None
        me = self.members.me
        return arc_params(me.compute_s, member.compute_s, rtt_ms, bw, self.swarm.activation_bytes)

    def create_arc(self, member: MemberInfo, estimate: LinkEstimate, reason: str) -> None:
        params = self.params(member, estimate)
        self.driver.own_arc(member.id, member.epoch, params, ring=False)
        self.log.info(
            "arc %s->%s %s: rtt %.2f ms, %.3f Gbit/s, cap %d, cost %d (gen %d)",
            self.node_id,
            member.id,
            reason,
            params.rtt_ms,
            params.bandwidth_gbps,
            params.cap,
            params.cost,
            self.driver.owned[member.id].gen,
        )
        self._after_change()

    # ================================================================== flow messages

    def _nudge(self) -> None:
        if self._phases is not None:
            self._phases.nudge()

    def _quiet(self) -> bool:
        return self.driver.quiet() and not self.prober.measuring

    def _after_change(self) -> None:
        """After anything touched the driver: start senders, and nudge the coordinator when
        this node has just become quiet while the swarm is still scaling."""
        if not self._ready or self._stopping:
            return
        driver = self.driver
        self._send_ready()
        quiet = self._quiet()
        if quiet and not self._was_quiet and (self._swarm_scaling or not driver.node.final):
            self._nudge()
        if driver.node.wants_rescale():
            self._nudge()
        self._was_quiet = quiet
        assert self._changed is not None
        self._changed.set()

    def _send_ready(self) -> None:
        """Start a call for every peer with something queued and room for another call in
        flight (and not backing off after a failure)."""
        driver = self.driver
        now = self._clock()
        for peer in driver.ready_peers():
            if self._peers.backing_off(peer, now):
                continue
            out = driver.take(peer)
            if out is not None:
                self.spawn(self._send(driver, out), "send")

    def _back_off(self, peer: str) -> None:
        delay = self._peers.back_off(peer)
        asyncio.get_running_loop().call_later(delay, self._after_change)

    async def _send(self, driver: FlowDriver, out: Outgoing) -> None:
        """One `Exchange` call; its reply is the acknowledgement (see gwtf.node.driver)."""
        member = self.members.get(out.peer)
        if member is None or not member.alive:
            driver.failed(out)
            return
        request = flow_pb2.FlowBatch(
            messages=[flow_message_to_pb(m) for m in out.messages],
            arcs=[arc_to_pb(a) for a in out.arcs],
            sender=self.node_id,
            sender_epoch=driver.epoch,
        )
        try:
            ack = await self.stubs(member).flow.Exchange(
                request, timeout=self.config.rpc_timeout_s
            )
        except aio.AioRpcError as err:
            driver.failed(out)
            if is_refused(err):
                self.refused(member)
            self._back_off(out.peer)
            return
        except asyncio.CancelledError:
            driver.failed(out)
            raise
        if driver is not self._driver:
            return  # this node came back as a new incarnation meanwhile
        driver.delivered(out, accepted=ack.ok)
        if ack.ok:
            self._peers.succeeded(out.peer)
        else:
            self.log.debug("%s refused an arc: %s", out.peer, ack.error)
            self._back_off(out.peer)
        self._after_change()

    def on_exchange(self, request: flow_pb2.FlowBatch) -> flow_pb2.FlowAck:
        self.require_ready()
        driver = self.driver
        arcs, messages = batch_from_pb(request, self.node_id)
        errors = []
        for ann in arcs:
            problem = self._check_announce(ann)
            if problem:
                errors.append(problem)
            else:
                driver.accept_arc(ann)
        if messages:
            driver.receive(messages)
        self._after_change()
        return flow_pb2.FlowAck(ok=not errors, error="; ".join(errors))

    def _check_announce(self, ann: ArcAnnounce) -> str:
        if ann.head_epoch != self.driver.epoch:
            return f"arc {ann.tail}->{ann.head} is for another incarnation of {ann.head}"
        tail = self.members.get(ann.tail)
        if tail is None or not tail.alive or tail.epoch != ann.tail_epoch:
            return f"{ann.tail} (incarnation {ann.tail_epoch}) is not a live member here yet"
        stage, last = self.settings.stage, self.swarm.num_stages - 1
        if not (tail.stage + 1 == stage or (tail.stage == last and stage == 0)):
            return f"no arc from stage {tail.stage} to stage {stage}"
        return ""

    # ================================================================== phases

    def live_members(self) -> list[MemberInfo]:
        return self.members.alive()

    def own_stage(self) -> int:
        return self.settings.stage

    def wants_rescale(self) -> bool:
        return self.driver.node.wants_rescale()

    def phase_state(self) -> tuple[int, int]:
        return self.driver.round, self.driver.tightens

    async def nudge_coordinator(self, coordinator: MemberInfo) -> None:
        request = flow_pb2.NudgeRequest(sender=self.node_id, wants_rescale=self.wants_rescale())
        with contextlib.suppress(aio.AioRpcError):
            await self.stubs(coordinator).flow.Nudge(request, timeout=self.config.rpc_timeout_s)

    async def call_phase(self, member: MemberInfo, command: Command) -> PhaseReportData | None:
        request = flow_pb2.PhaseCommand(
            coordinator=self.node_id,
            round=command.round,
            tightens=command.tightens,
            scaling=command.scaling,
        )
        try:
            reply = await self.stubs(member).flow.Phase(
                request, timeout=self.config.rpc_timeout_s
            )
            report = report_from_pb(reply)
        except aio.AioRpcError as err:
            if is_refused(err):
                self.refused(member)
            return None
        except InvalidMessage:
            return None
        if report.id != member.id or report.epoch != member.epoch:
            return None
        return report

    def on_nudge(self, request: flow_pb2.NudgeRequest) -> None:
        if self._ready and not self._stopping and self._phases is not None:
            self._phases.nudged()

    def on_phase(self, request: flow_pb2.PhaseCommand) -> flow_pb2.PhaseReport:
        self.require_ready()
        # Checked before anything moves: a command names a live member as its coordinator, at
        # most the phases a scaling has (each one is a tighten call: a huge count from a bad
        # peer would hold the event loop), and a round at most a few ahead of this node's (a
        # member that missed waves sees a small jump; a far one would desynchronise it).
        if request.coordinator != self.node_id and not any(
            m.id == request.coordinator for m in self.members.alive()
        ):
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"phase command from {request.coordinator[:40]!r}, not a live member",
            )
        limit = max_phases(self.swarm.flow)
        if request.tightens > limit:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"phase command ends {request.tightens} phases; a scaling has {limit}",
            )
        if request.round > self.driver.round + MAX_ROUND_AHEAD:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"phase command for round {request.round}, this node is in round "
                f"{self.driver.round}",
            )
        command = Command(request.round, request.tightens, request.scaling)
        return report_to_pb(self.apply_command(command))

    def apply_command(self, command: Command) -> PhaseReportData:
        driver = self.driver
        before = (driver.round, driver.tightens)
        driver.apply(command.round, command.tightens)
        after = (driver.round, driver.tightens)
        if after != before:
            if after[0] != before[0]:
                self.log.info("rescale: round %d", after[0])
            self.log.debug("phase %d of round %d (eps %d)", after[1], after[0], driver.node.eps)
        self._swarm_scaling = command.scaling
        self._after_change()
        return driver.report(measuring=bool(self.prober.measuring), view=self.members.view_hash())

    async def _tick_loop(self) -> None:
        """`quiet_s` mode: each node tightens on its own after a quiet spell."""
        assert self._changed is not None
        while True:
            due = self.driver.next_tick()
            if due is None:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                continue
            await asyncio.sleep(max(0.0, due - self._clock()))
            self.driver.tick()
            self._after_change()

    # ================================================================== membership calls

    def _check_swarm(self, swarm_id: str) -> None:
        if swarm_id != self.swarm.swarm_id:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this node belongs to swarm {self.swarm.swarm_id}, not {swarm_id[:60]!r}",
            )

    def on_config(self, request: node_pb2.ConfigRequest) -> node_pb2.ConfigReply:
        self.require_ready()
        self._check_joinable_stage(request.stage)
        return node_pb2.ConfigReply(swarm=swarm_to_pb(self.swarm))

    def _check_joinable_stage(self, stage: int) -> None:
        if stage >= self.swarm.num_stages:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"stage {stage} is outside this swarm's stages 0..{self.swarm.num_stages - 1}",
            )

    def on_join(self, request: node_pb2.JoinRequest) -> node_pb2.JoinReply:
        self.require_ready()
        self._check_joinable_stage(request.member.stage)
        joiner = member_from_pb(request.member, self.swarm.num_stages)
        if not joiner.alive:
            raise InvalidMessage("a joiner must be alive")
        current = self.members.get(joiner.id)
        if current is not None and current.alive and current.address != joiner.address:
            raise Refusal(
                grpc.StatusCode.ALREADY_EXISTS,
                f"id {joiner.id!r} is taken by a live member at {current.address}; "
                "choose another --id",
            )
        if current is not None and current.epoch >= joiner.epoch:
            raise Refusal(
                grpc.StatusCode.ALREADY_EXISTS,
                f"an incarnation of {joiner.id!r} as recent as this one is known (is this "
                "machine's clock behind?); choose another --id",
            )
        if joiner.id == self.node_id:
            raise Refusal(grpc.StatusCode.ALREADY_EXISTS, f"id {joiner.id!r} is this node's")
        self._on_events(self.members.merge([joiner]))
        driver = self.driver
        return node_pb2.JoinReply(
            swarm=swarm_to_pb(self.swarm),
            members=[member_to_pb(m) for m in self.members.digest()],
            round=driver.round,
            tightens=driver.tightens,
            final=driver.node.final,
        )

    def on_leave(self, request: node_pb2.LeaveRequest) -> node_pb2.LeaveReply:
        self.require_ready()
        self._on_events(self.members.leave(request.id, request.epoch))
        return node_pb2.LeaveReply()

    def on_gossip(self, request: node_pb2.GossipRequest) -> node_pb2.GossipReply:
        self.require_ready()
        self._check_swarm(request.swarm_id)
        infos = members_from_pb(request.members, self.swarm.num_stages)
        self._on_events(self.members.merge(infos))
        reply = node_pb2.GossipReply(members=[member_to_pb(m) for m in self.members.digest()])
        self._stats.gossip_bytes += reply.ByteSize()
        return reply

    # ================================================================== status

    def local_status(self) -> node_pb2.NodeStatus:
        driver = self.driver
        wan = self._peers.wan
        routes = driver.routes()
        status = node_pb2.NodeStatus(
            member=member_to_pb(self.members.me),
            round=driver.round,
            tightens=driver.tightens,
            final=driver.node.final,
            quiet=self._quiet(),
            eps=driver.node.eps,
            throughput=driver.throughput(),
            flow_messages_sent=driver.messages_sent,
            flow_batches_sent=driver.batches_sent,
            gossip_bytes_sent=self._stats.gossip_bytes,
            gossip_calls_sent=self._stats.gossip_calls,
            uptime_s=time.monotonic() - self._stats.started,
            departed=[m.id for m in self.members.departed()],
            wan_stack_rtt_ms=wan.stack_rtt_s * 1000 if wan is not None else 0.0,
            busy=driver.busy_reasons()
            + (
                ["measuring " + ",".join(sorted(self.prober.measuring))]
                if self.prober.measuring
                else []
            ),
            flow_messages_received=driver.messages_received,
            flow_messages_emitted=driver.messages_emitted,
        )
        for peer, arc in sorted(driver.owned.items()):
            estimate = self.prober.estimates.get(peer)
            measured = (
                (estimate.rtt_ms or 0.0, estimate.bandwidth_gbps or 0.0, estimate.probes)
                if estimate is not None
                else (0.0, 0.0, 0)
            )
            status.arcs.append(
                node_pb2.ArcStatus(
                    src=self.node_id,
                    dst=peer,
                    flow=0 if arc.ring else routes.get(peer, 0),
                    cap=arc.params.cap,
                    cost=arc.params.cost,
                    gen=arc.gen,
                    rtt_ms=arc.params.rtt_ms,
                    bandwidth_gbps=arc.params.bandwidth_gbps,
                    ring=arc.ring,
                    measured_rtt_ms=measured[0],
                    measured_bandwidth_gbps=measured[1],
                    rtt_probes=measured[2],
                )
            )
        return status

    async def on_status(self, request: node_pb2.StatusRequest) -> node_pb2.StatusReply:
        reply = node_pb2.StatusReply(node=self.node_id)
        if not self._ready or self._members is None:
            return reply
        reply.swarm.CopyFrom(swarm_to_pb(self.swarm))
        members = self.members.alive()
        reply.members.extend(
            member_to_pb(m) for m in (self.members.me, *members, *self.members.departed())
        )
        reply.nodes.append(self.local_status())
        if request.swarm:
            ask = node_pb2.StatusRequest(swarm=False)
            results = await asyncio.gather(
                *(self.stubs(m).status.Get(ask, timeout=self.config.status_timeout_s)
                  for m in members),
                return_exceptions=True,
            )
            for member, result in zip(members, results, strict=True):
                if isinstance(result, BaseException) or not result.nodes:
                    reply.unreachable.append(member.id)
                else:
                    reply.nodes.append(result.nodes[0])
        return reply


MAX_ROUND_AHEAD = 16
"""How far ahead of a member's scaling round a coordinator's command may be."""


def max_phases(config: FlowConfig) -> int:
    """Phases of one scaling: eps_start tightened by eps_factor down to eps_final (+1 spare)."""
    phases, eps = 0, config.eps_start
    while eps > config.eps_final:
        eps = max(config.eps_final, eps // config.eps_factor)
        phases += 1
    return phases + 1


def _describe(err: aio.AioRpcError) -> str:
    code = err.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return "nothing answers there (connection refused or unreachable)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer before the deadline"
    details = (err.details() or "").splitlines()
    return f"{code.name.lower()}: {details[0] if details else ''}"


def measure_compute(job_spec: str, stage: int, num_stages: int, placement: Any = None) -> float:
    """Seconds of forward + backward of one microbatch through `stage` of `job_spec`'s model,
    where the node's stages run (`placement`, a gwtf.train.device.Placement; None: the CPU).
    ValueError if the job or the cut is wrong."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from gwtf.train import build_stage_of, measure_stage_compute, resolve_job

    job = resolve_job(job_spec)
    module = build_stage_of(job.model, job.seed, stage, num_stages)
    return measure_stage_compute(module, job, placement=placement)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
