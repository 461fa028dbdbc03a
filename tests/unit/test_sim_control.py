"""The timed control plane: the flow machines on geo10 delays reach the oracle, repeatably."""

from __future__ import annotations

import numpy as np
import pytest

from gwtf.flow.generate import geo10
from gwtf.flow.oracle import oracle_cost_units, solve_oracle
from gwtf.flow.relax.bus import flow_config, node_views
from gwtf.flow.solution import cost_units, feasibility_violations, make_result
from gwtf.flow.topology import LinkSpec, Topology
from gwtf.sim.routing.control import ControlPlane


def assert_oracle(plane: ControlPlane, topology: Topology) -> None:
    flows = plane.flows()
    assert feasibility_violations(topology, flows) == []
    oracle = solve_oracle(topology)
    assert make_result(topology, flows).flow_value_units == oracle.flow_value_units
    assert cost_units(topology, flows) <= oracle_cost_units(topology, oracle) * 1.01
    for node in plane.nodes.values():
        assert node.final and node.idle()


@pytest.mark.parametrize("in_place", [True, False])
def test_changes_reconverge_to_the_oracle_in_simulated_time(in_place: bool) -> None:
    topology = geo10(np.random.default_rng(3), 16, 4)
    plane = ControlPlane.for_topology(topology, flow_config(topology), seed=3, in_place=in_place)
    cold = plane.run_timed()
    assert_oracle(plane, topology)
    # Six phases, each at least two one-way delays of the slowest link used, which is > 50 ms.
    assert cold.phases == plane.phases > 0 and cold.seconds > cold.phases * 0.1
    assert cold.messages == plane.messages and cold.rescales == 0

    victim = topology.stage_nodes(1)[0]
    topology = topology.without_node(victim)
    plane.remove(victim)
    crash = plane.run_timed()
    assert_oracle(plane, topology)
    assert 0 < crash.messages < plane.messages and plane.time == cold.seconds + crash.seconds

    a, b = sorted(topology.links, key=sorted)[0]
    old = topology.links[frozenset((a, b))]
    topology = topology.with_link(a, b, LinkSpec(old.rtt_ms * 2, old.bandwidth_gbps / 4))
    plane.link_changed(topology, a, b)
    plane.run_timed()
    assert_oracle(plane, topology)

    arc = max(topology.arcs, key=lambda x: (plane.flows().get((x.src, x.dst), 0), x.src, x.dst))
    plane.recreate(arc.src, arc.dst, arc.cap_units * 2, arc.cost_units)
    plane.recreate(arc.src, arc.dst, arc.cap_units, arc.cost_units)
    plane.run_timed()
    assert_oracle(plane, topology)


def test_a_joiner_is_placed_and_used() -> None:
    topology = geo10(np.random.default_rng(1), 12, 3)
    plane = ControlPlane.for_topology(topology, flow_config(topology), seed=1)
    plane.run_timed()
    model = topology.node(topology.stage_nodes(1)[0])
    bigger = topology.with_node(type(model).make("joiner", 1, model.compute_s / 4, "Tokyo"))
    plane.place("joiner", "Tokyo")
    plane.join(node_views(bigger)["joiner"])
    plane.run_timed()
    assert_oracle(plane, bigger)
    assert plane.nodes["joiner"].throughput() > 0


def test_same_seed_same_run() -> None:
    topology = geo10(np.random.default_rng(2), 12, 3)
    runs = []
    for _ in range(2):
        plane = ControlPlane.for_topology(topology, flow_config(topology), seed=7)
        runs.append((plane.run_timed(), plane.flows()))
    assert runs[0] == runs[1]
