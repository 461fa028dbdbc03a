"""`gwtf simulate SCENARIO.toml [--policy P,...] [--seed N] [--replay-bound N] [--out DIR]
[--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gwtf.sim.policies import simulation
from gwtf.sim.scenario import KNOWN_POLICIES, Scenario, ScenarioError, load_scenario
from gwtf.sim.simulator import SimResult

__all__ = ["parse_policies", "run_scenario", "run_simulate"]


def parse_policies(text: str | None, scenario: Scenario) -> list[str]:
    """The policies to run: `text` (comma-separated) or the scenario's list."""
    if not text:
        return list(scenario.policies)
    names = [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in KNOWN_POLICIES:
            raise ScenarioError(
                f"unknown policy {name!r}; use one or more of {', '.join(KNOWN_POLICIES)}"
            )
    if not names:
        raise ScenarioError("--policy is empty; give one or more of " + ", ".join(KNOWN_POLICIES))
    return names


def run_scenario(
    scenario: Scenario, policies: Sequence[str], seed: int, *, progress: bool = False
) -> list[SimResult]:
    """Run each policy on the scenario (one after the other), with a progress bar if asked."""
    results = []
    if not progress:
        for name in policies:
            results.append(simulation(scenario, name, seed).run())
        return results
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        for name in policies:
            task = bar.add_task(f"{scenario.name} {name:<15}", total=scenario.duration_s)
            sim = simulation(scenario, name, seed)

            def advance(now: float, task: TaskID = task) -> None:
                bar.update(task, completed=now)

            results.append(sim.run(progress=advance))
            bar.update(task, completed=scenario.duration_s)
    return results


def run_simulate(args: argparse.Namespace) -> int:
    if args.seed is not None and args.seed < 0:
        print("gwtf simulate: --seed must be >= 0", file=sys.stderr)
        return 2
    bound = getattr(args, "replay_bound", None)
    if bound is not None and bound < 0:
        print("gwtf simulate: --replay-bound must be >= 0 (0: no shipments)", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario, seed=args.seed)
        policies = parse_policies(args.policy, scenario)
    except ScenarioError as err:
        print(f"gwtf simulate: {err}", file=sys.stderr)
        return 2
    if bound is not None:
        scenario = replace(scenario, replay_bound=bound)
    seed = scenario.seed
    results = run_scenario(scenario, policies, seed, progress=sys.stderr.isatty())
    if args.out:
        from gwtf.sim.report import write_outputs

        try:
            written = write_outputs(Path(args.out), scenario, seed, results)
        except OSError as err:
            print(f"gwtf simulate: cannot write to {args.out!r}: {err.strerror or err}",
                  file=sys.stderr)
            return 2
        if not args.json:
            print(f"wrote {', '.join(str(p) for p in written)}")
    from gwtf.sim.report import summary_document

    doc = summary_document(scenario, seed, results)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{scenario.name}: {scenario.duration_s:.0f} s simulated, seed {seed}")
    for r in results:
        s = r.summary()
        ttt = s["time_to_train_s"]
        print(
            f"  {r.policy:<16} {r.throughput_mean:8.3f} mb/s"
            f"  iterations {r.iterations_completed:5d}"
            f"  time to train {'-' if ttt is None else f'{ttt:.0f} s':>9}"
            f"  wasted {100 * r.wasted_compute_fraction:5.2f}%  dropped {r.dropped_microbatches}"
            f"  lost {r.lost_microbatches}  msgs {r.control_messages}"
            f"  ({r.events} events in {r.sim_wall_s:.1f} s)"
        )
        for at, stage, before, to in r.rollbacks:
            print(f"    rollback at {at:.0f} s: stage {stage} wiped, iteration {before} "
                  f"back to {to}")
        if r.failed:
            print(f"    the job failed: {r.failed}")
    return 0
