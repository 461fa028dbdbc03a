"""Where a simulated iteration's time goes (docs/results/fidelity.md, *Short iterations*).

    .venv/bin/python -m benchmarks.breakdown simulations/fidelity.toml 0 gwtf,gwtf-fixed,swarm

Per policy, the mean over committed iterations of: the compute phase (iteration start to the
last microbatch done), the holders' tail within it (the first holder's last microbatch done to
the last one: the fixed shares of 3.7), and the commit (last microbatch done to the next
iteration's start, when the coordinator orders the step); for the exact policies the commit
split as `commit_timeline` times it: until the last member has the commit order (the last
report and the order), then the exchange and the prepared reports, and how long after the
step order the first holder has it (it injects from then; docs/design.md 5). It wraps the
simulator's own methods to observe them and changes nothing they compute.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import gwtf.sim.network as net
import gwtf.sim.recovery.recovering as recovering
import gwtf.sim.simulator as simulator
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario


def breakdown(path: str, seed: int, policies: list[str]) -> list[str]:
    current: dict[str, Any] = {}
    done: list[dict[str, Any]] = []
    timeline = recovering.commit_timeline
    stage_done = simulator.Simulation._stage_done
    complete = simulator.Simulation.maybe_complete
    start = simulator.Simulation._start_iteration

    def legs(network: net.Network, coordinator: Any, reported: Any, stages: Any,
             sum_bytes: Any, message_bytes: float, moves: Any = None,
             whole: Any = ()) -> net.CommitTimeline:
        out = timeline(network, coordinator, reported, stages, sum_bytes, message_bytes, moves,
                       whole)
        # The last call of a commit is the one charged (the first only times the order).
        current["legs"] = (out.ordered_s, out.decided_s - out.ordered_s,
                           min(out.step_s[h.id] for h in stages[0]) - out.decided_s)
        return out

    def on_stage_done(self: Any, node: Any, mb: Any, s: int) -> None:
        if s == 0:
            current.setdefault("holders", {})[node.id] = self.engine.now
        stage_done(self, node, mb, s)

    def on_complete(self: Any) -> None:
        it = self.iteration
        before = True if it is None else it.aggregating
        complete(self)
        if it is not None and not before and it.aggregating:
            last = current.get("holders", {})
            done.append({"start": it.start_s, "done": self.engine.now, "legs": current.get("legs"),
                         "first": min(last.values(), default=self.engine.now), "next": None})
            current.clear()

    def on_start(self: Any, index: int) -> None:
        if done and done[-1]["next"] is None:
            done[-1]["next"] = self.engine.now
        current.clear()
        start(self, index)

    recovering.commit_timeline = legs
    simulator.Simulation._stage_done = on_stage_done  # type: ignore[method-assign]
    simulator.Simulation.maybe_complete = on_complete  # type: ignore[method-assign]
    simulator.Simulation._start_iteration = on_start  # type: ignore[method-assign]
    lines = []
    try:
        sc = load_scenario(path, seed=seed)
        for policy in policies:
            done.clear()
            result = simulation(sc, policy).run()
            its = [d for d in done if d["next"] is not None]
            mean = statistics.fmean
            line = (f"{policy:12s} {result.throughput_mean:7.3f} mb/s, {len(its)} iterations; "
                    f"mean s: compute {mean(d['done'] - d['start'] for d in its):.3f} "
                    f"(holders' tail {mean(d['done'] - d['first'] for d in its):.3f}), "
                    f"commit {mean(d['next'] - d['done'] for d in its):.3f}")
            charged = [d["legs"] for d in its if d["legs"] is not None]
            if charged:
                line += (f" = reports+order {mean(c[0] for c in charged):.3f}"
                         f" + exchange+prepared {mean(c[1] for c in charged):.3f}"
                         f"; then the step reaches the first holder"
                         f" {mean(c[2] for c in charged):.3f} later")
            lines.append(line)
    finally:
        recovering.commit_timeline = timeline
        simulator.Simulation._stage_done = stage_done  # type: ignore[method-assign]
        simulator.Simulation.maybe_complete = complete  # type: ignore[method-assign]
        simulator.Simulation._start_iteration = start  # type: ignore[method-assign]
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m benchmarks.breakdown SCENARIO SEED POLICY[,POLICY...]")
    print("\n".join(breakdown(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))))
