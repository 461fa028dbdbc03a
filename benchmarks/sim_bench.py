"""`python -m benchmarks.sim_bench` (or `simulations/run_all`): every scenario, every policy.

Writes, per scenario, the outputs of `gwtf simulate --out` into OUT/<scenario>/, and a markdown
comparison (OUT/comparison.md). With `--results FILE` the comparison replaces the section between
the `sim_bench` markers of FILE (appended if absent; the rest of FILE is kept).

The gwtf policy runs the real decentralized flow machines, whose cost in wall time grows fast
with the swarm (benchmarks/RESULTS.md, routing section). `--gwtf-cap S` therefore runs gwtf for
at most S simulated seconds per scenario, together with every other policy over the same
truncated run, so that its ratios compare equal spans; the full-length rows of the other
policies are kept as well.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

from gwtf.sim.report import TABLE_HEADER, markdown_table, write_outputs
from gwtf.sim.scenario import POLICIES, load_scenario
from gwtf.sim.simulator import SimResult, Simulation

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["homogeneous", "geo10_hetero_links", "geo10_spot", "high_churn"]
BEGIN = "<!-- sim_bench:begin -->"
END = "<!-- sim_bench:end -->"


def _run(scenario_name: str, policies: list[str], duration: float | None,
         out: Path, label: str) -> tuple[list[str], list[SimResult]]:
    sc = load_scenario(ROOT / "simulations" / f"{scenario_name}.toml")
    if duration is not None and duration < sc.duration_s:
        sc = replace(sc, duration_s=duration, name=f"{sc.name} ({duration / 3600:.1f} h)")
    results = []
    for policy in policies:
        t0 = time.perf_counter()
        result = Simulation(sc, policy).run()
        results.append(result)
        print(f"{label:<32} {policy:<16} {result.throughput_mean:7.3f} mb/s "
              f"{result.iterations_completed:4d} it  {time.perf_counter() - t0:7.1f} s wall",
              file=sys.stderr, flush=True)
    write_outputs(out / label, sc, sc.seed, results)
    return markdown_table(sc, results), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "sim"))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--gwtf-cap", type=float, default=1800.0, metavar="S",
                        help="simulated seconds for the gwtf comparison (0: full length)")
    parser.add_argument("--results", metavar="FILE", help="replace the sim_bench section of FILE")
    args = parser.parse_args(argv)
    out = Path(args.out)
    scenarios = [s for s in args.scenarios.split(",") if s]
    policies = [p for p in args.policies.split(",") if p]
    others = [p for p in policies if p != "gwtf"]
    full_rows: list[str] = []
    capped_rows: list[str] = []
    speed_rows: list[str] = []
    for name in scenarios:
        rows, results = _run(name, others, None, out, name)
        full_rows += rows
        for r in results:
            speed_rows.append(f"| {name} | {r.policy} | {r.sim_time_s / 3600:.1f} | {r.events} | "
                              f"{r.sim_wall_s:.1f} | {r.events / r.sim_wall_s:,.0f} |")
        if "gwtf" in policies:
            cap = args.gwtf_cap or None
            sc = load_scenario(ROOT / "simulations" / f"{name}.toml")
            if cap is None or cap >= sc.duration_s:
                rows, results = _run(name, policies, None, out, f"{name}-gwtf")
            else:
                rows, results = _run(name, policies, cap, out, f"{name}-gwtf-capped")
            capped_rows += rows
            for r in results:
                if r.policy == "gwtf":
                    speed_rows.append(
                        f"| {name} | gwtf | {r.sim_time_s / 3600:.1f} | {r.events} | "
                        f"{r.sim_wall_s:.1f} | {r.events / r.sim_wall_s:,.0f} |")
    lines = [
        BEGIN,
        "## Simulator: policies compared (`python -m benchmarks.sim_bench`, "
        "`simulations/run_all`)",
        "",
        f"{platform.machine()}, Python {sys.version.split()[0]}, one core per run. "
        "Throughput = committed microbatches / simulated time (barriers and aggregation "
        "included); progress = the same plus the microbatches finished in the iteration still "
        "open at the end (the ratios use it: committed throughput moves in steps of one "
        "iteration, too coarse for short runs); time to train = commit of the scenario's "
        "`iterations`-th iteration "
        "(in parentheses: projected from the rate when the run ended first); wasted = compute "
        "thrown away or redone / all compute; lost = microbatches whose work was lost without "
        "being accounted for (swarm: a dead peer's accumulated gradients, a dead trainer's "
        "microbatches).",
        "",
        "### Full length, every policy but gwtf",
        "",
        *TABLE_HEADER,
        *full_rows,
    ]
    if capped_rows:
        lines += [
            "",
            f"### With gwtf (at most {args.gwtf_cap / 3600:.1f} h of each scenario, every "
            "policy over the same span)",
            "",
            *TABLE_HEADER,
            *capped_rows,
        ]
    lines += [
        "",
        "### Simulator speed",
        "",
        "| scenario | policy | simulated h | events | wall s | events/s |",
        "|---|---|---|---|---|---|",
        *speed_rows,
        END,
    ]
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(text)
    print(f"wrote {out / 'comparison.md'}", file=sys.stderr)
    if args.results:
        path = Path(args.results)
        old = path.read_text() if path.exists() else ""
        if BEGIN in old and END in old:
            head, rest = old.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            new = head + text.rstrip("\n") + tail
        else:
            new = old.rstrip("\n") + "\n\n" + text
        path.write_text(new)
        print(f"updated {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
