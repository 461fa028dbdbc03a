"""A node moves to the stage the minimum cut names (docs/design.md 2.11, "Moves"), with real node
processes: a SIGKILL makes stage 1 the bottleneck, and the job coordinator moves a node that
chose its stage (`--stage auto`) there at a commit, while the job runs.

The swarm: 2 stages, h0, h1 pinned at stage 0 (`--stage 0`), a0, a1 pinned at stage 1, and m0,
which chooses: with every node announcing the same speed it takes stage 0 (a tie, broken by the
stage with fewer nodes, then the lower index). A job runs; a1 is killed; stage 1's one node is
now the cut, and the coordinator (h0) names, at the next commit after the death, a move of m0 to
stage 1. h1 is as fast as m0 and its id comes first, so it would be the one moved if pinned
nodes were not left where they are. m0 steps that iteration at stage 0, leaves the swarm,
enters it again at stage 1 as a new incarnation under the same id and port, fetches stage 1's
state from a0 and is admitted: the job completes with exactly the loss curve and parameters of
the one-process reference (bit for bit: see tests/integration/test_train_cluster.py), the move
is in the job's record and in m0's log, and its leave was no crash (one crash: a1's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from cluster import LocalSwarm, wait_for

from gwtf.client import GwtfClient
from gwtf.train import PRESETS, JobConfig, train_reference

pytestmark = pytest.mark.chaos

COMPUTE_S = 0.05
PINNED = [("h0", 0, COMPUTE_S), ("h1", 0, COMPUTE_S), ("a0", 1, COMPUTE_S), ("a1", 1, COMPUTE_S)]
ITERATIONS = 40
WAIT_S = 240.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("moves")
    with LocalSwarm(logs, heartbeat_s=0.25, failure_timeout_s=3.0, train=True) as s:
        # The job's own activation size (tiny-gpt: 8 x 64 x 64 float32), as the recovery
        # cases do (tests/chaos/test_recovery.py): arc costs are the nodes' compute and latency.
        s.start(PINNED, 2, "--activation-bytes", "131072")
        s.wait_formed()
        s.join("m0", None, COMPUTE_S)
        s.wait_formed()
        yield s


def job_for(case: str) -> JobConfig:
    return dataclasses.replace(PRESETS["tiny-gpt"], name=f"moves-{case}", iterations=ITERATIONS)


def test_a_node_moves_to_the_cut_stage_and_the_job_equals_the_reference(
    swarm: LocalSwarm,
) -> None:
    mover = swarm.procs["m0"]
    assert mover.stage == 0  # the tie went to stage 0: the cut is not there yet
    job = job_for("cut")
    client = GwtfClient(swarm.procs["h0"].address)
    job_id = client.submit(job)
    wait_for(lambda: client.progress(job_id).iterations_completed >= 2, WAIT_S,
             "two iterations before the kill")
    swarm.kill("a1")
    result = client.wait(job_id, timeout_s=WAIT_S)

    assert result.state == "completed", result.error
    assert result.iterations_completed == job.iterations
    assert result.lost_microbatches == 0 and result.dropped_microbatches == 0
    assert result.checksum_mismatches == 0
    ref = train_reference(job)
    assert result.loss == ref.loss
    assert result.param_checksum == ref.param_checksum

    # One move, of the node that chose its stage, to the stage the death left with one node.
    assert [(m.node, m.from_stage, m.stage) for m in result.moves] == [("m0", 0, 1)], result.moves
    move = result.moves[0]
    assert move.gain > 0 and move.flow > 0
    # Its leave was no crash, and its entry at stage 1 a join.
    assert (result.crashes, result.leaves, result.joins) == (1, 0, 1), result
    assert mover.alive
    log = mover.log.read_text()
    assert "moved: stage 0 -> 1 (flow " in log, swarm.tail(mover, 20)
    assert "entered stage 1 at iteration" in log
    # Pinned nodes keep their stages (h1 was as good a candidate as m0).
    view = swarm.status("h0", swarm=False)
    assert view is not None
    stages = {m["id"]: m["stage"] for m in view["members"] if m["alive"]}
    assert stages == {"h0": 0, "h1": 0, "a0": 1, "m0": 1}, stages
