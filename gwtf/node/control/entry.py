"""Entering a swarm (docs/design.md 3.1, 3.3): creating one, or joining one through a bootstrap
member, with every way that can fail as one `NodeError` the user can act on.

A joiner asks a bootstrap member for the swarm's settings (`Config`), checks its stage against
them, loads torch if it trains and measures its compute (neither while it is a member: both hold
the interpreter for seconds, in which a member would answer no heartbeat), then `Join`s with a
fresh epoch and receives the member table and the swarm's phase, so that its flow state machine
starts warm when the swarm is final.

A node without a stage (`--stage auto`) chooses one first (docs/design.md 2.11): the stage where it
adds the most flow to the swarm as its bootstrap member sees it (`choose_stage`, the pure
`gwtf.flow.placement.best_stage` on the members' stages, speeds and locations and the link matrix),
measuring its compute at every stage it weighs (docs/design.md 3.3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import grpc
from grpc import aio

from gwtf.flow.pace import Pace
from gwtf.flow.placement import Swarm, best_stage, open_stage
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, NodeSpec
from gwtf.node.config import SwarmSettings
from gwtf.node.control.driver import FlowDriver
from gwtf.node.control.membership import MemberInfo, Membership, member_capacity
from gwtf.node.control.peers import Peers
from gwtf.node.errors import NodeError
from gwtf.node.observe import NodeLog
from gwtf.node.rpc.codec import InvalidMessage, member_to_pb, members_from_pb, swarm_from_pb
from gwtf.node.rpc.retry import Backoff, is_transient
from gwtf.node.state import LOG, NodeState
from gwtf.v1 import node_pb2

__all__ = ["Preloader", "SwarmEntry", "choose_stage", "measure_compute", "swarm_view"]


class Preloader(Protocol):
    """The job runtime as entering a swarm uses it (gwtf.node.jobs.manager.JobManager)."""

    @property
    def placement(self) -> Any:
        """Where stages run (a gwtf.train.device.Placement), chosen by `preload`."""

    async def preload(self, device: str, precision: str, threads: int | None) -> None: ...


class NewDriver(Protocol):
    """A flow state machine for this node's incarnation `me`
    (gwtf.node.control.flowcontrol.FlowControl)."""

    def __call__(
        self, me: MemberInfo, *, warm: bool, round_: int, tightens: int
    ) -> FlowDriver: ...


class SwarmEntry:
    """Creates or joins this node's swarm, and sets up its member table and flow driver."""

    def __init__(
        self, state: NodeState, peers: Peers, jobs: Preloader, new_driver: NewDriver
    ) -> None:
        self._state = state
        self._peers = peers
        self._jobs = jobs
        self._new_driver = new_driver

    async def enter(self) -> str:
        """Create a swarm (no bootstrap) or join one; NodeError if that is impossible. Returns
        the bootstrap address joined through ("" for a new swarm)."""
        state = self._state
        if state.settings.stage is None:  # its log says so until it has chosen (`_place`)
            state.log = NodeLog(LOG, {"node": state.node_id, "stage": "auto"})
        if state.settings.bootstrap:
            return await self._join()
        await self._create()
        return ""

    async def _create(self) -> None:
        state = self._state
        s = state.settings
        if s.num_stages is None:
            raise NodeError(
                "the first node of a swarm needs --stages S (or give --bootstrap HOST:PORT "
                "to join a running swarm)",
                2,
            )
        epoch = time.time_ns()
        try:
            swarm = SwarmSettings.create(
                f"{state.node_id}@{epoch}",
                s.num_stages,
                activation_bytes=s.activation_bytes,
                max_arc_cost_s=s.max_arc_cost_s,
                min_arc_cost_s=s.min_arc_cost_s,
                quiet_s=s.quiet_s,
                routing=s.routing,
            )
        except ValueError as err:
            raise NodeError(f"cannot create a swarm: {err}", 2) from None
        self._check_stage(swarm)
        await self._preload()
        compute_s = await self._place(swarm, _no_members)
        self._setup(swarm, self._me(swarm, compute_s, epoch), warm=False, round_=0, tightens=0)
        state.log.info(
            "created swarm %s: %d stages, %d-byte activations",
            swarm.swarm_id,
            swarm.num_stages,
            swarm.activation_bytes,
        )

    async def _preload(self) -> None:
        """A node that trains loads torch here, once its swarm is known to accept it and
        before it is a member: importing torch holds the interpreter for seconds, in which a
        member would answer no heartbeat."""
        s = self._state.settings
        if s.train:
            from gwtf.train.device import DeviceError

            try:
                await self._jobs.preload(s.device, s.precision, s.threads)
            except DeviceError as err:
                raise NodeError(str(err), 2) from None
            self._state.log.info("stages run on %s with %d torch thread(s)",
                                 self._jobs.placement, _torch_threads())

    def _check_stage(self, swarm: SwarmSettings) -> None:
        stage = self._state.settings.stage
        if stage is not None and not 0 <= stage < swarm.num_stages:
            raise NodeError(
                f"stage {stage} is outside the swarm's stages "
                f"0..{swarm.num_stages - 1}; choose --stage in that range",
                2,
            )

    async def _place(
        self, swarm: SwarmSettings, view_at: Callable[[], Awaitable[list[MemberInfo]]]
    ) -> float:
        """This node's stage and its compute time there: the stage it was given, or the one it
        chooses (docs/design.md 2.11) among the members `view_at()` returns (its bootstrap
        member's). A chosen stage goes into the node's settings (and its log), where the rest
        of the node reads it."""
        state = self._state
        s = state.settings
        if s.stage is not None:
            return await self._compute_s(swarm, s.stage)
        measured: dict[int, float] = {}
        await self._choose(swarm, await view_at(), measured)
        # Measuring took seconds (a model's stages are built): the swarm may have changed, by
        # other joiners above all. Choose again on a fresh view, just before joining.
        stage, view = await self._choose(swarm, await view_at(), measured)
        state.settings = dataclasses.replace(s, stage=stage, placed=True)
        state.log = NodeLog(LOG, {"node": state.node_id, "stage": stage})
        me = NodeSpec.make(state.node_id, stage, measured[stage], s.location or ONE_SITE)
        state.log.info(
            "stage auto: took stage %d of %d (%d live members; flow %.3f -> %.3f microbatches/s)",
            stage, swarm.num_stages, len(view.nodes), view.max_flow(),
            view.replaced(me).max_flow(),
        )  # fmt: skip
        return measured[stage]

    async def _choose(
        self, swarm: SwarmSettings, members: list[MemberInfo], measured: dict[int, float]
    ) -> tuple[int, Swarm]:
        """The stage to take among `members`, measuring (into `measured`) what the choice
        needs: the open stage alone if there is one, else every stage (docs/design.md 3.3)."""
        s = self._state.settings
        view = swarm_view(members, swarm.num_stages, swarm.activation_bytes, s.links)
        empty = open_stage(view)
        for stage in range(swarm.num_stages) if empty is None else (empty,):
            if stage not in measured:
                measured[stage] = await self._compute_s(swarm, stage)
        return choose_stage(view, self._state.node_id, s.location, measured.__getitem__), view

    async def _compute_s(self, swarm: SwarmSettings, stage: int) -> float:
        s = self._state.settings
        log = self._state.log
        if s.compute_s is not None:
            return s.compute_s
        log.info("measuring compute: a warm-up of stage %d of %s", stage, s.job)
        try:
            seconds = await asyncio.to_thread(
                measure_compute, s.job, stage, swarm.num_stages, self._jobs.placement,
            )
        except (ValueError, OSError) as err:
            raise NodeError(f"cannot measure this node's compute time: {err}", 2) from None
        log.info("compute: %.4f s per microbatch at stage %d", seconds, stage)
        return seconds

    def _me(self, swarm: SwarmSettings, compute_s: float, epoch: int) -> MemberInfo:
        state = self._state
        stage = state.settings.stage
        assert stage is not None, "placed by _place"
        return MemberInfo(
            id=state.node_id,
            address=state.address,
            stage=stage,
            location=state.settings.location,
            compute_s=compute_s,
            capacity=member_capacity(compute_s, stage, state.settings.uplink_gbps,
                                     swarm.num_stages, swarm.activation_bytes),
            epoch=epoch,
            movable=state.settings.movable,
            uplink_gbps=state.settings.uplink_gbps,
        )

    def _setup(
        self, swarm: SwarmSettings, me: MemberInfo, *, warm: bool, round_: int, tightens: int
    ) -> None:
        state = self._state
        config = state.config
        assert state.rng is not None
        state.swarm = swarm
        state.members = Membership(
            me,
            state.clock,
            failure_timeout_s=config.failure_timeout_s,
            ping_interval_s=config.heartbeat_s,
            tombstone_s=config.tombstone_s,
            rng=state.rng,
        )
        state.driver = self._new_driver(me, warm=warm, round_=round_, tightens=tightens)
        if state.pace is None:  # a new incarnation keeps what it measured
            state.pace = Pace(me.compute_s, state.clock, config.pace)

    async def _swarm_config(self) -> tuple[node_pb2.ConfigReply, str]:
        """The swarm's settings from the first bootstrap node that answers, and its address.
        Bootstrap nodes that do not answer yet are called again, every `bootstrap_retry_s` for
        `bootstrap_wait_s` (a joiner started before its bootstrap node waits for it); NodeError
        when none answered by then, or at once when one refused this node."""
        state = self._state
        config = state.config
        retry = Backoff(config.bootstrap_retry_s, factor=1.0)  # a steady poll: it is starting
        deadline = state.clock() + config.bootstrap_wait_s
        tries = 0
        while True:
            failures: list[str] = []
            transient = True
            for address in state.settings.bootstrap:
                try:
                    reply = await self._peers.stubs_at(address).membership.Config(
                        node_pb2.ConfigRequest(stage=state.settings.stage or 0),
                        timeout=config.rpc_timeout_s,
                    )
                except aio.AioRpcError as err:
                    _refused_by_bootstrap(address, err)
                    failures.append(f"{address}: {_describe(err)}")
                    transient = transient and is_transient(err)
                    continue
                return reply, address
            wait = retry.delay(tries)
            if not transient or state.clock() + wait > deadline:
                waited = f" for {config.bootstrap_wait_s:g} s" if tries else ""
                raise NodeError(
                    f"cannot reach the bootstrap node(s){waited}: {'; '.join(failures)}; check "
                    "the address and that a gwtf node runs there",
                    1,
                )
            if tries == 0:
                state.log.warning(
                    "bootstrap node(s) not answering yet (%s); trying again every %g s for up "
                    "to %g s", "; ".join(failures), wait, config.bootstrap_wait_s,
                )
            tries += 1
            await asyncio.sleep(wait)

    async def _join(self) -> str:
        state = self._state
        timeout = state.config.rpc_timeout_s
        config_reply, via = await self._swarm_config()
        try:
            swarm = swarm_from_pb(config_reply.swarm)
        except InvalidMessage as err:
            raise NodeError(f"the bootstrap node {via} sent an invalid swarm: {err}", 1) from None
        wanted = state.settings.num_stages
        if wanted not in (None, swarm.num_stages):
            raise NodeError(
                f"the swarm at {via} has {swarm.num_stages} stages, not {wanted}"
                " (--stages only sets up a new swarm; leave it out to join)",
                2,
            )
        self._check_stage(swarm)
        await self._preload()
        compute_s = await self._place(swarm, lambda: self._members_at(via, swarm))
        epoch = time.time_ns()
        me = self._me(swarm, compute_s, epoch)
        try:
            reply = await self._peers.stubs_at(via).membership.Join(
                node_pb2.JoinRequest(member=member_to_pb(me)), timeout=timeout
            )
        except aio.AioRpcError as err:
            _refused_by_bootstrap(via, err)
            raise NodeError(f"cannot join through {via}: {_describe(err)}", 1) from None
        try:
            members = members_from_pb(reply.members, swarm.num_stages)
        except InvalidMessage as err:
            raise NodeError(f"the bootstrap node {via} sent invalid members: {err}", 1) from None
        # A joiner enters at the swarm's phase: at the final epsilon if the swarm is there.
        self._setup(swarm, me, warm=reply.final, round_=reply.round, tightens=reply.tightens)
        state.members.merge(members)
        state.log.info(
            "joined swarm %s through %s: %d members, stage %d of %d",
            swarm.swarm_id,
            via,
            len(state.members.alive()) + 1,
            state.settings.stage,
            swarm.num_stages,
        )
        return via

    async def _members_at(self, via: str, swarm: SwarmSettings) -> list[MemberInfo]:
        """The members the bootstrap member `via` knows (itself included, departed ones too):
        the view a node without a stage chooses its stage on."""
        try:
            reply = await self._peers.stubs_at(via).status.Get(
                node_pb2.StatusRequest(swarm=False), timeout=self._state.config.rpc_timeout_s
            )
            members = members_from_pb(reply.members, swarm.num_stages)
        except aio.AioRpcError as err:
            _refused_by_bootstrap(via, err)
            raise NodeError(f"cannot read the members at {via}: {_describe(err)}", 1) from None
        except InvalidMessage as err:
            raise NodeError(f"the bootstrap node {via} sent invalid members: {err}", 1) from None
        return members


