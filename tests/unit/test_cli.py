"""The `gwtf` command as a user runs it: a real process, bounded in time."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60


def run_gwtf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gwtf", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_help_lists_every_command() -> None:
    result = run_gwtf("--help")
    assert result.returncode == 0, result.stderr
    for command in ("route", "node", "submit", "status", "launch", "simulate", "reference", "demo"):
        assert command in result.stdout


def test_version() -> None:
    result = run_gwtf("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "gwtf 0.1.0"


def test_route_help_shows_its_arguments() -> None:
    result = run_gwtf("route", "--help")
    assert result.returncode == 0, result.stderr
    for word in ("TOPOLOGY", "--oracle", "--seed", "--json"):
        assert word in result.stdout


def test_demo_exits_zero_and_points_to_route() -> None:
    result = run_gwtf("demo")
    assert result.returncode == 0, result.stderr
    assert "not available yet" in result.stdout
    assert "gwtf route" in result.stdout


def test_unavailable_command_is_one_line_exit_2() -> None:
    result = run_gwtf("submit")
    assert result.returncode == 2
    assert result.stderr.strip() == "gwtf submit: not available yet in this version"
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_node_status_launch_show_their_flags() -> None:
    expected = {
        "node": ("--port", "--host", "--stage", "--bootstrap", "--id", "--location",
                 "--link-matrix", "--compute-s", "--heartbeat-s", "--failure-timeout-s",
                 "--stages"),
        "status": ("--to", "--json"),
        "launch": ("--nodes", "--stages", "--base-port", "--link-matrix", "--json"),
    }
    for command, flags in expected.items():
        result = run_gwtf(command, "--help")
        assert result.returncode == 0, result.stderr
        for flag in flags:
            assert flag in result.stdout, (command, flag)


def test_node_usage_errors_are_one_line() -> None:
    for args in (("node",), ("node", "--stage", "-1"), ("node", "--stage", "0", "--port", "x"),
                 ("node", "--stage", "0", "--bootstrap", "nohost"),
                 ("node", "--stage", "0", "--compute-s", "0"),
                 ("status",), ("launch", "--nodes", "0", "--stages", "2")):
        result = run_gwtf(*args)
        assert result.returncode == 2, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0], (args, result.stderr)


def test_usage_error_is_one_line_exit_2() -> None:
    result = run_gwtf("route")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gwtf route: error:")
    assert "Traceback" not in result.stderr


def test_main_returns_exit_codes_in_process() -> None:
    from gwtf.cli import main

    assert main(["demo"]) == 0
    assert main(["simulate"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["status", "--help"]) == 0
