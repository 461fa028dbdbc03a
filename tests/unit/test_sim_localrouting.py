"""The simulator's gwtf policy routes as the node does (gwtf.sim.routing.localrouting,
docs/design.md 2.12, 5): by each node's own `LocalRoute` on a membership view spread by simulated
gossip; after a crash every node routes by the new solution within the failure timeout, the spread
and a quiet spell; the routes are those the node's driver computes from the same view; `routing =
"relax"` keeps the flow machines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gwtf.flow.localroute import solver
from gwtf.flow.topology import DEFAULT_INTRA, Members
from gwtf.node.config import NodeConfig
from gwtf.node.control.membership import WATCH as NODE_WATCH
from gwtf.node.control.routing import LocalRouting as NodeRouting
from gwtf.sim.policies import GwtfPolicy, simulation
from gwtf.sim.routing.localrouting import (
    GOSSIP_FANOUT,
    GOSSIP_PERIOD_S,
    WATCH,
    LocalRouting,
    gossip_spread,
)
from gwtf.sim.scenario import ScenarioError
from gwtf.sim.simulator import Simulation
from tests.unit.test_sim_run import scenario, trace_with

CRASH_S = 20.0
DETECT_S = 5.0


def crashed(tmp_path: Path, until: float, *, victim: str = "s1a") -> Simulation:
    """Two nodes per stage at Oregon / Ohio; `victim` crashes at CRASH_S; run until `until`."""
    sc = scenario(tmp_path, duration=until, trace=trace_with(f"{CRASH_S},crash,{victim}\n"))
    sim = simulation(sc, "gwtf-fixed")
    sim.run()
    return sim


def router(sim: Simulation) -> LocalRouting:
    policy = sim.policy
    assert isinstance(policy, GwtfPolicy) and isinstance(policy.router, LocalRouting)
    return policy.router


def optimum(sim: Simulation, routing: LocalRouting) -> dict[str, dict[str, int]]:
    """Each live node's out-flows in the solution of the true live membership (the node's
    objective: `solver()`, as `LocalRoute` solves by default)."""
    records = [routing.record(n) for n in sim.active_nodes()]
    members = Members(sim.sc.activation_bytes, tuple(sorted(records, key=lambda n: (n.stage,
                                                                                     n.id))),
                      dict(sim.sc.links), sim.sc.intra, frozenset())
    plan: dict[str, dict[str, int]] = {}
    for (src, dst), units in solver()(members).items():
        if units > 0:
            plan.setdefault(src, {})[dst] = units
    return plan


def test_the_sim_reroutes_within_the_failure_timeout_and_a_quiet_spell(tmp_path: Path) -> None:
    """Before the crash is noticed the upstream nodes still send to the victim; once noticed
    they repair at once; a quiet spell (and a solve) later every node routes by the optimum of
    the live members."""
    before = crashed(tmp_path, CRASH_S + DETECT_S - 0.1)
    assert any("s1a" in router(before).routes(n) for n in before.active_nodes(0))
    noticed = crashed(tmp_path, CRASH_S + DETECT_S + 0.01)
    assert router(noticed).repairs >= 1
    assert not any("s1a" in router(noticed).routes(n) for n in noticed.active_nodes(0))
    sim = crashed(tmp_path, CRASH_S + DETECT_S + sim_quiet(tmp_path) + 0.5)
    routing = router(sim)
    best = optimum(sim, routing)
    assert best
    for node in sim.active_nodes():
        assert routing.routes(node) == best.get(node.id, {}), node.id


def sim_quiet(tmp_path: Path) -> float:
    return scenario(tmp_path).route_quiet_s


def test_the_routes_are_the_nodes_own_for_the_same_view(tmp_path: Path) -> None:
    """The node's driver (gwtf.node.control.routing) and the simulator's hold the same `LocalRoute`:
    given the records of the simulated swarm, each node's routes are what the simulated node
    routes by."""
    sim = crashed(tmp_path, CRASH_S + DETECT_S + 3.0)
    routing = router(sim)
    records = [routing.record(n) for n in sim.active_nodes()]
    assert sim.sc.intra == DEFAULT_INTRA
    for node in sim.active_nodes():
        clock = SimpleNamespace(now=0.0)
        state = SimpleNamespace(
            node_id=node.id,
            swarm=SimpleNamespace(num_stages=sim.S, activation_bytes=sim.sc.activation_bytes),
            settings=SimpleNamespace(links=dict(sim.sc.links), routing_links="matrix"),
            config=NodeConfig(),
            clock=lambda clock=clock: clock.now,
        )
        on_node = NodeRouting(state, prober=None, start_link=lambda member: None)  # type: ignore[arg-type]
        on_node.route.set_view(records)
        clock.now = on_node.route.quiet_s
        assert on_node.route.solve()
        assert on_node.route.routes() == routing.routes(node), node.id
        assert on_node.route.throughput() == routing.members[node.id].route.throughput()


def test_the_models_constants_are_the_nodes(tmp_path: Path) -> None:
    config = NodeConfig()
    assert GOSSIP_PERIOD_S == config.heartbeat_s
    assert GOSSIP_FANOUT == config.gossip_fanout
    assert WATCH == NODE_WATCH
    assert scenario(tmp_path).route_quiet_s == config.route_quiet_s


def test_gossip_reaches_every_member_in_a_few_periods() -> None:
    ids = [f"n{i:02d}" for i in range(40)]

    def spread(seed: int) -> dict[str, float]:
        return gossip_spread({"n00": 10.0, "n01": 10.0}, ids, lambda a, b: 0.05,
                             lambda i: int(i[1:]) / 40 * GOSSIP_PERIOD_S,
                             np.random.default_rng(seed))

    learned = spread(0)
    assert learned["n00"] == learned["n01"] == 10.0
    assert all(10.0 < t < 10.0 + 8 * GOSSIP_PERIOD_S for i, t in learned.items()
               if i not in ("n00", "n01")), max(learned.values())
    assert spread(0) == learned != spread(1)


def test_a_crash_in_a_larger_swarm_spreads_before_all_switch(tmp_path: Path) -> None:
    """24 nodes: the crash is noticed by the victim's watchers, the rest learn it by gossip;
    within a few gossip periods and a quiet spell every node routes by the new optimum."""
    rows = "".join(f"0,join,s{s}n{i},{s},{loc}\n" for s in range(3) for i, loc in
                   enumerate(["Oregon", "Ohio", "Virginia", "Frankfurt"] * 2))
    trace = "time_s,event,node,stage,location\n" + rows + f"{CRASH_S},crash,s1n0\n"
    sc = scenario(tmp_path, duration=CRASH_S + DETECT_S + 0.01, trace=trace)
    sim = simulation(sc, "gwtf-fixed")
    sim.run()
    assert len(router(sim).members) == 23
    unaware = [m for m in router(sim).members.values() if m.route.view_size == 24]
    assert 0 < len(unaware) < 23 - WATCH + 1
    sc = replace(sc, duration_s=CRASH_S + DETECT_S + 4 * GOSSIP_PERIOD_S + sc.route_quiet_s + 1)
    sim = simulation(sc, "gwtf-fixed")
    sim.run()
    routing = router(sim)
    best = optimum(sim, routing)
    for node in sim.active_nodes():
        assert routing.routes(node) == best.get(node.id, {}), node.id


def test_relax_keeps_the_flow_machines(tmp_path: Path) -> None:
    sc = scenario(tmp_path, duration=300, trace=trace_with(f"{CRASH_S},crash,s1a\n"))
    local = simulation(sc, "gwtf").run()
    relax = simulation(replace(sc, routing="relax"), "gwtf").run()
    assert local.control_messages == 0 < relax.control_messages
    for result in (local, relax):
        assert result.iterations_completed >= 3
        assert result.audit["conserved_iterations"] == result.iterations_completed


def test_an_unknown_routing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="routing"):
        scenario(tmp_path, extra='[control]\nrouting = "gossip"\n')
