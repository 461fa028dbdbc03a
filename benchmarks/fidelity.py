"""`python -m benchmarks fidelity`: does the simulator predict what the real swarm does?

    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks fidelity   # section `fidelity`

One swarm, one churn trace, run twice (docs/design.md 5, "Fidelity"):

- for real: `gwtf node` processes on 127.0.0.1, one per node of `simulations/fidelity.toml`, each
  at its stage and location (the emulated WAN of docs/design.md 3.6 over the measured geo10
  matrix) and with its compute time emulated by sleep (`--emulate-compute`, the scenario's
  compute of that node's GPU), so that the two shared cores only carry the real tiny model's
  small work, not the modelled one. A tiny-gpt job trains through the trace: a crash is SIGKILL
  of the node's process by pid, a join starts a new process, at the trace's time after the first
  commit. The commits are read from the nodes' logs.
- in the simulator: the same scenario, nodes, speeds, links and trace and the real model's
  parameter count per stage, with the `gwtf` policy less its placement moves (`gwtf-fixed`: the
  node makes none).

It prints committed microbatches per second in windows of the trace and overall, measured over
predicted. The joins enter the simulator at the time their process was listening (the real
start-up of a process, measured in the run, is when that machine is there).
`python -m benchmarks.fidelity REAL_JSON` redoes the simulator's side of a saved real run
(`real.json` in the run's log folder; `benchmarks/fidelity_real.json` and `fidelity_real_2.json`
are the two runs of docs/results/fidelity.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from benchmarks.report import machine, write_section
from benchmarks.swarmrun import log, log_time, submit_when_formed
from gwtf.sim.policies import simulation
from gwtf.sim.scenario import Scenario, load_scenario
from gwtf.sim.traces import TraceEvent

if TYPE_CHECKING:
    from gwtf.train import JobConfig

SECTION = ("## Simulator fidelity: the real swarm against the simulator "
           "(`python -m benchmarks fidelity`)")
REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "simulations" / "fidelity.toml"
MATRIX = REPO / "gwtf" / "data" / "geo10_aws.csv"
POLICY = "gwtf-fixed"
"""The `gwtf` policy without placement moves: a node keeps the stage it took (docs/design.md 2.11,
moves run in the simulator only), and these nodes are pinned (`--stage K`)."""
HEARTBEAT_S = 0.25
WINDOW_S = 30.0
START_TIMEOUT_S = 120.0
TAIL_S = 5.0
"""Real seconds after the trace's end before the nodes stop (the last commits get logged)."""
COMMIT_LINE = re.compile(
    r"^(\S+ \S+) INFO node=\S+ stage=\S+ job \S+ iteration (\d+)/\d+ committed: loss (\S+), "
    r"(\d+) microbatches"
)
"""A node's log line of a committed iteration: its time, the iteration, the loss, the
microbatches."""
_LISTENING = re.compile(r"listening on (\S+)")


def tiny_stage_params(stages: int) -> tuple[float, ...]:
    """Parameters of each stage of the tiny-gpt preset cut into `stages`."""
    from gwtf.train import PRESETS
    from gwtf.train.stage import build_stage_of

    job = PRESETS["tiny-gpt"]
    return tuple(
        float(sum(p.numel() for p in build_stage_of(job.model, job.seed, s, stages).parameters()))
        for s in range(stages)
    )


def scenario() -> Scenario:
    """`simulations/fidelity.toml`, which states the real model's stages and the nodes'
    emulated compute (`compute_s_v100`); checked against the model, so the two cannot drift."""
    sc = load_scenario(SCENARIO)
    real = tiny_stage_params(sc.stages)
    if sc.params_per_stage != real:
        raise SystemExit(f"{SCENARIO}: params_per_stage {list(sc.params_per_stage)} is not the "
                         f"tiny-gpt preset's {list(real)}")
    return sc


# ---------------------------------------------------------------------------- the real swarm


