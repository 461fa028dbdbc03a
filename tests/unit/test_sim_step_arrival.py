"""After a commit each simulated node goes on when the step order reaches it, as the node does
(docs/design.md 3.7, 5): a holder injects, and a relay takes a microbatch, only once it has
stepped; the coordinator, which orders the step, goes on at once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario
from gwtf.sim.simulator import SimNode

SCENARIO = Path(__file__).resolve().parents[2] / "simulations" / "fidelity.toml"


def test_no_node_works_on_an_iteration_before_its_step_order_arrives() -> None:
    sc = dataclasses.replace(load_scenario(SCENARIO), events=(), duration_s=60.0)
    sim = simulation(sc, "gwtf-fixed")
    starts: list[tuple[str, float, float]] = []
    commits: list[float] = []
    start_next = sim.start_next
    on_commit = sim._on_commit

    def observe(node: SimNode) -> None:
        was = node.busy
        start_next(node)
        if node.busy and not was:
            starts.append((node.id, sim.engine.now, node.ready_at))

    def commit(payload: Any) -> Any:
        commits.append(sim.engine.now)
        return on_commit(payload)

    sim.start_next = observe  # type: ignore[method-assign]
    sim._on_commit = commit  # type: ignore[method-assign]
    result = sim.run()
    assert result.iterations_completed >= 20
    assert all(now >= ready - 1e-12 for _, now, ready in starts)
    # Frankfurt's replicas are 45 ms from the coordinator in Virginia: they start later.
    ready = {node: max(r for n, _, r in starts if n == node) for node in ("f0", "f3", "f5")}
    last = max(c for c in commits if c <= ready["f0"])
    assert ready["f0"] == last  # the coordinator steps at once
    assert ready["f3"] - last >= 0.044
    assert ready["f5"] - last >= 0.044
