"""A node that slows down mid-job loses its share of the work, and gets it back when it recovers
(docs/design.md 2.13), with real node processes.

Six nodes, two per stage, 0.05 s of emulated compute per microbatch, a 24-microbatch tiny-gpt
job. Each relay of stage 1 in turn becomes four times slower for six iterations: r0 by the
`slow:compute` fault (the node is not told; its stage work takes four times longer), r1 from
outside, SIGSTOP and SIGCONT at a duty cycle of 0.3 s stopped and 0.1 s running (a machine busy
with something else, which does not know it). Each time its pace reaches its record (its compute
time up, its capacity down), the flow value moves with it, and its share of the iteration's
microbatches falls from about half to about a fifth; once it recovers, its share comes back. The job
ends bit for bit equal to the one-process reference throughout. How fast the swarm trains meanwhile
is the benchmark's (`python -m benchmarks stragglers`), not a test's.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import LocalSwarm

from gwtf.client import GwtfClient
from gwtf.train import PRESETS, train_reference

pytestmark = pytest.mark.chaos

COMPUTE_S = 0.05
MICROBATCHES = 24
ITERATIONS = 33
FAULT = (3, 9)
"""The iterations r0's fault makes it four times slower in (from, until)."""
STOPPED = (17, 23)
"""The iterations r1 is stopped and continued from outside in."""
WAIT_S = 300.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("stragglers")
    fault = f"slow:compute:factor=4:from={FAULT[0]}:until={FAULT[1]}"
    with LocalSwarm(logs, heartbeat_s=0.25, failure_timeout_s=3.0, train=True,
                    extra=("--emulate-compute",)) as s:
        s.start([("h0", 0, COMPUTE_S), ("h1", 0, COMPUTE_S)], 3, "--activation-bytes", "131072")
        s.wait_formed()
        s.join("r0", 1, COMPUTE_S, "--fault", fault)
        s.join("r1", 1, COMPUTE_S)
        s.join("l0", 2, COMPUTE_S)
        s.join("l1", 2, COMPUTE_S)
        s.wait_formed()
        yield s


class Watch:
    """What the test sees while the job runs: the job's routes after each iteration, and each
    relay's record and the flow value as a stage-0 node's status says."""

    def __init__(self, swarm: LocalSwarm, client: GwtfClient, job_id: str) -> None:
        self.routes: dict[int, dict[tuple[str, ...], int]] = {}
        self.records: list[tuple[int, dict[str, float], float]] = []
        """(iterations completed, compute_s of each member, the flow value)."""
        self._swarm, self._client, self._job_id = swarm, client, job_id

    def run(self, on_iteration: Any) -> Any:
        while True:
            progress = self._client.progress(self._job_id)
            done = progress.iterations_completed
            if done not in self.routes:
                self.routes[done] = {tuple(p): c for p, c in progress.routes}
                on_iteration(done)
            view = self._swarm.status("h0")
            if view is not None:
                paces = {m["id"]: m["compute_s"] for m in view["members"]}
                self.records.append((done, paces, view["flow_value"]))
            if progress.over:
                return progress
            time.sleep(0.1)

    def share(self, relay: str, first: int, last: int) -> float:
        """`relay`'s share of stage 1's microbatches in iterations [first, last), from the
        cumulative routes at the nearest snapshots."""
        lo = min(k for k in self.routes if k >= first)
        hi = max(k for k in self.routes if k <= last)
        assert hi > lo, (first, last, sorted(self.routes))
        diff = {p: c - self.routes[lo].get(p, 0) for p, c in self.routes[hi].items()}
        total = sum(diff.values())
        return sum(c for p, c in diff.items() if p[1] == relay) / total

    def paces(self, relay: str, first: int, last: int) -> list[float]:
        return [p[relay] for k, p, _ in self.records if first <= k < last]

    def flows(self, first: int, last: int) -> list[float]:
        return [f for k, _, f in self.records if first <= k < last]

    def stage_1(self, first: int, last: int) -> list[float]:
        """Stage 1's capacity as the records say (microbatches/s of r0 and r1)."""
        return [1 / p["r0"] + 1 / p["r1"] for k, p, _ in self.records if first <= k < last]


