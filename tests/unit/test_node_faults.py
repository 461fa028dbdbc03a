"""The fault hook's spec (gwtf.node.faults) and `gwtf node --fault` with a bad one."""

import math
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


def test_a_poison_spec_says_what_from_when_and_how_much() -> None:
    grads = parse_fault("poison:gradients")
    assert grads == Fault("", poison="gradients", scale=1e4, start=0)
    assert grads.gradient_scale(0) == 1e4 and grads.weight_noise(0) is None
    assert not grads.matches("", 0) and not grads.matches("aggregation", 0)
    late = parse_fault("poison:gradients:scale=-3:from=2")
    assert [late.gradient_scale(k) for k in range(4)] == [None, None, -3.0, -3.0]
    weights = parse_fault("poison:weights:from=1")
    assert [weights.weight_noise(k) for k in range(3)] == [None, 1e-2, None]
    assert weights.gradient_scale(5) is None
    assert math.isnan(parse_fault("poison:gradients:scale=nan").gradient_scale(0) or 0.0)


def test_a_slow_spec_says_where_and_how_long() -> None:
    slow = parse_fault("slow:state-transfer")
    assert slow == Fault("", slow="state-transfer", scale=5.0)
    assert slow.delay_s("state-transfer") == 5.0 and slow.delay_s("forward") == 0.0
    assert not slow.matches("state-transfer", 0)  # slow, never killed
    assert parse_fault("slow:state-transfer:seconds=0.5").delay_s("state-transfer") == 0.5
    assert parse_fault("crash-in:state-transfer").delay_s("state-transfer") == 0.0


def test_a_straggler_spec_says_how_much_slower_and_when() -> None:
    slow = parse_fault("slow:compute:factor=4:from=3:until=6")
    assert [slow.slowdown("compute", k) for k in range(8)] == [1, 1, 1, 4, 4, 4, 1, 1]
    assert slow.slowdown("link", 4) == 1.0 and slow.delay_s("state-transfer") == 0.0
    assert not slow.matches("forward", 4)  # slow, never killed
    forever = parse_fault("slow:compute:factor=0.5")
    assert forever.slowdown("compute", 0) == forever.slowdown("compute", 10**6) == 0.5
    link = parse_fault("slow:link:factor=3:peer=b2:from=1")
    assert link.slowdown("link", 1, "b2") == 3.0
    assert link.slowdown("link", 1, "b3") == link.slowdown("link", 0, "b2") == 1.0
    assert parse_fault("slow:link:factor=2").slowdown("link", 0, "anyone") == 2.0


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("forward", "crash-in:POINT"),
        ("poison", "poison:WHAT"),
        ("poison:activations", "poison 'activations' is not one of gradients, weights"),
        ("poison:gradients:scale=0", "scale must not be 0"),
        ("poison:weights:scale=inf", "be finite for weights"),
        ("poison:gradients:scale=big", "'big' is not a number"),
        ("poison:weights:from=-1", "from must not be negative"),
        ("poison:weights:from=1:from=2", "is not scale=S or from=K"),
        ("poison:weights:iteration=1", "is not scale=S or from=K"),
        ("slow:forward", "slow point 'forward' is not one of state-transfer, compute, link"),
        ("slow:state-transfer:seconds=0", "seconds must be positive and finite"),
        ("slow:state-transfer:seconds=x", "'seconds=x' is not seconds=S"),
        ("slow:state-transfer:iteration=1", "only seconds=S may follow the point"),
        ("slow:compute", "slow:compute needs factor=F"),
        ("slow:compute:factor=0", "factor must be positive and finite"),
        ("slow:compute:factor=fast", "'fast' is not a number"),
        ("slow:compute:factor=4:from=3:until=3", "until must come after from"),
        ("slow:compute:factor=4:peer=a1", "is not one of factor=, from=, until="),
        ("slow:link:factor=4:from=-2", "from must not be negative"),
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
