"""A partition of the emulated WAN (docs/design.md 3.6, 4.5): two groups of regions lose every
message between them for a while, then heal, in the middle of a job.

Seven real node processes in 3 stages over the geo10 matrix: four in Oregon and Virginia (a data
holder, the job's coordinator, and a node of every stage), three in Tokyo and Seoul (a data
holder and a node of every stage). The schedule file cuts the two groups apart for
`PARTITION_S` while the job runs. Each side soon takes the other for dead; the Asian side has a
data holder, so it gets a coordinator of its own. Then:

- no two coordinators commit one iteration: each iteration's step is ordered by one node's
  coordinator in all seven nodes' logs, and every replica logs the checksum of every step it
  takes, one checksum per (iteration, stage) in all the logs;
- the job completes and equals `gwtf.train.train_reference` over the microbatches it trained,
  bit for bit;
- the replicas of every stage end with the same weights, those of the other side too.

The heal is where a race was (docs/design.md 4.5, "The race at re-entry"): the west's
coordinator admitted the east's nodes before its membership showed them alive, and skipped its
restarts to them, so the round stalled 20 s at the heal, and for good in one fresh-clone CI run
in three; then the west's stage workers gave up their commit exchange and their gradients to
those nodes as dead, and the round waited 10-20 s for the watchdog ("The stall after the
heal"); no node may log a watchdog stall, nor fail to enter.

Run time: 36 s on a shared 2-core machine (7 s to start the nodes; the 8 s cut; 16
iterations). The issue's 30 s cut, by hand (`GWTF_PARTITION_S=30`, 82 iterations): 84 s.
Figures in benchmarks/RESULTS.md, section `partition`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import REPO, LocalSwarm, wait_for

from gwtf.client import GwtfClient, JobResult
from gwtf.train import PRESETS, JobConfig, train_reference

# In `make soak`, not `make test`, for now: the stall after the heal is fixed (design 4.5) and
# 4 runs in a row passed after the fix on a loaded 2-core machine (2026-11-25), too few to put a
# 150-second case back in CI; its run time also grew with the longer job and the joiner's wait.
pytestmark = [pytest.mark.chaos, pytest.mark.soak]

MATRIX = REPO / "gwtf" / "data" / "geo10_aws.csv"
WEST = ("Oregon", "Virginia")
EAST = ("Tokyo", "Seoul")
NODES = [  # id, stage, compute_s, location
    ("h0", 0, 0.05, "Oregon"),
    ("a0", 1, 0.06, "Oregon"),
    ("z0", 2, 0.05, "Virginia"),
    ("a2", 1, 0.07, "Virginia"),
    ("h1", 0, 0.08, "Tokyo"),
    ("a1", 1, 0.09, "Seoul"),
    ("z1", 2, 0.07, "Tokyo"),
]
PARTITION_S = float(os.environ.get("GWTF_PARTITION_S", "8"))
"""How long the cut holds: 8 s in the suite (more than twice the failure timeout, so each side
declares the other dead); the issue's 30 s by hand, `GWTF_PARTITION_S=30` (benchmarks/RESULTS.md,
section `partition`)."""
WAIT_S = 180.0
_STEPPED = re.compile(r"job (\S+) iteration (\d+) stepped at stage (\d+) .*: checksum (\S+)")
_ORDERED = re.compile(r"job (\S+) iteration (\d+): every member is prepared")


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[LocalSwarm, Path]]:
    schedule = tmp_path / "partition.toml"
    schedule.write_text("")
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0, train=True) as s:
        for n, (node, stage, compute_s, location) in enumerate(NODES):
            first = ("--stages", "3", "--activation-bytes", "131072") if n == 0 else ()
            proc = s.spawn(node, stage, compute_s, *first, "--location", location,
                           "--link-matrix", str(MATRIX), "--wan-schedule", str(schedule))
            if n == 0:
                s.wait_listening(proc)
                s.bootstrap = proc.address
        s.wait_listening(*s.procs.values())
        s.wait_formed()
        yield s, schedule


def cut(schedule: Path, seconds: float) -> float:
    """Cut the west from the east for `seconds`, from half a second from now; when it heals
    (time.time())."""
    at = time.time() + 0.5
    schedule.write_text(
        f"[[partition]]\ngroups = [{list(WEST)!r}, {list(EAST)!r}]\n".replace("'", '"')
        + f"at = {at!r}\nduration_s = {seconds!r}\n"
    )
    return at + seconds


def steps_logged(swarm: LocalSwarm, job_id: str) -> dict[tuple[int, int], dict[str, set[str]]]:
    """(iteration, stage) -> checksum -> the nodes whose logs say they stepped to it."""
    out: dict[tuple[int, int], dict[str, set[str]]] = {}
    for log in sorted(swarm.log_dir.glob("*.log")):
        node = log.name.split(".")[0]
        for match in _STEPPED.finditer(log.read_text()):
            if match.group(1) != job_id:
                continue
            key = (int(match.group(2)), int(match.group(3)))
            out.setdefault(key, {}).setdefault(match.group(4), set()).add(node)
    return out


def steps_ordered(swarm: LocalSwarm, job_id: str) -> dict[int, set[str]]:
    """Iteration -> the nodes whose logs say they ordered its step as the job's coordinator."""
    out: dict[int, set[str]] = {}
    for log in sorted(swarm.log_dir.glob("*.log")):
        node = log.name.split(".")[0]
        for match in _ORDERED.finditer(log.read_text()):
            if match.group(1) == job_id:
                out.setdefault(int(match.group(2)), set()).add(node)
    return out


