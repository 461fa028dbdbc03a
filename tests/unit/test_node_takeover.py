"""A holder that takes a job over (docs/design.md 4.5): the job's record says what its new
coordinator says, not what the holder cleared after it.

The coordinator may pause the job while it takes over (a stage that emptied together with the
old coordinator): the record must show that pause once the takeover is done, whatever else calls
`update_pause` later. The real JobManager drives `_take_over`; the coordinator's own takeover,
which talks to the other participants, is replaced by one that pauses the job as the real one
does when it finds a stage empty (gwtf.node.jobs.coordinator.coordinator, `update_pause`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gwtf.node.jobs import manager as jobs
from tests.unit.test_node_job_verdicts import JOB, participant

EMPTY = "stage 1 has no live node: the job waits for a node to join it"


class Coordinator:
    """Pauses the job whenever it judges the pause, as JobCoordinator.update_pause does."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def update_pause(self) -> None:
        self.progress.paused = EMPTY


def test_the_pause_a_new_coordinator_set_while_taking_over_stays_on_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host, manager, _ = participant()
    progress = manager.book.records[JOB]
    progress.paused = "stage 0 has no live node: the job waits for a data holder to join"
    active = manager.book.active
    assert active is not None

    async def take_over(_: Any, __: Any) -> Coordinator:
        coord = Coordinator(progress)
        coord.update_pause()  # the stage it found empty while it took the job over
        return coord

    monkeypatch.setattr(jobs.JobCoordinator, "take_over", take_over)
    spawned: list[Any] = []
    host.spawn = lambda coro, name: spawned.append(coro)  # type: ignore[attr-defined]
    asyncio.run(manager._take_over(active, "died"))
    for coro in spawned:
        coro.close()  # the record's spread to the members: no swarm here
    assert progress.coordinator == host.node_id
    assert progress.crashes == 1
    assert progress.paused == EMPTY
