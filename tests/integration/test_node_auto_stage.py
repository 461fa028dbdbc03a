"""`gwtf node --stage auto` on real processes (docs/design.md 2.11): the first node of a swarm
takes stage 0; a node that joins without a stage takes the stage the minimum cut names, even
where that stage already has the most nodes, and the swarm's flow rises with it; while a job is
paused for a stage that lost its last node, a node that joins without a stage takes that stage
and the job resumes from the stage's backup (state transfer as for any joiner), equal to the
reference."""

from __future__ import annotations

import dataclasses
import re
import urllib.request
from pathlib import Path

import pytest
from cluster import LocalSwarm, pipeline_arcs, wait_for

from gwtf.client import GwtfClient
from gwtf.train import PRESETS, train_reference

pytestmark = pytest.mark.integration

SETTLE_S = 90.0


def test_a_node_without_a_stage_takes_the_bottleneck(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0) as swarm:
        # The first node, given no stage, creates the swarm at stage 0.
        first = swarm.spawn("h", None, 0.1, "--stages", "3")
        swarm.wait_listening(first)
        assert first.stage == 0
        swarm.bootstrap = first.address
        # Stage 1 is the bottleneck: two slow nodes (1 microbatch/s each) between one fast
        # node at stage 0 and one at stage 2 (10 each). Stage 1 has the most nodes: a rule
        # that filled the emptiest stage would put a joiner at stage 0.
        pinned = [swarm.spawn("r1", 1, 1.0), swarm.spawn("r2", 1, 1.0),
                  swarm.spawn("t", 2, 0.1)]
        swarm.wait_listening(*pinned)
        everyone = {"h", "r1", "r2", "t"}
        before = wait_for(lambda: swarm.settled(everyone, pipeline_arcs([1, 2, 1])), SETTLE_S,
                          "the four pinned nodes to settle")
        assert before["flow_value"] == pytest.approx(2.0, rel=0.01)

        joiner = swarm.join("j", None, 0.1, "--metrics-port", "0")  # no --stage: auto
        assert joiner.stage == 1
        # What its metrics say: its stage, and its capacity there.
        line = joiner.lines.get(timeout=30)
        match = re.search(r"metrics on (http://\S+)", line or "")
        assert match, line
        samples = scrape(match.group(1))
        assert samples['gwtf_node_info{location="-",node="j",stage="1"}'] == 1
        assert samples["gwtf_capacity_microbatches_per_second"] == pytest.approx(10.0)
        # What it says of itself, and what the others know of it.
        own = swarm.status("j", swarm=False)
        assert own is not None
        assert {m["id"]: m["stage"] for m in own["members"]}["j"] == 1
        after = wait_for(lambda: swarm.settled(everyone | {"j"}, pipeline_arcs([1, 3, 1])),
                         SETTLE_S, "the swarm to settle with the joiner")
        assert {m["id"]: m["stage"] for m in after["members"] if m["alive"]}["j"] == 1
        assert all(m["stage"] == 1 for m in after["members"] if m["id"] == "j")
        # The flow went from stage 1's 2 microbatches/s to what stages 0 and 2 allow.
        assert after["flow_value"] == pytest.approx(10.0, rel=0.01)
        log = joiner.log.read_text()
        assert "stage auto: took stage 1 of 3" in log, log[-2000:]


def test_a_node_without_a_stage_fills_a_wiped_stage_and_the_job_resumes(
    tmp_path: Path, one_thread: None
) -> None:
    # one_thread: the in-process reference runs with the nodes' torch thread count.
    wait_s = 150.0
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0, train=True) as swarm:
        # The job's own activation size (as tests/chaos/test_recovery.py, for the same reason).
        first = swarm.spawn("h0", 0, 0.05, "--stages", "3", "--activation-bytes", "131072")
        swarm.wait_listening(first)
        swarm.bootstrap = first.address
        # Stage 1's one node keeps backups of its state (a lone replica) and SIGKILLs itself in
        # iteration 2: the job pauses until stage 1 is held again.
        lone = swarm.spawn("a7", 1, 0.07, "--fault", "crash-in:forward:iteration=2")
        tail = swarm.spawn("z0", 2, 0.05)
        swarm.wait_listening(lone, tail)
        swarm.wait_formed()
        job = dataclasses.replace(PRESETS["tiny-gpt"], name="auto-refill", iterations=4)
        client = GwtfClient(tail.address)
        job_id = client.submit(job)
        wait_for(lambda: client.progress(job_id).paused, wait_s, "the job to pause")
        wait_for(lambda: not lone.alive, 30, "a7 to die")
        assert lone.popen.returncode == -9
        assert "stage 1 has no live node" in client.progress(job_id).paused

        joiner = swarm.join("j", None, 0.07)  # no --stage: auto
        assert joiner.stage == 1  # the empty stage, though it could hold any
        result = client.wait(job_id, timeout_s=wait_s)
        assert result.state == "completed", result.error
        assert (result.crashes, result.joins) == (1, 1)
        assert result.lost_microbatches == 0 and result.dropped_microbatches == 0
        ref = train_reference(job, microbatch_ids=result.trained_ids(job.microbatches))
        assert result.loss == ref.loss
        assert result.param_checksum == ref.param_checksum
        assert any("j" in path for path, _ in result.routes), result.routes


def scrape(url: str) -> dict[str, float]:
    """Every sample of the Prometheus exposition as {name{labels}: value}."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
