"""The client side of gwtf: ask a node about its swarm (`gwtf status`).

    reply = fetch_status("127.0.0.1:50051", timeout_s=5)   # StatusError if it cannot
    view = status_json(reply)   # {"members", "arcs", "flow_value", ...}

Job submission comes later (issue 5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from gwtf.flow.topology import CAP_SCALE
from gwtf.node.security import Credentials

__all__ = ["StatusError", "fetch_status", "format_status", "run_status", "status_json"]


class StatusError(Exception):
    """The node could not be asked (one sentence)."""


async def _fetch(address: str, timeout_s: float, swarm: bool, creds: Credentials) -> Any:
    from gwtf.node.security import open_channel
    from gwtf.node.transport import channel_options
    from gwtf.v1 import node_pb2, node_pb2_grpc

    async with open_channel(address, creds, options=channel_options()) as channel:
        stub = node_pb2_grpc.StatusStub(channel)
        return await stub.Get(node_pb2.StatusRequest(swarm=swarm), timeout=timeout_s)


def fetch_status(
    address: str,
    *,
    timeout_s: float = 10.0,
    swarm: bool = True,
    credentials: Credentials | None = None,
) -> Any:
    """The StatusReply of the node at `address` (with every member's part when `swarm`);
    `credentials` for a swarm that requires a token or TLS."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc
    from grpc import aio

    try:
        return asyncio.run(_fetch(address, timeout_s, swarm, credentials or Credentials()))
    except aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise StatusError(f"{address} refused the call: {err.details()}") from None
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            raise StatusError(
                f"cannot reach {address}: nothing answers there, or it refused the TLS "
                "handshake; check the address, that a gwtf node runs there, and --tls-*"
            ) from None
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise StatusError(f"{address} did not answer within {timeout_s:g} s") from None
        raise StatusError(f"{address} answered with an error: {err.code().name}") from None


def status_json(reply: Any) -> dict[str, Any]:
    """The swarm as the asked node sees it: `{"members": [{"id", "address", "stage",
    "alive", "capacity", ...}], "arcs": [{"src", "dst", "flow", ...}], "flow_value", ...}`.
    Flows and capacities in microbatches/s (the `_units` fields: integer flow units)."""
    states = {1: "alive", 2: "dead", 3: "left"}
    members = [
        {
            "id": m.id,
            "address": m.address,
            "stage": m.stage,
            "location": m.location,
            "alive": m.state == 1,
            "state": states.get(m.state, "unknown"),
            "capacity": m.capacity,
            "compute_s": m.compute_s,
            "epoch": m.epoch,
        }
        for m in reply.members
    ]
    stage_of = {m.id: m.stage for m in reply.members}
    last = reply.swarm.num_stages - 1
    arcs = []
    flow_units = 0
    nodes = []
    for node in reply.nodes:
        for arc in node.arcs:
            if arc.ring:
                continue
            arcs.append(
                {
                    "src": arc.src,
                    "dst": arc.dst,
                    "flow": arc.flow / CAP_SCALE,
                    "flow_units": arc.flow,
                    "cap_units": arc.cap,
                    "cost_units": arc.cost,
                    "rtt_ms": arc.rtt_ms,
                    "bandwidth_gbps": arc.bandwidth_gbps,
                    "gen": arc.gen,
                    "measured_rtt_ms": arc.measured_rtt_ms,
                    "measured_bandwidth_gbps": arc.measured_bandwidth_gbps,
                    "rtt_probes": arc.rtt_probes,
                }
            )
            if stage_of.get(arc.dst) == last:
                flow_units += arc.flow
        nodes.append(
            {
                "id": node.member.id,
                "epoch": node.member.epoch,
                "round": node.round,
                "phase": node.tightens,
                "final": node.final,
                "quiet": node.quiet,
                "eps": node.eps,
                "throughput": node.throughput / CAP_SCALE,
                "flow_messages_sent": node.flow_messages_sent,
                "flow_batches_sent": node.flow_batches_sent,
                "gossip_bytes_sent": node.gossip_bytes_sent,
                "gossip_calls_sent": node.gossip_calls_sent,
                "uptime_s": node.uptime_s,
                "departed": list(node.departed),
                "wan_stack_rtt_ms": node.wan_stack_rtt_ms,
                "busy": list(node.busy),
                "flow_messages_received": node.flow_messages_received,
                "flow_messages_emitted": node.flow_messages_emitted,
            }
        )
    arcs.sort(key=lambda a: (stage_of.get(a["src"], 0), a["src"], a["dst"]))
    nodes.sort(key=lambda n: n["id"])
    alive = sum(1 for m in members if m["alive"])
    converged = (
        bool(nodes)
        and not reply.unreachable
        and len(nodes) == alive
        and all(n["final"] and n["quiet"] for n in nodes)
    )
    return {
        "node": reply.node,
        "swarm": {
            "id": reply.swarm.swarm_id,
            "num_stages": reply.swarm.num_stages,
            "activation_bytes": reply.swarm.activation_bytes,
        },
        "members": members,
        "arcs": arcs,
        "flow_value": flow_units / CAP_SCALE,
        "flow_value_units": flow_units,
        "converged": converged,
        "nodes": nodes,
        "unreachable": list(reply.unreachable),
    }


def format_status(view: dict[str, Any]) -> str:
    members = view["members"]
    alive = sum(1 for m in members if m["alive"])
    state = "converged" if view["converged"] else "converging"
    lines = [
        f"swarm {view['swarm']['id']} as {view['node']} sees it: "
        f"{view['swarm']['num_stages']} stages, {alive} live members, "
        f"flow value {view['flow_value']:.4f} microbatches/s ({state})",
        "",
        f"{'id':<20} {'address':<22} {'stage':>5} {'location':<12} {'alive':<5} "
        f"{'capacity mb/s':>13}",
    ]
    for m in sorted(members, key=lambda m: (not m["alive"], m["stage"], m["id"])):
        lines.append(
            f"{m['id']:<20} {m['address']:<22} {m['stage']:>5} {m['location'] or '-':<12} "
            f"{'yes' if m['alive'] else m['state']:<5} {m['capacity']:>13.4f}"
        )
    lines += ["", f"{'flows':<43} {'mb/s':>8} {'rtt ms':>8} {'Gbit/s':>8}"]
    for arc in view["arcs"]:
        lines.append(
            f"{arc['src'] + ' -> ' + arc['dst']:<43} {arc['flow']:>8.4f} "
            f"{arc['rtt_ms']:>8.2f} {arc['bandwidth_gbps']:>8.3f}"
        )
    if view["unreachable"]:
        lines += ["", f"no answer from: {', '.join(view['unreachable'])}"]
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    from gwtf.node.security import SecurityError, credentials_from_args

    try:
        credentials = credentials_from_args(args)
    except SecurityError as err:
        print(f"gwtf status: {err}", file=sys.stderr)
        return 2
    if getattr(args, "watch", False):
        from gwtf.live import watch

        def fetch() -> dict[str, Any]:
            reply = fetch_status(args.to, timeout_s=args.timeout, swarm=not args.local,
                                 credentials=credentials)  # fmt: skip
            return status_json(reply)

        return watch(fetch, args.interval, errors=(StatusError,))
    try:
        reply = fetch_status(
            args.to,
            timeout_s=args.timeout,
            swarm=not args.local,
            credentials=credentials,
        )
    except StatusError as err:
        print(f"gwtf status: {err}", file=sys.stderr)
        return 1
    view = status_json(reply)
    if not view["members"]:
        print(f"gwtf status: {args.to} is not in a swarm yet", file=sys.stderr)
        return 1
    try:
        print(json.dumps(view, indent=2) if args.json else format_status(view), flush=True)
    except BrokenPipeError:  # `gwtf status | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
