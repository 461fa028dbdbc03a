"""`python -m benchmarks node`: the node's control plane on a local swarm (issue 4).

    .venv/bin/python -m benchmarks node            # every part, section `node` of RESULTS.md
    .venv/bin/python -m benchmarks.node_control --only rpc gossip   # some parts, printed only
    .venv/bin/python -m benchmarks.node_control --write    # all parts, and into RESULTS.md

Parts (real `gwtf node` processes on 127.0.0.1, as the integration tests start them):

- churn: time from a SIGKILL to reconverged flows on a 16-node, 4-stage swarm (no emulated
  delay, then the geo10 matrix), split into detection (first and last peer to declare the death,
  from their logs) and the rest; a graceful leave for comparison. "Reconverged" is what the tests
  check: every node final and quiet, every node sees the same members, and the flow value equals
  the networkx oracle's on the topology the nodes measured.
- rpc: control-call round trips from a client to one node on loopback, p50 and p99.
- gossip: heartbeat and gossip traffic per node per second, and control-plane CPU, in steady
  state, as the swarm grows (4 to 32 nodes).
- phases: ending the scaling phases by the coordinator's waves against the uncoordinated
  `--quiet-s` mode: flow messages and time to converge from a cold start, and after a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.report import write_section
from benchmarks.swarmrun import gossip_rates, log
from gwtf.flow.generate import data_path
from gwtf.local.launch import _locations, plan_nodes
from tests.integration.cluster import LocalSwarm, pipeline_arcs, wait_for

OUT = Path(__file__).with_name("out")
SECTION = "## Node control plane (`python -m benchmarks node`)"
GEO10 = str(data_path("geo10_aws.csv"))
SETTLE_S = 180.0
HEARTBEAT_S = 0.5
FAILURE_TIMEOUT_S = 5.0
PARTS = ("rpc", "gossip", "phases", "churn")


# --------------------------------------------------------------------------- swarms


def start_swarm(
    tmp: Path,
    n: int,
    stages: int,
    *,
    geo: bool,
    extra: tuple[str, ...] = (),
    seed: int = 0,
    until: str = "settled",
) -> tuple[LocalSwarm, float, str]:
    """A swarm as `gwtf launch` plans it; returns it, the seconds from the last node's start
    until it was `settled` (flows converged to the oracle's) or `formed` (every node sees every
    member), and which. The swarm is closed if neither happens."""
    plans = plan_nodes(
        n, stages, locations=_locations(GEO10) if geo else [], base_compute_s=0.1, seed=seed
    )
    swarm = LocalSwarm(tmp, heartbeat_s=HEARTBEAT_S, failure_timeout_s=FAILURE_TIMEOUT_S,
                       extra=extra)  # fmt: skip

    def args(plan: Any) -> list[str]:
        return ["--location", plan.location, "--link-matrix", GEO10] if plan.location else []

    try:
        first = swarm.spawn(plans[0].id, 0, plans[0].compute_s, "--stages", str(stages),
                            *args(plans[0]))  # fmt: skip
        swarm.wait_listening(first)
        swarm.bootstrap = first.address
        rest = [swarm.spawn(p.id, p.stage, p.compute_s, *args(p)) for p in plans[1:]]
        swarm.wait_listening(*rest)
        started = time.monotonic()
        if until == "settled":
            settle(swarm, stages)
        else:
            wait_for(lambda: formed(swarm), SETTLE_S, f"{n} nodes to see each other", 0.5)
            if until == "settled if possible":
                try:
                    settle(swarm, stages, timeout_s=120.0)
                except AssertionError:
                    until = "formed"
    except BaseException:
        swarm.close()
        raise
    return swarm, time.monotonic() - started, until


def formed(swarm: LocalSwarm) -> bool:
    everyone = {p.id for p in swarm.live()}
    for proc in swarm.live():
        local = swarm.status(proc.id, swarm=False)
        if local is None or {m["id"] for m in local["members"] if m["alive"]} != everyone:
            return False
    return True


def settle(swarm: LocalSwarm, stages: int, timeout_s: float = SETTLE_S) -> dict[str, Any]:
    sizes = [0] * stages
    for proc in swarm.live():
        sizes[proc.stage] += 1
    members = {p.id for p in swarm.live()}
    return wait_for(
        lambda: swarm.settled(members, pipeline_arcs(sizes)),
        timeout_s,
        f"{len(members)} nodes to settle",
        interval_s=0.25,
    )


def detection_times(swarm: LocalSwarm, victim: str, after: float) -> list[float]:
    """Wall-clock times at which the live nodes first logged `victim`'s death or departure
    after the wall-clock time `after` (an earlier incarnation's death is not this one's)."""
    times = []
    for proc in swarm.live():
        for line in proc.log.read_text().splitlines():
            if f"member {victim} " in line and ("declared dead" in line or " left:" in line):
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                if stamp.timestamp() >= after - 0.01:  # log stamps are to the millisecond
                    times.append(stamp.timestamp())
                    break
    return times


def flow_counts(swarm: LocalSwarm) -> dict[str, tuple[int, int, int]]:
    """Per live node: (flow messages sent, Exchange calls, messages its state machine
    produced), cumulative since it started."""
    view = swarm.status()
    assert view is not None
    return {
        n["id"]: (n["flow_messages_sent"], n["flow_batches_sent"], n["flow_messages_emitted"])
        for n in view["nodes"]
    }


def total_flow_messages(
    swarm: LocalSwarm, since: dict[str, tuple[int, int, int]] | None = None
) -> tuple[int, int, int]:
    """Summed over the live nodes: (messages sent, calls, messages produced); with `since`,
    what each node added since then (a node absent then counts from its start, and a node dead
    now is not counted: its work after `since` is unknowable, and a crashed node does none)."""
    now = flow_counts(swarm)
    base = since or {}
    sums = [0, 0, 0]
    for node, counts in now.items():
        start = base.get(node, (0, 0, 0))
        for i in range(3):
            sums[i] += counts[i] - start[i]
    return sums[0], sums[1], sums[2]


# --------------------------------------------------------------------------- churn


def churn(geo: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
        try:
            swarm, cold_s, _ = start_swarm(Path(tmp), 16, 4, geo=geo)
        except AssertionError as err:
            log(f"churn geo={geo}: {err}")
            return {"geo": geo, "error": str(err), "events": []}
        with swarm:
            log(f"churn geo={geo}: 16 nodes settled {cold_s:.1f} s after the last started")
            rows = []
            plans = {p.id: p for p in plan_nodes(
                16, 4, locations=_locations(GEO10) if geo else [], base_compute_s=0.1, seed=0
            )}  # fmt: skip
            # Three crashes, then the first victim comes back and leaves gracefully: the same
            # change of topology as its crash.
            for victim, how in (("s1n0", "crash"), ("s2n1", "crash"), ("s3n2", "crash"),
                                ("s1n0", "rejoin"), ("s1n0", "leave")):  # fmt: skip
                if how == "rejoin":
                    plan = plans[victim]
                    wan = ("--location", plan.location, "--link-matrix", GEO10) if geo else ()
                    swarm.join(victim, plan.stage, plan.compute_s, *wan)
                    continue
                try:
                    settle(swarm, 4)
                except AssertionError as err:
                    rows.append({"victim": victim, "how": how, "error": str(err)})
                    log(f"  {how} {victim}: {err}")
                    continue
                before = flow_counts(swarm)
                if how == "crash":
                    at = swarm.kill(victim)
                else:
                    at = swarm.terminate(victim)
                    wait_for(lambda v=victim: not swarm.procs[v].alive, 30, f"{victim} to exit")
                wall = time.time() - (time.monotonic() - at)
                try:
                    settle(swarm, 4)
                except AssertionError as err:
                    rows.append({"victim": victim, "how": how, "error": str(err)})
                    log(f"  {how} {victim}: {err}")
                    continue
                total = time.monotonic() - at
                seen = detection_times(swarm, victim, wall)
                after = total_flow_messages(swarm, since=before)
                rows.append(
                    {
                        "victim": victim,
                        "how": how,
                        "first_detect_s": min(seen) - wall if seen else None,
                        "last_detect_s": max(seen) - wall if seen else None,
                        "reconverged_s": total,
                        "flow_messages": after[0],
                        "flow_calls": after[1],
                        "emitted": after[2],
                    }
                )
                log(f"  {how} {victim}: {rows[-1]}")
            return {"geo": geo, "cold_start_s": cold_s, "events": rows}


# --------------------------------------------------------------------------- rpc


async def _rpc_times(address: str, calls: int) -> dict[str, list[float]]:
    from grpc import aio

    from gwtf.node.rpc.transport import channel_options
    from gwtf.v1 import flow_pb2, flow_pb2_grpc, node_pb2, node_pb2_grpc

    async with aio.insecure_channel(address, options=channel_options()) as channel:
        probe = node_pb2_grpc.ProbeStub(channel)
        status = node_pb2_grpc.StatusStub(channel)
        membership = node_pb2_grpc.MembershipStub(channel)
        flow = flow_pb2_grpc.FlowStub(channel)
        local = await status.Get(node_pb2.StatusRequest(), timeout=5)
        gossip = node_pb2.GossipRequest(
            swarm_id=local.swarm.swarm_id, sender="bench", members=list(local.members)
        )
        me = local.nodes[0].member
        phase = flow_pb2.PhaseCommand(
            coordinator="bench", round=local.nodes[0].round, tightens=local.nodes[0].tightens
        )
        cases: dict[str, Callable[[], Any]] = {
            "Probe.Echo (empty)": lambda: probe.Echo(node_pb2.EchoRequest(), timeout=5),
            "Membership.Gossip (table of 2)": lambda: membership.Gossip(gossip, timeout=5),
            "Flow.Exchange (empty batch)": lambda: flow.Exchange(
                flow_pb2.FlowBatch(sender="bench"), timeout=5
            ),
            "Flow.Phase (no-op command)": lambda: flow.Phase(phase, timeout=5),
            "Status.Get (one node)": lambda: status.Get(node_pb2.StatusRequest(), timeout=5),
        }
        assert me.id
        out: dict[str, list[float]] = {}
        for name, call in cases.items():
            for _ in range(100):
                await call()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                await call()
                times.append(time.perf_counter() - start)
            out[name] = times
        return out


def rpc(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp, LocalSwarm(Path(tmp)) as swarm:
        swarm.start([("a", 0, 0.1), ("b", 1, 0.1)], num_stages=2)
        settle(swarm, 2)
        times = asyncio.run(_rpc_times(swarm.procs["a"].address, calls))
    rows = {}
    for name, xs in times.items():
        xs.sort()
        rows[name] = {
            "p50_ms": 1000 * xs[len(xs) // 2],
            "p99_ms": 1000 * xs[int(len(xs) * 0.99)],
            "calls": len(xs),
        }
        log(f"rpc {name}: {rows[name]}")
    return rows


# --------------------------------------------------------------------------- gossip


def _cpu_ticks(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total


def gossip(sizes: list[int], window_s: float) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
            try:
                swarm, cold_s, reached = start_swarm(
                    Path(tmp), n, 4, geo=False, until="settled if possible"
                )
            except AssertionError as err:
                rows.append({"nodes": n, "error": str(err)})
                log(f"gossip {n}: {err}")
                continue
            with swarm:
                time.sleep(2 * HEARTBEAT_S)  # a measurement window, not a condition
                first = {p.id: swarm.status(p.id, swarm=False) for p in swarm.live()}
                pids = [p.popen.pid for p in swarm.live()]
                ticks0, t0 = _cpu_ticks(pids), time.monotonic()
                time.sleep(window_s)  # a measurement window, not a condition
                ticks1, t1 = _cpu_ticks(pids), time.monotonic()
                last = {p.id: swarm.status(p.id, swarm=False) for p in swarm.live()}
                rates, calls = gossip_rates(first, last)
                hz = os.sysconf("SC_CLK_TCK")
                row = {
                    "nodes": n,
                    "cold_start_s": cold_s,
                    "bytes_per_node_s_mean": statistics.mean(rates),
                    "bytes_per_node_s_max": max(rates),
                    "gossip_calls_per_node_s": statistics.mean(calls),
                    "cpu_per_node_pct": 100 * (ticks1 - ticks0) / hz / (t1 - t0) / n,
                    "state": reached,
                }
                rows.append(row)
                log(f"gossip {row}")
    return rows


# --------------------------------------------------------------------------- phases


def phases() -> list[dict[str, Any]]:
    rows = []
    for mode, extra in (("coordinated waves", ()), ("quiet_s = 0.1 s", ("--quiet-s", "0.1"))):
        for seed in (0, 1):
            with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
                plans = plan_nodes(8, 4, locations=[], base_compute_s=0.1, seed=seed)
                swarm = LocalSwarm(Path(tmp), heartbeat_s=HEARTBEAT_S,
                                   failure_timeout_s=FAILURE_TIMEOUT_S)  # fmt: skip
                with swarm:
                    first = swarm.spawn(plans[0].id, 0, plans[0].compute_s, "--stages", "4",
                                        *extra)  # fmt: skip
                    swarm.wait_listening(first)
                    swarm.bootstrap = first.address
                    rest = [swarm.spawn(p.id, p.stage, p.compute_s) for p in plans[1:]]
                    swarm.wait_listening(*rest)
                    started = time.monotonic()
                    try:
                        settle(swarm, 4)
                        cold_s = time.monotonic() - started
                        cold = total_flow_messages(swarm)
                        counts = flow_counts(swarm)
                        at = swarm.kill(plans[3].id)
                        settle(swarm, 4)
                    except AssertionError as err:
                        rows.append({"mode": mode, "seed": seed, "error": str(err)})
                        log(f"phases {mode} {seed}: {err}")
                        continue
                    warm_s = time.monotonic() - at
                    warm = total_flow_messages(swarm, since=counts)
                    row = {
                        "mode": mode,
                        "seed": seed,
                        "cold_messages": cold[0],
                        "cold_emitted": cold[2],
                        "cold_calls": cold[1],
                        "cold_s": cold_s,
                        "crash_messages": warm[0],
                        "crash_s": warm_s,
                    }
                    rows.append(row)
                    log(f"phases {row}")
    return rows


# --------------------------------------------------------------------------- report


def report(results: dict[str, Any], command: str) -> str:
    load = os.getloadavg()
    lines = [
        SECTION,
        "",
        f"Produced by `{command}` on {platform.machine()}, {os.cpu_count()} cores shared with "
        f"other work (load average {load[0]:.1f} at the end), Python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d')}. Real `gwtf node` processes on 127.0.0.1, heartbeat "
        f"{HEARTBEAT_S:g} s, failure timeout {FAILURE_TIMEOUT_S:g} s (the defaults), compute "
        "times as `gwtf launch` draws them (0.1 s on a V100 divided by a GPU speed of "
        "gpu_train_throughput.csv), 8 MiB activations.",
        "",
    ]
    for part in results.get("churn", []):
        where = "geo10 matrix (emulated WAN)" if part["geo"] else "loopback, no emulated delay"
        lines += [f"### SIGKILL to reconverged flows, 16 nodes in 4 stages, {where}", ""]
        if "error" in part:
            lines += [f"Not measured: {part['error']}.", ""]
            continue
        lines += [
            f"Cold start: settled {part['cold_start_s']:.1f} s after the last node started.",
            "",
            "| event | first peer detects (s) | last peer detects (s) | reconverged (s) | "
            "flow messages sent | produced by the state machines | Exchange calls |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in part["events"]:
            def fmt(x: float | None) -> str:
                return "-" if x is None else f"{x:.2f}"

            if "error" in e:
                lines.append(f"| {e['how']} {e['victim']} | {e['error']} | | | | | |")
                continue
            lines.append(
                f"| {e['how']} {e['victim']} | {fmt(e['first_detect_s'])} | "
                f"{fmt(e['last_detect_s'])} | {e['reconverged_s']:.2f} | {e['flow_messages']} "
                f"| {e['emitted']} | {e['flow_calls']} |"
            )
        lines.append("")
    if "rpc" in results:
        lines += [
            "### Control RPC round trip on loopback (client process -> node process)",
            "",
            "| call | p50 ms | p99 ms | calls |",
            "|---|---|---|---|",
        ]
        for name, r in results["rpc"].items():
            lines.append(f"| {name} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['calls']} |")
        lines.append("")
    if "gossip" in results:
        lines += [
            "### Heartbeat and gossip traffic per node, steady state",
            "",
            "Bytes are serialised protobuf (requests sent plus replies returned); CPU is the "
            "whole node process (gossip, latency probes on owned arcs, status polls, and flow "
            "work where the flows had not settled: 'formed' means every node saw every member "
            "but the flows did not settle within 2 minutes).",
            "",
            "| nodes | bytes/s per node (mean) | (max) | gossip calls/s per node | "
            "CPU per node % | measured once | after (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["gossip"]:
            if "error" in r:
                lines.append(f"| {r['nodes']} | {r['error']} | | | | | |")
                continue
            lines.append(
                f"| {r['nodes']} | {r['bytes_per_node_s_mean']:.0f} | "
                f"{r['bytes_per_node_s_max']:.0f} | {r['gossip_calls_per_node_s']:.2f} | "
                f"{r['cpu_per_node_pct']:.1f} | {r['state']} | {r['cold_start_s']:.1f} |"
            )
        lines.append("")
    if "phases" in results:
        lines += [
            "### Ending scaling phases: coordinator's waves vs each node after a quiet spell",
            "",
            "8 nodes in 4 stages; cold start to settled, then one stage-1 node SIGKILLed.",
            "",
            "| mode | seed | cold: flow messages sent | (produced) | cold: s | "
            "crash: flow messages sent | crash: s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["phases"]:
            if "error" in r:
                lines.append(f"| {r['mode']} | {r['seed']} | {r['error']} | | | | |")
                continue
            lines.append(
                f"| {r['mode']} | {r['seed']} | {r['cold_messages']} | {r['cold_emitted']} | "
                f"{r['cold_s']:.2f} | {r['crash_messages']} | {r['crash_s']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def collect(
    parts: Iterable[str], sizes: list[int], window_s: float, calls: int
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "rpc" in parts:
        results["rpc"] = rpc(calls)
    if "gossip" in parts:
        results["gossip"] = gossip(sizes, window_s)
    if "phases" in parts:
        results["phases"] = phases()
    if "churn" in parts:
        results["churn"] = [churn(geo=False), churn(geo=True)]
    OUT.mkdir(exist_ok=True)
    (OUT / "node_control.json").write_text(json.dumps(results, indent=1))
    return results


def run(quick: bool = False) -> str:
    """Every part (`--quick`: round trips and gossip up to 8 nodes), into section `node`."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    if quick:
        results = collect(["rpc", "gossip"], [4, 8], 5.0, 500)
        command = "python -m benchmarks node --quick"
    else:
        results = collect(PARTS, [4, 8, 16, 32], 10.0, 2000)
        command = "python -m benchmarks node"
    text = report(results, command)
    write_section("node", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node_control")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    # SIGTERM (a `timeout`) unwinds like Ctrl-C, so that every swarm is closed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = collect(args.only, args.sizes, args.window_s, args.calls)
    command = "python -m benchmarks.node_control " + " ".join(sys.argv[1:])
    text = report(results, command.strip())
    print(text)
    if args.write:
        write_section("node", text)
        log("wrote section node of benchmarks/RESULTS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
