"""A stage's microbatch table and the checks of an incoming tag (gwtf.job.microbatches)."""

from dataclasses import dataclass

from gwtf.job.microbatches import MicrobatchTable, StageRole, tag_problem
from gwtf.recovery import Mode

ROLE = StageRole(job_id="j", node_id="r1", stage=1, num_stages=3, microbatches=4, iterations=5)
PARTICIPANTS = {"h0": 0, "r1": 1, "r2": 1, "t0": 2}


@dataclass(frozen=True)
class Tag:
    iteration: int = 0
    microbatch: int = 0
    direction: str = "forward"
    sender: str = "h0"
    path: tuple[str, ...] = ("h0",)
    mode: int = 0
    downstream: str = ""


def problem(tag: Tag, role: StageRole = ROLE, excluded: frozenset[str] = frozenset()
            ) -> str | None:
    return tag_problem(tag, role, PARTICIPANTS, excluded)


def test_a_forward_and_a_backward_that_fit_pass() -> None:
    assert problem(Tag()) is None
    assert problem(Tag(direction="backward", sender="t0", path=("h0", "r1", "t0"))) is None
    assert problem(Tag(mode=int(Mode.RECOMPUTE), downstream="t0")) is None


def test_a_tag_outside_the_job_is_refused() -> None:
    assert problem(Tag(microbatch=4)) == "microbatch 4 is outside 0..3"
    assert problem(Tag(iteration=5)) == "iteration 5 is past the job's last"
    assert problem(Tag(), excluded=frozenset({"h0"})) == "h0 was excluded from job j as a bad peer"


def test_paths_modes_and_downstream_nodes_must_fit_the_stages() -> None:
    assert problem(Tag(path=("h0", "r2"))) is not None  # too long for stage 1
    assert problem(Tag(sender="x", path=("x",))) == "x is not a stage-0 node of job j"
    assert problem(Tag(mode=int(Mode.REPLAY))) is not None  # names no stage-2 node
    assert problem(Tag(downstream="t0")) == "an ordinary forward names no downstream node"
    last = StageRole(job_id="j", node_id="t0", stage=2, num_stages=3, microbatches=4,
                     iterations=5)
    replay = Tag(sender="r1", path=("h0", "r1"), mode=int(Mode.REPLAY))
    assert problem(replay, last) is None
    assert problem(Tag(sender="r1", path=("h0", "r1"), mode=int(Mode.RECOMPUTE)), last) is not None
    backward = Tag(direction="backward", sender="t0", path=("h0", "r2", "t0"))
    assert problem(backward) is not None  # r1 is not on the path


def test_a_table_knows_which_work_is_over_now_or_ahead() -> None:
    table = MicrobatchTable(3, round=1)
    assert table.at(3, 1) and not table.at(3, 0)
    assert table.too_far(3, 1) is None
    assert table.too_far(3, 2) is None  # a restart this node has not heard of yet
    assert table.too_far(4, 0) is None  # the next iteration, once this one steps
    assert table.too_far(3, 0) == "iteration 3 round 0 is over here (now at 3 round 1)"
    assert table.too_far(2, 5) is not None
    assert table.too_far(5, 0) == "iteration 5 is ahead of this node's 3"
