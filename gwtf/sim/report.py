"""What a run writes: the JSON summary, the CSV time series, PNG plots, a markdown table."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gwtf.sim.scenario import Scenario
from gwtf.sim.simulator import SimResult

__all__ = ["markdown_table", "rollback_cell", "summary_document", "write_outputs"]


def summary_document(scenario: Scenario, seed: int, results: Sequence[SimResult]) -> dict[str, Any]:
    """The JSON summary: the scenario, the seed, and per policy the fields of the issue."""
    return {
        "scenario": scenario.name,
        "seed": seed,
        "duration_s": scenario.duration_s,
        "stages": scenario.stages,
        "iterations": scenario.iterations,
        "microbatches_per_iteration": scenario.microbatches_per_iteration,
        "policies": {r.policy: r.summary() for r in results},
    } | ({"compression": list(scenario.compression)} if scenario.compression else {})


def write_outputs(
    out: Path, scenario: Scenario, seed: int, results: Sequence[SimResult]
) -> list[Path]:
    """Write summary.json, timeseries.csv, iterations.csv and the PNG plots into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "summary.json"
    path.write_text(json.dumps(summary_document(scenario, seed, results), indent=2) + "\n")
    written.append(path)
    path = out / "timeseries.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "time_s", "throughput_mb_s", "alive_nodes", "active_nodes",
                         "iterations_committed"])
        for r in results:
            for t, rate, alive, active, committed in r.series:
                writer.writerow([r.policy, f"{t:.3f}", f"{rate:.6f}", alive, active, committed])
    written.append(path)
    path = out / "iterations.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "iteration", "commit_s", "duration_s"])
        for r in results:
            previous = 0.0
            for i, t in enumerate(r.commit_times):
                writer.writerow([r.policy, i, f"{t:.3f}", f"{t - previous:.3f}"])
                previous = t
    written.append(path)
    written.extend(_plots(out, scenario, results))
    return written


def _plots(out: Path, scenario: Scenario, results: Sequence[SimResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    window_s = max(600.0, scenario.duration_s / 60)
    for r in results:
        if len(r.series) < 2:
            continue
        step = r.series[1][0] - r.series[0][0]
        k = max(1, round(window_s / step))
        rates = [p[1] for p in r.series]
        smooth = [sum(rates[max(0, i - k + 1): i + 1]) / len(rates[max(0, i - k + 1): i + 1])
                  for i in range(len(rates))]
        ax.plot([p[0] / 3600 for p in r.series], smooth, label=r.policy, linewidth=1.2)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("finished microbatches / s")
    ax.set_title(f"{scenario.name}: throughput over time ({window_s / 60:.0f} min moving average)")
    ax.legend()
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in results:
        times = r.commit_times
        durations = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        if durations:
            ax.plot(range(len(durations)), durations, label=r.policy, linewidth=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration time (s)")
    ax.set_yscale("log")
    ax.set_title(f"{scenario.name}: time per iteration")
    ax.legend()
    fig.tight_layout()
    path = out / "iterations.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    if results and results[0].series:
        series = results[0].series
        ax.step([p[0] / 3600 for p in series], [p[2] for p in series], where="post",
                label="alive")
        for r in results:
            ax.step([p[0] / 3600 for p in r.series], [p[3] for p in r.series], where="post",
                    label=f"active ({r.policy})", linewidth=0.8)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("nodes")
    ax.set_title(f"{scenario.name}: nodes alive and in use")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out / "nodes.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def markdown_table(scenario: Scenario, results: Sequence[SimResult]) -> list[str]:
    """One markdown table row per policy, with ratios against oracle, swarm and SWARM with
    rebalancing (the strongest baseline that moves peers, as gwtf's placement does)."""
    by = {r.policy: r for r in results}
    oracle = by.get("oracle")
    swarm = by.get("swarm")
    rebalance = by.get("swarm-rebalance")

    def progress(r: SimResult | None) -> float:
        return float(r.summary()["progress_throughput"]) if r is not None else 0.0

    rows = []
    for r in results:
        s = r.summary()
        # Ratios of progress (committed + finished in the last, unfinished iteration), which
        # short runs need: committed throughput moves in steps of one iteration.
        vs_oracle = f"{progress(r) / progress(oracle):.3f}" if progress(oracle) else ""
        vs_swarm = f"{progress(r) / progress(swarm):.3f}" if progress(swarm) else ""
        vs_rebalance = f"{progress(r) / progress(rebalance):.3f}" if progress(rebalance) else ""
        ttt = s["time_to_train_s"]
        ttt_text = f"{ttt:.0f}" if ttt is not None else (
            f"({s['projected_time_to_train_s']:.0f})" if s["projected_time_to_train_s"] else "-")
        rows.append(
            f"| {scenario.name} | {r.policy} | {r.throughput_mean:.3f} | "
            f"{s['progress_throughput']:.3f} | "
            f"{vs_oracle} | "
            f"{vs_swarm} | {vs_rebalance} | {r.iterations_completed} | {ttt_text} | "
            f"{100 * r.wasted_compute_fraction:.2f}% | {r.dropped_microbatches} | "
            f"{r.lost_microbatches} | {rollback_cell(r)} | {r.control_messages} | {r.events} | "
            f"{r.sim_wall_s:.1f} | {s['events_per_s']} |"
        )
    return rows


def rollback_cell(r: SimResult) -> str:
    """Rollbacks (iterations they undid), and whether the job failed (4.6)."""
    cell = f"{len(r.rollbacks)} ({r.rolled_back_iterations})" if r.rollbacks else "0"
    return cell + (" failed" if r.failed else "")


TABLE_HEADER = [
    "| scenario | policy | throughput (mb/s) | progress (mb/s) | / oracle | / swarm | "
    "/ swarm-rebalance | iterations | "
    "time to train (s) | wasted | dropped | lost | rollbacks (iterations undone) | "
    "control msgs | events | wall (s) | events/s |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
