"""The decentralized solver against the networkx oracle (same integer-scaled problem)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.flow.bus import config_for, node_views, solve_decentralized
from gwtf.flow.generate import random_layered
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.solution import cost_units, feasibility_violations, make_result
from gwtf.flow.topology import Topology, parse_topology

COST_TOLERANCE = 0.01  # the bound: within 1% of the oracle's cost


def assert_matches_oracle(topology: Topology, flows: dict[tuple[str, str], int]) -> None:
    assert feasibility_violations(topology, flows) == []
    oracle = solve_oracle(topology)
    mine = make_result(topology, flows)
    assert mine.flow_value_units == oracle.flow_value_units
    best = oracle_cost_units(topology, oracle)
    assert cost_units(topology, flows) <= best * (1 + COST_TOLERANCE)


def test_two_nodes_limited_by_the_last_stage() -> None:
    topo = parse_topology(
        {
            "activation_bytes": 8388608,
            "nodes": [
                {"id": "h0", "stage": 0, "compute_s": 0.1, "location": "A"},
                {"id": "z0", "stage": 1, "compute_s": 0.2, "location": "A"},
            ],
            "links": [],
        }
    )
    result, _ = solve_decentralized(topo, seed=1)
    assert result.flow_value_units == 5_000_000  # 1 / 0.2 s, the slower node
    assert result.messages > 0 and result.rounds > 0
    assert_matches_oracle(topo, dict(result.flows))


@pytest.mark.parametrize("seed", range(10))
def test_random_topologies_match_the_oracle(seed: int) -> None:
    topo = random_layered(np.random.default_rng(seed), 12, 3)
    result, _ = solve_decentralized(topo, seed=seed)
    assert_matches_oracle(topo, dict(result.flows))


@pytest.mark.parametrize("seed", range(4))
def test_duplicated_and_reordered_delivery(seed: int) -> None:
    topo = random_layered(np.random.default_rng(seed), 12, 3)
    result, _ = solve_decentralized(topo, seed=seed + 100, max_delay=5, duplicate_p=0.3)
    assert_matches_oracle(topo, dict(result.flows))


@pytest.mark.parametrize("seed", [0, 1])
def test_warm_restart_after_a_crash_and_a_join(seed: int) -> None:
    topo = random_layered(np.random.default_rng(seed), 16, 3)
    cold, bus = solve_decentralized(topo, seed=seed)
    victim = topo.stage_nodes(1)[0]
    smaller = topo.without_node(victim)

    bus.reset_counts()
    bus.remove(victim)
    crash = bus.run(200_000)
    assert_matches_oracle(smaller, bus.flows())
    assert crash.messages < cold.messages

    bus.reset_counts()
    bus.join(node_views(topo)[victim], config_for(topo, bus), epoch=1)
    bus.run(200_000)
    assert_matches_oracle(topo, bus.flows())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(4, 10), stages=st.integers(2, 3))
def test_property_small_topologies(seed: int, n: int, stages: int) -> None:
    topo = random_layered(np.random.default_rng(seed), n, stages)
    result, _ = solve_decentralized(topo, seed=seed, max_rounds=200_000)
    assert_matches_oracle(topo, dict(result.flows))
