"""`python -m benchmarks gossip`: gossip bytes per node as the swarm grows (docs/design.md 3.4).

    .venv/bin/python -m benchmarks gossip                       # section `gossip` of RESULTS.md
    .venv/bin/python -m benchmarks.gossip_scale --sizes 32 64 --real 8   # printed only

Two protocols in the same run, on the same seeds:
- full: every gossip carries the whole member table both ways and every node times out every
  member (the protocol the partial one replaced: `Membership` watching everyone, sending
  `digest()`);
- partial: the bounded lists of `Membership.outgoing` with the anti-entropy of
  `Membership.incoming` and the ring of watched members (docs/design.md 3.4).

Simulated: n pure `Membership` tables driven in one process by a discrete-event loop, with the
node's schedule (a heartbeat, the failure detector, then the calls of
gwtf.node.control.membercontrol every `HEARTBEAT_S`, each node at its own phase) over a transport
with a fixed one-way delay. Every message is built with the node's codec (gwtf.node.rpc.codec) as a
GossipRequest or GossipReply, serialised, counted, parsed and checked as a node does, so the bytes
are the wire's. A node counts what it sends: its requests and its replies (as `gossip_bytes_sent` of
a real node).

After a steady-state window, one member is SIGKILLed (its calls are refused from then on) and
the time until the first and the last survivor declare it dead is measured; then another one
hangs (its calls time out: only silence declares it).

Real: `--real` runs real `gwtf node` processes (benchmarks.node_control's gossip part) with the
code as it is now, to check the simulated partial figures at small sizes, and SIGKILLs one of
them to measure detection from their logs.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_section
from benchmarks.swarmrun import gossip_rates, log
from gwtf.node.control.membership import Gossip, MemberInfo, Membership
from gwtf.node.rpc.codec import member_to_pb, members_from_pb
from gwtf.v1 import node_pb2

OUT = Path(__file__).with_name("out")
SECTION = "## Gossip traffic as the swarm grows (`python -m benchmarks gossip`)"
HEARTBEAT_S = 0.5
FAILURE_TIMEOUT_S = 5.0
TOMBSTONE_S = 300.0
FANOUT = 3
DELAY_S = 0.001
"""One-way delay of the simulated transport (loopback-like; detection is dominated by periods)."""
STAGES = 4
SWARM = "bench"
WARMUP_S = 10.0
WINDOW_S = 10.0
DETECT_LIMIT_S = 30.0


@dataclass
class SimNode:
    id: str
    members: Membership
    crashed: bool = False
    hung: bool = False
    sent_bytes: int = 0
    calls: int = 0
    dead_seen: dict[str, float] = field(default_factory=dict)
    """Victim id -> when this node first declared or heard of its death."""
    false_deaths: int = 0


class GossipSim:
    """n tables, one event loop, the node's gossip schedule over a counted transport."""

    def __init__(self, n: int, partial: bool, seed: int) -> None:
        self.now = 0.0
        self.partial = partial
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        rng = np.random.default_rng(seed)
        infos = [
            MemberInfo(
                id=f"s{i % STAGES}n{i // STAGES}",
                address=f"127.0.0.1:{40000 + i}",
                stage=i % STAGES,
                location="",
                compute_s=0.1 * float(rng.uniform(0.5, 2.0)),
                capacity=float(rng.uniform(5.0, 20.0)),
                epoch=1_700_000_000_000_000_000 + i,
            )
            for i in range(n)
        ]
        self.nodes: dict[str, SimNode] = {}
        for i, info in enumerate(infos):
            table = Membership(
                info,
                lambda: self.now,
                failure_timeout_s=FAILURE_TIMEOUT_S,
                ping_interval_s=HEARTBEAT_S,
                tombstone_s=TOMBSTONE_S,
                rng=np.random.default_rng([seed, i]),
                # Watching everyone is the full protocol's failure detector.
                **({} if partial else {"watch": max(2, n)}),
            )
            # everyone has joined, as a node starts (gwtf.node.control.membercontrol)
            table.merge(infos)
            table.forget_news()
            self.nodes[info.id] = SimNode(info.id, table)
            node = self.nodes[info.id]
            self.at(float(rng.uniform(0, HEARTBEAT_S)), lambda node=node: self._tick(node))

    # --------------------------------------------------------------- loop

    def at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._seq), action))

    def run_until(self, t: float, stop: Callable[[], bool] = lambda: False) -> None:
        while self._queue and self._queue[0][0] <= t and not stop():
            self.now, _, action = heapq.heappop(self._queue)
            action()
        self.now = max(self.now, t) if not stop() else self.now

    def _tick(self, node: SimNode) -> None:
        if node.crashed:
            return
        self.at(HEARTBEAT_S, lambda: self._tick(node))
        if node.hung:
            return
        members = node.members
        members.beat()
        events, to_ping = members.check()
        self._note(node, events)
        if members.declared_dead:
            node.false_deaths += 1
            members.reincarnate(members.me.epoch + 1)
            return
        calls = {m.id: m for m in members.targets(FANOUT)}
        extra = members.watch_targets() if self.partial else []
        for m in (*extra, *to_ping):
            calls.setdefault(m.id, m)
        for m in calls.values():
            self._call(node, m)

    def _note(self, node: SimNode, events: list[Any]) -> None:
        for e in events:
            if e.kind == "dead":
                node.dead_seen.setdefault(e.member.id, self.now)

    # --------------------------------------------------------------- transport

    def _call(self, caller: SimNode, member: MemberInfo) -> None:
        table = caller.members
        gossip = (
            table.outgoing(member.id)
            if self.partial
            else Gossip(tuple(table.digest()), table.view_hash(), False)
        )
        request = node_pb2.GossipRequest(
            swarm_id=SWARM,
            sender=caller.id,
            members=[member_to_pb(m) for m in gossip.members],
            view=gossip.view if self.partial else 0,
            spreading=gossip.spreading,
        )
        wire = request.SerializeToString()
        caller.sent_bytes += len(wire)
        caller.calls += 1
        self.at(DELAY_S, lambda: self._serve(caller, member, wire))

    def _serve(self, caller: SimNode, member: MemberInfo, wire: bytes) -> None:
        callee = self.nodes[member.id]
        if callee.crashed:  # nothing listens there: refused, one delay later
            self.at(DELAY_S, lambda: self._note(
                caller, caller.members.refused(member.id, member.epoch)))  # fmt: skip
            return
        if callee.hung:
            return  # the call times out: no evidence
        request = node_pb2.GossipRequest.FromString(wire)
        infos = members_from_pb(request.members, STAGES)
        table = callee.members
        if self.partial:
            events, answer = table.incoming(
                request.sender, Gossip(tuple(infos), request.view, request.spreading)
            )
        else:
            events = table.merge(infos)
            answer = Gossip(tuple(table.digest()), 0, False)
        self._note(callee, events)
        reply = node_pb2.GossipReply(members=[member_to_pb(m) for m in answer.members])
        back = reply.SerializeToString()
        callee.sent_bytes += len(back)
        self.at(DELAY_S, lambda: self._answered(caller, back))

    def _answered(self, caller: SimNode, wire: bytes) -> None:
        if caller.crashed or caller.hung:
            return
        reply = node_pb2.GossipReply.FromString(wire)
        self._note(caller, caller.members.merge(members_from_pb(reply.members, STAGES)))

    # --------------------------------------------------------------- measures

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if not n.crashed and not n.hung]

    def formed(self) -> bool:
        everyone = {n.id for n in self.live()}
        return all({m.id for m in n.members.alive()} | {n.id} >= everyone for n in self.live())

    def detect(self, victim: str, how: str) -> tuple[float, float]:
        """Crash or hang `victim` now; seconds until the first and the last other live node
        knows it is dead."""
        start = self.now
        node = self.nodes[victim]
        if how == "crash":
            node.crashed = True
        else:
            node.hung = True
        others = [n for n in self.live()]

        def done() -> bool:
            return all(victim in n.dead_seen for n in others)

        self.run_until(start + DETECT_LIMIT_S, done)
        seen = [n.dead_seen[victim] - start for n in others if victim in n.dead_seen]
        if len(seen) < len(others):
            return (min(seen) if seen else float("nan"), float("inf"))
        return min(seen), max(seen)


