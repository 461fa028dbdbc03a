"""Wire <-> in-memory values, and the checks on everything a peer sends.

Every inbound message is checked before it touches any state (sizes of strings and lists,
finite positive numbers, stages within the swarm); a bad one raises `InvalidMessage`, which the
servicer turns into INVALID_ARGUMENT for the caller while the node keeps serving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gwtf.flow.linkreports import (
    MAX_BLOCKED,
    MAX_REPORTS,
    LinkReport,
    LinkReportError,
    check_record,
    site_of,
)
from gwtf.flow.relax.decentralized import FlowConfig, FlowMessage
from gwtf.node.config import MAX_ID_LENGTH, MAX_STAGES, ROUTINGS, SwarmSettings
from gwtf.node.control.driver import ArcAnnounce
from gwtf.node.control.membership import MemberInfo, State
from gwtf.node.control.phases import PhaseReportData
from gwtf.v1 import flow_pb2, node_pb2

__all__ = [
    "MAX_LIST",
    "InvalidMessage",
    "arc_from_pb",
    "arc_to_pb",
    "check_name",
    "flow_message_from_pb",
    "flow_message_to_pb",
    "member_from_pb",
    "member_to_pb",
    "report_from_pb",
    "report_to_pb",
    "swarm_from_pb",
    "swarm_to_pb",
]

MAX_LIST = 65_536
"""Most entries of any repeated field a node accepts (members, messages, arcs)."""

MAX_UNITS = 2**62
"""Largest capacity or cost (units) a peer may announce: far above any real one, and safe from
overflow in the state machine's sums."""


class InvalidMessage(ValueError):
    """A peer sent something malformed; the message says what."""


def check_name(what: str, value: str, *, empty_ok: bool = False) -> str:
    if not value and not empty_ok:
        raise InvalidMessage(f"{what} is empty")
    if len(value) > MAX_ID_LENGTH or not value.isprintable() or value != value.strip():
        raise InvalidMessage(f"{what} {value[:40]!r} is not a short printable name")
    return value


def _check_list(what: str, items: Iterable[object]) -> None:
    if len(list(items)) > MAX_LIST:
        raise InvalidMessage(f"too many {what} (more than {MAX_LIST})")


