"""`python -m benchmarks versus`: gwtf's routing against SWARM's, in real node processes.

    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks versus            # 3 pairs
    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks versus --quick    # 1 pair, 60 s

Three cases, each a scenario of `simulations/versus/` (their descriptions say what and from
which data): (a) a heterogeneous swarm whose home uplinks bind, (b) the same with churn, (c) the
same with two stragglers. Each case runs as 12 `gwtf node` processes (15 over the churn) on
127.0.0.1 (the emulated WAN over the measured geo10 matrix, each node's uplink shared by its
data plane, compute emulated by sleep) training tiny-gpt through the scenario's trace, once
routed by gwtf's flows (`--routing local`) and once by SWARM's chooser (`--routing swarm`,
gwtf.job.swarmroute), alternated A B A B, `PAIRS` pairs. Both recover from crashes by gwtf's
rules: the comparison is of routing alone (docs/design.md 2.14).

Per run, from the nodes' logs: committed microbatches per second over the trace (between the
first commit and `duration_s` after it, linear between commits), the time to the loss of
iteration K (K: the fewest iterations any run of the case committed; every run trains the same
model iteration by iteration, which the losses at K confirm), and the microbatches lost or
dropped. Per case: gwtf/swarm of each pair, their mean and spread. And the simulator's
prediction of the same runs (`gwtf-fixed` and `swarm-routing`, the trace as applied in each
run): measured over predicted, for both policies. The CPU the node processes used, over the
two cores, says whether the machine carried the emulated swarm honestly.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fidelity import COMMIT_LINE, Swarm, committed_at, load, run_real, save
from benchmarks.report import machine, write_section
from benchmarks.swarmrun import log
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import Scenario, load_scenario
from gwtf.sim.traces import TraceEvent

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "simulations" / "versus"
CASES = (
    ("(a) link-bound", "links"),
    ("(b) link-bound, churn", "churn"),
    ("(c) link-bound, stragglers", "stragglers"),
)
ROUTINGS = (("gwtf", "local", "gwtf-fixed"), ("swarm", "swarm", "swarm-routing"))
"""(label, `gwtf node --routing`, the simulator's policy for the same)."""
PAIRS = 3
MICROBATCH_SIZE = 8
"""Sequences per microbatch: the scenarios' 512 tokens, 128 KiB activations."""
_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux
HEARTBEAT_S = 0.5


HEADER = (
    "| case | pair | gwtf mb/s | swarm mb/s | gwtf/swarm | to the loss of K: gwtf / swarm "
    "(ratio) | lost | measured / predicted | CPU cores |\n|---|---|---|---|---|---|---|---|---|"
)


class VersusSwarm(Swarm):
    """The scenario's nodes with their uplinks (`--uplink-mbps`: the data plane shares it),
    routed by `routing`; a machine that the scenario slows from the start runs with the
    straggler fault; the CPU each process used is read before it stops."""

    def __init__(self, sc: Scenario, log_dir: Path, routing: str) -> None:
        super().__init__(sc, log_dir)
        self.routing = routing
        self.slow = {e.node: e.factor for e in sc.events
                     if e.kind == "speed" and e.time_s <= 0 and e.factor is not None}
        self.cpu_s: dict[str, float] = {}
        self.wall_s: dict[str, float] = {}

    def argv(self, node: str) -> list[str]:
        argv = super().argv(node)
        # Heartbeats at the node's default: twelve processes gossiping every 0.25 s take a
        # quarter of a core between them, idle.
        argv[argv.index("--heartbeat-s") + 1] = repr(HEARTBEAT_S)
        info = self.sc.nodes[node]
        if info.uplink_gbps < float("inf"):
            argv += ["--uplink-mbps", repr(info.uplink_gbps * 1000)]
        if node in self.slow:
            argv += ["--fault", f"slow:compute:factor={self.slow[node]:g}"]
        if not self.bootstrap:
            argv += ["--routing", self.routing,
                     "--activation-bytes", str(self.sc.activation_bytes)]
        return argv

    def stop(self) -> None:
        for node, entry in self.procs.items():
            if entry.proc.poll() is None:
                try:
                    fields = Path(f"/proc/{entry.proc.pid}/stat").read_text().rsplit(")", 1)[1]
                    utime, stime = (int(v) for v in fields.split()[11:13])
                except (OSError, ValueError, IndexError):
                    continue
                self.cpu_s[node] = (utime + stime) / _TICKS
                self.wall_s[node] = time.time() - entry.spawned
        super().stop()


def losses(log_dir: Path) -> dict[int, str]:
    """The loss each committed iteration logged (as text: compared exactly)."""
    out: dict[int, str] = {}
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            match = COMMIT_LINE.match(line)
            if match:
                out.setdefault(int(match.group(2)), match.group(3))
    return out


def run_sim(sc: Scenario, events: list[TraceEvent], policy: str) -> list[tuple[float, int]]:
    """`policy` on `sc` with the run's `events` (times after its first commit): commits relative
    to the simulation's own first commit. The scenario's stragglers are slow from the start in
    both (the real ones by their fault, from the node's start)."""
    slow = tuple(e for e in sc.events if e.kind == "speed" and e.time_s <= 0)
    quiet = dataclasses.replace(sc, events=slow, duration_s=120.0)
    first = simulation(quiet, policy).run().commit_times[0]
    shifted = tuple(dataclasses.replace(e, time_s=e.time_s + first) for e in events)
    full = dataclasses.replace(sc, events=slow + shifted, duration_s=first + sc.duration_s + 5)
    result = simulation(full, policy).run()
    mbs = sc.microbatches_per_iteration
    return [(t - first, mbs) for t in result.commit_times]


def one_run(sc: Scenario, label: str, routing: str, policy: str, name: str) -> dict[str, Any]:
    from gwtf.train import PRESETS

    log_dir = Path(tempfile.mkdtemp(prefix=f"gwtf-versus-{name}-{label}-"))
    log(f"{name}, {label}: {len(sc.initial)} nodes routed by {routing}; logs in {log_dir}")
    swarm = VersusSwarm(sc, log_dir, routing)
    job = dataclasses.replace(
        PRESETS["tiny-gpt"], name=f"versus-{name}", iterations=100_000,
        microbatch_size=MICROBATCH_SIZE, microbatches=sc.microbatches_per_iteration,
    )
    # The stragglers are slowed by their fault from the start; the real run replays the rest.
    churn = dataclasses.replace(sc, events=tuple(e for e in sc.events if e.kind != "speed"))
    real = run_real(churn, log_dir, swarm, job)
    real["cpu_s"] = sum(swarm.cpu_s.values())
    real["wall_s"] = max(swarm.wall_s.values(), default=1.0)
    save(real, log_dir / "real.json")  # the simulator's side can be redone from it
    return figures(sc, label, policy, log_dir, real)


def figures(sc: Scenario, label: str, policy: str, log_dir: Path,
            real: dict[str, Any]) -> dict[str, Any]:
    """One run's figures from its real side (`real.json`) and the simulator's prediction."""
    events = [e for e in real["events"] if e.kind != "speed"]
    span = sc.duration_s
    done = real["commits"]
    by_iteration = losses(log_dir)
    predicted = run_sim(sc, events, policy)
    lost = sum(sc.microbatches_per_iteration - mbs for at, mbs in done if 0 < at <= span)
    return {
        "label": label,
        "rate": committed_at(done, span) / span,
        "predicted": committed_at(predicted, span) / span,
        "commits": [(at, mbs) for at, mbs in done if at <= span],
        "losses": by_iteration,
        "lost": lost,
        "cpu_cores": real["cpu_s"] / real["wall_s"] if "cpu_s" in real else float("nan"),
        "events": events,
        "log_dir": str(log_dir),
    }


def time_to(run: dict[str, Any], iteration: int) -> float:
    """Seconds from the run's first commit to its `iteration`-th after it."""
    return float(run["commits"][iteration][0]) if iteration < len(run["commits"]) else float("nan")


def _cores(run: dict[str, Any]) -> str:
    cores = run["cpu_cores"]
    return "-" if cores != cores else f"{cores:.2f}"  # nan: not recorded


def case_rows(case: str, runs: list[dict[str, Any]]) -> tuple[list[str], list[float], str]:
    gwtf = [r for r in runs if r["label"] == "gwtf"]
    swarm = [r for r in runs if r["label"] == "swarm"]
    k = min(len(r["commits"]) for r in runs) - 1
    at_k = {r["losses"].get(min(r["losses"], default=0) + k) for r in runs}
    same = "the same loss at K in every run" if len(at_k) == 1 else f"losses at K differ: {at_k}"
    ratios = [a["rate"] / b["rate"] for a, b in zip(gwtf, swarm, strict=True) if b["rate"]]
    times = [time_to(b, k) / time_to(a, k) for a, b in zip(gwtf, swarm, strict=True)]
    rows = []
    for i, (a, b) in enumerate(zip(gwtf, swarm, strict=True)):
        rows.append(
            f"| {case} | {i + 1} | {a['rate']:.2f} | {b['rate']:.2f} | "
            f"**{a['rate'] / b['rate']:.2f}** | {time_to(a, k):.0f} / {time_to(b, k):.0f} s "
            f"({time_to(b, k) / time_to(a, k):.2f}) | {a['lost']} / {b['lost']} | "
            f"{a['rate'] / a['predicted']:.2f} / {b['rate'] / b['predicted']:.2f} | "
            f"{_cores(a)} / {_cores(b)} |"
        )
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
    summary = (f"| {case} | mean | | | **{statistics.fmean(ratios):.2f}** ({spread}) | "
               f"K = {k}: {statistics.fmean(times):.2f} | | | |")
    return [*rows, summary], ratios, same


def saved_runs(name: str, sc: Scenario) -> list[dict[str, Any]]:
    """The runs of case `name` kept in /tmp (their `real.json`), oldest first, A B A B."""
    runs = []
    policy = {label: p for label, _, p in ROUTINGS}
    for path in sorted(Path(tempfile.gettempdir()).glob(f"gwtf-versus-{name}[0-9]-*/real.json"),
                       key=lambda p: p.stat().st_mtime):
        label = path.parent.name.split("-")[3]
        runs.append(figures(sc, label, policy[label], path.parent, load(path)))
    return runs


def run(quick: bool = False, pairs: int = PAIRS, saved: tuple[str, ...] = ()) -> str:
    """`saved`: the cases whose runs are taken from their kept `real.json` files rather than
    run again (the simulator's side is computed anew)."""
    pairs = 1 if quick else pairs
    rows: list[str] = []
    notes: list[str] = []
    fidelity: dict[str, list[tuple[float, float]]] = {"gwtf": [], "swarm": []}
    for case, name in CASES:
        sc = load_scenario(SCENARIOS / f"{name}.toml")
        if quick:
            sc = dataclasses.replace(sc, duration_s=60.0, events=tuple(
                e for e in sc.events if e.time_s < 60.0))
        runs = saved_runs(name, sc) if name in saved else []
        for pair in range(0 if name in saved else pairs):
            for label, routing, policy in ROUTINGS:
                runs.append(one_run(sc, label, routing, policy, f"{name}{pair}"))
                log(f"{name} pair {pair + 1} {label}: {runs[-1]['rate']:.2f} mb/s "
                    f"(predicted {runs[-1]['predicted']:.2f})")
        case_lines, _, same = case_rows(case, runs)
        rows += case_lines
        notes.append(f"{case}: {same}.")
        log(f"{case}: logs in {', '.join(r['log_dir'] for r in runs)}")
        for r in runs:
            fidelity[r["label"]].append((r["rate"], r["predicted"]))
    fid = {label: sum(m for m, _ in v) / sum(p for _, p in v) for label, v in fidelity.items()}
    flag = " --quick" if quick else ""
    if saved:
        flag += f" --saved={','.join(saved)}"
        notes.append(f"The real runs of {', '.join(saved)} are their kept `real.json` files, "
                     "measured earlier the same day by this benchmark (the simulator's side "
                     "computed anew); `-`: the cores were not recorded in that run.")
    body = f"""## gwtf against SWARM's routing in real processes (`python -m benchmarks versus`)

Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()} by `flock /tmp/gwtf-heavy.lock
.venv/bin/python -m benchmarks.versus{flag}`: {pairs} pair(s) per case, gwtf then swarm. The
scenarios are `simulations/versus/*.toml` (12 home nodes in 3 stages, geo10 RTTs, uplinks of
2-40 Mbit/s shared by each node's data plane, 0.5 s emulated compute per microbatch and
stage, tiny-gpt at 32 microbatches of 128 KiB activations per iteration,
{'60' if quick else '150'} s of trace after the first commit). Both routings recover by gwtf's
rules (SWARM's routing alone: `gwtf node --routing swarm`, docs/design.md 2.14).

Columns: committed microbatches/s of gwtf and of swarm; their ratio; the time each took to
reach the loss of iteration K (K: the fewest any run of the case committed) and swarm's over
gwtf's; microbatches lost or dropped (gwtf / swarm); measured over the simulator's prediction
of the same run (`gwtf-fixed` / `swarm-routing`); the CPU cores the node processes used
(of 2).

{HEADER}
{chr(10).join(rows)}

Simulator fidelity over every run (measured over predicted, committed microbatches):
gwtf **{fid['gwtf']:.2f}**, swarm **{fid['swarm']:.2f}**.

{chr(10).join('- ' + n for n in notes)}
"""
    write_section("versus", body)
    return body


if __name__ == "__main__":
    args = sys.argv[1:]
    count = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--pairs=")), PAIRS)
    kept = next((tuple(a.split("=", 1)[1].split(",")) for a in args
                 if a.startswith("--saved=")), ())
    print(run(quick="--quick" in args, pairs=count, saved=kept))
