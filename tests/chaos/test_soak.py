"""Soak: a local cluster trains under a generated churn trace and ends equal to the reference.

`gwtf launch --churn TRACE` starts 7 nodes in 3 stages and replays a trace generated here
(`soak_trace`, seeded) for `GWTF_SOAK_S` seconds (1800 in `make soak`): from 15 s on, about 100
SIGKILLs and as many joins per 30 minutes (scaled with the length), among them

- whole-stage wipes, several: every live node of stage 1 or 2 killed at the same moment, then a
  node joining that stage some seconds later (docs/design.md 4.6). Two wipes in three first grow
  the stage to three replicas, which are not thin, so its newest snapshot is a periodic one and
  the swarm rolls back to it (unless the wipe strikes in the very iteration of that snapshot,
  one time in three or four); the third is of a stage of two replicas, snapshotted after every
  step, which comes back with no rollback. Around a wipe the trace is quiet (no join for a while
  before, so that every participant holds the state the swarm rolls back to; no kill of the
  coordinator, which keeps the snapshots): the limits of 4.6, not what this test is after;
- kills of the job's coordinator (the smallest live data holder by id when the last one died:
  succession, 4.5) and of the other data holders;
- two kills at the same moment in two different stages.

Outside the wipes the trace never kills the last live node of a stage, nor `WATCHER`, the data
holder the test follows the job through (so the data holders go on). A tiny-gpt job long enough
to outlast the trace runs meanwhile; it must complete with the loss curve and the parameters of
`train_reference` over the microbatches it trained, bit for bit (the tolerance argument of
tests/chaos/test_recovery.py), every microbatch trained or reported dropped, the rollbacks on its
record, and the kills and joins the launcher reports having done at least the trace's targets.

`make soak` runs it for 30 minutes and more; `GWTF_SOAK_S=300` is a 6-minute version (figures:
benchmarks/RESULTS.md, section `soak`). `GWTF_SOAK_JOB` adds job keys as JSON, for instance
`{"replay_bound": 1}` to ship every running gradient sum to a stage peer (docs/design.md 4.9).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster import REPO, wait_for

from gwtf.client import GwtfClient, JobResult, StatusError, fetch_status, status_json
from gwtf.local.launch import plan_nodes
from gwtf.train import PRESETS, train_reference

NODES, STAGES = 7, 3
WATCHER = "s0n2"
"""A data holder the trace never kills: the test submits and follows the job through it."""
SOAK_S = float(os.environ.get("GWTF_SOAK_S", "1800"))
START_S = 15.0
KILLS_PER_S = JOINS_PER_S = 100 / 1800
"""The issue's at least 100 SIGKILLs and 100 joins in 30 minutes, scaled with the length."""
WIPE_EVERY_S = 200.0
WIPE_JOIN_S = 8.0
"""From a wipe to the join that refills the stage: past the failure timeout (3 s), so the job
has paused for the stage, as a volunteer would arrive."""
GROW_BEFORE_S, QUIET_AFTER_S = 35.0, 30.0
"""The quiet around a wipe: from the join of the stage's third replica (which has to enter the
job, and every participant to reach a periodic boundary after it, before the wipe) to the
refilled stage's return."""
NO_COORDINATOR_KILL_S = 60.0
"""No kill of the coordinator this long before a wipe: a new coordinator has no snapshot of the
other stages until their next ones reach it (docs/design.md 4.6, limits)."""
SETTLED_S = 12.0
"""A joiner younger than this may not have entered the job yet: the trace kills older nodes."""
JOB = {"name": "soak", "microbatch_size": 1, **json.loads(os.environ.get("GWTF_SOAK_JOB", "{}"))}
"""tiny-gpt's model and 8 microbatches an iteration, of one sequence each rather than 8: the
reference the result is checked against trains every iteration the swarm trained, one after
the other on one core (0.33 s of CPU an iteration with 8 sequences, 0.12 s with one), and the
swarm trains thousands in 30 minutes."""
ITERATIONS_PER_S = 6.0
"""At least the job's pace under this churn (measured, see docs/results/soak.md: 3.4 an iteration
a second on two busy cores, 5.2 on two quiet ones once snapshots streamed in the background):
the job has enough iterations to outlast the whole trace, and goes on to its end with no more
churn on a slower machine (`JOB_WAIT_S`)."""
SLOWEST_PER_S = 3.0
"""Below the slowest pace measured, for how long the client waits (`JOB_WAIT_S`)."""
ITERATIONS = max(240, math.ceil(ITERATIONS_PER_S * (START_S + SOAK_S) * 1.1))
JOB_WAIT_S = ITERATIONS / SLOWEST_PER_S + 600
"""The client waits for every iteration at the slowest pace, and ten minutes more."""
REFERENCE = """
import dataclasses, json, os, sys
import torch
from gwtf.train import PRESETS, train_reference
os.nice(19)
torch.set_num_threads(1)
job = dataclasses.replace(PRESETS["tiny-gpt"], **json.loads(sys.argv[1]))
ref = train_reference(job)
json.dump({"loss": ref.loss, "param_checksum": ref.param_checksum}, sys.stdout)
"""
"""The reference over every microbatch, in a process of its own at the lowest priority while
the swarm trains (it takes what CPU the swarm leaves): what the result is compared with when
the job dropped nothing."""


