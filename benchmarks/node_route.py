"""`python -m benchmarks noderoute`: the real node's routing, local solves against the relaxation.

    .venv/bin/python -m benchmarks noderoute                  # both parts, section `noderoute`
    .venv/bin/python -m benchmarks.node_route --only scale    # one part, printed only
    .venv/bin/python -m benchmarks.node_route --only scale --explore-peers 0 \
        --heartbeat-s 1.5 --failure-timeout-s 20               # 64 processes on 2 cores

Real `gwtf node --no-train` processes on 127.0.0.1 (tests/integration/cluster.py), heartbeat
0.5 s and failure timeout 5 s (the defaults) unless the scale part is given others.

- crash: 16 nodes in 4 stages on the emulated geo10 WAN (`--link-matrix geo10_aws.csv`, nodes
  spread over the 10 regions as `gwtf launch` spreads them, compute times from
  gpu_train_throughput.csv), once with `--routing local` (the default) and once with
  `--routing relax`, the same plan and the same three SIGKILLs (one node of stage 1, 2, 3 in
  turn, each after the swarm settled). After each kill the swarm's status is polled: the
  *delivered* flow is what reaches the last stage when every live node splits what it gets in
  the proportions of the out-rates it reports, as its weighted round-robin does, each node
  passing on at most its capacity and each arc at most its capacity (`gossip.delivered`),
  against the networkx oracle's maximum flow of the swarm without the victim on the geo10
  matrix. Reported: the first and last peer's detection (their logs), the first poll at which
  the delivered flow was at least 95% of that optimum, the time until settled (every node final
  and quiet, the same members everywhere, the flow value the oracle's: what the node tests
  check), and the messages spent: flow messages (the relaxation's), solves (local), and the
  membership gossip calls every node makes anyway. A *message delay* is the mean one-way delay
  between two of the swarm's nodes on the matrix (0.5 ms within a region): times are also given
  in those units.
- scale: 64 routing-only nodes in 4 stages, local routing, on loopback without emulated delay
  (each node a site of its own, no link matrix), started 8 at a time; the time from the last
  start until every node sees every member (formed), and until the flows settle as above, the
  whole swarm's CPU meanwhile, the arcs probed (flow and explored, `--explore-peers`) and the
  death verdicts in the logs (every one false: nothing is killed). 64 processes on 2 cores get
  1/32 of a core each and go silent for seconds at a time: `--heartbeat-s` and
  `--failure-timeout-s` set the failure detector for the machine (their values are in the
  table).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.node_control import (
    GEO10,
    OUT,
    _cpu_ticks,
    detection_times,
    flow_counts,
    formed,
    log,
    settle,
    start_swarm,
)
from benchmarks.report import write_section
from gwtf.flow.generate import geo10_links
from gwtf.flow.gossip import delivered
from gwtf.flow.oracle import solve_oracle
from gwtf.flow.topology import DEFAULT_INTRA, Members, NodeSpec, Topology
from gwtf.local.launch import _locations, plan_nodes
from tests.integration.cluster import LocalSwarm, wait_for

PARTS = ("crash", "scale")
VICTIMS = ("s1n0", "s2n1", "s3n2")
TARGET = 0.95
SETTLE_AFTER_KILL_S = 180.0


def _plans(n: int, stages: int, geo: bool) -> dict[str, Any]:
    locations = _locations(GEO10) if geo else []
    return {p.id: p for p in plan_nodes(n, stages, locations=locations, base_compute_s=0.1,
                                        seed=0)}  # fmt: skip


def message_delay_s(plans: Iterable[Any]) -> float:
    """Mean one-way delay between two distinct nodes of the plan on the geo10 matrix."""
    links = geo10_links()
    delays = []
    for a, b in itertools.combinations(list(plans), 2):
        rtt = DEFAULT_INTRA.rtt_ms if a.location == b.location else links[
            frozenset((a.location, b.location))
        ].rtt_ms
        delays.append(rtt / 2000)
    return statistics.fmean(delays)


def geo_topology(plans: Iterable[Any], activation_bytes: int) -> Topology:
    nodes = [NodeSpec.make(p.id, p.stage, p.compute_s, p.location) for p in plans]
    return Topology.build(activation_bytes, nodes, geo10_links())


def delivered_ratio(view: dict[str, Any], topology: Topology, optimum: int) -> float:
    """The flow the live nodes' reported out-rates deliver, over `optimum` (module doc)."""
    plan: dict[str, dict[str, int]] = {}
    for arc in view["arcs"]:
        if arc["flow_units"] > 0:
            plan.setdefault(arc["src"], {})[arc["dst"]] = arc["flow_units"]
    return delivered(Members.of(topology), {"old": plan}, {}) / max(1, optimum)


