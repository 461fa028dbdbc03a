"""The coordinator's commit bookkeeping (gwtf.node.iterations), with no I/O."""

import pytest

from gwtf.node.iterations import (
    CommittedReport,
    IterationCoordinator,
    ReportError,
    assign,
)
from gwtf.train.data import assign_microbatches

PARTICIPANTS = {"h0": 0, "h1": 0, "a": 1, "b": 1, "z": 2}


def coordinator(iterations: int = 3, microbatches: int = 5) -> IterationCoordinator:
    return IterationCoordinator(
        iterations=iterations,
        microbatches=microbatches,
        participants=PARTICIPANTS,
        num_stages=3,
        holders=("h1", "h0"),
    )


def report(sender: str, k: int, checksum: str = "c", **kw: object) -> CommittedReport:
    return CommittedReport(sender, k, PARTICIPANTS[sender], checksum + str(PARTICIPANTS[sender]),
                           **kw)  # type: ignore[arg-type]


def last(k: int, ids: range | list[int], **kw: object) -> CommittedReport:
    ids = list(ids)
    return report(
        "z", k, losses={m: float(m) for m in ids},
        routes={("h0", "a", "z"): len(ids)}, **kw,
    )


def test_assign_is_the_trainers_assignment() -> None:
    for count, holders in ((8, ["b", "a"]), (3, ["x", "y", "z", "w"]), (0, ["a"])):
        assert assign(count, holders) == assign_microbatches(count, holders)


def test_an_iteration_commits_once_every_holder_is_done_and_completes_in_order() -> None:
    c = coordinator()
    assert c.assignment() == {"h0": (0, 2, 4), "h1": (1, 3)}
    assert c.done("h0", 0, [4, 0, 2]) is None
    order = c.done("h1", 0, [1, 3])
    assert order is not None
    assert (order.iteration, order.microbatches, order.final) == (0, (0, 1, 2, 3, 4), False)
    assert order.next_holders == ("h0", "h1")
    # The holders go on with iteration 1 while the commit of 0 is being reported.
    assert c.done("h0", 1, [0, 2, 4]) is None
    for sender in ("h0", "h1", "a", "b"):
        assert c.committed(report(sender, 0)) == []
    assert c.done("h1", 1, [1, 3]) is not None
    (outcome,) = c.committed(last(0, range(5)))
    assert outcome.iteration == 0 and outcome.microbatches == 5 and not outcome.final
    assert outcome.loss == sum(range(5)) / 5
    assert outcome.mismatched == ()
    assert outcome.routes == {("h0", "a", "z"): 5}
    assert c.completed == 1 and c.committing() == [1]


def test_a_later_iteration_completes_only_after_the_earlier_one() -> None:
    c = coordinator()
    c.done("h0", 0, [0, 2, 4])
    c.done("h1", 0, [1, 3])
    c.done("h0", 1, [0, 2, 4])
    c.done("h1", 1, [1, 3])
    for sender in ("h0", "h1", "a", "b"):
        c.committed(report(sender, 1))
    assert c.committed(last(1, range(5))) == []  # iteration 0 is not complete yet
    for sender in ("h0", "h1", "a", "b"):
        c.committed(report(sender, 0))
    outcomes = c.committed(last(0, range(5)))
    assert [o.iteration for o in outcomes] == [0, 1]


def test_the_final_iteration_gathers_the_digests_and_names_a_diverging_replica() -> None:
    c = coordinator(iterations=1)
    c.done("h0", 0, [0, 2, 4])
    order = c.done("h1", 0, [1, 3])
    assert order is not None and order.final and order.next_holders == ()
    c.committed(report("h0", 0, digests={"embed.w": "e"}))
    c.committed(report("h1", 0, digests={"embed.w": "e"}))
    c.committed(report("a", 0, digests={"blocks.0.w": "a"}))
    c.committed(report("b", 0, checksum="other", digests={"blocks.0.w": "B"}))
    (outcome,) = c.committed(last(0, range(5), digests={"head.w": "h"}))
    assert outcome.final
    # a and b disagree 1:1: which is right cannot be told, both are named.
    assert outcome.mismatched == ("a", "b")
    assert set(outcome.digests) == {"embed.w", "blocks.0.w", "head.w"}