@dataclass(frozen=True)
class Row:
    t: float
    kind: str  # "crash" or "join"
    node: str
    stage: int
    why: str  # "wipe", "grow", "refill", "coordinator", "holder", "pair", "any", "join"


def soak_trace(
    rng: np.random.Generator, initial: dict[str, int], *, keep: str, start_s: float,
    duration_s: float, stages: int,
) -> list[Row]:
    """The churn of the module doc, in time order (rows at the same time happen together)."""
    end = start_s + duration_s
    wipes = max(3, round(duration_s / WIPE_EVERY_S))
    wipe_at = [start_s + (i + 0.5) * duration_s / wipes for i in range(wipes)]
    kills = math.ceil(KILLS_PER_S * duration_s)
    joins = math.ceil(JOINS_PER_S * duration_s)
    live = dict(initial)
    born = dict.fromkeys(initial, -math.inf)
    coordinator = min(n for n, s in initial.items() if s == 0)
    rows: list[Row] = []
    joined = 0

    def counts() -> list[int]:
        return [sum(1 for s in live.values() if s == k) for k in range(stages)]

    def kill(t: float, node: str, why: str) -> None:
        nonlocal coordinator
        rows.append(Row(t, "crash", node, live.pop(node), why))
        if node == coordinator:  # succession: the smallest holder that has entered the job
            coordinator = min(n for n, s in live.items() if s == 0 and born[n] + SETTLED_S < t)

    def join(t: float, stage: int, why: str) -> None:
        nonlocal joined
        node = f"j{joined}"
        joined += 1
        live[node], born[node] = stage, t
        rows.append(Row(t, "join", node, stage, why))

    def victims(t: float, stage: int | None = None) -> list[str]:
        # Only settled nodes count as the ones left: a joiner that has not entered the job yet
        # leaves the stage empty for it (a wipe nobody planned, seen in a run).
        settled = [s for n, s in live.items() if born[n] + SETTLED_S < t]
        return sorted(n for n, s in live.items() if n != keep and settled.count(s) > 1
                      and born[n] + SETTLED_S < t and stage in (None, s))

    def others(t: float, stage: int | None = None) -> list[str]:
        return [n for n in victims(t, stage) if n != coordinator]

    def kill_one(t: float, what: str, c: list[int]) -> bool:
        """Kill as `what` says at `t` if the rules allow it now; whether it did."""
        if what == "coordinator":
            near_wipe = any(0 <= w - t < NO_COORDINATOR_KILL_S for w in wipe_at)
            # A successor that is not the keeper, which would then coordinate for good.
            heirs = [n for n in others(t, 0) if n != keep]
            if coordinator == keep or near_wipe or not heirs:
                return False
            kill(t, coordinator, what)
        elif what == "pair":
            two = [k for k in range(stages) if others(t, k)]
            if len(two) < 2:
                return False
            for k in sorted(rng.choice(two, size=2, replace=False).tolist()):
                v = others(t, k)
                kill(t, v[int(rng.integers(len(v)))], what)
        else:
            v = others(t, 0 if what == "holder" else None)
            if not v:
                return False
            kill(t, v[int(rng.integers(len(v)))], what)
        return True

    quiet = [(w - GROW_BEFORE_S, w + QUIET_AFTER_S) for w in wipe_at]
    busy_s = duration_s - sum(min(b, end) - a for a, b in quiet)
    # The wipes' own kills and joins count towards the targets; the regular slots do the rest,
    # a little more often than needed so that a slot the rules leave empty costs nothing.
    regular = max(0, kills - 2 * wipes) + max(0, joins - 2 * wipes)
    gap = busy_s / (regular * 1.15 + 1)
    t = start_s
    wipe = 0
    cycle = ["coordinator", "any", "pair", "holder", "any", "pair", "any"]
    pending: list[str] = []  # kinds of kill due, oldest first, until the rules allow them
    slot = 0
    while t < end:
        if wipe < wipes and t >= wipe_at[wipe] - GROW_BEFORE_S:
            w = wipe_at[wipe]
            stage = 1 + (wipe // 2) % (stages - 1)
            while wipe % 3 != 1 and counts()[stage] < 3:  # not thin: it will roll back
                join(w - GROW_BEFORE_S, stage, "grow")
            for node in sorted(n for n, s in live.items() if s == stage):
                kill(w, node, "wipe")
            join(w + WIPE_JOIN_S, stage, "refill")
            t = w + QUIET_AFTER_S
            wipe += 1
            continue
        c = counts()
        # The keeper never dies, so stage 0 counts one short: joins go there too, so that
        # there are holders to kill and to take over from a killed coordinator.
        short = [n - (1 if k == 0 else 0) for k, n in enumerate(c)]
        if slot % 2 == 0 and len(live) > stages + 1:
            kind = cycle[(slot // 2) % len(cycle)]
            if kind not in pending:
                pending.append(kind)
            for what in [*pending, "any"]:
                if kill_one(t, what, c):
                    if what in pending:
                        pending.remove(what)
                    break
            else:
                join(t, short.index(min(short)), "join")
        else:
            join(t, short.index(min(short)), "join")
        slot += 1
        t += float(rng.uniform(0.7, 1.3)) * gap
    rows.sort(key=lambda r: r.t)
    return rows


def trace_csv(rows: list[Row]) -> str:
    return "time_s,event,node,stage\n" + "".join(
        f"{r.t:.2f},{r.kind},{r.node},{r.stage if r.kind == 'join' else ''}\n" for r in rows)


def initial_swarm() -> dict[str, int]:
    plans = plan_nodes(NODES, STAGES, locations=[], base_compute_s=0.1, seed=0)
    return {p.id: p.stage for p in plans}


@pytest.mark.parametrize("duration_s", [300.0, 1201.0, 1800.0])
def test_the_soak_trace_has_the_churn_it_promises(duration_s: float) -> None:
    initial = initial_swarm()
    rows = soak_trace(np.random.default_rng(7), initial, keep=WATCHER, start_s=START_S,
                      duration_s=duration_s, stages=STAGES)
    why = Counter(r.why for r in rows)
    crashes = [r for r in rows if r.kind == "crash"]
    assert len(crashes) >= KILLS_PER_S * duration_s
    assert len(rows) - len(crashes) >= JOINS_PER_S * duration_s
    assert why["coordinator"] >= 1 and why["holder"] >= 1 and why["refill"] >= 2, why
    assert why["grow"] >= 1, why
    pairs: dict[float, list[int]] = {}
    for r in crashes:
        if r.why == "pair":
            pairs.setdefault(r.t, []).append(r.stage)
    assert any(len(set(s)) == 2 for s in pairs.values()), pairs
    live = dict(initial)
    born = dict.fromkeys(initial, -math.inf)
    for t in sorted({r.t for r in rows}):
        for r in (r for r in rows if r.t == t):
            if r.kind == "crash":
                assert r.node != WATCHER and live.pop(r.node) == r.stage
            else:
                assert r.node not in live
                live[r.node], born[r.node] = r.stage, t
        settled = {s for n, s in live.items() if born[n] + SETTLED_S < t}
        empty = [k for k in range(STAGES) if k not in settled and any(
            r.t == t and r.kind == "crash" and r.stage == k for r in rows)]
        wiped = {r.stage for r in rows if r.t == t and r.why == "wipe"}
        assert not empty or (len(empty) == 1 and set(empty) == wiped), (t, empty)


class LaunchEvents:
    """The launcher's JSON lines (`gwtf launch --json`), read on a thread as they come."""

    def __init__(self, stdout: Any) -> None:
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stdout,), daemon=True)
        self._thread.start()

    def _read(self, stdout: Any) -> None:
        for line in stdout:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._lock:
                self.lines.append(item)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.lines)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


