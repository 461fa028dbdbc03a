"""Churn trace readers and the churn generator; the discrete-event engine's ordering."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gwtf.sim.engine import Engine, Kind
from gwtf.sim.traces import (
    TraceError,
    generate_churn,
    read_bamboo_trace,
    read_csv_trace,
    read_trace,
)

REPO = Path(__file__).resolve().parents[2]
SPOT = REPO / "simulations" / "traces" / "spot_p3_bamboo.csv"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_trace_reads_every_kind_sorted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "time_s,event,node,stage,location\n"
        "# a comment\n"
        "30,crash,a\n"
        "5,join,a,1,Tokyo\n"
        "\n"
        "10,join,b\n"
        "20,link,Oregon:Tokyo,150,0.2\n"
        "40,leave,b\n",
    )
    events = read_trace(path, "csv")
    assert [(e.time_s, e.kind, e.node) for e in events] == [
        (5.0, "join", "a"), (10.0, "join", "b"), (20.0, "link", "Oregon:Tokyo"),
        (30.0, "crash", "a"), (40.0, "leave", "b"),
    ]
    assert events[0].stage == 1 and events[0].location == "Tokyo"
    assert events[1].stage is None and events[1].location is None
    assert events[2].link_pair == ("Oregon", "Tokyo")
    assert events[2].rtt_ms == 150 and events[2].bandwidth_gbps == 0.2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("abc,join,a", "time_s must be a number"),
        ("-1,join,a", "time_s must be a number >= 0"),
        ("1,explode,a", "event must be one of join, leave, crash, link"),
        ("1,join", "expected time_s,event,node"),
        ("1,join,a,one", "stage must be an integer"),
        ("1,crash,a,1", "only a join row may give a stage"),
        ("1,link,Oregon,10,1", "a link row is time_s,link,LOC_A:LOC_B"),
        ("1,link,Oregon:Tokyo,10,0", "bandwidth_gbps must be a positive number"),
        ("1,join,a,1,Tokyo,0.1,extra", "at most 6 fields"),
        ("1,join,a,1,Tokyo,fast", "uplink_gbps must be"),
        ("1,crash,a,,,0.1", "only a join row may give"),
    ],
)
def test_csv_trace_rejects_a_malformed_row_naming_the_line(
    tmp_path: Path, row: str, message: str
) -> None:
    path = write(tmp_path, f"time_s,event,node\n0,join,z\n{row}\n")
    with pytest.raises(TraceError) as err:
        read_csv_trace(path)
    text = str(err.value)
    assert "line 3" in text and message in text and "t.csv" in text
    assert "\n" not in text


def test_csv_trace_rejects_impossible_churn(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="'a' crashes at 5 s but is not alive"):
        read_trace(write(tmp_path, "5,crash,a\n"), "csv")
    with pytest.raises(TraceError, match="joins at 2 s while already alive"):
        read_trace(write(tmp_path, "1,join,a\n2,join,a\n"), "csv")
    with pytest.raises(TraceError, match="unknown format"):
        read_trace(write(tmp_path, "1,join,a\n"), "json")


def test_bamboo_trace_of_the_real_p3_spot_instances() -> None:
    events = read_trace(SPOT, "bamboo")
    assert len(events) == 344
    assert {e.kind for e in events} == {"join", "crash"}
    assert len({e.node for e in events}) == 177
    alive = peak = 0
    for e in events:
        alive += 1 if e.kind == "join" else -1
        peak = max(peak, alive)
    assert peak == 32
    assert 11 * 3600 < events[-1].time_s < 11.5 * 3600


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("100,add", "expected 3 fields"),
        ("1e3,grow,node1", "event must be add or remove"),
        ("x,add,node1", "time_ms must be a number"),
        ("100,add,", "the node is empty"),
    ],
)
def test_bamboo_trace_rejects_a_malformed_row_naming_the_line(
    tmp_path: Path, row: str, message: str
) -> None:
    path = write(tmp_path, f"time_ms,event,node\n0,add,node1\n{row}\n", "b.csv")
    with pytest.raises(TraceError) as err:
        read_bamboo_trace(path)
    assert "line 3" in str(err.value) and message in str(err.value)


def test_unreadable_trace_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_csv_trace(tmp_path / "missing.csv")


def test_generated_churn_is_seeded_and_consistent() -> None:
    def make(seed: int) -> list[tuple[float, str, str]]:
        events = generate_churn(
            np.random.default_rng(seed), initial=["n0", "n1", "n2"], duration_s=7200,
            join_rate_per_h=30, session_mean_s=600, leave_fraction=0.25,
        )
        return [(e.time_s, e.kind, e.node) for e in events]

    first = make(3)
    assert first == make(3)
    assert first != make(4)
    assert [t for t, _, _ in first] == sorted(t for t, _, _ in first)
    alive = {"n0", "n1", "n2"}
    for _, kind, node in first:
        if kind == "join":
            assert node not in alive
            alive.add(node)
        else:
            assert node in alive
            alive.remove(node)
    kinds = {k for _, k, _ in first}
    assert kinds == {"join", "crash", "leave"}


def test_engine_orders_ties_by_kind_then_schedule_order() -> None:
    engine = Engine()
    seen: list[str] = []

    def handler(name: str) -> list[tuple[float, Kind, object, str]] | None:
        seen.append(name)
        if name == "spawn":
            return [(engine.now, Kind.CRASH, handler, "child")]
        return None

    engine.schedule(1.0, Kind.COMPUTE, handler, "compute-a")
    engine.schedule(1.0, Kind.CRASH, handler, "crash")
    engine.schedule(1.0, Kind.COMPUTE, handler, "compute-b")
    engine.schedule(0.5, Kind.SAMPLE, handler, "spawn")
    engine.schedule(2.0, Kind.LINK, handler, "late")
    engine.run(1.5)
    assert seen == ["spawn", "child", "crash", "compute-a", "compute-b"]
    assert engine.now == 1.5 and engine.events == 5 and engine.pending() == 1
