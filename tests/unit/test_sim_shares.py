"""The simulator deals an iteration's microbatches over the data holders as the job coordinator
does (gwtf.job.iterations.assign), so a small iteration does not go to one holder alone."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario
from gwtf.sim.simulator import Iteration, SimNode

SCENARIO = Path(__file__).resolve().parents[2] / "simulations" / "fidelity.toml"


def test_every_holder_with_a_flow_injects_its_share_of_a_small_iteration() -> None:
    # 8 microbatches an iteration and 8 memory slots: drawn from a pool, the first holder's
    # burst took all of them and the other holder never injected.
    sc = dataclasses.replace(load_scenario(SCENARIO), events=(), duration_s=30.0)
    sim = simulation(sc, "gwtf-fixed")  # placement would move a node into stage 0
    counts: Counter[str] = Counter()
    injected = sim.policy.injected

    def count(holder: SimNode, it: Iteration) -> None:
        counts[holder.id] += 1
        injected(holder, it)

    sim.policy.injected = count  # type: ignore[method-assign]
    result = sim.run()
    assert result.iterations_completed >= 5
    assert set(counts) == {"f0", "f1"}
    assert min(counts.values()) >= 2 * result.iterations_completed