@pytest.mark.chaos
@pytest.mark.soak
@pytest.mark.timeout(int(JOB_WAIT_S + 900))
def test_a_cluster_under_churn_trains_exactly_what_the_reference_trains(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    initial = initial_swarm()
    assert initial.get(WATCHER) == 0
    rows = soak_trace(np.random.default_rng(7), initial, keep=WATCHER, start_s=START_S,
                      duration_s=SOAK_S, stages=STAGES)
    trace = tmp_path / "soak.csv"
    trace.write_text(trace_csv(rows))
    planned = Counter(r.why for r in rows)
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=ITERATIONS, **JOB)
    reference = subprocess.Popen(
        [sys.executable, "-c", REFERENCE, json.dumps({"iterations": ITERATIONS, **JOB})],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    request.addfinalizer(lambda: (reference.kill(), reference.wait()))
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", str(NODES), "--stages", str(STAGES),
         "--json", "--heartbeat-s", "0.25", "--failure-timeout-s", "3", "--log-dir",
         str(tmp_path / "logs"), "--churn", str(trace)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    began = time.monotonic()
    try:
        assert launch.stdout is not None
        nodes = {n["id"]: n for n in json.loads(launch.stdout.readline())["nodes"]}
        events = LaunchEvents(launch.stdout)
        address = nodes[WATCHER]["address"]

        def formed() -> bool:
            try:
                view = status_json(fetch_status(address, timeout_s=5.0, swarm=False))
            except StatusError:
                return False
            return sum(m["alive"] for m in view["members"]) == NODES

        wait_for(formed, 60, "the launched nodes to know each other", interval_s=0.5)
        client = GwtfClient(address)
        job_id = client.submit(job)

        def progress(result: JobResult) -> None:
            now = time.monotonic() - began
            if now - shown[0] >= 15 or result.over:
                shown[0] = now
                print(f"soak: {now:7.1f} s  iteration {result.iterations_completed}/"
                      f"{result.iterations}  crashes {result.crashes}  joins {result.joins}  "
                      f"restarts {result.restarts}  rollbacks {len(result.rollbacks)}"
                      + (f"  paused: {result.paused}" if result.paused else ""), flush=True)

        shown = [0.0]
        result = client.wait(job_id, on_progress=progress, timeout_s=JOB_WAIT_S)
        replayed = events.snapshot()
        ended_s = time.monotonic() - began
    finally:
        launch.terminate()
        launch.wait(timeout=60)
    events.join(10)
    done = Counter(e["event"] for e in replayed if "event" in e)
    joined = {e["node"] for e in replayed if e.get("event") == "join"}
    came_up = {e["node"] for e in replayed if e.get("event") == "listening"} & joined
    killed = {e["node"] for e in replayed if e.get("event") == "crash"}
    # What the replay did of each kind of the plan: a wipe or a pair counts once all its kills
    # were carried out.
    groups: dict[tuple[str, float], set[str]] = {}
    for r in rows:
        if r.kind == "crash":
            groups.setdefault((r.why, r.t), set()).add(r.node)
    did = Counter(why for (why, _), group in groups.items() if group <= killed)
    summary = {
        "soak_s": SOAK_S, "job_s": round(ended_s, 1), "iterations": result.iterations_completed,
        "kills": done["crash"], "joins": len(came_up), "skipped": done["skipped"],
        "wipes": did["wipe"], "pairs": did["pair"], "coordinator_kills": did["coordinator"],
        "holder_kills": did["holder"],
        "rollbacks": [dataclasses.asdict(r) for r in result.rollbacks],
        "job_crashes": result.crashes, "job_joins": result.joins, "restarts": result.restarts,
        "dropped": result.dropped_microbatches, "lost": result.lost_microbatches,
        "replayed": result.replayed_microbatches, "kept": result.kept_microbatches,
        "coordinator": result.coordinator,
        "iteration_s": round(float(np.mean(result.iteration_s)), 3) if result.iteration_s else 0,
        "state": result.state, "error": result.error,
    }
    print("soak:", json.dumps(summary), flush=True)
    assert result.state == "completed", result.error
    # The job outlasted the trace: every row was replayed before it completed.
    assert done["crash"] + done["join"] == len(rows), (done, len(rows))
    assert done["crash"] >= KILLS_PER_S * SOAK_S, done
    assert len(came_up) >= JOINS_PER_S * SOAK_S, (len(came_up), done)
    assert did["wipe"] == planned["refill"] and did["pair"] >= 1, did
    assert result.crashes >= KILLS_PER_S * SOAK_S / 2, result  # the churn hit the job
    assert result.lost_microbatches == 0 and result.checksum_mismatches == 0
    assert result.iterations_completed == ITERATIONS
    assert result.microbatches_trained == ITERATIONS * job.microbatches - sum(
        len(ids) for _, ids in result.dropped)
    assert result.dropped_microbatches == sum(len(ids) for _, ids in result.dropped)
    if result.dropped:  # not the microbatches the process in the background trained
        reference.kill()
        reference.wait()
        ref = train_reference(job, microbatch_ids=result.trained_ids(job.microbatches))
        loss, checksum = ref.loss, ref.param_checksum
    else:
        out, _ = reference.communicate(timeout=3600)
        assert reference.returncode == 0
        every = json.loads(out)
        loss, checksum = tuple(every["loss"]), every["param_checksum"]
    assert result.loss == loss
    assert result.param_checksum == checksum
    # Every wipe that grew its stage to three replicas first rolled back (unless it struck
    # right at a periodic boundary); every rollback names a wiped stage and why.
    assert result.rollbacks, summary
    wiped = {r.stage for r in rows if r.why == "wipe"}
    for back in result.rollbacks:
        assert back.stage in wiped and back.to_iteration < back.from_iteration, back
        assert f"stage {back.stage} lost every replica" in back.reason, back
    assert result.coordinator != min(n for n, s in initial.items() if s == 0)
    for log in (tmp_path / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log