def measure(n: int, partial: bool, seed: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    started = time.monotonic()
    sim = GossipSim(n, partial, seed)
    sim.run_until(warmup_s)
    formed = sim.formed()
    before = {k: (v.sent_bytes, v.calls) for k, v in sim.nodes.items()}
    sim.run_until(warmup_s + window_s)
    rates = [(v.sent_bytes - before[k][0]) / window_s for k, v in sim.nodes.items()]
    calls = [(v.calls - before[k][1]) / window_s for k, v in sim.nodes.items()]
    ids = sorted(sim.nodes)
    rng = np.random.default_rng(seed)
    crash_victim, hang_victim = (ids[i] for i in rng.choice(len(ids), 2, replace=False))
    crash = sim.detect(crash_victim, "crash")
    hang = sim.detect(hang_victim, "hang")
    row = {
        "nodes": n,
        "protocol": "partial" if partial else "full",
        "seed": seed,
        "formed": formed,
        "bytes_per_node_s_mean": statistics.mean(rates),
        "bytes_per_node_s_max": max(rates),
        "calls_per_node_s": statistics.mean(calls),
        "crash_first_s": crash[0],
        "crash_last_s": crash[1],
        "hang_first_s": hang[0],
        "hang_last_s": hang[1],
        "false_deaths": sum(v.false_deaths for v in sim.nodes.values()),
        "wall_s": time.monotonic() - started,
    }
    log(f"sim {row}")
    return row


# --------------------------------------------------------------------------- real processes


def real(n: int, window_s: float) -> dict[str, Any]:
    """`n` real `gwtf node` processes on loopback: gossip bytes per node per second once every
    node sees every member, then one SIGKILL and its detection, from the nodes' logs."""
    import tempfile

    from benchmarks.node_control import detection_times, start_swarm
    from tests.integration.cluster import wait_for

    with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
        try:
            swarm, formed_s, _ = start_swarm(Path(tmp), n, STAGES, geo=False, until="formed")
        except AssertionError as err:
            log(f"real {n}: {err}")
            return {"nodes": n, "error": str(err)}
        with swarm:
            time.sleep(2 * HEARTBEAT_S)  # a measurement window, not a condition
            first = {p.id: swarm.status(p.id, swarm=False) for p in swarm.live()}
            time.sleep(window_s)  # a measurement window, not a condition
            last = {p.id: swarm.status(p.id, swarm=False) for p in swarm.live()}
            rates, calls = gossip_rates(first, last)
            victim = sorted(p.id for p in swarm.live())[n // 2]
            at = swarm.kill(victim)
            wall = time.time() - (time.monotonic() - at)
            survivors = len(swarm.live())
            try:
                wait_for(
                    lambda: len(detection_times(swarm, victim, wall)) == survivors,
                    DETECT_LIMIT_S,
                    f"every survivor to declare {victim} dead",
                    0.5,
                )
            except AssertionError as err:
                log(f"real {n}: {err}")
            seen = detection_times(swarm, victim, wall)
    row = {
        "nodes": n,
        "formed_s": formed_s,
        "bytes_per_node_s_mean": statistics.mean(rates),
        "bytes_per_node_s_max": max(rates),
        "calls_per_node_s": statistics.mean(calls),
        "crash_first_s": min(seen) - wall if seen else float("nan"),
        "crash_last_s": max(seen) - wall if len(seen) == survivors else float("inf"),
    }
    log(f"real {row}")
    return row


# --------------------------------------------------------------------------- report


def _s(x: float) -> str:
    return "never" if x == float("inf") else f"{x:.2f}"


def report(sim: list[dict[str, Any]], reals: list[dict[str, Any]], command: str) -> str:
    load = os.getloadavg()
    lines = [
        SECTION,
        "",
        f"Produced by `{command}` on {platform.machine()}, {os.cpu_count()} cores shared with "
        f"other work (load average {load[0]:.1f} at the end), Python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d')}. Heartbeat {HEARTBEAT_S:g} s, failure timeout "
        f"{FAILURE_TIMEOUT_S:g} s, gossip fanout {FANOUT} (the defaults). Bytes are serialised "
        "protobuf (GossipRequest and GossipReply as the node's codec builds them) that a node "
        "sends, its requests plus its replies, per second, in steady state.",
        "",
        f"### Simulated: {WARMUP_S:g} s of warm-up, then a {WINDOW_S:g} s window",
        "",
        "`full`: the whole table each way, every member timed out by every node (the protocol "
        "the partial one replaced). `partial`: bounded lists, digests and anti-entropy, ring of "
        "watched members (docs/design.md 3.4). Detection: seconds from the SIGKILL (calls "
        "refused) or the hang (calls time out) of one member until the first and the last "
        "other member declares or hears of its death.",
        "",
        "| members | protocol | bytes/s per node (mean) | (max) | calls/s per node | "
        "full / partial | SIGKILL: first (s) | last (s) | hang: first (s) | last (s) | "
        "false deaths |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["nodes"], r["protocol"]): r for r in sim}
    for r in sim:
        other = by.get((r["nodes"], "full"))
        ratio = (
            f"{other['bytes_per_node_s_mean'] / r['bytes_per_node_s_mean']:.1f}x"
            if r["protocol"] == "partial" and other
            else ""
        )
        lines.append(
            f"| {r['nodes']} | {r['protocol']} | {r['bytes_per_node_s_mean']:.0f} | "
            f"{r['bytes_per_node_s_max']:.0f} | {r['calls_per_node_s']:.2f} | {ratio} | "
            f"{_s(r['crash_first_s'])} | {_s(r['crash_last_s'])} | {_s(r['hang_first_s'])} | "
            f"{_s(r['hang_last_s'])} | {r['false_deaths']} |"
        )
    partial = sorted(
        (r["nodes"], r["bytes_per_node_s_mean"])
        for r in sim
        if r["protocol"] == "partial" and r["nodes"] >= 32
    )
    if len(partial) >= 2:
        (n0, b0), (n1, b1) = partial[0], partial[-1]
        growth = f"Growth from {n0} to {n1} members ({n1 / n0:g}x): partial {b1 / b0:.2f}x"
        if (n0, "full") in by and (n1, "full") in by:
            full = (
                by[(n1, "full")]["bytes_per_node_s_mean"]
                / by[(n0, "full")]["bytes_per_node_s_mean"]
            )
            growth += f", full {full:.2f}x"
        lines += ["", growth + " the bytes per node per second."]
    lines.append("")
    if reals:
        lines += [
            "### Real `gwtf node` processes on 127.0.0.1 (the partial protocol), the same measure",
            "",
            "Measured once every node saw every member (flows not necessarily settled); then "
            "one node SIGKILLed, detection from the survivors' logs.",
            "",
            "| nodes | bytes/s per node (mean) | (max) | simulated (mean) | calls/s per node | "
            "SIGKILL: first (s) | last (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in reals:
            if "error" in r:
                lines.append(f"| {r['nodes']} | {r['error']} | | | | | |")
                continue
            sim_row = by.get((r["nodes"], "partial"))
            simulated = f"{sim_row['bytes_per_node_s_mean']:.0f}" if sim_row else "-"
            lines.append(
                f"| {r['nodes']} | {r['bytes_per_node_s_mean']:.0f} | "
                f"{r['bytes_per_node_s_max']:.0f} | {simulated} | {r['calls_per_node_s']:.2f} "
                f"| {_s(r['crash_first_s'])} | {_s(r['crash_last_s'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def collect(
    sizes: list[int], real_sizes: list[int], seed: int, full_up_to: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sim = []
    for n in sorted(set(sizes) | set(real_sizes)):
        if n <= full_up_to:
            sim.append(measure(n, False, seed, WARMUP_S, WINDOW_S))
        sim.append(measure(n, True, seed, WARMUP_S, WINDOW_S))
    reals = [real(n, WINDOW_S) for n in real_sizes]
    OUT.mkdir(exist_ok=True)
    (OUT / "gossip_scale.json").write_text(json.dumps({"sim": sim, "real": reals}, indent=1))
    return sim, reals


def run(quick: bool = False) -> str:
    """Simulated 32 to 256 members, both protocols; real processes at 8, 16 and 32
    (`--quick`: simulated 32 and 64, real 8)."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    if quick:
        sim, reals = collect([32, 64], [8], 0, 64)
        command = "python -m benchmarks gossip --quick"
    else:
        sim, reals = collect([32, 64, 128, 256], [8, 16, 32], 0, 256)
        command = "python -m benchmarks gossip"
    text = report(sim, reals, command)
    write_section("gossip", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gossip_scale")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--real", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full-up-to", type=int, default=256, help="largest size simulated with the full table"
    )
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sim, reals = collect(args.sizes, args.real, args.seed, args.full_up_to)
    command = "python -m benchmarks.gossip_scale " + " ".join(sys.argv[1:])
    text = report(sim, reals, command.strip())
    print(text)
    if args.write:
        write_section("gossip", text)
        log("wrote section gossip of benchmarks/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