def _positive(what: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise InvalidMessage(f"{what} must be a positive finite number, got {value!r}")
    return value


# ---------------------------------------------------------------------------- members


def member_to_pb(info: MemberInfo) -> node_pb2.Member:
    return node_pb2.Member(
        id=info.id,
        address=info.address,
        stage=info.stage,
        location=info.location,
        compute_s=info.compute_s,
        capacity=info.capacity,
        epoch=info.epoch,
        heartbeat=info.heartbeat,
        state=int(info.state),  # type: ignore[arg-type]
        links=[
            node_pb2.LinkReport(
                site=r.site, rtt_level=r.rtt_level, bandwidth_level=r.bandwidth_level
            )
            for r in info.links
        ],
        blocked=info.blocked,
        revision=info.revision,
        movable=info.movable,
        uplink_gbps=info.uplink_gbps,
        relay=info.relay,
    )


def _links_from_pb(pb: node_pb2.Member) -> tuple[tuple[LinkReport, ...], tuple[str, ...]]:
    if len(pb.links) > MAX_REPORTS or len(pb.blocked) > MAX_BLOCKED:
        raise InvalidMessage(
            f"member {pb.id!r} has {len(pb.links)} link reports and {len(pb.blocked)} blocked "
            f"arcs (at most {MAX_REPORTS} and {MAX_BLOCKED})"
        )
    links = tuple(
        LinkReport(
            check_name(f"member {pb.id!r} link site", r.site),
            r.rtt_level if r.HasField("rtt_level") else None,
            r.bandwidth_level if r.HasField("bandwidth_level") else None,
        )
        for r in pb.links
    )
    blocked = tuple(check_name(f"member {pb.id!r} blocked head", b) for b in pb.blocked)
    try:
        check_record(pb.id, site_of(pb.id, pb.location), links, blocked)
    except LinkReportError as err:
        raise InvalidMessage(str(err)) from None
    return tuple(sorted(links)), tuple(sorted(blocked))


def member_from_pb(pb: node_pb2.Member, num_stages: int | None) -> MemberInfo:
    """A member from a peer; `num_stages` None skips the stage check (not known yet)."""
    check_name("member id", pb.id)
    check_name(f"member {pb.id!r} address", pb.address)
    check_name(f"member {pb.id!r} location", pb.location, empty_ok=True)
    limit = MAX_STAGES if num_stages is None else num_stages
    if pb.stage >= limit:
        raise InvalidMessage(f"member {pb.id!r} has stage {pb.stage}, outside 0..{limit - 1}")
    check_name(f"member {pb.id!r} relay", pb.relay, empty_ok=True)
    _positive(f"member {pb.id!r} compute_s", pb.compute_s)
    _positive(f"member {pb.id!r} capacity", pb.capacity)
    if not (math.isfinite(pb.uplink_gbps) and pb.uplink_gbps >= 0):
        raise InvalidMessage(f"member {pb.id!r} has uplink {pb.uplink_gbps} Gbit/s")
    if int(pb.state) not in (State.ALIVE, State.DEAD, State.LEFT):
        raise InvalidMessage(f"member {pb.id!r} has no valid state ({pb.state})")
    links, blocked = _links_from_pb(pb)
    return MemberInfo(
        id=pb.id,
        address=pb.address,
        stage=pb.stage,
        location=pb.location,
        compute_s=pb.compute_s,
        capacity=pb.capacity,
        epoch=pb.epoch,
        heartbeat=pb.heartbeat,
        state=State(pb.state),
        links=links,
        blocked=blocked,
        revision=pb.revision,
        movable=pb.movable,
        uplink_gbps=pb.uplink_gbps,
        relay=pb.relay,
    )


def members_from_pb(
    pbs: Iterable[node_pb2.Member], num_stages: int | None
) -> list[MemberInfo]:
    items = list(pbs)
    _check_list("members", items)
    return [member_from_pb(pb, num_stages) for pb in items]


# ---------------------------------------------------------------------------- swarm


def swarm_to_pb(swarm: SwarmSettings) -> node_pb2.SwarmConfig:
    flow = swarm.flow
    return node_pb2.SwarmConfig(
        swarm_id=swarm.swarm_id,
        num_stages=swarm.num_stages,
        activation_bytes=swarm.activation_bytes,
        big_m=flow.big_m,
        max_cost=flow.max_cost,
        eps_final=flow.eps_final,
        eps_start=flow.eps_start,
        eps_factor=flow.eps_factor,
        rescale_after=flow.rescale_after,
        quiet_s=flow.quiet_s or 0.0,
        routing=swarm.routing,
    )


def swarm_from_pb(pb: node_pb2.SwarmConfig) -> SwarmSettings:
    """The swarm's settings as a joiner receives them (checked: a bootstrap can be wrong too)."""
    check_name("swarm id", pb.swarm_id)
    if not 2 <= pb.num_stages <= MAX_STAGES:
        raise InvalidMessage(f"the swarm has {pb.num_stages} stages, outside 2..{MAX_STAGES}")
    if pb.activation_bytes < 1:
        raise InvalidMessage("the swarm's activation size is 0")
    if not (0 < pb.eps_final <= pb.eps_start and pb.max_cost > 0 and pb.big_m > pb.max_cost):
        raise InvalidMessage("the swarm's flow configuration is inconsistent")
    if pb.eps_factor < 2 or not math.isfinite(pb.quiet_s) or pb.quiet_s < 0:
        raise InvalidMessage("the swarm's flow configuration is inconsistent")
    flow = FlowConfig(
        big_m=pb.big_m,
        max_cost=pb.max_cost,
        eps_final=pb.eps_final,
        eps_start=pb.eps_start,
        eps_factor=pb.eps_factor,
        rescale_after=pb.rescale_after,
        quiet_s=pb.quiet_s or None,
    )
    routing = pb.routing or "relax"
    if routing not in ROUTINGS:
        raise InvalidMessage(f"the swarm routes by {routing[:40]!r}, unknown to this node")
    return SwarmSettings(pb.swarm_id, pb.num_stages, pb.activation_bytes, flow, routing)


# ---------------------------------------------------------------------------- flow


def flow_message_to_pb(msg: FlowMessage) -> flow_pb2.FlowMessage:
    return flow_pb2.FlowMessage(
        sender=msg.sender,
        receiver=msg.receiver,
        sender_epoch=msg.sender_epoch,
        receiver_epoch=msg.receiver_epoch,
        gen=msg.gen,
        from_tail=msg.from_tail,
        price=msg.price,
        flow=msg.flow,
        echo=msg.echo,
        eps=msg.eps,
    )


def flow_message_from_pb(pb: flow_pb2.FlowMessage, sender: str, me: str) -> FlowMessage:
    if pb.sender != sender:
        raise InvalidMessage(f"a message from {pb.sender[:40]!r} in a batch from {sender!r}")
    if pb.receiver != me:
        raise InvalidMessage(f"a message for {pb.receiver[:40]!r} sent to {me!r}")
    return FlowMessage(
        pb.sender,
        pb.receiver,
        pb.sender_epoch,
        pb.receiver_epoch,
        pb.gen,
        pb.from_tail,
        pb.price,
        pb.flow,
        pb.echo,
        pb.eps,
    )


def arc_to_pb(ann: ArcAnnounce) -> flow_pb2.ArcParams:
    return flow_pb2.ArcParams(
        tail=ann.tail,
        head=ann.head,
        tail_epoch=ann.tail_epoch,
        head_epoch=ann.head_epoch,
        gen=ann.gen,
        cap=ann.cap,
        cost=ann.cost,
    )


def arc_from_pb(pb: flow_pb2.ArcParams, sender: str, me: str) -> ArcAnnounce:
    if pb.tail != sender or pb.head != me:
        raise InvalidMessage(f"arc {pb.tail[:40]!r}->{pb.head[:40]!r} announced by {sender!r}")
    if pb.cap > MAX_UNITS or pb.cost > MAX_UNITS or pb.gen == 0:
        raise InvalidMessage(f"arc {pb.tail!r}->{pb.head!r} has out-of-range parameters")
    return ArcAnnounce(pb.tail, pb.head, pb.tail_epoch, pb.head_epoch, pb.gen, pb.cap, pb.cost)


def batch_from_pb(
    pb: flow_pb2.FlowBatch, me: str
) -> tuple[list[ArcAnnounce], list[FlowMessage]]:
    check_name("batch sender", pb.sender)
    _check_list("flow messages", pb.messages)
    _check_list("arcs", pb.arcs)
    arcs = [arc_from_pb(a, pb.sender, me) for a in pb.arcs]
    messages = [flow_message_from_pb(m, pb.sender, me) for m in pb.messages]
    return arcs, messages


# ---------------------------------------------------------------------------- phases


def report_to_pb(report: PhaseReportData) -> flow_pb2.PhaseReport:
    return flow_pb2.PhaseReport(
        id=report.id,
        epoch=report.epoch,
        round=report.round,
        tightens=report.tightens,
        final=report.final,
        quiet=report.quiet,
        activity=report.activity,
        wants_rescale=report.wants_rescale,
        view=report.view,
        edits=report.edits,
    )


def report_from_pb(pb: flow_pb2.PhaseReport) -> PhaseReportData:
    check_name("report id", pb.id)
    return PhaseReportData(
        id=pb.id,
        epoch=pb.epoch,
        round=pb.round,
        tightens=pb.tightens,
        final=pb.final,
        quiet=pb.quiet,
        activity=pb.activity,
        wants_rescale=pb.wants_rescale,
        view=pb.view,
        edits=pb.edits,
    )