ONE_SITE = "one-site"
"""The location placement gives every node of a swarm without a link matrix (a topology names
one; the node then emulates no WAN, and every pair is the intra-location link)."""


def swarm_view(
    members: Iterable[MemberInfo],
    num_stages: int,
    activation_bytes: int,
    links: Mapping[frozenset[str], LinkSpec] | None,
) -> Swarm:
    """The swarm as placement sees it (docs/design.md 2.11): each live member at its stage with
    its announced compute time and capacity and its location; the links of the emulated WAN's
    matrix, or none without one (every member then has location "": all are put at one place,
    joined by the intra-location link, as on one machine or one site)."""
    nodes = tuple(
        NodeSpec(m.id, m.stage, m.compute_s, m.location or ONE_SITE, m.capacity)
        for m in sorted(members, key=lambda m: m.id)
        if m.alive
    )
    return Swarm(num_stages, activation_bytes, nodes, dict(links or {}), DEFAULT_INTRA)


def member_links(
    members: Sequence[MemberInfo], link: Callable[[MemberInfo, MemberInfo], LinkSpec | None]
) -> dict[frozenset[str], LinkSpec]:
    """The links (`link(a, b)`: the link matrix's) between the members' locations; none without
    a matrix."""
    out: dict[frozenset[str], LinkSpec] = {}
    for i, a in enumerate(members):
        for b in members[i + 1:]:
            if a.location and b.location and a.location != b.location:
                found = link(a, b)
                if found is not None:
                    out[frozenset((a.location, b.location))] = found
    return out


