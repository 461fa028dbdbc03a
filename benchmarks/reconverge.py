"""Reconvergence benchmark: how long the routing takes to settle again after a change.

`python -m benchmarks reconverge [--quick]`. The real flow state machines run on
`gwtf.sim.routing.control.ControlPlane`: every message takes the one-way delay of the geo10 link
between its ends (`gwtf/data/geo10_aws.csv`, RTT up to ~300 ms, 1 ms within a region) times
1 + 0.1 U(0, 1); a scaling phase ends two of the slowest one-way delays after the swarm went
quiet; a rescale asked for is applied at once. Swarms from `gwtf.flow.generate.geo10` with the
node's swarm-wide settings (`SwarmSettings`: arc costs 0.01-2 s, hence 6 scaling phases). From
the converged cold start, one change after the other, each from the state the last one left:

- crash (cut): the node of the most loaded stage that carries the most flow in the optimum;
- crash (other): the same in the next stage;
- join: a node with the fastest GPU of gpu_train_throughput.csv joins the most loaded stage;
- link: the inter-region link carrying the most flow gets 4x slower (bandwidth / 4, RTT x 2);
  every arc over it gets the new parameters, and every machine hears of it (as the simulator
  does for a link row of a trace);
- re-measure: the busiest arc's tail re-measures it with noisy parameters (capacity x 0.4,
  cost x 1.6: past the node's hysteresis, as a loaded machine measures); only its two ends hear
  of it, as in the node;
- re-measure back: the same tail measures the true parameters again.

Each change is timed in simulated seconds from the change until every machine is final and
nothing is in flight (what the node's tests call reconverged); messages count every flow message
delivered. After each, the flows are checked against the networkx oracle of the changed swarm
(value equal, cost within 1%); a variant that misses it fails the benchmark. Both variants run
on the same swarms, seeds and changes:

- before: the drivers as they were: a changed arc is re-created empty (`FlowNode.add_peer`), a
  rescale is asked after 64 relabels at the final epsilon;
- after: a changed arc is updated in place and an update that breaks a condition asks for a
  rescale at once (`FlowNode.update_arc`); a rescale is asked after 16 relabels at the final
  epsilon (`FlowConfig.rescale_after_final`), 64 in the middle of a scaling.

Under churn: the simulator's `high_churn` scenario (24 nodes over the geo10 regions, a crash
every ~50 s and as many joins, crashes noticed after 10 s; simulations/high_churn.toml) with the
gwtf policy, full length, for the file's seed and three more: throughput (microbatches trained
per simulated second) and control messages, before and after. It has no link changes, so there
the two variants differ only in when a machine asks for a rescale.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx
import numpy as np

from benchmarks.report import machine, write_section
from gwtf.flow.generate import geo10, gpu_speeds
from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network, solve_oracle
from gwtf.flow.relax.bus import node_views
from gwtf.flow.relax.decentralized import FlowConfig
from gwtf.flow.solution import feasibility_violations
from gwtf.flow.topology import LinkSpec, NodeSpec, Topology, cost_to_units
from gwtf.sim.policies import GwtfPolicy, simulation
from gwtf.sim.routing.control import ControlPlane, Settled
from gwtf.sim.scenario import load_scenario
from gwtf.sim.simulator import SimulationError

CASES = [(16, 4), (32, 4), (32, 8), (64, 8)]
QUICK_CASES = [(16, 4)]
SEEDS = [0, 1, 2, 3, 4, 5]
QUICK_SEEDS = [0]
EVENTS = ("crash (cut)", "crash (other)", "join", "link", "re-measure", "re-measure back")
COST_TOLERANCE = 0.01

Overrides = dict[tuple[str, str], tuple[int, int]]
Results = dict[tuple[str, int, int, int, str], Settled]


@dataclass(frozen=True)
class Variant:
    name: str
    configure: Callable[[FlowConfig], FlowConfig]
    in_place: bool


BEFORE = Variant(
    "before",
    lambda config: replace(config, rescale_after=64, rescale_after_final=64),
    in_place=False,
)
AFTER = Variant("after", lambda config: config, in_place=True)


def swarm_config(stages: int) -> FlowConfig:
    """What `gwtf.node.config.SwarmSettings.create` gives a swarm of `stages` stages."""
    return FlowConfig.for_costs(stages, cost_to_units(2.0), cost_to_units(0.01))


def _oracle(topology: Topology, overrides: Overrides) -> tuple[int, int]:
    """Flow value and least cost (units) of `topology` with some arcs' parameters overridden."""
    graph = build_oracle_network(topology)
    for (src, dst), (cap, cost) in overrides.items():
        graph.edges[(src, 1), (dst, 0)].update(capacity=cap, weight=cost)
    flow = nx.max_flow_min_cost(graph, SOURCE, SINK, capacity="capacity", weight="weight")
    value = sum(int(units) for units in flow[SOURCE].values())
    cost = sum(
        int(flow[(a.src, 1)][(a.dst, 0)]) * graph.edges[(a.src, 1), (a.dst, 0)]["weight"]
        for a in topology.arcs
    )
    return value, cost


