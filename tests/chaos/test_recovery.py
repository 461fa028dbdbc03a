"""Losing nothing when nodes die (docs/design.md 4), with real node processes killed by SIGKILL.

One swarm of 6 nodes in 3 stages (2 data holders, 2 nodes in each other stage) trains one short
tiny-gpt job per case. Each case adds a node armed with a fault (`gwtf node --fault`, the node
SIGKILLs itself at that exact point: in a forward, in a backward, after a backward before its
gradient leaves, during the commit's exchange of gradient sums, while streaming its state to a
joiner), or kills or stops one from the test, and checks what the job ends with:

- the same loss curve and parameters as `gwtf.train.train_reference` over the microbatches the
  swarm trained. Tolerance: none, bit for bit. A replacement recomputes the dead node's work with
  the same seeds (dropout by job seed, iteration, microbatch and model part) and one torch thread,
  and gradient sums are float64, where summing a handful of float32 gradients is exact whatever
  node holds which (see tests/integration/test_train_cluster.py);
- no lost microbatch; dropped ones only where a data holder died, and the reference is then
  trained over the microbatches that were actually trained (the dropped ids per iteration are
  in the job's summary);
- the summary's crash count, and rerouted and replayed work where the rule says there is some.

The cases share the swarm in order: each armed node dies in its case, so the swarm is back to its
6 nodes for the next one; the last cases empty a stage and refill it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from cluster import LocalSwarm, Proc, wait_for

from gwtf.client import GwtfClient, JobResult
from gwtf.train import PRESETS, JobConfig, train_reference

pytestmark = pytest.mark.chaos

NODES = [
    ("h0", 0, 0.05),
    ("h1", 0, 0.08),
    ("a0", 1, 0.06),
    ("a1", 1, 0.09),
    ("z0", 2, 0.05),
    ("z1", 2, 0.07),
]
ITERATIONS = 4
WAIT_S = 150.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("chaos")
    with LocalSwarm(logs, heartbeat_s=0.25, failure_timeout_s=3.0, train=True) as s:
        # The job's own activation size (tiny-gpt: 8 x 64 x 64 float32), so that arc costs are
        # the nodes' compute and latency. With the default 8 MiB, the bandwidth term (loopback
        # read between 0.7 and 15 Gbit/s on a busy machine: 4 to 90 ms) outweighed the compute
        # differences, and a joining holder measured slow got no flow at all: its fault never
        # fired (the test then timed out waiting for it, once in four CI runs).
        s.start(NODES, 3, "--activation-bytes", "131072")
        s.wait_formed()
        yield s


def job_for(case: str, iterations: int = ITERATIONS) -> JobConfig:
    return dataclasses.replace(PRESETS["tiny-gpt"], name=f"chaos-{case}", iterations=iterations)


def armed(
    swarm: LocalSwarm, node_id: str, stage: int, fault: str, compute_s: float = 0.07,
    *, routed: bool = True,
) -> Proc:
    """A node that SIGKILLs itself at `fault`. `routed`: wait until the flows send it
    microbatches (a data holder: until it sends some), or its fault may never fire: a newcomer's
    links are first measured while it is still starting (a low bandwidth, so a costly arc), and
    the flows take it in only once they are measured again."""
    proc = swarm.join(node_id, stage, compute_s, "--fault", fault)
    swarm.wait_formed()
    if routed:

        def carries_flow() -> bool:
            view = swarm.status(node_id)
            # Converged flows only: a scaling phase's flows move, and the job follows the
            # flows as they are when it routes.
            return view is not None and view["converged"] and any(
                arc["flow"] > 0 and (arc["src"] if stage == 0 else arc["dst"]) == node_id
                for arc in view["arcs"]
            )

        wait_for(carries_flow, 120, f"the flows to route microbatches through {node_id}")
    return proc


def train(swarm: LocalSwarm, job: JobConfig, to: str = "z0") -> JobResult:
    client = GwtfClient(swarm.procs[to].address)
    job_id = client.submit(job)
    return client.wait(job_id, timeout_s=WAIT_S)


def died(proc: Proc) -> None:
    try:
        wait_for(lambda: proc.popen.poll() is not None, 30, f"{proc.id} to die")
    except AssertionError:
        # Its fault never fired: kill it anyway, so that the armed node cannot fire in the next
        # case's job and fail that one too (the cases share the swarm).
        proc.popen.kill()
        proc.popen.wait(timeout=10)
        raise
    assert proc.popen.returncode == -9, (proc.id, proc.popen.returncode)


def assert_equals_reference(result: JobResult, job: JobConfig, *, dropped: bool = False) -> None:
    assert result.state == "completed", result.error
    assert result.iterations_completed == job.iterations
    assert result.lost_microbatches == 0
    assert result.checksum_mismatches == 0
    if not dropped:
        assert result.dropped_microbatches == 0, result.dropped
    assert result.dropped_microbatches == sum(len(ids) for _, ids in result.dropped)
    assert result.microbatches_trained == (
        job.iterations * job.microbatches - result.dropped_microbatches
    )
    ref = train_reference(job, microbatch_ids=result.trained_ids(job.microbatches))
    assert result.loss == ref.loss
    assert result.param_checksum == ref.param_checksum


def test_a_crash_in_a_forward_is_resent_to_another_node(swarm: LocalSwarm) -> None:
    victim = armed(swarm, "a2", 1, "crash-in:forward:iteration=1")
    job = job_for("forward")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.rerouted_microbatches >= 1
    assert result.restarts == 0


def test_a_crash_in_a_backward_is_recomputed_only_at_its_stage(swarm: LocalSwarm) -> None:
    victim = armed(swarm, "a3", 1, "crash-in:backward:iteration=1")
    job = job_for("backward")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1
    # The microbatch in its backward had finished its forward there: rule 2 recomputes it.
    assert result.replayed_microbatches >= 1 and result.replayed_s > 0
    assert result.restarts == 0


def test_a_crash_after_a_backward_before_its_gradient_left_is_redone(swarm: LocalSwarm) -> None:
    # On the last stage forward and backward are one step: with no proof that it finished
    # (its gradient never left), the microbatch is resent whole to the other last-stage node.
    # Stage 1 is the bottleneck, so stage 2 needs only part of its capacity; a victim as slow
    # as z1 could be left without flow (tied costs) and never reach its fault. The fastest node
    # of the stage has the cheapest arcs: min-cost routing fills it first.
    victim = armed(swarm, "z2", 2, "crash-in:after-backward:iteration=2", compute_s=0.03)
    job = job_for("after-backward")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.rerouted_microbatches >= 1
    assert result.replayed_s > 0  # the replacement's work for the dead node is counted
    assert result.restarts == 0


def test_a_crash_during_aggregation_reruns_it(swarm: LocalSwarm) -> None:
    victim = armed(swarm, "a4", 1, "crash-in:aggregation:iteration=1")
    job = job_for("aggregation")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    # Everything it accumulated in iteration 1 died with it: replayed at its stage peers.
    assert result.crashes == 1 and result.replayed_microbatches >= 1
    assert result.restarts == 0


def test_a_crash_during_aggregation_with_shipped_sums_is_kept_at_a_peer(swarm: LocalSwarm) -> None:
    """Bounded replay (docs/design.md 4.9) between real processes: with `replay_bound = 1` a
    node ships its running gradient sum to a stage peer after each microbatch it accumulates.
    a5 dies in the commit of iteration 1, its share accumulated: its keeper adopts the sum its
    last shipment carried, in its place, and only what no shipment covered is replayed."""
    victim = armed(swarm, "a5", 1, "crash-in:aggregation:iteration=1")
    job = dataclasses.replace(job_for("kept"), replay_bound=1)
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.restarts == 0
    assert result.kept_microbatches >= 1


def test_a_dead_data_holder_drops_only_what_never_left_it(swarm: LocalSwarm) -> None:
    victim = armed(swarm, "h2", 0, "crash-in:forward:iteration=1")
    job = job_for("holder")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job, dropped=True)
    assert result.crashes == 1
    assert [k for k, ids in result.dropped if ids] == [1], result.dropped
    assert result.restarts == 0


def test_a_holder_dead_after_its_backward_has_stage_0_redone_by_another(swarm: LocalSwarm) -> None:
    # Its microbatches had left it: another holder rebuilds their token ids from its own copy
    # of the data, recomputes stage 0 and takes the stage-1 node's gradient. Nothing dropped.
    victim = armed(swarm, "h3", 0, "crash-in:after-backward:iteration=1")
    job = job_for("holder-backward")
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.replayed_microbatches >= 1
    assert result.restarts == 0


def test_the_coordinator_dies_and_the_next_holder_takes_over(swarm: LocalSwarm) -> None:
    # The smallest holder id coordinates: g0 < h0. Its bookkeeping dies with it, so h0 asks
    # every participant where it is and starts the iteration in progress again.
    victim = armed(swarm, "g0", 0, "crash-in:forward:iteration=1")
    job = job_for("coordinator")
    result = train(swarm, job, to="z1")
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.restarts == 1
    assert result.coordinator == "h0"


def test_a_joiner_gets_its_state_from_another_donor_when_the_first_dies(
    swarm: LocalSwarm,
) -> None:
    # Joiners ask the live replicas of their stage in id order: "a-donor" first, which dies
    # once the first chunk of its state is on its way; the joiner fetches it from a0 instead.
    # Meanwhile a1 leaves gracefully: it lets the iteration it is in step, then goes.
    donor = armed(swarm, "a-donor", 1, "crash-in:state-transfer", routed=False)
    # Long enough for a9 to start, fetch its state twice and enter, and for a1 to leave,
    # with iterations to spare for a9 to be routed microbatches: the job's end must not race
    # them (checked below, so a slow machine fails with that reason, not a missing route).
    job = job_for("join", iterations=48)
    client = GwtfClient(swarm.procs["z0"].address)
    job_id = client.submit(job)
    wait_for(lambda: client.progress(job_id).iterations_completed >= 2, WAIT_S,
             "two iterations")
    joiner = swarm.join("a9", 1, 0.07)
    wait_for(lambda: client.progress(job_id).joins >= 1, WAIT_S, "a9 to enter the job")
    swarm.terminate("a1")
    done = client.progress(job_id).iterations_completed
    assert done <= job.iterations - 8, f"a9 entered with {job.iterations - done} iterations left"
    result = client.wait(job_id, timeout_s=WAIT_S)
    died(donor)
    assert swarm.procs["a1"].popen.wait(timeout=30) == 0
    assert joiner.alive
    assert_equals_reference(result, job)
    assert (result.crashes, result.leaves, result.joins) == (1, 1, 1)
    # The joiner took microbatches after it entered.
    assert any("a9" in path for path, _ in result.routes), result.routes


def test_a_joiner_whose_state_went_stale_catches_up_with_the_steps(swarm: LocalSwarm) -> None:
    # docs/design.md 3.8: "a-slow" (first in id order, so every joiner's donor) waits 8 s after
    # the first chunk of its state, as a donor behind a thin uplink: longer than the commit
    # waits for a joiner (ENTRY_HOLD_S, 5 s), so the stage steps meanwhile, and the joiner
    # applies the steps it missed instead of fetching the state again. The job keeps more steps
    # than 8 s of iterations take on a fast machine, so that the catch-up does not depend on
    # the machine's speed; the result is still the reference's, bit for bit.
    slow = swarm.join("a-slow", 1, 0.07, "--fault", "slow:state-transfer:seconds=8")
    swarm.wait_formed()
    # 80 iterations: the joiner enters after its start, 5 s of the commit's wait and 8 s of the
    # slow stream (at iterations 31 and 36 in two runs), with iterations left to be routed work.
    job = dataclasses.replace(job_for("catch-up", iterations=80), catch_up_steps=64)
    client = GwtfClient(swarm.procs["z0"].address)
    job_id = client.submit(job)
    wait_for(lambda: client.progress(job_id).iterations_completed >= 2, WAIT_S,
             "two iterations")
    joiner = swarm.join("a8", 1, 0.07)
    wait_for(lambda: client.progress(job_id).joins >= 1, WAIT_S, "a8 to enter the job")
    done = client.progress(job_id).iterations_completed
    assert done <= job.iterations - 8, f"a8 entered with {job.iterations - done} iterations left"
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert_equals_reference(result, job)
    assert (result.crashes, result.joins) == (0, 1)
    log = joiner.log.read_text()
    assert "caught up stage 1 from iteration" in log, swarm.tail(joiner, 20)
    assert "is stale" not in log  # it never fetched the whole state a second time
    assert any("a8" in path for path, _ in result.routes), result.routes
    for proc in (slow, joiner):
        swarm.terminate(proc.id)
    for proc in (slow, joiner):
        assert proc.popen.wait(timeout=30) == 0


def test_the_last_node_of_a_stage_dies_and_the_job_resumes_when_one_joins(
    swarm: LocalSwarm,
) -> None:
    # Stage 1 down to one node, which keeps a backup of its state at the coordinator after
    # every step; it dies in iteration 2, the job pauses (rule 5) until a node joins stage 1
    # and takes the backup's state.
    stage_1 = [p.id for p in swarm.live() if p.stage == 1]
    for node in stage_1:
        swarm.terminate(node)
    for node in stage_1:
        wait_for(lambda node=node: not swarm.procs[node].alive, 30, f"{node} to leave")
    lone = armed(swarm, "a7", 1, "crash-in:forward:iteration=2")
    job = job_for("empty-stage")
    client = GwtfClient(swarm.procs["z0"].address)
    job_id = client.submit(job)
    wait_for(lambda: client.progress(job_id).paused, WAIT_S, "the job to pause")
    died(lone)
    assert "stage 1 has no live node" in client.progress(job_id).paused
    swarm.join("a8", 1, 0.07)
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert_equals_reference(result, job)
    assert (result.crashes, result.joins) == (1, 1)
    assert result.paused == "" and result.paused_s > 0
    assert result.restarts == 0


def test_every_data_holder_dies_and_a_joining_holder_takes_the_job_over(
    swarm: LocalSwarm,
) -> None:
    # Stage 0 down to one holder (the coordinator), which keeps its state elsewhere after each
    # step; SIGKILLed in iteration 2: no holder, no coordinator, the job waits. A holder that
    # joins takes stage 0's state from the node that keeps it, coordinates and starts the
    # iteration again.
    holders = [p.id for p in swarm.live() if p.stage == 0]
    for node in holders:
        swarm.terminate(node)
    for node in holders:
        wait_for(lambda node=node: not swarm.procs[node].alive, 30, f"{node} to leave")
    swarm.bootstrap = swarm.procs["z0"].address  # the first node, h0, is gone
    lone = armed(swarm, "h6", 0, "crash-in:forward:iteration=2")
    job = job_for("no-holder")
    client = GwtfClient(swarm.procs["z0"].address)
    job_id = client.submit(job)
    wait_for(lambda: "stage 0 has no live node" in client.progress(job_id).paused, WAIT_S,
             "the job to wait for a data holder")
    died(lone)
    swarm.join("h7", 0, 0.07)
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert_equals_reference(result, job)
    assert result.coordinator == "h7" and result.joins >= 1 and result.restarts == 1


def test_the_logs_hold_no_traceback(swarm: LocalSwarm) -> None:
    for proc in swarm.procs.values():
        text = proc.log.read_text()
        assert "Traceback" not in text, (proc.id, text[-3000:])
