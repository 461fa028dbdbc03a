"""A node started by a launcher dies with it (PR_SET_PDEATHSIG, asked for by the node itself):
real processes, the launcher SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# The launcher starts a "node" that asks to die with it, prints the node's pid, and waits.
LAUNCHER = """
import subprocess, sys, time
from gwtf.local.launch import child_env
node = subprocess.Popen(
    [sys.executable, "-c",
     "import time; from gwtf.local.launch import die_with_launcher; die_with_launcher(); "
     "print('ready', flush=True); time.sleep(60)"],
    env=child_env(), stdout=subprocess.PIPE, text=True,
)
assert node.stdout.readline().strip() == "ready"
print(node.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (its parent, the launcher, is gone; init reaps it soon, and may do
    # so between the two looks).
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_node_dies_when_its_launcher_is_killed() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        assert launcher.stdout is not None
        node = int(launcher.stdout.readline())
        assert alive(node)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(node) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(node)
    finally:
        launcher.kill()


def test_a_node_whose_launcher_is_already_gone_stops() -> None:
    # The environment names a launcher that is not the node's parent (it died before the node
    # could ask): the node stops at once instead of living on unowned.
    env = {**os.environ, "GWTF_LAUNCHER_PID": "1"}
    node = subprocess.run(
        [sys.executable, "-c", "import time; from gwtf.local.launch import die_with_launcher; "
         "die_with_launcher(); time.sleep(30)"],
        env=env, timeout=20, check=False,
    )  # fmt: skip
    assert node.returncode == -signal.SIGTERM