def exact(plane: ControlPlane, topology: Topology, overrides: Overrides) -> bool:
    """The flows are feasible, of the oracle's value and within 1% of its cost."""
    flows = plane.flows()
    if feasibility_violations(topology, flows):  # overrides only ever lower a capacity here
        return False
    value = sum(units for (src, _), units in flows.items() if topology.node(src).stage == 0)
    cost = 0
    for (src, dst), units in flows.items():
        arc = topology.arc(src, dst)
        cap, arc_cost = overrides.get((src, dst), (arc.cap_units, arc.cost_units))
        if units > cap:
            return False
        cost += units * arc_cost
    best_value, best_cost = _oracle(topology, overrides)
    return value == best_value and cost <= best_cost * (1 + COST_TOLERANCE)


def _through(topology: Topology) -> dict[str, int]:
    """Flow units through each node in the oracle's optimum."""
    through: dict[str, int] = {}
    for (src, dst), units in solve_oracle(topology).flows.items():
        through[dst] = through.get(dst, 0) + units
        if topology.node(src).stage == 0:
            through[src] = through.get(src, 0) + units
    return through


def _hot_stage(topology: Topology, through: dict[str, int]) -> int:
    load = []
    for stage in range(topology.num_stages):
        ids = topology.stage_nodes(stage)
        cap = sum(topology.node(n).cap_units for n in ids)
        load.append((sum(through.get(n, 0) for n in ids) / max(1, cap), stage))
    return max(load)[1]


