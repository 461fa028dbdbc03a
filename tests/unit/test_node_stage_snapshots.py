"""What a node keeps of its own stage's states (docs/design.md 4.6, `StageContext.keep_snapshot`):
the latest periodic boundary and the floor, and the iteration it entered at, never every
boundary declared since the floor (declared while a stage is thin, they come whether the one
before landed or not)."""

from __future__ import annotations

from types import SimpleNamespace

from gwtf.node.worker.stage import StageContext, WorkerConfig
from tests.unit.test_node_heal import Host


def context(entered: int) -> StageContext:
    host = Host("a0", {"a0"})
    host.metrics = SimpleNamespace()  # type: ignore[attr-defined]
    job = SimpleNamespace(job_id="job-keep", microbatches=4, iterations=64, snapshot_every=2,
                          snapshot_thin=2)
    executor = SimpleNamespace(stage=1, num_stages=3, iteration=entered)
    return StageContext(host, job, executor, slots=2,  # type: ignore[arg-type]
                        config=WorkerConfig(retry_s=0.0), fault=None)


def test_a_node_keeps_the_latest_boundary_the_floor_and_its_entry_state_only() -> None:
    ctx = context(entered=3)
    ctx.keep_snapshot(3, b"entry")  # it entered at 3 (not a periodic boundary)
    # Boundaries 4, 6 and 8 are declared one after the other while the floor stays at 0 (none
    # landed everywhere): each step's order declares the next and names the floor.
    for boundary in (4, 6, 8):
        ctx.declare(boundary, floor=0)
        ctx.keep_snapshot(boundary, f"state {boundary}".encode())
        ctx.keep_snapshot(boundary + 1, None)
    assert sorted(ctx.snapshots) == [3, 8]  # 0 is the job's start: this node never held it
    # Once 8 landed everywhere it is the floor, and the entry state goes too.
    ctx.declare(None, floor=8)
    ctx.keep_snapshot(10, None)
    assert sorted(ctx.snapshots) == [8]
