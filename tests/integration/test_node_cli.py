"""`gwtf node`, `gwtf status` and `gwtf launch` as a user runs them: real processes.

Bad input ends in one clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import REPO, LocalSwarm, wait_for

pytestmark = pytest.mark.integration

TIMEOUT_S = 60


def gwtf(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gwtf", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def first_line(proc: subprocess.Popen[str]) -> list[str]:
    """The first line the process prints, as a one-item list (empty if none within TIMEOUT_S:
    a reader thread, so that a process that prints nothing cannot hang the test)."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)  # fmt: skip
    reader.start()
    reader.join(TIMEOUT_S)
    return line


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def first_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("cli")) as swarm:
        swarm.start([("only", 0, 0.1)], num_stages=2)
        yield swarm


def test_unreachable_bootstrap() -> None:
    # A bound socket that does not listen: connections to it are refused, and no one else can
    # take the port meanwhile.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        port = hole.getsockname()[1]
        result = gwtf("node", "--stage", "0", "--compute-s", "0.1",
                      "--bootstrap", f"127.0.0.1:{port}", "--bootstrap-wait-s", "0")
    one_line_error(result, 1, "cannot reach the bootstrap", f"127.0.0.1:{port}")


def test_a_joiner_started_before_its_bootstrap_node_waits_for_it() -> None:
    """It failed at once and never tried again: nodes started together by a script raced."""
    node = [sys.executable, "-m", "gwtf", "node", "--no-train", "--compute-s", "0.1"]
    with socket.socket() as hole:  # the bootstrap node's port, taken until it starts
        hole.bind(("127.0.0.1", 0))
        port = hole.getsockname()[1]
        joiner = subprocess.Popen([*node, "--id", "late", "--stage", "1", "--bootstrap",
                                   f"127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert joiner.stderr is not None
            said: list[str] = []
            reader = threading.Thread(target=lambda: said.append(joiner.stderr.readline()),  # type: ignore[union-attr]
                                      daemon=True)  # fmt: skip
            reader.start()
            reader.join(TIMEOUT_S)
            assert said and "bootstrap node(s) not answering yet" in said[0], said
        except BaseException:
            joiner.kill()
            raise
    first = subprocess.Popen([*node, "--id", "first", "--stage", "0", "--stages", "2", "--port",
                              str(port)], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert first_line(first) and first_line(joiner)[0].startswith(
            "gwtf node late listening on"
        )
    finally:
        for proc in (joiner, first):
            proc.send_signal(signal.SIGTERM)
        for proc in (joiner, first):
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_status_watch_into_a_pipe_writes_lines(first_node: LocalSwarm) -> None:
    """Into a pipe or a file the live screen showed nothing: it writes its events as lines."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "status", "--to", first_node.bootstrap, "--watch",
         "--interval", "0.2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    view = first_node.status("only")
    assert view is not None
    try:
        line = first_line(watch)
        assert line and line[0].endswith(f"watching swarm {view['swarm']['id']} via only\n"), line
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            _, err = watch.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            watch.kill()  # it ignored the Ctrl-C: do not leave it running after the test
            watch.communicate()
            raise
    assert watch.returncode == 0 and "Traceback" not in err, err


def test_stage_outside_the_swarm(first_node: LocalSwarm) -> None:
    result = gwtf("node", "--stage", "5", "--compute-s", "0.1", "--bootstrap",
                  first_node.bootstrap)
    one_line_error(result, 2, "stage 5 is outside", "0..1")


def test_malformed_matrix_file(tmp_path: Path) -> None:
    bad = tmp_path / "links.csv"
    bad.write_text("src,dst,rtt_ms,bandwidth_gbps\nOregon,Tokyo,fast,1\n")
    result = gwtf("node", "--stage", "0", "--stages", "2", "--compute-s", "0.1",
                  "--location", "Oregon", "--link-matrix", str(bad))
    one_line_error(result, 2, "line 2", "rtt_ms")
    result = gwtf("node", "--stage", "0", "--stages", "2", "--compute-s", "0.1",
                  "--location", "Atlantis", "--link-matrix", "gwtf/data/geo10_aws.csv")
    one_line_error(result, 2, "Atlantis", "Oregon")


def test_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gwtf("node", "--stage", "0", "--stages", "2", "--compute-s", "0.1",
                      "--port", str(port))
    one_line_error(result, 1, f"cannot listen on 127.0.0.1:{port}", "--port")


def test_first_node_needs_the_number_of_stages() -> None:
    result = gwtf("node", "--stage", "0", "--compute-s", "0.1")
    one_line_error(result, 2, "--stages")


def test_status_of_an_address_where_nothing_runs() -> None:
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        port = hole.getsockname()[1]
        result = gwtf("status", "--to", f"127.0.0.1:{port}", "--timeout", "5")
    one_line_error(result, 1, "cannot reach")


def test_status_json_has_the_issue_shape(first_node: LocalSwarm) -> None:
    result = gwtf("status", "--to", first_node.bootstrap, "--json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert {"members", "arcs", "flow_value"} <= set(view)
    (member,) = view["members"]
    assert {"id", "address", "stage", "alive", "capacity"} <= set(member)
    assert member["id"] == "only" and member["alive"] and member["capacity"] == 10.0
    text = gwtf("status", "--to", first_node.bootstrap)
    assert text.returncode == 0 and "only" in text.stdout and "flow value" in text.stdout


def test_launch_starts_a_swarm_and_stops_every_process(tmp_path: Path) -> None:
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", "4", "--stages", "2", "--json",
         "--heartbeat-s", "0.25", "--failure-timeout-s", "3", "--log-dir", str(tmp_path),
         "--no-train"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = first_line(launch)
        assert line and line[0], "gwtf launch printed nothing"
        nodes = json.loads(line[0])["nodes"]
        assert [n["stage"] for n in nodes] == [0, 0, 1, 1]
        status = wait_for(
            lambda: (r := gwtf("status", "--to", nodes[0]["address"], "--json")).returncode == 0
            and (v := json.loads(r.stdout))["converged"]
            and len(v["arcs"]) == 4
            and v,
            TIMEOUT_S,
            "the launched swarm to converge",
            interval_s=0.5,
        )
        assert {m["id"] for m in status["members"]} == {n["id"] for n in nodes}
        assert status["flow_value"] > 0
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(timeout=TIMEOUT_S) == 0, launch.stderr.read()  # type: ignore[union-attr]
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    for node in nodes:
        assert not _running(node["pid"]), f"{node['id']} is still running"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def test_launch_replays_a_churn_trace(tmp_path: Path) -> None:
    trace = tmp_path / "churn.csv"
    trace.write_text(
        "time_s,event,node\n"
        "1.0,crash,s1n0\n"
        "1.5,join,late,1\n"
        "2.0,leave,s0n1\n"
    )
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", "4", "--stages", "2", "--json",
         "--heartbeat-s", "0.25", "--failure-timeout-s", "2", "--log-dir", str(tmp_path),
         "--churn", str(trace), "--time-scale", "2", "--no-train"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[dict] = []

    def read() -> None:
        for text in launch.stdout:  # type: ignore[union-attr]
            lines.append(json.loads(text))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: lines, TIMEOUT_S, "gwtf launch to print the nodes")
        nodes = {n["id"]: n for n in lines[0]["nodes"]}
        def churn() -> list[dict]:
            return [e for e in lines[1:] if e.get("event") in ("crash", "join", "leave")]

        events = wait_for(lambda: len(churn()) == 3 and churn(), TIMEOUT_S, "the churn events",
                          interval_s=0.2)  # fmt: skip
        assert [(e["event"], e["node"]) for e in events] == [
            ("crash", "s1n0"), ("join", "late"), ("leave", "s0n1"),
        ]
        # time_s scaled by 2: 2, 3 and 4 s after the swarm formed, never early, and in order;
        # late by the launcher's half-second tick and, on a loaded machine, by its scheduling
        # (bounded loosely: the order and "never early" are what the schedule promises).
        for event, due in zip(events, (2.0, 3.0, 4.0), strict=True):
            assert due <= event["t"] < due + 5.0, (event, due)
        assert [e["t"] for e in events] == sorted(e["t"] for e in events)
        late = wait_for(
            lambda: next((e for e in lines[1:] if e == {**e, "event": "listening", "node": "late"}),
                         None),
            TIMEOUT_S,
            "the joiner to listen",
        )
        address = nodes["s0n0"]["address"]
        status = wait_for(
            lambda: (r := gwtf("status", "--to", address, "--json")).returncode == 0
            and (v := json.loads(r.stdout))["converged"]
            and {m["id"] for m in v["members"] if m["alive"]} == {"s0n0", "s1n1", "late"}
            and v,
            TIMEOUT_S,
            "the swarm to reconverge after the churn",
            interval_s=0.5,
        )
        assert any(a["dst"] == "late" and a["flow"] > 0 for a in status["arcs"]), status["arcs"]
        assert late["address"]
        assert not _running(nodes["s1n0"]["pid"])
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(timeout=TIMEOUT_S) == 0, launch.stderr.read()  # type: ignore[union-attr]
        reader.join(10)
        assert lines[-1] == {"churn": {"join": 1, "crash": 1, "leave": 1, "trace_events": 3,
                                       "replayed_all": True}}
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


def test_launch_refuses_a_trace_it_cannot_replay(tmp_path: Path) -> None:
    trace = tmp_path / "churn.csv"
    trace.write_text("time_s,event,node\n1.0,crash,nobody\n")
    result = gwtf("launch", "--nodes", "2", "--stages", "2", "--churn", str(trace))
    one_line_error(result, 2, "nobody", "not alive")


def test_advertised_address_is_what_peers_dial(tmp_path: Path) -> None:
    # A node behind NAT or on a wildcard address tells peers where to reach it. Here: listen on
    # 127.0.0.1 but advertise the name `localhost`; a joiner dials that name and both see a swarm
    # of two at the advertised addresses.
    with LocalSwarm(tmp_path) as swarm:
        first = swarm.spawn("a", 0, 0.1, "--stages", "2", "--advertise", "localhost")
        swarm.wait_listening(first)
        assert first.address.startswith("localhost:"), first.address
        swarm.bootstrap = first.address
        second = swarm.join("b", 1, 0.1, "--advertise", "localhost")
        assert second.address.startswith("localhost:"), second.address

        def both_alive() -> dict[str, str] | None:
            view = swarm.status("b")
            members = {m["id"]: m["address"] for m in (view or {}).get("members", [])
                       if m["alive"]}  # fmt: skip
            return members if len(members) == 2 else None

        members = wait_for(both_alive, 30, "two members at advertised addresses")
        assert members == {"a": first.address, "b": second.address}


def test_advertise_must_be_a_bare_host() -> None:
    for bad in ("host:7000", "a b", ""):
        result = gwtf("node", "--stage", "0", "--stages", "2", "--advertise", bad)
        one_line_error(result, 2, "--advertise")


def test_a_node_runs_on_plain_asyncio_where_uvloop_is_missing(tmp_path: Path) -> None:
    # As on Windows, where uvloop does not exist: the import fails, the node serves all the same
    # and a SIGTERM still makes it leave cleanly.
    code = ("import sys; sys.modules['uvloop'] = None; from gwtf.cli import main; "
            "sys.exit(main(sys.argv[1:]))")  # fmt: skip
    node = subprocess.Popen(
        [sys.executable, "-c", code, "node", "--stage", "0", "--stages", "2", "--port", "0",
         "--compute-s", "0.1", "--no-train"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = first_line(node)
        assert lines and "listening on" in lines[0], (lines, node.poll())
        address = lines[0].split("listening on ")[1].split()[0]
        status = gwtf("status", "--to", address, "--json")
        assert status.returncode == 0, status.stderr
        assert len(json.loads(status.stdout)["members"]) == 1
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=TIMEOUT_S) == 0, node.stderr.read()  # type: ignore[union-attr]
        assert "uvloop" not in node.stderr.read()  # type: ignore[union-attr]
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


def test_launch_passes_the_observability_flags_to_its_nodes(tmp_path: Path) -> None:
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", "2", "--stages", "2", "--json",
         "--no-train", "--log-dir", str(tmp_path), "--metrics-port", "0", "--log-json",
         "--log-level", "debug"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = first_line(launch)
        assert line and line[0], "gwtf launch printed nothing"
        nodes = json.loads(line[0])["nodes"]
        for node in nodes:
            text = urllib.request.urlopen(node["metrics"], timeout=10).read()
            assert f'node="{node["id"]}"'.encode() in text
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(timeout=TIMEOUT_S) == 0, launch.stderr.read()  # type: ignore[union-attr]
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    for node in nodes:
        records = [json.loads(x) for x in (tmp_path / f"{node['id']}.log").read_text().splitlines()
                   if x.startswith("{")]  # fmt: skip
        # The node's own records name it; at debug level, grpc's own debug records are there too.
        assert {r["node"] for r in records if "node" in r} == {node["id"]}
        assert any(r["level"] == "debug" for r in records), node["id"]


def test_a_node_takes_its_settings_from_a_config_file_and_the_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\nid = "from-file"\nstage = 1\nstages = 3\nport = 0\n'
                      'compute_s = 0.1\nno-train = true\nlog-level = "warning"\n')  # fmt: skip
    node = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "node", "--config", str(config), "--stage", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = first_line(node)
        assert lines and "listening on" in lines[0], (lines, node.poll())
        # The file's id and stage count; the command line's stage (0, not the file's 1).
        assert lines[0].startswith("gwtf node from-file listening on"), lines[0]
        assert "(stage 0 of 3," in lines[0], lines[0]
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=TIMEOUT_S) == 0
        # log-level warning from the file: nothing at info level was logged.
        assert " INFO " not in node.stderr.read()  # type: ignore[union-attr]
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    bad = tmp_path / "bad.toml"
    bad.write_text("stage = 0\nstagez = 3\n")
    one_line_error(gwtf("node", "--config", str(bad)), 2, str(bad), "'stagez'",
                   "not a setting")  # fmt: skip
    bad.write_text("stage = [0\n")
    one_line_error(gwtf("node", "--config", str(bad)), 2, "not valid TOML")
    one_line_error(gwtf("node", "--config", str(tmp_path / "none.toml")), 2, "cannot read")