def scenario(
    topology: Topology, seed: int, config: FlowConfig, *, in_place: bool
) -> Iterator[tuple[str, Settled, bool]]:
    """Cold start, then the changes of the module doc; yields (event, what it took, exact).
    The changes are chosen from the oracle's optimum, so every variant gets the same ones."""
    plane = ControlPlane.for_topology(topology, config, seed=seed, in_place=in_place)
    yield "cold start", plane.run_timed(), exact(plane, topology, {})
    for event in ("crash (cut)", "crash (other)"):
        through = _through(topology)
        stage = _hot_stage(topology, through)
        if event == "crash (other)":
            stage = (stage + 1) % topology.num_stages
        if len(topology.stage_nodes(stage)) < 2:
            continue
        victim = max(topology.stage_nodes(stage), key=lambda n: (through.get(n, 0), n))
        topology = topology.without_node(victim)
        plane.remove(victim)
        yield event, plane.run_timed(), exact(plane, topology, {})

    rng = np.random.default_rng([seed, 7])
    stage = _hot_stage(topology, _through(topology))
    regions = sorted({topology.node(n).location for n in topology.node_ids})
    location = regions[int(rng.integers(len(regions)))]
    speed = max(s for _, s in gpu_speeds())
    topology = topology.with_node(NodeSpec.make("joiner", stage, 0.1 / speed, location))
    plane.place("joiner", location)
    plane.join(node_views(topology)["joiner"])
    yield "join", plane.run_timed(), exact(plane, topology, {})

    per_link: dict[frozenset[str], int] = {}
    for (src, dst), units in solve_oracle(topology).flows.items():
        pair = frozenset((topology.node(src).location, topology.node(dst).location))
        if len(pair) == 2:
            per_link[pair] = per_link.get(pair, 0) + units
    if per_link:
        busiest: frozenset[str] = max(per_link, key=lambda p: (per_link[p], sorted(p)))
        a, b = sorted(busiest)
        old = topology.link_between(a, b)
        assert old is not None
        topology = topology.with_link(a, b, LinkSpec(old.rtt_ms * 2, old.bandwidth_gbps / 4))
        plane.link_changed(topology, a, b)
        yield "link", plane.run_timed(), exact(plane, topology, {})

    flows = solve_oracle(topology).flows
    src, dst = max(flows, key=lambda k: (flows[k], k))
    arc = topology.arc(src, dst)
    noisy = (int(arc.cap_units * 0.4), int(arc.cost_units * 1.6))
    plane.recreate(src, dst, *noisy)
    yield "re-measure", plane.run_timed(), exact(plane, topology, {(src, dst): noisy})
    plane.recreate(src, dst, arc.cap_units, arc.cost_units)
    yield "re-measure back", plane.run_timed(), exact(plane, topology, {})


