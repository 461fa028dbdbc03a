"""Local solves on gossiped records (docs/design.md 2.12) against the networkx oracle on the full
node graph; the split back to node pairs; gossip; crash repair; `gwtf route --method`."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from gwtf.flow.generate import geo10, geo10_members, random_layered, topology_to_file
from gwtf.flow.gossip import crash_curve, delivered, disseminate, repair, without_node
from gwtf.flow.localsolve import evaluate, solve_members
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units, feasibility_violations, make_result
from gwtf.flow.topology import Members, Topology, TopologyError, load_members, parse_topology

REPO = Path(__file__).resolve().parents[2]


def random_case(seed: int) -> Topology:
    """A small adversarial topology (missing links, explicit capacities), some arcs blocked."""
    rng = np.random.default_rng(seed)
    topo = random_layered(rng, int(rng.integers(4, 30)), int(rng.integers(2, 5)))
    for _ in range(int(rng.integers(0, 4))):
        if topo.arcs:
            arc = topo.arcs[int(rng.integers(len(topo.arcs)))]
            topo = topo.without_arc(arc.src, arc.dst)
    return topo


def value_units(topo: Topology, flows: dict[tuple[str, str], int]) -> int:
    last = set(topo.stage_nodes(topo.num_stages - 1))
    return sum(x for (_, d), x in flows.items() if d in last)


@pytest.mark.parametrize("seed", range(40))
def test_groups_equal_the_oracle_exactly(seed: int) -> None:
    # Without hub relaxations the group network is the node network's exact aggregate: same
    # maximum flow, same least cost, to the unit.
    topo = random_case(seed)
    oracle = solve_oracle(topo)
    solved = solve_members(Members.of(topo), hub_slack=None)
    assert feasibility_violations(topo, solved.flows) == []
    assert value_units(topo, solved.flows) == oracle.flow_value_units
    assert cost_units(topo, solved.flows) == oracle_cost_units(topo, oracle)
    assert solved.trimmed_units == 0


@pytest.mark.parametrize("seed", range(40))
def test_hubs_keep_the_flow_and_the_cost(seed: int) -> None:
    topo = random_case(seed)
    oracle = solve_oracle(topo)
    solved = solve_members(Members.of(topo))
    assert feasibility_violations(topo, solved.flows) == []
    assert value_units(topo, solved.flows) == oracle.flow_value_units
    # Hub arcs carry the two halves of a compute cost, each rounded: within 2 units per arc.
    assert cost_units(topo, solved.flows) <= oracle_cost_units(topo, oracle) * (1 + 1e-6) + 10


@pytest.mark.parametrize("seed", range(12))
def test_bytes_per_boundary_are_priced_as_the_oracle_prices_them(seed: int) -> None:
    """A compression plan (docs/design.md 2.15): each boundary's arcs carry its own bytes; the
    local solve reads them from Members as the oracle from the Topology."""
    topo = random_case(seed)
    rng = np.random.default_rng(seed)
    sizes = tuple(int(topo.activation_bytes / rng.choice([1.0, 3.76, 7.1]))
                  for _ in range(topo.num_stages - 1))
    planned = topo.with_boundary_bytes(sizes)
    oracle = solve_oracle(planned)
    solved = solve_members(Members.of(planned), hub_slack=None)
    assert feasibility_violations(planned, solved.flows) == []
    assert value_units(planned, solved.flows) == oracle.flow_value_units
    assert cost_units(planned, solved.flows) == oracle_cost_units(planned, oracle)
    fewer = topo.with_boundary_bytes([max(1, s // 10) for s in sizes])
    assert solve_oracle(fewer).flow_value_units >= solve_oracle(topo).flow_value_units


def test_geo10_matches_the_oracle() -> None:
    topo = geo10(np.random.default_rng(3), 200, 8)
    oracle = solve_oracle(topo)
    solved = solve_members(Members.of(topo))
    assert solved.groups < len(topo.nodes) and solved.hub_arcs > 0
    assert feasibility_violations(topo, solved.flows) == []
    assert value_units(topo, solved.flows) >= oracle.flow_value_units - 10
    assert cost_units(topo, solved.flows) <= oracle_cost_units(topo, oracle) * (1 + 1e-6)


def test_interchangeable_nodes_form_one_group_and_split_evenly() -> None:
    # Four identical holders and four identical relays at one location: one group per stage,
    # and the relays' 4 x 10 mb/s spread as 10 mb/s per relay.
    nodes = [
        {"id": f"{k}{i}", "stage": s, "compute_s": 0.1, "location": "A"}
        for s, k in ((0, "h"), (1, "r"))
        for i in range(4)
    ]
    topo = parse_topology({"activation_bytes": 1_000_000, "nodes": nodes, "links": []})
    solved = solve_members(Members.of(topo))
    assert solved.groups == 2
    through: dict[str, int] = {}
    for (_, d), x in solved.flows.items():
        through[d] = through.get(d, 0) + x
    assert through == {f"r{i}": 10_000_000 for i in range(4)}
    assert feasibility_violations(topo, solved.flows) == []


def test_pair_capacity_binds_on_a_shared_hub() -> None:
    # One fast holder in A, two slow relays in B over a thin link: each pair carries at most
    # 0.008e9/8/1e6 = 1 mb/s, so the flow is 2 mb/s, not the nodes' 10.
    topo = parse_topology(
        {
            "activation_bytes": 1_000_000,
            "nodes": [
                {"id": "h", "stage": 0, "compute_s": 0.01, "location": "A"},
                {"id": "r1", "stage": 1, "compute_s": 0.1, "location": "B"},
                {"id": "r2", "stage": 1, "compute_s": 0.2, "location": "B", "capacity": 10},
            ],
            "links": [{"src": "A", "dst": "B", "rtt_ms": 10, "bandwidth_gbps": 0.008}],
        }
    )
    solved = solve_members(Members.of(topo), hub_slack=0.0)
    assert solved.flows == {("h", "r1"): 1_000_000, ("h", "r2"): 1_000_000}
    assert feasibility_violations(topo, solved.flows) == []


def test_answer_does_not_depend_on_record_order() -> None:
    topo = random_case(7)
    members = Members.of(topo)
    rng = random.Random(1)
    nodes = list(members.nodes)
    rng.shuffle(nodes)
    links = list(members.links.items())
    rng.shuffle(links)
    shuffled = replace(members, nodes=tuple(nodes), links=MappingProxyType(dict(links)))
    assert solve_members(shuffled).flows == solve_members(members).flows


def test_evaluate_agrees_with_make_result() -> None:
    topo = random_case(11)
    flows = dict(solve_members(Members.of(topo)).flows)
    ours, theirs = evaluate(Members.of(topo), flows), make_result(topo, flows)
    assert ours.flows == theirs.flows
    assert ours.flow_value_units == theirs.flow_value_units
    assert ours.total_cost == pytest.approx(theirs.total_cost, rel=1e-12)
    assert ours.max_path_cost == pytest.approx(theirs.max_path_cost, rel=1e-12)


def test_geo10_members_are_the_topology_s() -> None:
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert geo10_members(rng_a, 60, 5) == Members.of(geo10(rng_b, 60, 5))


def test_load_members_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"activation_bytes": 1, "nodes": [{"id": "a", "stage": 1}]}))
    with pytest.raises(TopologyError, match="compute_s") as err:
        load_members(path)
    assert "\n" not in str(err.value)


# -- gossip -----------------------------------------------------------------------------------


def test_gossip_completes_every_view_and_is_seeded() -> None:
    n = 300
    first = disseminate(n, [1 << i for i in range(n)], random.Random(4))
    again = disseminate(n, [1 << i for i in range(n)], random.Random(4))
    assert first == again
    assert all(0 <= at <= first.rounds for at in first.complete_at)
    assert max(first.complete_at) == first.rounds
    # Push gossip reaches everyone in O(log n) delays, far below the relaxation's thousands.
    assert first.rounds < 60
    assert first.messages < 200 * n


def test_a_late_start_delays_completion() -> None:
    spread = disseminate(50, [1] + [0] * 49, random.Random(0), start={0: 7})
    assert min(spread.complete_at) >= 7


# -- crashes ----------------------------------------------------------------------------------


def test_repair_resplits_over_residual_capacity() -> None:
    topo = parse_topology(
        {
            "activation_bytes": 1_000_000,
            "nodes": [
                {"id": "h", "stage": 0, "compute_s": 0.01, "location": "A"},
                {"id": "x", "stage": 1, "compute_s": 0.1, "location": "A"},
                {"id": "y", "stage": 1, "compute_s": 0.1, "location": "A"},
                {"id": "z", "stage": 1, "compute_s": 0.1, "location": "A"},
            ],
            "links": [],
        }
    )
    members = Members.of(topo)
    plan = {"h": {"x": 6_000_000, "y": 9_000_000, "z": 2_000_000}}
    # x's 6 mb/s go to y (1 mb/s free) and z (8 free) in proportion 1:8.
    mine = repair(members, plan, "h", "x")
    assert mine == {"y": 9_000_000 + 666_666, "z": 2_000_000 + 5_333_333}
    assert all(mine[p] <= 10_000_000 for p in mine)


def test_crash_curve_reaches_the_new_optimum() -> None:
    members = geo10_members(np.random.default_rng(2), 120, 4)
    old = solve_members(members)
    victim = max(old.flows, key=lambda k: (old.flows[k], k))[1]
    curve = crash_curve(members, victim, old, seed=0, horizon=80)
    after = without_node(members, victim)
    assert curve.new_value == value_units_m(after, solve_members(after).flows)
    assert curve.rounds < curve.switch_at <= 45
    assert all(r <= 1 + 1e-9 for r in curve.ratios)
    assert curve.ratios[curve.switch_at] == pytest.approx(1.0, abs=1e-6)
    assert min(curve.ratios) > 0.9


def value_units_m(members: Members, flows: dict[tuple[str, str], int]) -> int:
    last = max(n.stage for n in members.nodes)
    stage = {n.id: n.stage for n in members.nodes}
    return sum(x for (_, d), x in flows.items() if stage[d] == last)


def test_delivered_is_the_plan_when_everyone_follows_it() -> None:
    members = geo10_members(np.random.default_rng(1), 60, 3)
    flows = solve_members(members).flows
    plan: dict[str, dict[str, int]] = {}
    for (s, d), x in flows.items():
        plan.setdefault(s, {})[d] = x
    got = delivered(members, {"old": plan}, {})
    assert got == pytest.approx(value_units_m(members, dict(flows)), rel=1e-9)


# -- the command ------------------------------------------------------------------------------


def route(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gwtf", "route", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_route_methods_agree_with_the_oracle(tmp_path: Path) -> None:
    topo = geo10(np.random.default_rng(0), 30, 3)
    path = tmp_path / "topology.json"
    topology_to_file(topo, path)
    oracle = solve_oracle(topo)
    for extra in ([], ["--method", "local"], ["--method", "relax"]):
        done = route(str(path), "--json", *extra)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["flow_value"] == pytest.approx(oracle.flow_value, rel=1e-6)
        assert out["total_cost"] == pytest.approx(oracle.total_cost, rel=1e-3)
        assert out["rounds"] > 0 and out["messages"] > 0


def test_route_rejects_a_bad_method_and_a_bad_file(tmp_path: Path) -> None:
    done = route("x.json", "--method", "fast")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid choice" in lines[0]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = route(str(bad))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gwtf route: topology file")
    assert "Traceback" not in done.stderr