class DutyCycle:
    """SIGSTOP and SIGCONT to a process from outside: 0.3 s stopped in every 0.4 s."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._cycle, daemon=True)
        self._thread.start()

    def _cycle(self) -> None:
        try:
            while not self._stop.is_set():
                os.kill(self._pid, signal.SIGSTOP)
                self._stop.wait(0.3)
                os.kill(self._pid, signal.SIGCONT)
                self._stop.wait(0.1)
        finally:
            os.kill(self._pid, signal.SIGCONT)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def test_a_straggler_loses_its_share_and_gets_it_back(swarm: LocalSwarm) -> None:
    """r0 four times slower by its fault in iterations 3-8; r1 stopped and continued from
    outside in iterations 17-22: each time the straggler's share falls from about half to
    about a fifth, its record and the flow value move, and both come back after."""
    job = dataclasses.replace(PRESETS["tiny-gpt"], name="stragglers", iterations=ITERATIONS,
                              microbatches=MICROBATCHES)
    client = GwtfClient(swarm.procs["h0"].address)
    job_id = client.submit(job)
    watch = Watch(swarm, client, job_id)
    cycle = DutyCycle(swarm.procs["r1"].popen.pid)

    def on_iteration(done: int) -> None:
        if done == STOPPED[0]:
            cycle.start()
        elif done == STOPPED[1]:
            cycle.stop()

    try:
        watch.run(on_iteration)
    finally:
        cycle.stop()
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    assert result.lost_microbatches == 0 and result.dropped_microbatches == 0
    assert result.crashes == 0  # slow is not dead
    ref = train_reference(job)
    assert result.loss == ref.loss
    assert result.param_checksum == ref.param_checksum

    # Each straggler's windows: before, slowed (from two iterations in), recovered (from three
    # iterations after, until the other relay's slowdown or the job's end: a straggler gets a
    # fifth of the work, so the five samples that show its recovery take it an iteration).
    # r0's recovery has five iterations before r1's slowdown, r1's is its last four: a record
    # held back by a pace that flapped on a loaded machine (the hold doubles while it flaps,
    # docs/design.md 2.13) has time to come back (with two and three iterations, runs beside
    # another chaos test saw 0.33 for r0 and 0.06 for r1).
    for relay, (slow, until), back in (("r0", FAULT, (FAULT[1] + 3, STOPPED[0])),
                                       ("r1", STOPPED, (ITERATIONS - 4, ITERATIONS))):
        shares = (watch.share(relay, slow - 3, slow), watch.share(relay, slow + 2, until),
                  watch.share(relay, *back))
        # Before: the two relays alike (r1's before is r0's after, which its recovery may
        # still tilt towards r1).
        assert (0.3 < shares[0] < 0.7) if relay == "r0" else shares[0] > 0.35, (relay, shares)
        assert shares[1] < 0.32, (relay, shares)  # a quarter of the speed: a fifth of the work
        assert shares[2] > 0.35, (relay, shares)  # recovered: its share back
        declared = watch.paces(relay, 0, 1)[0]
        assert declared == pytest.approx(COMPUTE_S)
        slowed = max(watch.paces(relay, slow + 2, until))
        assert slowed > 2 * COMPUTE_S, watch.records
        # Recovered: back to its speed (on a loaded machine that is up to 1.5x the declared
        # 0.05 s for every node, and a record within the band of it stays).
        assert watch.paces(relay, *back)[-1] < min(0.5 * slowed, 2 * COMPUTE_S), (
            watch.records)
        # The flow value follows the straggler down; stage 1's capacity in the records comes
        # back up with it (the flow value is every stage's: on this loaded machine another
        # node's pace may move it meanwhile).
        low = min(watch.flows(slow + 2, until))
        assert low < 0.8 * watch.flows(0, 1)[0], watch.records
        assert watch.stage_1(*back)[-1] > 1.25 * min(
            watch.stage_1(slow + 2, until)), watch.records
