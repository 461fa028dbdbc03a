"""The simulated network (gwtf/sim/network.py): the pair model gives every pair its own link,
the access model makes a node's sends share its uplink and its receipts share its downlink."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gwtf.flow.topology import LinkSpec
from gwtf.sim.network import Network
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import NodeInfo, load_scenario
from tests.unit.test_sim_run import run, scenario

MB = 10**6  # bytes
WAN = LinkSpec(rtt_ms=100.0, bandwidth_gbps=1.0)
LAN = LinkSpec(rtt_ms=2.0, bandwidth_gbps=10.0)


def node(name: str, loc: str = "A", up: float = math.inf, down: float = math.inf) -> NodeInfo:
    return NodeInfo(name, 0, loc, "gpu", 1.0, False, up, down)


def network() -> Network:
    return Network({frozenset(("A", "B")): WAN}, LAN)


def test_pair_model_gives_each_pair_its_own_link() -> None:
    net = network()
    a, b, c = node("a"), node("b", "B"), node("c", "B")
    # 10 MB at 1 Gbit/s = 80 ms, then 50 ms one way; two peers at once, both at full rate.
    assert net.transfer(0.0, a, b, 10 * MB) == pytest.approx(0.13)
    assert net.transfer(0.0, a, c, 10 * MB) == pytest.approx(0.13)
    # The same pair queues: the second send starts when the first has left.
    assert net.transfer(0.0, a, b, 10 * MB) == pytest.approx(0.21)


def test_access_model_shares_the_uplink_and_the_downlink() -> None:
    net = network()
    a = node("a", up=0.1)  # 100 Mbit/s up: 10 MB takes 0.8 s
    b, c = node("b", "B"), node("c", "B")
    assert net.gbps(a, b) == 0.1
    assert net.one_way(a, b, 10 * MB) == pytest.approx(0.85)
    assert net.transfer(0.0, a, b, 10 * MB) == pytest.approx(0.85)
    assert net.transfer(0.0, a, c, 10 * MB) == pytest.approx(1.65)  # behind the first send
    # Receipts share a downlink the same way, whoever sends.
    d = node("d", "B", down=0.1)
    e, f = node("e"), node("f")
    assert net.transfer(0.0, e, d, 10 * MB) == pytest.approx(0.85)
    assert net.transfer(0.0, f, d, 10 * MB) == pytest.approx(1.65)
    # A send that finds the links idle later starts at once.
    assert net.transfer(5.0, a, c, 10 * MB) == pytest.approx(5.85)


def test_access_links_bound_capacity_and_throughput(tmp_path: Path) -> None:
    """A swarm whose uplinks bind trains slower than the same swarm on the pair model, its
    nodes' flow capacities say so, and nothing is lost on the way."""
    pair = scenario(tmp_path, duration=300)
    slow = "[nodes]\nuplink_gbps = [0.05]\ndownlink_gbps = [0.2]\n"
    (tmp_path / "access.toml").write_text(
        (tmp_path / "s.toml").read_text().replace("[nodes]\n", slow))
    access = load_scenario(tmp_path / "access.toml")
    fast_run, slow_run = run(pair, "oracle"), run(access, "oracle")
    assert slow_run.iterations_completed >= 1
    assert slow_run.throughput_mean < 0.5 * fast_run.throughput_mean
    assert slow_run.audit["conserved_iterations"] == slow_run.iterations_completed
    sim = simulation(access, "oracle")
    info = next(i for i in access.nodes.values() if i.stage == 1)
    # An inner stage moves two activations each way per microbatch over 50 Mbit/s.
    bound = 0.05e9 / 8 / (2 * access.activation_bytes)
    assert sim.capacity_at(info, 1) == pytest.approx(bound)
