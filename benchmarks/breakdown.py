"""Where a simulated iteration's time goes (benchmarks/RESULTS.md, `short-iterations-reading`).

    .venv/bin/python -m benchmarks.breakdown simulations/fidelity.toml 0 gwtf,gwtf-fixed,swarm

Per policy, the mean over committed iterations of: the compute phase (iteration start to the
last microbatch done), the holders' tail within it (the first holder's last microbatch done to
the last one: the fixed shares of 3.7), and the commit (last microbatch done to the next
iteration's start); for the exact policies the commit split into its legs as
`two_phase_commit_s` charges them: the reports and the order, the slowest stage's exchange, the
prepared reports and the step order. It wraps the simulator's own methods to observe them and
changes nothing they compute.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import gwtf.sim.network as net
import gwtf.sim.recovering as recovering
import gwtf.sim.simulator as simulator
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import load_scenario


def breakdown(path: str, seed: int, policies: list[str]) -> list[str]:
    current: dict[str, Any] = {}
    done: list[dict[str, Any]] = []
    commit_s = recovering.two_phase_commit_s
    stage_done = simulator.Simulation._stage_done
    complete = simulator.Simulation.maybe_complete
    start = simulator.Simulation._start_iteration

    def legs(network: net.Network, coordinator: Any, holders: Any, stages: Any,
             sum_bytes: Any, message_bytes: float, moves: Any = None,
             whole: Any = ()) -> float:
        members = [m for stage in stages for m in stage]
        exchange = 0.0
        for s, stage in enumerate(stages):
            if s in whole:
                exchange = max(exchange, net.leg_s(network, stage,
                                                   net.whole_moves(stage, sum_bytes[s])))
                continue
            scatter, gather = moves[s] if moves else net.fresh_moves(stage, sum_bytes[s])
            exchange = max(exchange, net.leg_s(network, stage, scatter)
                           + net.leg_s(network, stage, gather))
        current["legs"] = (net.order_s(network, coordinator, holders, members, message_bytes),
                           exchange,
                           net.order_s(network, coordinator, members, members, message_bytes))
        # Passed on only when some stage goes all to all: the module then also runs against
        # a tree from before the choice of exchange (copied in), for a same-run comparison.
        extra = (whole,) if whole else ()
        return commit_s(network, coordinator, holders, stages, sum_bytes, message_bytes, moves,
                        *extra)

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

    recovering.two_phase_commit_s = legs  # type: ignore[assignment]
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
                         f" + exchange {mean(c[1] for c in charged):.3f}"
                         f" + prepared+step {mean(c[2] for c in charged):.3f}")
            lines.append(line)
    finally:
        recovering.two_phase_commit_s = commit_s
        simulator.Simulation._stage_done = stage_done  # type: ignore[method-assign]
        simulator.Simulation.maybe_complete = complete  # type: ignore[method-assign]
        simulator.Simulation._start_iteration = start  # type: ignore[method-assign]
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m benchmarks.breakdown SCENARIO SEED POLICY[,POLICY...]")
    print("\n".join(breakdown(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))))