def choose_stage(
    swarm: Swarm, node_id: str, location: str, compute_s: Callable[[int], float]
) -> int:
    """The stage a node without one takes (docs/design.md 2.11): a stage with no node if there
    is one (the lowest; `compute_s` is then not called), else the one where the node, taking
    `compute_s(stage)` seconds per microbatch there, adds the most flow to `swarm`. An earlier
    incarnation of the node that `swarm` still holds is not counted: this one replaces it."""
    swarm = swarm.replaced(None, drop=node_id)
    empty = open_stage(swarm)
    if empty is not None:
        return empty
    place = location or ONE_SITE
    return best_stage(swarm, lambda stage: NodeSpec.make(node_id, stage, compute_s(stage), place))


async def _no_members() -> list[MemberInfo]:
    """The members of a swarm this node is creating."""
    return []


def _refused_by_bootstrap(address: str, err: aio.AioRpcError) -> None:
    """NodeError if the bootstrap node refused this node for a reason the user must fix (the
    swarm's token, the stage, a taken id); other failures let the next address be tried."""
    if err.code() == grpc.StatusCode.UNAUTHENTICATED:
        raise NodeError(f"the swarm at {address} refused this node: {err.details()}", 2)
    if err.code() in (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
    ):
        raise NodeError(f"the swarm at {address} refused this node: {err.details()}", 2)


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
