"""The node's journals on disk (gwtf.node.jobs.journals): off unless GWTF_JOB_RECORD names a
folder."""

import json
import logging
from pathlib import Path

import pytest

from gwtf.job.iterations import IterationCoordinator
from gwtf.job.journal import JournaledLedger, decisions, replay
from gwtf.node.jobs.journals import RECORD_ENV, journaled_ledger, record_journal

LOG = logging.getLogger("test")


def coordinator() -> IterationCoordinator:
    return IterationCoordinator(iterations=1, microbatches=2, participants={"h:1": 0, "z": 1},
                                num_stages=2, holders=("h:1",))


def test_journals_are_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RECORD_ENV, raising=False)
    plan = coordinator()
    assert not record_journal(plan, "h:1", "j", LOG) and plan.journal is None
    assert journaled_ledger("h:1", 0, 0, "j", LOG) is None


def test_each_coordinator_and_ledger_writes_its_own_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    first, second = coordinator(), coordinator()
    assert record_journal(first, "h:1", "j", LOG) and record_journal(second, "h:1", "j", LOG)
    first.done("h:1", 0, 0, [0, 1])
    first.commit_order()
    assert isinstance(journaled_ledger("h:1", 0, 0, "j", LOG), JournaledLedger)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["h_1-j-coordinator-1.jsonl", "h_1-j-coordinator-2.jsonl",
                     "h_1-j-ledger-1.jsonl"]
    records = [json.loads(line) for line in (tmp_path / names[0]).read_text().splitlines()]
    assert [r["call"] for r in records] == ["start", "done", "commit_order"]
    assert all(r["node"] == "h:1" and r["job"] == "j" and r["t"] > 0 for r in records)
    assert replay(records) == decisions(records)


def test_a_folder_it_cannot_write_leaves_the_job_unjournaled_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING):
        assert not record_journal(coordinator(), "h:1", "j", LOG)
    assert "no journal of its coordinator" in caplog.text
