"""The stall watcher (gwtf.node.stalls): the share of the time a process ran, and what of a
compute item's wall time was a stall; and a real stop of the watching process seen whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from gwtf.flow.pace import Pace, PaceConfig
from gwtf.node.stalls import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_availability_and_the_stalls_inside_an_item() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    clock.now += 10.0
    assert watch.availability(5.0) == 1.0
    for k in range(10):  # 0.3 s stopped in every 0.4 s, for 4 s
        watch.stalled(clock.now + 0.4 * k + 0.3, 0.3)
    clock.now += 4.0
    assert watch.availability(4.0) == pytest.approx(0.25)
    assert watch.availability(8.0) == pytest.approx(1 - 3.0 / 8.0)
    # An item from 0.1 s into the first cycle to 0.05 s into the third: the stalls it overlaps,
    # the first and the third only in part.
    start = clock.now - 4.0 + 0.1
    assert watch.stalled_between(start, start + 0.75) == pytest.approx(0.2 + 0.3 + 0.05)
    assert watch.stalled_between(clock.now, clock.now + 1.0) == 0.0


def test_a_pace_counts_the_time_its_process_did_not_run() -> None:
    pace = Pace(0.08, Clock(), PaceConfig(persist_s=0.0))
    for _ in range(9):
        pace.observe("forward", 0.08 / 3)
        pace.observe("backward", 0.16 / 3)
    assert pace.estimate() == pytest.approx(0.08) and pace.due() is None
    pace.set_availability(0.25)  # items at full speed, the process stopped 3/4 of the time
    assert pace.estimate() == pytest.approx(0.32) and pace.due() == pytest.approx(0.32)
    pace.set_availability(0.0)
    assert pace.estimate() == pytest.approx(0.08 / 0.05)  # bounded


CHILD = """
import sys, time
from gwtf.node.stalls import StallWatch
watch = StallWatch()
watch.start()
print("ready", flush=True)
sys.stdin.readline()  # the parent stops this process for a while, then continues it
time.sleep(0.2)
print(f"{watch.availability(60.0):.3f} {watch.stalled_between(0.0, time.monotonic()):.3f}",
      flush=True)
"""


def test_a_process_stopped_from_outside_sees_the_stop_whole() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGSTOP)
        subprocess.run(["sleep", "0.6"], check=True)
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        availability, stalled = map(float, child.stdout.readline().split())
        assert 0.5 <= stalled < 1.5, stalled
        assert availability < 1.0
    finally:
        child.kill()
        child.wait(10)
