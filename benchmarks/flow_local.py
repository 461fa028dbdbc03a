"""Section `flow`: local solves on gossiped records (`gwtf route`, the default method).

See benchmarks/flow.py for what is measured; every ratio is against a baseline measured in the
same run: the networkx oracle on the full node graph (not the project's solver), or, at 10,000
nodes where that graph (4.75 million arcs) is out of reach, an upper bound on the maximum flow
(the smallest stage capacity, a cut) and a feasibility check written here, apart from the solver.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.report import machine, write_section
from gwtf.flow.generate import geo10, geo10_members, members_to_file, topology_to_file
from gwtf.flow.gossip import crash_curve, disseminate
from gwtf.flow.localsolve import solve_members
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units, feasibility_violations
from gwtf.flow.topology import Members, cap_to_units

CASES = [(40, 4), (100, 6), (200, 8), (400, 12), (1000, 10)]
QUICK_CASES = [(40, 4), (100, 6)]
SEEDS = [0, 1]
CRASH_ROUNDS = (0, 1, 2, 3, 5, 10, 20, 40, 41, 45, 200)


def _quality(nodes: int, stages: int, seed: int) -> str:
    topo = geo10(np.random.default_rng(seed), nodes, stages)
    t0 = time.perf_counter()
    oracle = solve_oracle(topo)
    oracle_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spread = disseminate(nodes, [1 << i for i in range(nodes)], random.Random(seed))
    gossip_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    solved = solve_members(Members.of(topo))
    solve_s = time.perf_counter() - t0
    assert feasibility_violations(topo, solved.flows) == []
    last = set(topo.stage_nodes(stages - 1))
    value = sum(x for (_, d), x in solved.flows.items() if d in last)
    flow_ratio = value / oracle.flow_value_units
    cost_ratio = cost_units(topo, solved.flows) / oracle_cost_units(topo, oracle)
    print(f"flow local {nodes}x{stages} seed {seed}: {flow_ratio:.9f} {cost_ratio:.9f}",
          file=sys.stderr, flush=True)
    return (
        f"| {nodes} | {stages} | {seed} | {flow_ratio:.9f} | {cost_ratio:.9f} | "
        f"{solved.groups} | {solved.hub_arcs} | {solved.direct_arcs} | {solved.solves} | "
        f"{spread.messages / nodes:.0f} | {spread.rounds} | {solve_s:.2f} | {gossip_s:.2f} | "
        f"{oracle_s:.2f} | {oracle_s / solve_s:.1f}x |"
    )


def _route(path: Path, *extra: str) -> tuple[float, dict[str, object]]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gwtf", "route", str(path), "--json", *extra],
        capture_output=True, text=True, check=True,
    )
    return time.perf_counter() - t0, json.loads(done.stdout)


def _check(members: Members, arcs: list[dict[str, object]]) -> tuple[list[str], float]:
    """Feasibility from first principles (arc capacity = bandwidth / 8 / activation bytes, node
    capacity = 1 / compute_s or the stated one), and the smallest stage capacity: a cut."""
    node = {n.id: n for n in members.nodes}
    last = max(n.stage for n in members.nodes)
    act = members.activation_bytes
    into: dict[str, float] = defaultdict(float)
    out: dict[str, float] = defaultdict(float)
    problems = []
    for arc in arcs:
        s, d, f = str(arc["src"]), str(arc["dst"]), float(arc["flow"])  # type: ignore[arg-type]
        a, b = node[s], node[d]
        link = (members.intra if a.location == b.location
                else members.links.get(frozenset((a.location, b.location))))
        if link is None or b.stage != a.stage + 1 or (s, d) in members.blocked:
            problems.append(f"no arc {s}->{d}")
            continue
        if f > link.bandwidth_gbps * 1e9 / 8 / act + 1e-6:
            problems.append(f"arc {s}->{d} over capacity")
        out[s] += f
        into[d] += f
    for n in members.nodes:
        if 0 < n.stage < last and abs(into[n.id] - out[n.id]) > 1e-5:
            problems.append(f"node {n.id} does not conserve flow")
        if (out[n.id] if n.stage == 0 else into[n.id]) > n.capacity + 1e-6:
            problems.append(f"node {n.id} over capacity")
    stage_cap = [0.0] * (last + 1)
    for n in members.nodes:
        stage_cap[n.stage] += cap_to_units(n.capacity) / 1e6
    return problems, min(stage_cap)


def _routes(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g1k.json"
        topology_to_file(geo10(np.random.default_rng(0), 1000, 10), path)
        ours_s, ours = _route(path)
        oracle_s, oracle = _route(path, "--oracle")
        flow_ratio = float(ours["flow_value"]) / float(oracle["flow_value"])  # type: ignore[arg-type]
        cost_ratio = float(ours["total_cost"]) / float(oracle["total_cost"])  # type: ignore[arg-type]
        lines += [
            "",
            f"`gwtf route` on 1000 nodes in 10 stages (geo10 seed 0, a child process, file load "
            f"and JSON output included): **{ours_s:.1f} s**, {ours['rounds']} rounds, "
            f"{ours['messages']} messages (targets 30 s and 500 rounds); `gwtf route --oracle` on "
            f"the same file: {oracle_s:.1f} s, so {oracle_s / ours_s:.1f}x faster than the central "
            f"solve. Flow ratio {flow_ratio:.9f}, cost ratio {cost_ratio:.9f} (targets >= 0.99 and "
            "<= 1.02).",
        ]
        members = geo10_members(np.random.default_rng(0), 10000, 20)
        path = Path(tmp) / "g10k.json"
        members_to_file(members, path)
        big_s, big = _route(path)
        arcs = big["arcs"]
        assert isinstance(arcs, list)
        problems, bound = _check(members, arcs)
        value = float(big["flow_value"])  # type: ignore[arg-type]
        lines += [
            "",
            f"`gwtf route` on 10000 nodes in 20 stages (geo10 seed 0, one process): **{big_s:.1f} "
            f"s** (target 60 s), {big['rounds']} rounds, {big['messages']} messages, "
            f"{len(arcs)} arcs with flow. Independent checks (the full node graph, 4.75 million "
            f"arcs, is beyond networkx here): feasibility from first principles "
            f"({len(problems)} violations); flow {value:.3f} against the smallest stage capacity "
            f"{bound:.3f}, an upper bound on the maximum flow: ratio {value / bound:.9f}. The cost "
            "was not checked against an optimum at this size.",
        ]


def _crashes(lines: list[str]) -> None:
    members = geo10_members(np.random.default_rng(0), 1000, 10)
    old = solve_members(members)
    through: dict[str, int] = defaultdict(int)
    for (_, d), x in old.flows.items():
        through[d] += x
    for (s, _), x in old.flows.items():
        if s.startswith("s0"):
            through[s] += x
    stage = {n.id: n.stage for n in members.nodes}
    caps = {n.id: n.cap_units for n in members.nodes}
    load = []
    for k in range(10):
        ids = [n for n in stage if stage[n] == k]
        load.append((sum(through[n] for n in ids) / sum(caps[n] for n in ids), k))
    hot = max(load)[1]
    victims = [
        ("bottleneck", max((n for n in stage if stage[n] == hot), key=lambda n: (through[n], n))),
        ("busiest of another stage",
         max((n for n in stage if stage[n] != hot), key=lambda n: (through[n], n))),
    ]
    lines += [
        "",
        "After a crash at 1000 nodes in 10 stages (geo10 seed 0): the delivered flow over the new "
        "optimum at each round after the crash (round 0), while the death spreads. The neighbours "
        "detect it within one delay (1-3 rounds), its upstream senders repair at once, every node "
        "changes to the new solution 40 rounds after the first detection (`SWITCH_AFTER`). "
        "Delivered flow: each node splits what it gets in the proportions of its plan, capped by "
        "node and arc capacities (`gossip.delivered`). Last column: the lowest ratio if instead "
        "each node changed as soon as it learned (`switch_after=0`).",
        "",
        "| victim | new opt / old | " + " | ".join(f"r{t}" for t in CRASH_ROUNDS)
        + " | min | first >= 0.95 | first at opt | death known by all (rounds) | messages | "
        "min, switching one by one |",
        "|---|---|" + "---|" * len(CRASH_ROUNDS) + "---|---|---|---|---|---|",
    ]
    for kind, victim in victims:
        curve = crash_curve(members, victim, old, seed=0)
        eager = crash_curve(members, victim, old, seed=0, switch_after=0)
        r = curve.ratios
        first95 = next((t for t, x in enumerate(r) if x >= 0.95), None)
        first_opt = next((t for t, x in enumerate(r) if x >= 1 - 1e-6), None)
        lines.append(
            f"| {kind} {victim} | {curve.new_value / curve.old_value:.4f} | "
            + " | ".join(f"{r[t]:.4f}" for t in CRASH_ROUNDS)
            + f" | {min(r):.4f} | {first95} | {first_opt} | {curve.rounds} | {curve.messages} | "
            f"{min(eager.ratios):.4f} |"
        )


def run_local(quick: bool = False) -> str:
    lines = [
        "## Routing: local solves on gossiped records vs the networkx oracle "
        "(`python -m benchmarks flow`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one core per process. Topologies "
        "from `gwtf.flow.generate.geo10` (10 AWS regions, GPUs from `gpu_train_throughput.csv`, "
        "0.1 s per stage on a V100, 8 MiB activations). Gossip: push to 3 random peers of what is "
        "new, anti-entropy pull every 2 rounds, each message delivered 1-3 rounds after it is "
        "sent (the relaxation's bus's unit; section `flow-relax`). Ratios are against the "
        "networkx oracle (`max_flow_min_cost` on the full node graph) in the same run; `speed-up` "
        "is oracle s / local solve s. `groups`, `hubs`, `direct`: the aggregate network's group "
        "vertices, hub arcs and direct group arcs; `solves`: network solves including re-solves.",
        "",
        "| nodes | stages | seed | flow ratio | cost ratio | groups | hubs | direct | solves | "
        "msgs/node | rounds | solve s | gossip sim s | oracle s | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for nodes, stages in QUICK_CASES if quick else CASES:
        for seed in SEEDS:
            lines.append(_quality(nodes, stages, seed))
    if not quick:
        _routes(lines)
        _crashes(lines)
    body = "\n".join(lines)
    write_section("flow", body)
    return body
