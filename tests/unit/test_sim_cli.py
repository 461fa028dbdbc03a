"""`gwtf simulate` as a user runs it: outputs, the JSON summary, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf.cli import main
from gwtf.recovery import DEFAULT_REPLAY_BOUND, REPLAY_AUTO

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "gwtf" / "data" / "geo10_aws.csv"
FIELDS = (
    "throughput_mean", "iterations_completed", "time_to_train_s", "wasted_compute_s",
    "wasted_compute_fraction", "dropped_microbatches", "lost_microbatches",
    "control_messages", "events", "sim_wall_s",
)

SCENARIO = f"""
name = "cli"
seed = 1
duration_s = 300
[model]
stages = 2
params_per_stage = [3.0e8, 3.0e8]
tokens_per_microbatch = 4096
hidden_size = 1024
[training]
iterations = 3
microbatches_per_iteration = 16
memory_slots = 4
[network]
matrix = "{MATRIX}"
[nodes]
count = 4
locations = ["Oregon", "Ohio"]
[churn]
generator = "poisson"
join_rate_per_h = 30
session_mean_s = 600
"""


@pytest.fixture()
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "cli.toml"
    path.write_text(SCENARIO)
    return path


def test_json_summary_and_output_files(scenario_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gwtf", "simulate", str(scenario_file), "--policy",
         "gwtf,swarm,oracle", "--seed", "2", "--out", str(out), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    doc = json.loads(result.stdout)
    assert doc["scenario"] == "cli" and doc["seed"] == 2
    assert list(doc["policies"]) == ["gwtf", "swarm", "oracle"]
    for summary in doc["policies"].values():
        for field in FIELDS:
            assert field in summary
        assert summary["iterations_completed"] > 0 and summary["events"] > 0
    # Local routing (the default) sends no flow message: its records ride on the membership's
    # gossip; `routing = "relax"` counts the flow machines' (test_sim_localrouting).
    assert doc["policies"]["gwtf"]["control_messages"] == 0
    assert doc["policies"]["gwtf"]["lost_microbatches"] == 0
    assert json.loads((out / "summary.json").read_text()) == doc
    series = (out / "timeseries.csv").read_text().splitlines()
    assert series[0] == ("policy,time_s,throughput_mb_s,alive_nodes,active_nodes,"
                         "iterations_committed")
    assert len(series) > 10
    for png in ("throughput.png", "iterations.png", "nodes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_output(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(scenario_file), "--policy", "dtfm"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("cli: 300 s simulated, seed 1")
    assert "dtfm" in text and "mb/s" in text


def test_replay_bound_overrides_the_scenarios(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", str(scenario_file), "--policy", "oracle", "--json"]
    assert main([*argv, "--replay-bound", "2"]) == 0
    shipping = json.loads(capsys.readouterr().out)["policies"]["oracle"]["shipping"]
    assert shipping["replay_bound"] == 2 and shipping["shipments"] > 0
    assert main(argv) == 0  # the scenario says nothing: the default
    shipping = json.loads(capsys.readouterr().out)["policies"]["oracle"]["shipping"]
    assert DEFAULT_REPLAY_BOUND == REPLAY_AUTO and shipping["replay_bound"] == "auto"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent.toml"], "cannot read scenario"),
        (["{scenario}", "--policy", "petals"], "unknown policy 'petals'"),
        (["{scenario}", "--policy", ","], "--policy is empty"),
        (["{scenario}", "--seed", "-1"], "--seed must be >= 0"),
        (["{bad}"], "not valid TOML"),
        (["{scenario}", "--seed", "x"], "invalid int value"),
        (["{scenario}", "--replay-bound", "-1"], "--replay-bound must be >= 0"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    args: list[str], message: str,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    argv = [a.replace("{scenario}", str(scenario_file)).replace("{bad}", str(bad)) for a in args]
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