def heal_stalls(swarm: LocalSwarm) -> list[str]:
    """Log lines of a round the watchdog found stalled, or of a node that could not enter the
    job: what the race at the heal left (docs/design.md 4.5)."""
    return [
        f"{log.name}: {line}" for log in sorted(swarm.log_dir.glob("*.log"))
        for line in log.read_text().splitlines()
        if "made no progress for" in line or "could not enter within" in line
    ]


def final_weights(swarm: LocalSwarm, job_id: str) -> dict[str, tuple[int, int, str]]:
    """Node -> (stage, iteration, sha256 of its weights of the job) for every live node."""
    from grpc import aio

    from gwtf.v1 import job_pb2, job_pb2_grpc

    async def one(address: str, stage: int) -> tuple[int, int, str]:
        async with aio.insecure_channel(address) as channel:
            digest = hashlib.sha256()
            iteration = -1
            async for chunk in job_pb2_grpc.JobServiceStub(channel).FetchWeights(
                job_pb2.WeightsRequest(job_id=job_id, stage=stage), timeout=30
            ):
                iteration = chunk.iteration
                digest.update(chunk.payload)
            return stage, iteration, digest.hexdigest()

    async def every() -> dict[str, tuple[int, int, str]]:
        procs = swarm.live()
        got = await asyncio.gather(*(one(p.address, p.stage) for p in procs))
        return {p.id: g for p, g in zip(procs, got, strict=True)}

    return asyncio.run(every())


def assert_equals_reference(result: JobResult, job: JobConfig) -> None:
    assert result.state == "completed", result.error
    assert result.iterations_completed == job.iterations
    assert result.lost_microbatches == 0
    assert result.checksum_mismatches == 0
    assert len(result.loss) == job.iterations
    ref = train_reference(job, microbatch_ids=result.trained_ids(job.microbatches))
    assert result.loss == ref.loss
    assert result.param_checksum == ref.param_checksum


def test_a_partition_heals_without_split_brain(swarm: tuple[LocalSwarm, Path]) -> None:
    nodes, schedule = swarm
    # Long enough to go on well after the heal, so that the side that was cut off re-enters the
    # job before it ends: measured, the cut side re-entered 1.7 s after an 8 s cut healed, and
    # an iteration takes 0.4-0.9 s here; the 2 iterations before the cut and about 4 during an
    # 8 s one leave 10 after it (and 2 an iteration for each further second of cut).
    # A fresh-clone run on a loaded machine once ended the job 10.8 s after the heal with h1, of
    # the cut side, not yet back in it, so that it held no weights of the job: the test now waits
    # for the cut side's re-entry (it must happen before the job ends) and the job is longer.
    iterations = 32 + 3 * max(0, round(PARTITION_S) - 8)
    job = dataclasses.replace(PRESETS["tiny-gpt"], name="partition", iterations=iterations)
    client = GwtfClient(nodes.procs["h0"].address)
    began = time.monotonic()
    job_id = client.submit(job)
    wait_for(lambda: client.progress(job_id).iterations_completed >= 2, WAIT_S, "2 iterations")
    healed = cut(schedule, PARTITION_S)
    east = sum(1 for *_, location in NODES if location in EAST)

    def back_or_over() -> JobResult | None:
        progress = client.progress(job_id)
        return progress if progress.joins >= east or progress.over else None

    back = wait_for(back_or_over, WAIT_S, "the cut side to re-enter the job")
    assert back.joins >= east, (
        f"the job ended {time.time() - healed:.1f} s after the heal with {back.joins} of the "
        f"{east} nodes of the cut side back in it")
    result = client.wait(job_id, timeout_s=WAIT_S)
    print(f"job over {time.monotonic() - began:.1f} s after submission, "
          f"{time.time() - healed:.1f} s after the heal")
    ordered = steps_ordered(nodes, job_id)
    assert sorted(ordered) == list(range(iterations)), ordered
    twice = {k: v for k, v in ordered.items() if len(v) > 1}
    assert not twice, f"two coordinators committed one iteration: {twice}"
    steps = steps_logged(nodes, job_id)
    split = {k: v for k, v in steps.items() if len(v) > 1}
    assert not split, f"two updates of one iteration: {split}"
    assert_equals_reference(result, job)
    assert not heal_stalls(nodes), heal_stalls(nodes)
    weights = final_weights(nodes, job_id)
    for stage in range(3):
        ends = {(it, d) for s, it, d in weights.values() if s == stage}
        assert len(ends) == 1, (stage, weights)