def gossip_calls(view: dict[str, Any]) -> dict[str, int]:
    return {n["id"]: n["gossip_calls_sent"] for n in view["nodes"]}


def crash(routing: str) -> dict[str, Any]:
    plans = _plans(16, 4, geo=True)
    delay = message_delay_s(plans.values())
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
        try:
            swarm, cold_s, _ = start_swarm(Path(tmp), 16, 4, geo=True,
                                           extra=("--routing", routing))  # fmt: skip
        except AssertionError as err:
            log(f"crash {routing}: {err}")
            return {"routing": routing, "error": str(err), "events": [], "delay_s": delay}
        rows = []
        with swarm:
            log(f"crash {routing}: 16 nodes settled {cold_s:.1f} s after the last started")
            alive = dict(plans)
            for victim in VICTIMS:
                try:
                    view = settle(swarm, 4, timeout_s=SETTLE_AFTER_KILL_S)
                except AssertionError as err:
                    rows.append({"victim": victim, "error": f"not settled before: {err}"})
                    break
                activation = view["swarm"]["activation_bytes"]
                before_flow = flow_counts(swarm)
                before_gossip = gossip_calls(view)
                before_solves = {n["id"]: n["solves"] for n in view["nodes"]}
                del alive[victim]
                topology = geo_topology(alive.values(), activation)
                optimum = solve_oracle(topology).flow_value_units
                at = swarm.kill(victim)
                wall = time.time() - (time.monotonic() - at)
                timeline: list[tuple[float, float]] = []
                settled_s = None
                deadline = at + SETTLE_AFTER_KILL_S
                while time.monotonic() < deadline:
                    polled = time.monotonic()
                    view = swarm.status()
                    if view is not None and len(view["nodes"]) >= 1:
                        timeline.append(
                            (polled - at, delivered_ratio(view, topology, optimum))
                        )
                    reached_yet = any(r >= TARGET for _, r in timeline)
                    if not reached_yet and len(timeline) % 4:
                        time.sleep(0.1)  # the settled check is slow: keep the polls dense
                        continue
                    sizes = [sum(1 for p in alive.values() if p.stage == s) for s in range(4)]
                    expect = set(alive)
                    arcs = sum(a * b for a, b in itertools.pairwise(sizes))
                    if swarm.settled(expect, arcs):
                        settled_s = time.monotonic() - at
                        break
                    time.sleep(0.1)
                seen = detection_times(swarm, victim, wall)
                first = min(seen) - wall if seen else None
                last = max(seen) - wall if seen else None
                reached = next((t for t, r in timeline if r >= TARGET), None)
                # Dips after the target was first reached (nodes switching apart).
                after_target = [r for t, r in timeline if reached is not None and t >= reached]
                end = swarm.status()
                flows = flow_counts(swarm)
                row = {
                    "victim": victim,
                    "first_detect_s": first,
                    "last_detect_s": last,
                    "ratio_at_detect": next(
                        (r for t, r in timeline if first is not None and t >= first), None
                    ),
                    "reached_95_s": reached,
                    "min_after_95": min(after_target) if after_target else None,
                    "settled_s": settled_s,
                    "flow_messages": sum(
                        c[0] - before_flow.get(n, (0, 0, 0))[0] for n, c in flows.items()
                    ),
                    "gossip_calls": sum(
                        c - before_gossip.get(n, 0) for n, c in gossip_calls(end).items()
                    ) if end else None,
                    "solves": sum(
                        n["solves"] - before_solves.get(n["id"], 0) for n in end["nodes"]
                    )
                    if end
                    else None,
                    "polls": len(timeline),
                }
                rows.append(row)
                log(f"crash {routing} {victim}: {row}")
        return {"routing": routing, "cold_start_s": cold_s, "events": rows, "delay_s": delay}