def measure(variants: list[Variant], cases: list[tuple[int, int]], seeds: list[int]) -> Results:
    results: Results = {}
    for nodes, stages in cases:
        for seed in seeds:
            topology = geo10(np.random.default_rng(seed), nodes, stages)
            for variant in variants:
                t0 = time.perf_counter()
                config = variant.configure(swarm_config(stages))
                for event, settled, ok in scenario(
                    topology, seed, config, in_place=variant.in_place
                ):
                    if not ok:
                        raise AssertionError(
                            f"{variant.name} {nodes}x{stages} seed {seed}: the flows after "
                            f"{event} are not the oracle's"
                        )
                    results[(variant.name, nodes, stages, seed, event)] = settled
                print(
                    f"reconverge {variant.name} {nodes}x{stages} seed {seed}: "
                    f"{time.perf_counter() - t0:.1f} s wall",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def _rows(results: Results, variant: str, event: str, case: tuple[int, int] | None) -> list[
    Settled
]:
    return [
        s for (v, n, st, _, e), s in results.items()
        if v == variant and e == event and (case is None or (n, st) == case)
    ]  # fmt: skip


def _cells(rows: list[Settled]) -> str:
    seconds = statistics.fmean(r.seconds for r in rows)
    messages = statistics.fmean(r.messages for r in rows)
    rescales = statistics.fmean(r.rescales for r in rows)
    return f"{seconds:.1f} | {max(r.seconds for r in rows):.1f} | {messages:,.0f} | {rescales:.2f}"


def tables(results: Results, cases: list[tuple[int, int]], seeds: list[int]) -> list[str]:
    lines = [
        f"All swarms ({', '.join(f'{n}x{s}' for n, s in cases)}; seeds "
        f"{', '.join(map(str, seeds))}): means per change; the ratio is after / before.",
        "",
        "| change | before: settled s | max | messages | rescales | after: settled s | max "
        "| messages | rescales | time ratio | messages ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals = {"before": [0.0, 0.0], "after": [0.0, 0.0]}
    for event in ("cold start", *EVENTS):
        before = _rows(results, BEFORE.name, event, None)
        after = _rows(results, AFTER.name, event, None)
        if not before or not after:
            continue
        ratios = []
        for key in ("seconds", "messages"):
            b = statistics.fmean(getattr(r, key) for r in before)
            a = statistics.fmean(getattr(r, key) for r in after)
            ratios.append(a / b)
            if event != "cold start":
                index = 0 if key == "seconds" else 1
                totals["before"][index] += b
                totals["after"][index] += a
        lines.append(
            f"| {event} | {_cells(before)} | {_cells(after)} | {ratios[0]:.2f} | "
            f"{ratios[1]:.2f} |"
        )
    (bs, bm), (as_, am) = totals["before"], totals["after"]
    lines += [
        f"| every change (sum of the means) | {bs:.1f} | | {bm:,.0f} | | {as_:.1f} | | "
        f"{am:,.0f} | | {as_ / bs:.2f} | {am / bm:.2f} |",
        "",
        "Per swarm size (means over the seeds): settled s / messages, before -> after.",
        "",
        "| change | " + " | ".join(f"{n}x{s}" for n, s in cases) + " |",
        "|---|" + "---|" * len(cases),
    ]
    for event in ("cold start", *EVENTS):
        cells = []
        for case in cases:
            before = _rows(results, BEFORE.name, event, case)
            after = _rows(results, AFTER.name, event, case)
            if not before or not after:
                cells.append("n/a")
                continue
            cells.append(
                f"{statistics.fmean(r.seconds for r in before):.1f} / "
                f"{statistics.fmean(r.messages for r in before):,.0f} -> "
                f"{statistics.fmean(r.seconds for r in after):.1f} / "
                f"{statistics.fmean(r.messages for r in after):,.0f}"
            )
        lines.append(f"| {event} | " + " | ".join(cells) + " |")
    return lines


CHURN_SCENARIO = Path(__file__).resolve().parents[1] / "simulations" / "high_churn.toml"
CHURN_SEEDS = [0, 1, 2, 3]


class _PolicyBefore(GwtfPolicy):
    """The gwtf policy with the flow configuration of `BEFORE` (its drivers' rule for a link
    change is not exercised: the churn scenario has none)."""

    def _config(self) -> FlowConfig:
        return BEFORE.configure(super()._config())


def churn(seeds: list[int]) -> list[str]:
    """The `high_churn` rows: seed, then throughput and messages before and after."""
    rows = []
    for seed in seeds:
        scenario = load_scenario(CHURN_SCENARIO, seed=seed)
        cells = []
        for variant in (BEFORE, AFTER):
            t0 = time.perf_counter()
            sim = simulation(scenario, "gwtf")
            if variant is BEFORE:
                sim.policy = _PolicyBefore(sim)
            try:
                result = sim.run()
            except SimulationError as err:
                cells.append(f"simulator invariant broke: {err} | ")
            else:
                cells.append(f"{result.throughput_mean:.3f} | {result.control_messages:,}")
            print(
                f"reconverge churn seed {seed} {variant.name}: "
                f"{time.perf_counter() - t0:.1f} s wall",
                file=sys.stderr,
                flush=True,
            )
        rows.append(f"| {seed} | {cells[0]} | {cells[1]} |")
    return rows


def run(quick: bool = False) -> str:
    cases = QUICK_CASES if quick else CASES
    seeds = QUICK_SEEDS if quick else SEEDS
    t0 = time.perf_counter()
    results = measure([BEFORE, AFTER], cases, seeds)
    wall = time.perf_counter() - t0
    intro = ("What is run, each change and the two variants: the docstring of "
             "benchmarks/reconverge.py.")
    lines = [
        "## Reconvergence after a change (`python -m benchmarks reconverge`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()} ({wall:.0f} s wall for both "
        "variants). Simulated time: the figures do not depend on the machine's load.",
        "",
        intro,
        "",
        *tables(results, cases, seeds),
    ]
    if not quick:
        lines += [
            "",
            "Under churn (`high_churn`, gwtf policy, full length):",
            "",
            "| seed | before: mb/s | messages | after: mb/s | messages |",
            "|---|---|---|---|---|",
            *churn(CHURN_SEEDS),
        ]
    body = "\n".join(lines)
    if not quick:
        write_section("reconverge", body)
    return body
