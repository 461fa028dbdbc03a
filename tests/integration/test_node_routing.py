"""The node's routing on real processes (docs/design.md 2.12): local solves by default, with a
dead next hop repaired at once and the new view solved; the relaxation on request."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import LocalSwarm, oracle_value, pipeline_arcs, wait_for

pytestmark = pytest.mark.integration

SETTLE_S = 60.0

# (id, stage, seconds per microbatch): s0 can feed both stage-1 nodes, so both carry flow.
NODES = [
    ("s0", 0, 0.02),
    ("s1a", 1, 0.08),
    ("s1b", 1, 0.06),
    ("s2a", 2, 0.05),
    ("s2b", 2, 0.07),
]


def test_local_routing_repairs_a_dead_next_hop_then_solves_the_new_view(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0) as swarm:
        swarm.start(NODES, num_stages=3)
        expect = {n[0] for n in NODES}
        view = wait_for(lambda: swarm.settled(expect, pipeline_arcs([1, 2, 2])), SETTLE_S,
                        "the swarm to settle")  # fmt: skip
        assert all(n["routing"] == "local" and n["solves"] >= 1 for n in view["nodes"])
        assert sum(n["flow_messages_sent"] for n in view["nodes"]) == 0
        routes = {a["dst"]: a["flow_units"] for a in view["arcs"] if a["src"] == "s0"}
        assert routes["s1a"] > 0 and routes["s1b"] > 0, routes

        swarm.kill("s1b")
        expect.discard("s1b")
        after = wait_for(lambda: swarm.settled(expect, pipeline_arcs([1, 1, 2])), SETTLE_S,
                         "the swarm to settle without s1b")  # fmt: skip
        assert after["flow_value_units"] == oracle_value(after) > 0
        s0 = next(n for n in after["nodes"] if n["id"] == "s0")
        assert s0["repairs"] == 1 and s0["solves"] >= 2
        # Every node at one site: a message delay is half the intra-location RTT (1 ms).
        assert all(n["message_delay_s"] == 0.0005 for n in after["nodes"])
        log = swarm.procs["s0"].log.read_text()
        repaired = log.index("routes: next hop s1b is gone")
        assert "routes: solved" in log[repaired:]


def test_the_relaxation_on_request_converges_to_the_oracle(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0) as swarm:
        swarm.start(NODES[:3], 2, "--routing", "relax")
        view = wait_for(lambda: swarm.settled({"s0", "s1a", "s1b"}, 2), SETTLE_S,
                        "the relaxation to settle")  # fmt: skip
        assert all(n["routing"] == "relax" and n["solves"] == 0 for n in view["nodes"])
        assert sum(n["flow_messages_sent"] for n in view["nodes"]) > 0
        assert view["flow_value_units"] == oracle_value(view) > 0
