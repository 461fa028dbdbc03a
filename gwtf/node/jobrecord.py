"""The journal of a job's coordinator on disk (docs/design.md 4.10), off unless asked for.

With `GWTF_JOB_RECORD=FOLDER` in a node's environment, every coordinator of a job on the node
enters each input it takes, and what it decided, in `FOLDER/<node>-<job>-<n>.jsonl` (`n` counts
the coordinators of that job on the node: one that takes the job over starts a journal of its
own), one JSON line per input, stamped with the node's clock (`t`, time.monotonic) and written
through at once: a node SIGKILLed keeps every line it had entered. `gwtf.job.journal.replay`
reads them back. Off, a coordinator pays one attribute test per input.
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
from gwtf.job.journal import to_record

__all__ = ["RECORD_ENV", "JobRecorder", "record_journal"]

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


def record_journal(plan: IterationCoordinator, node: str, job: str,
                   log: logging.Logger | logging.LoggerAdapter[logging.Logger]
                   ) -> Path | None:
    """Attach a journal to `plan` (just built) when the environment asks for one; its path."""
    folder = os.environ.get(RECORD_ENV, "")
    if not folder:
        return None
    stem = _UNSAFE.sub("_", f"{node}-{job}")
    for n in range(1, 1000):
        path = Path(folder) / f"{stem}-{n}.jsonl"
        try:
            file = open(path, "x", encoding="utf-8", buffering=1)  # noqa: SIM115
        except FileExistsError:
            continue
        except OSError as err:
            log.warning("job %s: no journal of its coordinator: %s", job, err)
            return None
        plan.attach(JobRecorder(file, node, job))
        return path
    log.warning("job %s: no journal of its coordinator: %s holds 999 already", job, folder)
    return None
