"""`two_phase_commit_s`: the node's commit over the simulated links (docs/design.md 3.7, 5)."""

from __future__ import annotations

import math

import pytest

from gwtf.flow.topology import LinkSpec
from gwtf.sim.network import Network, two_phase_commit_s
from gwtf.sim.scenario import NodeInfo


def node(node_id: str, stage: int, location: str, uplink: float = math.inf) -> NodeInfo:
    return NodeInfo(node_id, stage, location, "gpu", 1.0, uplink_gbps=uplink)


def test_five_one_way_legs_each_as_slow_as_its_slowest_message() -> None:
    # A (coordinator) -- B: 100 ms RTT; A -- C: 40 ms; B -- C: 60 ms; 8 Gbit/s everywhere.
    links = {
        frozenset(("A", "B")): LinkSpec(100.0, 8.0),
        frozenset(("A", "C")): LinkSpec(40.0, 8.0),
        frozenset(("B", "C")): LinkSpec(60.0, 8.0),
    }
    net = Network(links, LinkSpec(1.0, 8.0))
    h0, h1 = node("h0", 0, "A"), node("h1", 0, "B")
    r0, r1 = node("r0", 1, "C"), node("r1", 1, "B")
    commit = two_phase_commit_s(net, h0, [h0, h1], [[h0, h1], [r0, r1]], [1e9, 1e9], 0.0)
    # report from h1 (0.05) + order to B (0.05) + the slowest exchange (h0 <-> h1: 0.05 + 1 s
    # of bytes) + prepared from B (0.05) + step order to B (0.05)
    assert commit == pytest.approx(0.05 * 4 + 0.05 + 1.0)


def test_a_shared_uplink_sends_the_sums_one_after_the_other() -> None:
    net = Network({}, LinkSpec(0.0, 8.0))
    stage = [node(f"n{i}", 0, "A", uplink=8.0) for i in range(3)]
    assert two_phase_commit_s(net, stage[0], stage, [stage], [1e9], 0.0) == pytest.approx(2.0)
    free = [node(f"n{i}", 0, "A") for i in range(3)]
    assert two_phase_commit_s(net, free[0], free, [free], [1e9], 0.0) == pytest.approx(1.0)
