"""A coordinator's journal (gwtf.job.journal): written as JSON, read back, replayed."""

import json
from typing import Any

import pytest

from gwtf.job.iterations import (
    CommittedReport,
    IterationCoordinator,
    JournalEntry,
    PreparedReport,
    StepOrder,
)
from gwtf.job.journal import JournaledLedger, JournalError, decisions, replay, to_record
from gwtf.recovery import Evidence, Mode, NeighbourReport

PARTICIPANTS = {"h0": 0, "h1": 0, "a": 1, "b": 1, "z": 2}


def journaled_run() -> list[dict[str, Any]]:
    """A coordinator through a death, a sweep, a failed check, a restart and a step, its
    journal written as JSON lines and read back."""
    entries: list[JournalEntry] = []
    c = IterationCoordinator(iterations=2, microbatches=4, participants=PARTICIPANTS,
                             num_stages=3, holders=("h0", "h1"))
    c.attach(entries.append)
    c.done("h0", 0, 0, iter([0, 2]), 3)
    c.member_down("b")
    reports = [NeighbourReport("h0", 0, ((0, Evidence.BACKWARD_DONE),)),
               NeighbourReport("z", 2, ((0, Evidence.FORWARD_DONE),))]
    c.plan_recovery("b", 1, reports)
    c.plan_recovery("b", 1, reports)  # a sweep: nothing new
    with pytest.raises(ValueError):
        c.done("x", 0, 0, [1])
    c.done("h1", 0, 0, [1, 3], None)
    c.replayed("a", 0, 0, 0, 1)
    assert c.commit_order() is not None
    for sender, ids in (("h0", [0, 2]), ("h1", [1, 3]), ("a", [0, 1, 2])):
        c.prepared(PreparedReport(sender, 0, 0, 1, PARTICIPANTS[sender], frozenset(ids)))
    assert isinstance(c.prepared(PreparedReport(
        "z", 0, 0, 1, 2, frozenset(range(4)), {m: 0.5 for m in range(4)},
        {("h0", "a", "z"): 4})), str)  # a's sums miss microbatch 3: the check fails
    c.restart("the commit check failed")
    c.done("h0", 0, 1, [0, 1, 2, 3])
    c.commit_order()
    for sender, ids in (("h0", [0, 1, 2, 3]), ("h1", []), ("a", [0, 1, 2, 3])):
        c.prepared(PreparedReport(sender, 0, 1, 1, PARTICIPANTS[sender], frozenset(ids)))
    step = c.prepared(PreparedReport("z", 0, 1, 1, 2, frozenset(range(4)),
                                     {m: float("nan") for m in range(4)},
                                     {("h0", "a", "z"): 4}))
    assert isinstance(step, StepOrder)
    for sender in ("h0", "h1", "a", "z"):
        c.committed(CommittedReport(sender, 0, PARTICIPANTS[sender], "s"))
    lines = [json.dumps({"t": i * 0.5, **to_record(e)}) for i, e in enumerate(entries)]
    return [json.loads(line) for line in lines]


def test_a_replayed_journal_decides_what_the_coordinator_decided() -> None:
    records = journaled_run()
    calls = [r["call"] for r in records]
    assert calls[0] == "start" and calls.count("plan_recovery") == 2
    assert "error" in records[calls.index("done", 2)]
    recorded = decisions(records)
    assert replay(records) == recorded
    assert recorded[-1].call == "committed" and '"IterationOutcome"' in recorded[-1].result


def test_a_journal_that_misses_an_input_does_not_replay_the_same() -> None:
    records = journaled_run()
    missing = [r for r in records if not (r["call"] == "done" and r["args"][0] == "h1")]
    assert replay(missing) != decisions(missing)


def test_a_journal_is_attached_before_the_first_input_and_read_back_strictly() -> None:
    c = IterationCoordinator(iterations=1, microbatches=1, participants={"h": 0},
                             num_stages=1, holders=("h",))
    c.commit_order()
    with pytest.raises(ValueError, match="before the coordinator's first input"):
        c.attach(lambda entry: None)
    with pytest.raises(JournalError, match="starts with"):
        replay([{"call": "done", "args": [], "kwargs": {}}])
    with pytest.raises(JournalError, match="no input"):
        replay([{"call": "__init__", "args": [], "kwargs": {}}])
    start = to_record(JournalEntry("start", (), {"iterations": 1}))
    with pytest.raises(JournalError, match="cannot be built"):
        replay([start])


def test_a_ledgers_journal_replays_to_the_same_evidence() -> None:
    entries: list[JournalEntry] = []
    ledger = JournaledLedger("a", 1, 0, entries.append)
    ledger.activation_received(0, "h0")
    ledger.activation_sent(0, "z")
    ledger.gradient_received(0, "z")
    ledger.accumulated(0)
    ledger.activation_received(1, "h0")
    ledger.activation_sent(1, "y", Mode.RECOMPUTE)
    assert ledger.report_about("z").as_dict() == {0: Evidence.BACKWARD_DONE}
    ledger.reset(1)
    ledger.activation_sent(2, "z")
    ledger.report_about("z")
    records = [json.loads(json.dumps(to_record(e))) for e in entries]
    assert records[0]["call"] == "start" and len(records) == 11
    assert replay(records) == decisions(records)
    missing = [r for r in records if r["call"] != "gradient_received"]
    assert replay(missing) != decisions(missing)
    with pytest.raises(JournalError, match="not an input of the journal's ledger"):
        replay([*records, to_record(JournalEntry("commit_order", (), {}))])
