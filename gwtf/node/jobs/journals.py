"""The journals of a job's coordinator and of a participant's ledger on disk (docs/design.md
4.10), off unless asked for.

With `GWTF_JOB_RECORD=FOLDER` in a node's environment, every coordinator of a job on the node
enters each input it takes, and what it decided, in `FOLDER/<node>-<job>-coordinator-<n>.jsonl`
(`n` counts the coordinators of that job on the node: one that takes the job over starts a
journal of its own), and the node's stage worker its ledger's records and answers in
`FOLDER/<node>-<job>-ledger-<n>.jsonl`. One JSON line per input, stamped with the node's clock
(`t`, time.monotonic) and written through at once: a node SIGKILLed keeps every line it had
entered. `gwtf.job.journal.replay` reads them back. Off, a coordinator pays one attribute test
per input and a ledger nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from gwtf.job.iterations import IterationCoordinator, JournalEntry
from gwtf.job.journal import JournaledLedger, to_record
from gwtf.recovery import Ledger

__all__ = ["RECORD_ENV", "JobRecorder", "journaled_ledger", "record_journal"]

RECORD_ENV = "GWTF_JOB_RECORD"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class JobRecorder:
    """Writes a coordinator's journal entries as JSON lines to `file`."""

    def __init__(self, file: IO[str], node: str, job: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._file = file
        self._node = node
        self._job = job
        self._clock = clock

    def __call__(self, entry: JournalEntry) -> None:
        record = {"t": self._clock(), "node": self._node, "job": self._job, **to_record(entry)}
        self._file.write(json.dumps(record) + "\n")


Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


def _open(node: str, job: str, kind: str, log: Log) -> IO[str] | None:
    """A new journal file of `kind` when the environment asks for journals, else None."""
    folder = os.environ.get(RECORD_ENV, "")
    if not folder:
        return None
    stem = _UNSAFE.sub("_", f"{node}-{job}-{kind}")
    for n in range(1, 1000):
        try:
            return open(Path(folder) / f"{stem}-{n}.jsonl", "x",  # noqa: SIM115
                        encoding="utf-8", buffering=1)
        except FileExistsError:
            continue
        except OSError as err:
            log.warning("job %s: no journal of its %s: %s", job, kind, err)
            return None
    log.warning("job %s: no journal of its %s: %s holds 999 already", job, kind, folder)
    return None


def record_journal(plan: IterationCoordinator, node: str, job: str, log: Log) -> bool:
    """Attach a journal to `plan` (just built) when the environment asks for one."""
    file = _open(node, job, "coordinator", log)
    if file is None:
        return False
    plan.attach(JobRecorder(file, node, job))
    return True


def journaled_ledger(node: str, stage: int, iteration: int, job: str, log: Log
                     ) -> Ledger | None:
    """A ledger that journals itself when the environment asks for journals, else None."""
    file = _open(node, job, "ledger", log)
    if file is None:
        return None
    return JournaledLedger(node, stage, iteration, JobRecorder(file, node, job))
