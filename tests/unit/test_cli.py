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


def test_demo_refuses_a_swarm_too_small_to_lose_a_node() -> None:
    result = run_gwtf("demo", "--nodes", "3", "--stages", "3")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "give --nodes >= 2 x --stages" in lines[0], result.stderr


def one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]


def test_submit_mistakes_are_one_line(tmp_path: Path) -> None:
    one_line(run_gwtf("submit"), 2, "error:")
    one_line(run_gwtf("submit", "--to", "nohost", "--job", "tiny-gpt"), 2, "HOST:PORT")
    # The job is read and checked before any node is asked (port 9 is never a gwtf node).
    one_line(run_gwtf("submit", "--to", "127.0.0.1:9", "--job", str(tmp_path / "no.toml")), 2,
             "does not exist")
    bad = tmp_path / "bad.toml"
    bad.write_text("iterations = 3\nmicrobatches = 2\nmicrobatch_size = 1\n"
                   "[model]\nkind = 'gpt'\nlayers = 2\nwidth = 30\nheads = 4\nseq_len = 8\n")
    one_line(run_gwtf("submit", "--to", "127.0.0.1:9", "--job", str(bad)), 2,
             "model.heads (4) must divide model.width (30)")
    bad.write_text("iterations = [\n")
    one_line(run_gwtf("submit", "--to", "127.0.0.1:9", "--job", str(bad)), 2, "not valid TOML")
    one_line(run_gwtf("submit", "--to", "127.0.0.1:9", "--job", "tiny-gpt", "--aggregation",
                      "median"), 2, "aggregation must be one of mean, trimmed-mean, centered-clip")
    one_line(run_gwtf("submit", "--to", "127.0.0.1:9", "--job", "tiny-gpt"), 1, "cannot reach")


def test_node_status_launch_show_their_flags() -> None:
    expected = {
        "node": ("--port", "--host", "--stage", "--bootstrap", "--id", "--location",
                 "--link-matrix", "--compute-s", "--heartbeat-s", "--failure-timeout-s",
                 "--stages"),
        "status": ("--to", "--json"),
        "launch": ("--nodes", "--stages", "--base-port", "--link-matrix", "--json"),
        "submit": ("--to", "--job", "--wait", "--json", "--iterations", "--aggregation"),
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

    assert main(["demo", "--nodes", "2", "--stages", "2"]) == 2
    assert main(["simulate"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["status", "--help"]) == 0


def test_the_deployment_example_config_is_what_gwtf_node_accepts() -> None:
    # docs/deploy: the example node.toml, and the systemd unit and Dockerfile that start a node
    # with it, say what `gwtf node` really takes.
    from gwtf.cli import _subcommand, build_parser
    from gwtf.node.cli import with_config

    deploy = REPO / "docs" / "deploy"
    parser = build_parser()
    argv = with_config(["--config", str(deploy / "node.toml")], _subcommand(parser, "node"))
    args = parser.parse_args(["node", *argv])
    assert (args.stage, args.host, args.port, args.metrics_port) == (1, "0.0.0.0", 7000, 9100)
    assert args.bootstrap == ["seed1.example.org:7000", "seed2.example.org:7000"]
    assert args.log_json and args.token_file == "/etc/gwtf/token" and args.id == "node7"
    assert "gwtf node --config /etc/gwtf/node.toml" in (deploy / "gwtf-node.service").read_text()
    dockerfile = (deploy / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gwtf", "node"]' in dockerfile and "/etc/gwtf/node.toml" in dockerfile


def test_node_stage_is_auto_unless_pinned() -> None:
    from gwtf.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["node"]).stage is None  # auto: the node chooses (design 2.11)
    assert parser.parse_args(["node", "--stage", "auto"]).stage is None
    assert parser.parse_args(["node", "--stage", "2"]).stage == 2
    result = run_gwtf("node", "--help")
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())
    assert "--stage K|auto" in words and "default auto" in words, words


def test_node_moves_are_on_for_auto_nodes_unless_turned_off(tmp_path: Path) -> None:
    from gwtf.cli import _subcommand, build_parser
    from gwtf.node.cli import with_config

    parser = build_parser()
    assert not parser.parse_args(["node"]).no_moves  # default: an auto node may be moved
    assert parser.parse_args(["node", "--no-moves"]).no_moves
    config = tmp_path / "node.toml"  # a config file says it as the flag does
    config.write_text("no-moves = true\n")
    argv = with_config(["--config", str(config)], _subcommand(parser, "node"))
    assert parser.parse_args(["node", *argv]).no_moves


def test_node_uplink_is_declared_in_mbit_and_bad_values_are_usage_errors() -> None:
    from gwtf.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["node"]).uplink_mbps is None
    assert parser.parse_args(["node", "--uplink-mbps", "40"]).uplink_mbps == 40.0
    for bad in ("0", "-5", "fast"):
        result = run_gwtf("node", "--uplink-mbps", bad)
        assert result.returncode == 2 and "--uplink-mbps" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
