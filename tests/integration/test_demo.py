"""`gwtf demo --quick` end to end, as CI runs it: a swarm on the emulated geo10 WAN trains while
nodes are SIGKILLed and new ones join; the summary says nothing was lost and the result equals
the one-process reference, and the trained model is written beside the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_the_quick_demo_loses_nothing_and_equals_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "gwtf", "demo", "--quick", "--no-live", "--json",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=580, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["state"] == "completed"
    assert summary["iterations_completed"] == 20
    assert summary["crashes"] >= 1 and summary["joins"] >= 1
    assert summary["lost_microbatches"] == 0
    assert summary["dropped_microbatches"] == 0  # data holders are spared in the demo
    assert summary["equal_to_reference"] is True
    assert summary["loss"] == summary["reference_loss"]
    assert (out / "demo.png").stat().st_size > 10_000
    # The trained model is handed back, and it is the reference's model.
    from gwtf.train.checkpoints.checkpoint import load_model

    assert summary["model"] == str(out / "model.safetensors")
    saved = load_model(out)
    assert saved.checksum == summary["reference_checksum"] and saved.iteration == 20
    assert "Traceback" not in result.stderr