def scale(
    n: int, explore_peers: int = 2, heartbeat_s: float = 0.5, failure_timeout_s: float = 5.0,
    settle_s: float = 300.0,
) -> dict[str, Any]:
    """`n` routing-only processes on this machine: the time to form and to settle. The
    failure detector's settings are the node's defaults unless given: with 64 processes on 2
    cores each gets 1/32 of a core, and a silence of several seconds says nothing of a death."""
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-") as tmp:
        plans = plan_nodes(n, 4, locations=[], base_compute_s=0.1, seed=0)
        swarm = LocalSwarm(Path(tmp), heartbeat_s=heartbeat_s,
                           failure_timeout_s=failure_timeout_s,
                           extra=("--explore-peers", str(explore_peers)))  # fmt: skip
        with swarm:
            t0 = time.monotonic()
            first = swarm.spawn(plans[0].id, 0, plans[0].compute_s, "--stages", "4")
            swarm.wait_listening(first)
            swarm.bootstrap = first.address
            # In batches of 8: 63 Python processes importing grpc at once on 2 cores take
            # longer to start than a joiner's bootstrap call waits.
            for i in range(1, len(plans), 8):
                rest = [swarm.spawn(p.id, p.stage, p.compute_s) for p in plans[i : i + 8]]
                swarm.wait_listening(*rest, timeout_s=300)
            started = time.monotonic()
            pids = [p.popen.pid for p in swarm.live()]
            ticks0 = _cpu_ticks(pids)
            try:
                wait_for(lambda: formed(swarm), 300, f"{n} nodes to see each other", 1.0)
                formed_s = time.monotonic() - started
                view = settle(swarm, 4, timeout_s=settle_s)
            except AssertionError as err:
                log(f"scale {n}: {err}")
                return {"nodes": n, "explore_peers": explore_peers, "heartbeat_s": heartbeat_s,
                        "failure_timeout_s": failure_timeout_s, "error": str(err)}
            settled_s = time.monotonic() - started
            cpu_s = (_cpu_ticks(pids) - ticks0) / os.sysconf("SC_CLK_TCK")
            deaths = sum(p.log.read_text().count("declared dead") for p in swarm.live())
            row = {
                "nodes": n,
                "explore_peers": explore_peers,
                "heartbeat_s": heartbeat_s,
                "failure_timeout_s": failure_timeout_s,
                "probed_arcs": sum(1 for a in view["arcs"] if a["rtt_probes"] > 0),
                "false_deaths": deaths,
                "start_s": started - t0,
                "formed_s": formed_s,
                "settled_s": settled_s,
                "cpu_s": cpu_s,
                "flow_value": view["flow_value"],
                "arcs": len(view["arcs"]),
                "solves_mean": statistics.fmean(x["solves"] for x in view["nodes"]),
                "solve_ms_max": 1000 * max(x["last_solve_s"] for x in view["nodes"]),
            }
            log(f"scale {row}")
            return row


