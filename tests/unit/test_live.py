"""The live view: successive swarm views become events (deaths, joins, reconvergence) and a
screen that shows members per stage and the flows."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rich.console import Console

from gwtf.live import SwarmWatch, watch


def member(node: str, stage: int, *, alive: bool = True, state: str = "alive",
           epoch: int = 1) -> dict[str, Any]:  # fmt: skip
    return {"id": node, "stage": stage, "alive": alive, "state": state, "epoch": epoch,
            "capacity": 10.0, "address": "127.0.0.1:1", "location": ""}  # fmt: skip


def view(members: list[dict[str, Any]], *, converged: bool, flow: float) -> dict[str, Any]:
    live = [m["id"] for m in members if m["alive"]]
    arcs = [{"src": a, "dst": b, "flow": flow / 2, "rtt_ms": 1.0, "bandwidth_gbps": 10.0}
            for a in live if a.startswith("a") for b in live if b.startswith("b")]  # fmt: skip
    return {
        "node": "a0", "swarm": {"id": "sw", "num_stages": 2}, "members": members,
        "arcs": arcs, "flow_value": flow, "converged": converged,
        "nodes": [{"id": m, "throughput": flow / 2} for m in live],
    }  # fmt: skip


def test_events_follow_the_swarm() -> None:
    clock = iter(range(100)).__next__
    watch = SwarmWatch(clock=lambda: float(clock()))
    a0, b0, b1 = member("a0", 0), member("b0", 1), member("b1", 1)
    assert "watching swarm sw" in watch.update(view([a0, b0, b1], converged=True, flow=10))[0]
    dead = member("b1", 1, alive=False, state="dead")
    assert [e.split("s  ")[1] for e in watch.update(view([a0, b0, dead], converged=False,
                                                          flow=5))] == [  # fmt: skip
        "b1 died (declared dead)", "flows rerouting",
    ]
    back = member("b1", 1, epoch=2)
    events = watch.update(view([a0, b0, back], converged=True, flow=10))
    assert [e.split("s  ")[1] for e in events] == [
        "b1 joined stage 1", "flows reconverged: 10.000 mb/s",
    ]
    gone = member("b0", 1, alive=False, state="left")
    assert watch.update(view([a0, gone, back], converged=True, flow=10))[0].endswith("b0 left")


def test_the_screen_shows_stages_flows_and_events() -> None:
    watch = SwarmWatch(clock=lambda: 0.0)
    watch.update(view([member("a0", 0), member("b0", 1)], converged=True, flow=4))
    watch.update(view([member("a0", 0), member("b0", 1, alive=False, state="dead")],
                      converged=False, flow=0))  # fmt: skip
    watch.failed("cannot reach 127.0.0.1:1")
    console = Console(record=True, width=120)
    console.print(watch.render())
    text = console.export_text()
    assert "members per stage" in text and "empty" in text  # stage 1 has nobody left
    assert "b0 died" in text and "rerouting" in text
    assert "cannot reach 127.0.0.1:1" in text


def test_a_ctrl_c_that_a_fetch_swallows_still_ends_the_watch() -> None:
    """`asyncio.run` turns Ctrl-C into cancelling the fetch's task; a call that ends anyway (its
    channel closing, or grpc answering CANCELLED) lost it, and the watch ran on."""
    calls = 0
    before = signal.getsignal(signal.SIGINT)  # ignored in a pytest-xdist worker

    def fetch() -> dict[str, object]:
        nonlocal calls
        calls += 1
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here
        except KeyboardInterrupt:
            pass  # swallowed inside the call
        raise RuntimeError("the node answered with an error: CANCELLED")

    assert watch(fetch, 0.01, errors=(RuntimeError,)) == 0
    assert calls == 1
    assert signal.getsignal(signal.SIGINT) == before  # put back