@dataclasses.dataclass
class _Proc:
    node: str
    proc: subprocess.Popen[str]
    spawned: float
    listening: float = math.nan
    address: str = ""


class Swarm:
    """Node processes of the scenario on loopback; stopped together."""

    def __init__(self, sc: Scenario, log_dir: Path) -> None:
        self.sc = sc
        self.log_dir = log_dir
        self.procs: dict[str, _Proc] = {}
        self._logs: list[IO[str]] = []
        self._ready = threading.Condition()
        self.bootstrap = ""

    def argv(self, node: str) -> list[str]:
        info = self.sc.nodes[node]
        argv = [
            sys.executable, "-m", "gwtf", "node", "--id", node, "--stage", str(info.stage),
            "--host", "127.0.0.1", "--port", "0",
            "--compute-s", repr(self.sc.compute_s(info)), "--emulate-compute",
            "--location", info.location, "--link-matrix", str(MATRIX),
            "--heartbeat-s", repr(HEARTBEAT_S),
            "--failure-timeout-s", repr(self.sc.detection_timeout_s),
            "--memory-slots", str(self.sc.memory_slots), "--threads", "1",
        ]  # fmt: skip
        if self.bootstrap:
            return argv + ["--bootstrap", self.bootstrap]
        return argv + ["--stages", str(self.sc.stages)]

    def start(self, node: str) -> _Proc:
        out = open(self.log_dir / f"{node}.{len(self.procs)}.log", "w", encoding="utf-8")  # noqa: SIM115
        self._logs.append(out)
        env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
        proc = subprocess.Popen(self.argv(node), stdout=subprocess.PIPE, stderr=out,
                                stdin=subprocess.DEVNULL, text=True, cwd=REPO, env=env,
                                start_new_session=True)
        entry = _Proc(node, proc, time.time())
        self.procs[node] = entry
        threading.Thread(target=self._read, args=(entry,), daemon=True).start()
        return entry

    def _read(self, entry: _Proc) -> None:
        assert entry.proc.stdout is not None
        for line in entry.proc.stdout:
            match = _LISTENING.search(line)
            if match and not entry.address:
                with self._ready:
                    entry.listening, entry.address = time.time(), match.group(1)
                    self._ready.notify_all()

    def wait_listening(self, nodes: list[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with self._ready:
            while not all(self.procs[n].address for n in nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nodes did not start; logs in {self.log_dir}")
                self._ready.wait(0.5)

    def crash(self, node: str) -> float:
        entry = self.procs[node]
        os.kill(entry.proc.pid, signal.SIGKILL)
        return time.time()

    def live_addresses(self) -> list[str]:
        return [p.address for p in self.procs.values() if p.address and p.proc.poll() is None]

    def stop(self) -> None:
        for entry in self.procs.values():
            if entry.proc.poll() is None:
                os.kill(entry.proc.pid, signal.SIGKILL)
        for entry in self.procs.values():
            entry.proc.wait()
        for out in self._logs:
            out.close()


def commits(log_dir: Path) -> list[tuple[float, int]]:
    """(wall time, microbatches) of each committed iteration, from whichever node logged it
    first (a successor coordinator logs the iterations it commits)."""
    first: dict[int, tuple[float, int]] = {}
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            match = COMMIT_LINE.match(line)
            if match:
                at, it, mbs = log_time(match.group(1)), int(match.group(2)), int(match.group(4))
                if it not in first or at < first[it][0]:
                    first[it] = (at, mbs)
    return sorted(first.values())


def run_real(sc: Scenario, log_dir: Path, swarm: Swarm | None = None,
             job: JobConfig | None = None) -> dict[str, Any]:
    """Run the trace on real processes (`swarm`: this scenario's `Swarm` by default; `job`: a
    tiny-gpt job by default): commits relative to the first, and the trace as it happened
    (crash at the SIGKILL, join when the new process listened)."""
    from gwtf.train import PRESETS

    swarm = swarm or Swarm(sc, log_dir)
    initial = list(sc.initial)
    applied: list[TraceEvent] = []
    try:
        swarm.start(initial[0])
        swarm.wait_listening(initial[:1])
        swarm.bootstrap = swarm.procs[initial[0]].address
        for node in initial[1:]:
            swarm.start(node)
        swarm.wait_listening(initial)
        job = job or dataclasses.replace(PRESETS["tiny-gpt"], name="fidelity", iterations=100000)
        deadline = time.monotonic() + 120
        job_id = submit_when_formed(swarm.bootstrap, job)
        started = time.time()
        log(f"submitted {job_id}; waiting for the first commit")
        while not commits(log_dir):
            if time.monotonic() > deadline + 60:
                raise RuntimeError(f"no commit; logs in {log_dir}")
            time.sleep(0.2)
        t0 = commits(log_dir)[0][0]
        log("first commit: replaying the trace")
        joined: list[tuple[TraceEvent, _Proc]] = []
        for event in sc.events:
            wait = t0 + event.time_s - time.time()
            if wait > 0:
                time.sleep(wait)
            if event.kind == "crash":
                at = swarm.crash(event.node)
                applied.append(dataclasses.replace(event, time_s=at - t0))
                log(f"SIGKILL {event.node} (pid {swarm.procs[event.node].proc.pid})")
            elif event.kind == "join":
                joined.append((event, swarm.start(event.node)))
                log(f"started {event.node}")
            else:
                raise ValueError(f"the fidelity trace has only crashes and joins, not {event}")
        time.sleep(max(0.0, t0 + sc.duration_s + TAIL_S - time.time()))
        for event, entry in joined:
            if not math.isnan(entry.listening):
                applied.append(dataclasses.replace(event, time_s=entry.listening - t0))
        startup = [e.listening - e.spawned for _, e in joined if not math.isnan(e.listening)]
    finally:
        swarm.stop()
    done = [(at - t0, mbs) for at, mbs in commits(log_dir)]
    return {"commits": done, "events": sorted(applied, key=lambda e: e.time_s),
            "startup": startup, "first_s": t0 - started}


# ---------------------------------------------------------------------------- the simulator


def run_sim(sc: Scenario, events: list[TraceEvent]) -> dict[str, Any]:
    """The `POLICY` on `sc` with `events` (times after the first commit, as the real run's),
    commits relative to its own first commit."""
    quiet = dataclasses.replace(sc, events=(), duration_s=60.0)
    first = simulation(quiet, POLICY).run().commit_times[0]
    shifted = tuple(dataclasses.replace(e, time_s=e.time_s + first) for e in events)
    full = dataclasses.replace(sc, events=shifted, duration_s=first + sc.duration_s + TAIL_S)
    result = simulation(full, POLICY).run()
    mbs = sc.microbatches_per_iteration
    return {"commits": [(t - first, mbs) for t in result.commit_times], "first_s": first,
            "restarts": result.restarts, "dropped": result.dropped_microbatches}


def committed_at(done: list[tuple[float, int]], t: float) -> float:
    """Microbatches committed by `t`, linear between commits (an iteration's microbatches are
    spread over the time it took), so that a window's figure does not jump by a whole
    iteration as a commit falls just inside or just outside it."""
    total, last = 0.0, 0.0
    for at, mbs in done:
        if at <= 0:
            continue
        if at >= t:
            return total + mbs * max(0.0, t - last) / (at - last)
        total, last = total + mbs, at
    return total


def windows(done: list[tuple[float, int]], span_s: float) -> list[float]:
    """Committed microbatches per second in each WINDOW_S window of [0, span_s)."""
    edges = [i * WINDOW_S for i in range(int(span_s // WINDOW_S) + 1)]
    return [(committed_at(done, b) - committed_at(done, a)) / (b - a)
            for a, b in zip(edges, edges[1:], strict=False)]


def save(real: dict[str, Any], path: Path) -> None:
    """The real run's figures as JSON, so that the simulator side can be redone from them."""
    data = {**real, "events": [dataclasses.asdict(e) for e in real["events"]]}
    path.write_text(json.dumps(data, indent=1))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data["events"] = [TraceEvent(**e) for e in data["events"]]
    data["commits"] = [tuple(c) for c in data["commits"]]
    return data


def measure(quick: bool, saved: Path | None = None) -> dict[str, Any]:
    sc = scenario()
    if quick:
        sc = dataclasses.replace(sc, duration_s=60.0,
                                 events=tuple(e for e in sc.events if e.time_s < 60.0))
    if saved is not None:
        real = load(saved)
        log_dir = saved.parent
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="gwtf-fidelity-"))
        log(f"real swarm: {len(sc.initial)} nodes, {len(sc.events)} events; logs in {log_dir}")
        real = run_real(sc, log_dir)
        save(real, log_dir / "real.json")
    sim = run_sim(sc, real["events"])
    return {"sc": sc, "real": real, "sim": sim, "log_dir": str(log_dir)}


def run(quick: bool = False, saved: Path | None = None) -> str:
    m = measure(quick, saved)
    sc: Scenario = m["sc"]
    span = sc.duration_s
    real_w = windows(m["real"]["commits"], span)
    sim_w = windows(m["sim"]["commits"], span)
    rows = []
    for i, (r, s) in enumerate(zip(real_w, sim_w, strict=True)):
        ratio = r / s if s else float("nan")
        rows.append(f"| {i * WINDOW_S:.0f}-{(i + 1) * WINDOW_S:.0f} s | {r:.3f} | {s:.3f} | "
                    f"{ratio:.2f} |")
    real_all = committed_at(m["real"]["commits"], span) / span
    sim_all = committed_at(m["sim"]["commits"], span) / span
    overall = real_all / sim_all if sim_all else float("nan")
    startup = m["real"]["startup"]
    events = ", ".join(f"{e.kind} {e.node} {e.time_s:.1f} s" for e in m["real"]["events"])
    quick_flag = " --quick" if quick else ""
    if saved is None:
        measured = (f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {machine()}"
                    f"{', quick mode' if quick else ''}. Command: `flock /tmp/gwtf-heavy.lock "
                    f".venv/bin/python -m benchmarks fidelity{quick_flag}`.")
    else:
        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved.stat().st_mtime))
        measured = (f"Real swarm measured {at} on {machine()} by `flock /tmp/gwtf-heavy.lock "
                    f".venv/bin/python -m benchmarks fidelity{quick_flag}` (its figures: "
                    f"`{saved.name}`); the simulator's side computed "
                    f"{time.strftime('%Y-%m-%d %H:%M')} from them by `.venv/bin/python -m "
                    f"benchmarks.fidelity{quick_flag} {saved}`.")
    body = f"""{SECTION}

{measured}

`simulations/fidelity.toml`: {len(sc.initial)} nodes, {sc.stages} stages, geo10 links, compute
{sc.compute_s_v100[0]:g} s per microbatch on a V100 over the GPU's speed (sleep-padded in the real
nodes), tiny-gpt, failure timeout {sc.detection_timeout_s:g} s. Trace as applied (seconds after
the first commit): {events}. Joiner start-up (spawn to listening):
{', '.join(f'{s:.1f}' for s in startup)} s.

| window | measured (microbatches/s) | predicted | measured / predicted |
|---|---|---|---|
{chr(10).join(rows)}
| **overall** | {real_all:.3f} | {sim_all:.3f} | **{overall:.2f}** |
"""
    write_section("fidelity", body)
    return body


if __name__ == "__main__":
    # `python -m benchmarks.fidelity [--quick] [REAL_JSON]`: REAL_JSON (a run's real.json)
    # redoes the simulator's side of that run without running the swarm again.
    paths = [Path(a) for a in sys.argv[1:] if a != "--quick"]
    print(run(quick="--quick" in sys.argv, saved=paths[0] if paths else None))