def report(results: dict[str, Any], command: str) -> str:
    load = results.get("load", os.getloadavg())
    lines = [
        "## The node's routing: local solves and the relaxation (`python -m benchmarks "
        "noderoute`)",
        "",
        f"Produced by `{command}` on {platform.machine()}, {os.cpu_count()} cores shared with "
        f"other work (load average {load[0]:.1f} at the end), Python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        (__doc__ or "").split("\n\n", 2)[2].strip(),
        "",
    ]
    for part in results.get("crash", []):
        delay = part["delay_s"]
        lines += [
            f"### SIGKILL, 16 nodes in 4 stages, emulated geo10 WAN, `--routing "
            f"{part['routing']}`",
            "",
        ]
        if "error" in part:
            lines += [f"Not measured: {part['error']}.", ""]
            continue
        lines += [
            f"Cold start: settled {part['cold_start_s']:.1f} s after the last node started. "
            f"A message delay: {1000 * delay:.1f} ms.",
            "",
            "| victim | first / last peer detects (s) | delivered at the first poll after it | "
            ">= 95% at (s) | after first detection (s / delays) | lowest after | settled (s) "
            "| settled after first detection (delays) | flow messages | solves | gossip calls |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in part["events"]:
            if "error" in e:
                lines.append(f"| {e['victim']} | {e['error']} |" + " |" * 9)
                continue

            def fmt(x: float | None, spec: str = ".2f") -> str:
                return "-" if x is None else format(x, spec)

            first = e["first_detect_s"]
            reached = e["reached_95_s"]
            since = reached - first if reached is not None and first is not None else None
            if since is not None and since < 0:
                since = 0.0  # at 95% before anyone detected the death
            settled = e["settled_s"]
            settled_since = settled - first if settled is not None and first is not None else None
            lines.append(
                f"| {e['victim']} | {fmt(first)} / {fmt(e['last_detect_s'])} | "
                f"{fmt(e['ratio_at_detect'], '.3f')} | {fmt(reached)} | "
                f"{fmt(since)} / {fmt(since / delay if since is not None else None, '.0f')} | "
                f"{fmt(e['min_after_95'], '.3f')} | "
                f"{fmt(settled) if settled is not None else 'not in 180 s'} | "
                f"{fmt(settled_since / delay if settled_since is not None else None, '.0f')} | "
                f"{e['flow_messages']:,} | {e['solves']} | {e['gossip_calls']} |"
            )
        lines.append("")
    if "scale" in results:
        lines += [
            "### Routing-only swarms, local routing, loopback (each node a site of its own)",
            "",
            "| nodes | explored peers per node | heartbeat / failure timeout (s) | "
            "processes started (s) | formed after (s) | "
            "settled after (s) | CPU while forming and settling (s, all processes) | arcs | "
            "arcs probed | death verdicts | flow (mb/s) | solves per node | slowest solve (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["scale"]:
            explore = r.get("explore_peers", "-")
            detector = f"{r.get('heartbeat_s', 0.5)} / {r.get('failure_timeout_s', 5.0)}"
            if "error" in r:
                lines.append(f"| {r['nodes']} | {explore} | {detector} | {r['error']} |"
                             + " |" * 9)
                continue
            lines.append(
                f"| {r['nodes']} | {explore} | {detector} | {r['start_s']:.1f} | "
                f"{r['formed_s']:.1f} | "
                f"{r['settled_s']:.1f} | {r['cpu_s']:.0f} | {r['arcs']} | "
                f"{r.get('probed_arcs', '-')} | {r.get('false_deaths', '-')} | "
                f"{r['flow_value']:.2f} | {r['solves_mean']:.1f} | {r['solve_ms_max']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def collect(
    parts: Iterable[str],
    sizes: list[int],
    routings: Iterable[str] = ("local", "relax"),
    explore: Iterable[int] = (2,),
    detector: tuple[float, float] = (0.5, 5.0),
    settle_s: float = 300.0,
) -> dict[str, Any]:
    """`detector`: the scale part's heartbeat and failure timeout (s)."""
    results: dict[str, Any] = {}
    OUT.mkdir(exist_ok=True)

    def keep() -> None:  # after every part: a later one that fails loses nothing
        (OUT / "node_route.json").write_text(json.dumps(results, indent=1))

    if "crash" in parts:
        results["crash"] = []
        for routing in routings:
            results["crash"].append(crash(routing))
            keep()
    if "scale" in parts:
        results["scale"] = []
        for n in sizes:
            for k in explore:
                results["scale"].append(scale(n, k, *detector, settle_s=settle_s))
                keep()
    results["load"] = os.getloadavg()
    keep()
    return results


def run(quick: bool = False) -> str:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    results = collect(PARTS if not quick else ("scale",), [64] if not quick else [16])
    text = report(results, "python -m benchmarks noderoute" + (" --quick" if quick else ""))
    if not quick:
        write_section("noderoute", text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node_route")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--routings", nargs="+", choices=("local", "relax"),
                        default=["local", "relax"])
    parser.add_argument("--explore-peers", type=int, nargs="+", default=[2], metavar="K",
                        help="scale: run each size with each node's --explore-peers K")
    parser.add_argument("--heartbeat-s", type=float, default=0.5,
                        help="scale: each node's heartbeat period (default 0.5, the node's)")
    parser.add_argument("--failure-timeout-s", type=float, default=5.0,
                        help="scale: each node's failure timeout (default 5, the node's)")
    parser.add_argument("--settle-s", type=float, default=300.0,
                        help="scale: how long to wait for the flows to settle (default 300)")
    parser.add_argument("--write", action="store_true", help="put the section in RESULTS.md")
    parser.add_argument("--from-json", metavar="PATH",
                        help="report a run saved in benchmarks/out (its command with --command)")
    parser.add_argument("--command", help="the command that produced --from-json's run")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        command = args.command or "python -m benchmarks.node_route"
    else:
        results = collect(args.only, args.sizes, args.routings, args.explore_peers,
                          (args.heartbeat_s, args.failure_timeout_s), args.settle_s)
        command = "python -m benchmarks.node_route " + " ".join(sys.argv[1:])
    text = report(results, command.strip())
    print(text)
    if args.write:
        write_section("noderoute", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