def test_wrong_reports_are_refused_and_change_nothing() -> None:
    c = coordinator()
    with pytest.raises(ReportError, match="not a data holder"):
        c.done("a", 0, [0])
    with pytest.raises(ReportError, match="share"):
        c.done("h0", 0, [0, 2])
    with pytest.raises(ReportError, match="in progress"):
        c.done("h0", 2, [0, 2, 4])
    c.done("h0", 0, [0, 2, 4])
    c.done("h1", 0, [1, 3])
    with pytest.raises(ReportError, match="not being committed"):
        c.committed(report("a", 1))
    with pytest.raises(ReportError, match="does not take part"):
        c.committed(CommittedReport("stranger", 0, 1, "x"))
    with pytest.raises(ReportError, match="holds stage"):
        c.committed(CommittedReport("a", 0, 2, "x"))
    with pytest.raises(ReportError, match="not on the last stage"):
        c.committed(report("a", 0, losses={0: 1.0}))
    with pytest.raises(ReportError, match="not in iteration"):
        c.committed(report("z", 0, losses={9: 1.0}, routes={("h0", "a", "z"): 1}))
    with pytest.raises(ReportError, match="routes"):
        c.committed(report("z", 0, losses={0: 1.0}))
    for sender in ("h0", "h1", "a", "b"):
        c.committed(report(sender, 0))
    with pytest.raises(ReportError, match="another commit"):
        c.committed(report("a", 0, checksum="changed"))
    # The last report must cover every microbatch of the commit.
    with pytest.raises(ReportError, match="no last-stage node reported the loss"):
        c.committed(last(0, [0, 1, 2]))
    assert c.completed == 0
    (outcome,) = c.committed(last(0, range(5)))
    assert outcome.iteration == 0


def test_a_report_repeated_by_a_retry_is_ignored() -> None:
    c = coordinator()
    c.done("h0", 0, [0, 2, 4])
    assert c.done("h0", 0, [0, 2, 4]) is None
    c.done("h1", 0, [1, 3])
    assert c.done("h1", 0, [1, 3]) is None  # iteration 0 is already ordered
    c.committed(report("a", 0))
    assert c.committed(report("a", 0)) == []
    for sender in ("h0", "h1", "b"):
        c.committed(report(sender, 0))
    c.committed(last(0, range(5)))
    assert c.committed(last(0, range(5))) == []  # iteration 0 is complete


def test_two_last_stage_replicas_cannot_both_count_a_microbatch() -> None:
    participants = {"h": 0, "y": 1, "z": 1}
    c = IterationCoordinator(
        iterations=1, microbatches=2, participants=participants, num_stages=2, holders=["h"]
    )
    c.done("h", 0, [0, 1])
    c.committed(CommittedReport("y", 0, 1, "c", losses={0: 1.0}, routes={("h", "y"): 1}))
    with pytest.raises(ReportError, match="reported by both"):
        c.committed(CommittedReport("z", 0, 1, "c", losses={0: 1.0}, routes={("h", "z"): 1}))


def test_a_job_needs_a_participant_on_every_stage_and_holders_on_stage_0() -> None:
    with pytest.raises(ValueError, match="stage 2"):
        IterationCoordinator(iterations=1, microbatches=1, participants={"h": 0, "a": 1},
                             num_stages=3, holders=["h"])
    with pytest.raises(ValueError, match="not a data holder"):
        IterationCoordinator(iterations=1, microbatches=1, participants=PARTICIPANTS,
                             num_stages=3, holders=["a"])
