"""`python -m benchmarks churn`: crash recovery on a local cluster under a real spot trace.

    .venv/bin/python -m benchmarks churn            # section `churn` of RESULTS.md
    .venv/bin/python -m benchmarks churn --quick    # a shorter slice

The churn is the AWS p3 spot trace of Bamboo (simulations/traces/spot_p3_bamboo.csv, the trace of
the `geo10_spot` scenario: 18 to 32 nodes alive over 11.4 h, every remove a crash). Two cores
cannot run 32 training processes, so a bounded slice of it is replayed: the nodes whose number is
1 mod 3 (every third node, with its own joins and crashes: 6 to 11 alive) over the trace's first
2 hours (1 in quick mode), by `gwtf launch --churn` with `--time-scale` so that it lasts 3 minutes
(80 s). A stage for each joiner as the launcher picks it (the one with the fewest live nodes).
The nodes pad each microbatch's stage work to their stated compute time (`--emulate-compute`,
0.3 s on a V100 divided by a GPU speed drawn from gwtf/data/gpu_train_throughput.csv), so that
the simulator can be given the same speeds. A tiny-gpt job is submitted once the swarm is formed
and trains through the whole slice; at its end the figures are read from the job's progress and
the nodes' logs:

- wasted compute: the stage work done again for a dead node (recompute, replay, resend) and the
  work of iterations that started over, as a fraction of all stage compute (target under 1%);
- from each crash (the launcher's SIGKILL) to the first microbatch rerouted away from the dead
  node (a node's log line), which includes the failure detector's timeout (3 s here);
- throughput under churn (microbatches trained per second over the slice) against what
  `gwtf.sim` predicts for the same nodes, speeds, trace and detection timeout with the `gwtf`
  policy: how well the simulator predicts the real system.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.report import machine, write_section
from benchmarks.swarmrun import log, log_time, submit_when_formed
from gwtf.client import JobResult, fetch_jobs
from gwtf.flow.topology import LinkSpec
from gwtf.local.churn import plan_churn
from gwtf.local.launch import plan_nodes
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import NodeInfo, load_scenario
from gwtf.sim.traces import TraceEvent, read_bamboo_trace
from gwtf.train import PRESETS, activation_bytes

SECTION = "## Crash recovery under churn (`python -m benchmarks churn`)"
REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "simulations" / "traces" / "spot_p3_bamboo.csv"
STAGES = 3
BASE_COMPUTE_S = 0.3
FAILURE_TIMEOUT_S = 3.0
LEAD_S = 12.0
"""Real seconds before the first event of the slice: the job is submitted meanwhile."""
_REROUTE = re.compile(
    r"^(\S+ \S+) INFO node=\S+ stage=\S+ job \S+ it \d+ mb \d+: "
    r"(?:rerouted from dead (\S+)|stage 0 of dead (\S+)'s microbatch)"
)


def trace_slice(window_s: float, every: int = 3) -> list[TraceEvent]:
    """The events of the nodes numbered 1 mod `every`, up to `window_s` trace seconds."""
    def keep(node: str) -> bool:
        digits = node.removeprefix("node")
        return digits.isdigit() and int(digits) % every == 1

    return [e for e in read_bamboo_trace(TRACE) if keep(e.node) and e.time_s <= window_s]


def write_trace(events: list[TraceEvent], path: Path, lead_trace_s: float) -> None:
    rows = ["time_s,event,node"]
    for e in events:
        t = 0.0 if e.time_s == 0 else e.time_s + lead_trace_s
        rows.append(f"{t:.3f},{e.kind},{e.node}")
    path.write_text("\n".join(rows) + "\n")


def reroutes(log_dir: Path) -> dict[str, float]:
    """Dead node -> the wall time of the first microbatch rerouted away from it."""
    first: dict[str, float] = {}
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            match = _REROUTE.match(line)
            if match:
                dead = match.group(2) or match.group(3)
                at = log_time(match.group(1))
                first[dead] = min(at, first.get(dead, at))
    return first


def simulate(
    initial: list[Any], actions: list[Any], events_at: list[tuple[float, str, str]],
    duration_s: float, iterations: int,
) -> tuple[float, float]:
    """(throughput, wasted fraction) the simulator predicts for this cluster and churn."""
    base = load_scenario(REPO / "simulations" / "homogeneous.toml")
    job = PRESETS["tiny-gpt"]
    nodes = {p.id: NodeInfo(p.id, p.stage, "local", "launch", BASE_COMPUTE_S / p.compute_s)
             for p in initial}
    for action in actions:
        if action.kind == "join" and action.plan is not None:
            plan = action.plan
            nodes[plan.id] = NodeInfo(plan.id, plan.stage, "local", "launch",
                                      BASE_COMPUTE_S / plan.compute_s)
    events = tuple(
        TraceEvent(max(0.0, t), kind, node, nodes[node].stage if kind == "join" else None)
        for t, kind, node in events_at
    )
    scenario = dataclasses.replace(
        base,
        name="churn_real",
        duration_s=duration_s,
        stages=STAGES,
        params_per_stage=(1.0e5,) * STAGES,
        activation_bytes=activation_bytes(job),
        compute_s_v100=(BASE_COMPUTE_S,) * STAGES,
        iterations=iterations,
        microbatches_per_iteration=job.microbatches,
        memory_slots=8,
        links={},
        intra=LinkSpec(0.2, 10.0),
        nodes=nodes,
        initial=tuple(p.id for p in initial),
        events=events,
        detection_timeout_s=FAILURE_TIMEOUT_S,
        phase_end_s=0.05,
        policies=("gwtf",),
    )
    # gwtf-fixed: the launched nodes are pinned (`--stage K`) and a node makes no placement moves
    # (docs/design.md 2.11), where the `gwtf` policy would move them.
    result = simulation(scenario, "gwtf-fixed").run()
    return result.throughput_mean, result.wasted_compute_fraction


def measure(quick: bool, job_changes: dict[str, Any] | None = None,
            predict: bool = True) -> dict[str, Any]:
    """One run on the slice. `job_changes`: keys of the tiny-gpt job to change (another
    benchmark's cases); `predict`: also run the simulator on what happened."""
    window_s = 3600.0 if quick else 7200.0
    replay_s = 80.0 if quick else 180.0
    scale = replay_s / window_s
    events = trace_slice(window_s)
    initial_n = sum(1 for e in events if e.time_s == 0)
    plans = plan_nodes(initial_n, STAGES, locations=[], base_compute_s=BASE_COMPUTE_S, seed=0)
    lead_trace_s = LEAD_S / scale
    shifted = [dataclasses.replace(e, time_s=0.0 if e.time_s == 0 else e.time_s + lead_trace_s)
               for e in events]
    # The launcher draws its joiners' GPUs with its --seed + 1 (gwtf.local.launch._plan_churn):
    # the same seed here, or the simulator gets other speeds than the nodes that ran.
    actions = plan_churn(shifted, plans, num_stages=STAGES, locations=[],
                         base_compute_s=BASE_COMPUTE_S, time_scale=scale, seed=1)
    tmp = Path(tempfile.mkdtemp(prefix="gwtf-churn-"))
    trace = tmp / "slice.csv"
    write_trace(events, trace, lead_trace_s)
    log(f"slice: {len(events)} events of {initial_n}+ nodes over {window_s:.0f} trace s, "
        f"replayed in {replay_s:.0f} s after {LEAD_S:.0f} s; logs in {tmp}")
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", str(initial_n), "--stages",
         str(STAGES), "--json", "--heartbeat-s", "0.25", "--failure-timeout-s",
         str(FAILURE_TIMEOUT_S), "--compute-s", str(BASE_COMPUTE_S), "--emulate-compute",
         "--log-dir", str(tmp / "logs"), "--churn", str(trace), "--time-scale", repr(scale)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def read() -> None:
        assert launch.stdout is not None
        for line in launch.stdout:
            lines.put((time.time(), line))

    threading.Thread(target=read, daemon=True).start()
    addresses: dict[str, str] = {}
    crashes: dict[str, float] = {}
    events_at: list[tuple[float, str, str]] = []
    started = 0.0

    def drain() -> None:
        while True:
            try:
                at, line = lines.get_nowait()
            except queue.Empty:
                return
            record = json.loads(line)
            if "nodes" in record:
                for n in record["nodes"]:
                    addresses[n["id"]] = n["address"]
            elif record.get("event") == "listening":
                addresses[record["node"]] = record["address"]
            elif record.get("event") in ("crash", "leave", "join"):
                if record["event"] != "join":
                    addresses.pop(record["node"], None)
                    crashes[record["node"]] = at
                events_at.append((at - started, record["event"], record["node"]))

    def progress(job_id: str) -> JobResult | None:
        for address in list(addresses.values()):
            for job in fetch_jobs(address, timeout_s=3.0):
                if job.job_id == job_id:
                    return job
        return None

    job = dataclasses.replace(PRESETS["tiny-gpt"], **{"name": "churn", "iterations": 100000,
                                                      **(job_changes or {})})
    try:
        while not addresses:
            at, line = lines.get(timeout=300)
            lines.put((at, line))
            drain()
        job_id = submit_when_formed(addresses[plans[-1].id], job)
        started = time.time()
        log(f"submitted {job_id}")
        end = started + LEAD_S + replay_s + 5.0
        result: JobResult | None = None
        while time.time() < end:
            time.sleep(1.0)
            drain()
            result = progress(job_id) or result
        drain()
        result = progress(job_id) or result
        window = time.time() - started
    finally:
        launch.terminate()
        launch.wait(timeout=60)
    assert result is not None, "no node answered about the job"
    elapsed = window
    delays = []
    first_reroute = reroutes(tmp / "logs")
    for node, at in sorted(crashes.items()):
        if node in first_reroute and first_reroute[node] >= at:
            delays.append(first_reroute[node] - at)
    sim_tput, sim_waste = simulate(plans, actions, [e for e in events_at if e[0] >= 0],
                                   elapsed, max(1, result.iterations_completed)) if predict \
        else (float("nan"), float("nan"))
    return {
        "events": len(events),
        "initial": initial_n,
        "window_s": window_s,
        "replay_s": replay_s,
        "result": result,
        "delays": delays,
        "crashes_seen": len(crashes),
        "sim_throughput": sim_tput,
        "sim_waste": sim_waste,
        "log_dir": str(tmp),
        "elapsed_s": elapsed,
    }


def run(quick: bool = False) -> str:
    m = measure(quick)
    r: JobResult = m["result"]
    waste = r.replayed_s / r.compute_s if r.compute_s else 0.0
    # Over the benchmark's own clock, from the submission to the last look at the job.
    tput = r.microbatches_trained / m["elapsed_s"] if m["elapsed_s"] else 0.0
    delays = m["delays"]
    delay_text = (
        f"median {statistics.median(delays):.2f} s, min {min(delays):.2f} s, max "
        f"{max(delays):.2f} s over {len(delays)} crashes that held microbatches"
        if delays else "no crash held a microbatch"
    )
    ratio = tput / m["sim_throughput"] if m["sim_throughput"] else float("nan")
    moved = f"{r.rerouted_microbatches} / {r.replayed_microbatches}"
    wasted = (f"{r.replayed_s:.3f} s = **{100 * waste:.2f}%** (target < 1%); the simulator "
              f"predicts {100 * m['sim_waste']:.2f}%")
    predicted = (f"{m['sim_throughput']:.2f} microbatches/s: measured / predicted = "
                 f"**{ratio:.2f}**")
    body = f"""{SECTION}

Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}{', quick mode' if quick else ''}; the
machine is shared with other work, so the figures carry its load. Command: `python -m benchmarks
churn{' --quick' if quick else ''}`.

The Bamboo p3 spot trace (the churn of `geo10_spot`), every third node (number 1 mod 3), its first
{m['window_s'] / 3600:.0f} h: {m['events']} events, {m['initial']} nodes at the start, replayed by
`gwtf launch --churn --time-scale` in {m['replay_s']:.0f} s on a local cluster of 3 stages while a
tiny-gpt job trains (nodes padded to 0.3 s per microbatch on a V100 over their GPU's speed;
failure detector timeout {FAILURE_TIMEOUT_S:g} s).

| figure | value |
|---|---|
| crashes, joins seen by the job | {r.crashes}, {r.joins} |
| iterations, microbatches trained | {r.iterations_completed}, {r.microbatches_trained} |
| microbatches rerouted / replayed (rules 1-3) | {moved} |
| dropped (a data holder died with them), lost | {r.dropped_microbatches}, {r.lost_microbatches} |
| iterations started over | {r.restarts} |
| paused (a stage had no node) | {r.paused_s:.1f} s |
| stage compute, all nodes | {r.compute_s:.2f} s |
| wasted compute (redone for dead nodes, or in rounds started over) | {wasted} |
| crash to first rerouted microbatch | {delay_text} |
| throughput under churn | {tput:.2f} microbatches/s over {m['elapsed_s']:.0f} s |
| simulator's prediction (`gwtf-fixed` policy, same nodes, speeds, trace, timeout) | {predicted} |

Reading. A death costs the dead node's own stage work (rules 1-3 redo one stage, never the
pipeline) and its accumulated gradient sums (replayed from the neighbours' kept tensors): that
part of the waste is small. What is not small is an iteration started over: the job's
coordinator keeps the iteration's bookkeeping, and when it dies the next data holder starts the
iteration again from scratch, throwing away every node's work of it; in this trace data holders
die often (joiners go to the stage with the fewest nodes, and preemptions come in bursts), so
restarts dominate the waste when there are several. The time from a crash to the first reroute
is the failure detector's verdict (a heartbeat silent for the timeout, sooner when calls to the
dead node are refused) plus one round of ledger reports (milliseconds on loopback). The
simulator's throughput assumes nodes that run exactly at their stated speed and an iteration
that survives its coordinator; on two shared cores the real nodes' torch work, serialisation
and gRPC come on top of the padding, so the ratio carries both. The wasted-compute figures are
not the same quantity: the simulator counts the dead node's lost work, the swarm counts the work
done again (which is what it can measure).
"""
    write_section("churn", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
