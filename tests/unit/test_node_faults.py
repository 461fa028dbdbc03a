"""The fault hook's spec (gwtf.node.faults) and `gwtf node --fault` with a bad one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gwtf.node.faults import Fault, FaultError, parse_fault

REPO = Path(__file__).resolve().parents[2]


def test_a_spec_names_a_point_and_optionally_where() -> None:
    assert parse_fault("crash-in:forward:iteration=2:microbatch=3") == Fault("forward", 2, 3)
    assert parse_fault("crash-in:aggregation:iteration=1") == Fault("aggregation", 1, None)
    assert parse_fault(" crash-in:state-transfer ") == Fault("state-transfer")
    fault = parse_fault("crash-in:after-backward:microbatch=5")
    assert fault.matches("after-backward", 7, 5)
    assert not fault.matches("after-backward", 7, 4)
    assert not fault.matches("backward", 7, 5)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("forward", "crash-in:POINT"),
        ("crash-in:sideways", "is not one of"),
        ("crash-in:forward:iteration=x", "not a whole number"),
        ("crash-in:forward:iteration=-1", "must not be negative"),
        ("crash-in:forward:stage=1", "is not iteration=K or microbatch=M"),
        ("crash-in:forward:iteration=1:iteration=2", "is not iteration=K"),
    ],
)
def test_a_bad_spec_is_one_sentence(spec: str, words: str) -> None:
    with pytest.raises(FaultError, match=words) as err:
        parse_fault(spec)
    assert "\n" not in str(err.value)


def test_a_node_with_a_bad_fault_says_so_in_one_line_and_exits_2() -> None:
    env = dict(os.environ, GWTF_FAULT="crash-in:nowhere")
    result = subprocess.run(
        [sys.executable, "-m", "gwtf", "node", "--stage", "0", "--stages", "2", "--no-train"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gwtf node: fault point 'nowhere' is not one of forward, backward, after-backward, "
        "aggregation, state-transfer"
    ]
