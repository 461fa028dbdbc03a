"""Training across a swarm of real `gwtf node` processes (issue 5): the central correctness test.

One swarm of 7 nodes in 3 stages (2 data holders, 3 nodes in stage 1 and 2 in stage 2, uneven
speeds so the flows have choices; three replicas make the commit's reduce-scatter and all-gather
cut uneven slices) trains a tiny-gpt job submitted with the Python client and a tiny-llama
job submitted with `gwtf submit`; each must end with exactly the loss curve and the parameters of
`train_reference`, the same job trained in this process with no pipeline.

Tolerance: none, bit for bit. Each replica keeps its gradient sums in float64 (the jobs'
`grad_accum`), where the sum of a handful of float32 per-microbatch gradients is exact, so neither
the routes the microbatches took, nor the order they arrived in, nor the split over the replicas
changes a bit; the replicas combine the sums in node-id order and step AdamW identically; and the
nodes and this process run torch with one thread (`torch.set_num_threads(1)`: reductions split
their work by thread count, tests/unit/test_train_swarm.py says more). A lost or double-counted
microbatch, a wrong route back, or replicas that diverged would all change the checksum.

The tests share the swarm in order; the last one empties a stage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from cluster import REPO, LocalSwarm, send_as_peer, wait_for

from gwtf.client import AsyncGwtfClient, ClientError, GwtfClient, fetch_jobs
from gwtf.train import PRESETS, JobConfig, ReferenceResult, train_reference
from gwtf.train.checkpoints.checkpoint import load_model
from gwtf.train.stage import build_model

pytestmark = pytest.mark.integration

# (id, stage, seconds per microbatch): uneven, so that the flows split unevenly.
NODES = [
    ("h0", 0, 0.05),
    ("h1", 0, 0.08),
    ("a0", 1, 0.06),
    ("a1", 1, 0.09),
    ("a2", 1, 0.07),
    ("z0", 2, 0.05),
    ("z1", 2, 0.07),
]
GPT_ITERATIONS = 24  # enough to see the loss fall; about half a second each here
LLAMA_ITERATIONS = 4
WAIT_S = 240.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("train")
    # Two memory slots: fewer than a holder's share of an iteration (4), so that holders wait
    # for slots and relays hold streams open (back-pressure) all the time; a node that took
    # more would fail the job (its executor refuses a third forward).
    with LocalSwarm(
        logs, heartbeat_s=0.25, failure_timeout_s=5.0, train=True, extra=("--memory-slots", "2")
    ) as s:
        s.start(NODES, num_stages=3)
        everyone = {n[0] for n in NODES}

        def formed() -> bool:  # a joiner learns the members by gossip, a moment after it joins
            for proc in s.live():
                view = s.status(proc.id, swarm=False)
                if view is None or {m["id"] for m in view["members"] if m["alive"]} != everyone:
                    return False
            return True

        wait_for(formed, 30, "every node to know every member")
        yield s



def reference(job: JobConfig) -> ReferenceResult:
    return train_reference(job)


def job_of(preset: str, iterations: int) -> JobConfig:
    return dataclasses.replace(PRESETS[preset], iterations=iterations)


def send_bad_tensors(address: str, job_id: str) -> list[tuple[grpc.StatusCode, str]]:
    """What a faulty peer could send a stage-1 node: each is refused with its reason."""
    from gwtf.node.dataplane.tensors import MicrobatchTag

    shape = (8, 64, 64)
    labels = torch.zeros(8, 64, dtype=torch.int64)
    tag = MicrobatchTag(job_id, 0, 0, "forward", "h0", ("h0",))
    cases = [
        (tag, {"activation": torch.zeros(8, 64, 32), "labels": labels}),
        (tag, {"activation": torch.zeros(shape, dtype=torch.float64), "labels": labels}),
        (tag, {"activation": torch.full(shape, float("nan")), "labels": labels}),
        (dataclasses.replace(tag, sender="intruder", path=("intruder",)),
         {"activation": torch.zeros(shape), "labels": labels}),
    ]

    return send_as_peer(address, cases)


def test_a_gpt_job_equals_the_reference_bit_for_bit_whatever_the_routes(
    swarm: LocalSwarm, one_thread: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Every Watch call has a deadline: following the job takes several calls here.
    monkeypatch.setattr("gwtf.client.WATCH_CALL_S", 2.0)
    job = job_of("tiny-gpt", GPT_ITERATIONS)
    # Submitted to a relay: any node takes a job.
    client = GwtfClient(swarm.procs["a0"].address)
    job_id = client.submit(job)
    assert job_id == job.job_id
    # A faulty peer meanwhile: its tensors are refused, and the job goes on unharmed.
    refused = send_bad_tensors(swarm.procs["a1"].address, job_id)
    assert [code for code, _ in refused] == [grpc.StatusCode.INVALID_ARGUMENT] * 4, refused
    for (_, details), words in zip(
        refused, (["shape", "[8, 64, 64]"], ["float64"], ["NaN"], ["intruder"]), strict=True
    ):
        assert all(w in details for w in words) and "\n" not in details, details
    # One job at a time: the same job again is the same job, another one is refused.
    assert GwtfClient(swarm.procs["z0"].address).submit(job) == job_id
    with pytest.raises(ClientError, match=f"job {job_id} is running") as refused:
        GwtfClient(swarm.procs["h1"].address).submit(job_of("tiny-llama", 1))
    assert refused.value.exit_code == 1
    seen: list[int] = []
    result = client.wait(job_id, on_progress=lambda r: seen.append(r.iterations_completed),
                         timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    assert seen == sorted(seen) and seen[-1] == GPT_ITERATIONS
    ref = reference(job)
    assert result.loss == ref.loss
    assert result.param_checksum == ref.param_checksum
    assert result.checksum_mismatches == 0 and result.dropped_microbatches == 0
    assert result.microbatches_trained == GPT_ITERATIONS * job.microbatches
    # More than one route through the stages, every microbatch on one of them.
    assert len(result.routes) > 1, result.routes
    assert sum(count for _, count in result.routes) == result.microbatches_trained
    # The loss falls on the default data (the Python standard library sources).
    assert sum(result.loss[-4:]) / 4 < result.loss[0] - 1.0, result.loss
    # Every member hears: another node reports the same outcome (the coordinator tells each
    # member in its own call, so z1 may hear a moment after the client did).
    def heard() -> Any:
        (record,) = [r for r in fetch_jobs(swarm.procs["z1"].address) if r.job_id == job_id]
        return record if record.state == "completed" else None

    elsewhere = wait_for(heard, 30, "z1 to hear that the job completed")
    assert elsewhere.param_checksum == ref.param_checksum
    # The trained model out, from the stages' replicas: the reference's tensors, same names.
    saved = load_model(client.download(job_id, tmp_path / "swarm").parent)
    assert saved.iteration == GPT_ITERATIONS and saved.checksum == ref.param_checksum
    assert sorted(saved.parameters) == sorted(ref.parameters)
    assert all(torch.equal(saved.parameters[n], ref.parameters[n]) for n in ref.parameters)
    # A download that asks for the whole state (as one of a running job does) of a job that
    # completed meanwhile gets the final weights: the nodes keep only those (no optimizer).

    async def whole_state() -> tuple[int, dict[str, Any], Any]:
        async with AsyncGwtfClient(swarm.procs["a1"].address) as late:
            return await late._stage_part(job, 1, [swarm.procs["a1"].address], full=True)

    iteration, stage_params, optimizer = asyncio.run(whole_state())
    assert iteration == GPT_ITERATIONS and optimizer is None
    assert all(torch.equal(t, ref.parameters[n]) for n, t in stage_params.items())
    # The same job submitted again, anywhere, is the job that completed: not trained twice.
    assert GwtfClient(swarm.procs["z1"].address).submit(job) == job_id
    again = client.progress(job_id)
    assert again.state == "completed" and again.param_checksum == ref.param_checksum
    assert again.iterations_completed == GPT_ITERATIONS


def test_a_llama_job_submitted_with_the_cli_equals_the_reference(
    swarm: LocalSwarm, one_thread: None, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gwtf", "submit", "--to", swarm.procs["h1"].address,
         "--job", "tiny-llama", "--iterations", str(LLAMA_ITERATIONS), "--wait", "--json",
         "--checkpoint-dir", str(tmp_path / "model"), "--checkpoint-every", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    # The keys of `gwtf reference --json`, and what the swarm did about nodes that died.
    assert set(summary) == {"job_id", "iterations_completed", "loss", "param_checksum",
                            "throughput_mb_s", "dropped_microbatches", "crashes", "leaves",
                            "joins", "rerouted_microbatches", "replayed_microbatches",
                            "replayed_s", "kept_microbatches", "compute_s", "lost_microbatches",
                            "restarts", "compression",
                            "dropped", "excluded", "resumed_from", "rollbacks", "moves"}
    assert summary["rollbacks"] == []
    assert summary["moves"] == []  # every node is pinned (--stage K): none moves
    assert summary["compression"] == {"after": {}, "bytes_saved": 0}  # one host: no link binds
    ref = reference(job_of("tiny-llama", LLAMA_ITERATIONS))
    assert summary["job_id"] == ref.job_id
    assert summary["iterations_completed"] == LLAMA_ITERATIONS
    assert summary["loss"] == list(ref.loss)
    assert summary["param_checksum"] == ref.param_checksum
    assert summary["throughput_mb_s"] > 0 and summary["dropped_microbatches"] == 0
    assert summary["crashes"] == 0 and summary["rerouted_microbatches"] == 0
    assert summary["lost_microbatches"] == 0 and summary["restarts"] == 0
    assert summary["replayed_s"] == 0 and summary["compute_s"] > 0
    assert summary["excluded"] == []
    # --checkpoint-dir wrote the model gwtf reference --checkpoint-dir writes: the same job
    # file, the same tensors under the same names, the same metadata (safetensors writes its
    # header's metadata in no fixed order, so the files are compared by content).
    reference_cli = subprocess.run(
        [sys.executable, "-m", "gwtf", "reference", "--job", "tiny-llama", "--iterations",
         str(LLAMA_ITERATIONS), "--threads", "1", "--json", "--checkpoint-dir",
         str(tmp_path / "reference")],
        cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert reference_cli.returncode == 0, reference_cli.stderr
    swarm_model, reference_model = (load_model(tmp_path / d) for d in ("model", "reference"))
    # The same job, but the swarm's states the plan it ran with (compressing nothing here).
    from gwtf.train.job import load_job

    swarm_job, reference_job = (load_job(tmp_path / d / "job.toml") for d in ("model", "reference"))
    assert swarm_job.is_planned and not swarm_job.compression.after
    assert swarm_job.job_id == reference_job.job_id
    assert dataclasses.replace(swarm_job, compression=reference_job.compression) == reference_job
    assert list(swarm_model.parameters) == list(reference_model.parameters)
    assert all(torch.equal(t, reference_model.parameters[n])
               for n, t in swarm_model.parameters.items())  # fmt: skip
    assert (swarm_model.iteration, swarm_model.checksum) == (
        LLAMA_ITERATIONS, reference_model.checksum
    )

    def z0_heard() -> bool:
        status = subprocess.run(
            [sys.executable, "-m", "gwtf", "status", "--to", swarm.procs["z0"].address, "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        jobs = {j["job_id"]: j for j in json.loads(status.stdout)["jobs"]}
        return bool(jobs[ref.job_id]["state"] == "completed")

    wait_for(z0_heard, 60, "gwtf status at z0 to show the job completed", interval_s=0.5)


def test_the_async_client_in_a_running_event_loop_submits_follows_and_cancels(
    swarm: LocalSwarm, tmp_path: Path
) -> None:
    job = job_of("tiny-gpt", 500)  # far more than it will be let train

    async def main() -> None:
        async with AsyncGwtfClient(swarm.procs["h1"].address) as client:
            job_id = await client.submit(job)
            while (await client.progress(job_id)).iterations_completed < 1:
                await asyncio.sleep(0.2)
            # The weights of a job still training: every stage at the same iteration.
            saved = load_model((await client.download(job_id, tmp_path)).parent)
            assert 1 <= saved.iteration < job.iterations and saved.job.job_id == job_id
            whole = dict(build_model(job.model, job.seed).named_parameters())
            assert sorted(saved.parameters) == sorted(whole)
            # The blocking client works inside the loop too (a notebook cell): on a thread.
            assert job_id in {r.job_id for r in GwtfClient(swarm.procs["z0"].address).jobs()}
            assert await client.cancel(job_id, "wrong learning rate") == "failed"
            result = await client.wait(job_id, timeout_s=60)
            assert result.state == "failed"
            assert result.error.startswith("cancelled by the user: wrong learning rate")
            assert result.iterations_completed < job.iterations
            # Cancelling an ended job changes nothing; an unknown one is an error.
            assert await client.cancel(job_id) == "failed"
            with pytest.raises(ClientError, match="knows no job"):
                await client.cancel("job-0000")

    asyncio.run(main())
    done = subprocess.run(
        [sys.executable, "-m", "gwtf", "cancel", job.job_id, "--to", swarm.procs["z0"].address],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, f"job {job.job_id}: failed"), done.stderr
    # Every member stopped it: a later job is not refused as "running".
    for proc in swarm.live():
        wait_for(lambda p=proc: any(r.state == "failed" for r in fetch_jobs(p.address)
                                    if r.job_id == job.job_id), 30, f"{proc.id} to stop the job")


def test_a_model_that_does_not_cut_into_the_stages_is_refused(swarm: LocalSwarm) -> None:
    model = dataclasses.replace(PRESETS["tiny-gpt"].model, layers=2)
    job = dataclasses.replace(PRESETS["tiny-gpt"], model=model, iterations=1)
    with pytest.raises(ClientError) as refused:
        GwtfClient(swarm.procs["z0"].address).submit(job)
    assert refused.value.exit_code == 2
    assert "2 layers cannot be cut into 3 stages" in str(refused.value)
    # More microbatches than a node will track: refused before any node builds anything.
    huge = dataclasses.replace(PRESETS["tiny-gpt"], microbatches=100_000, iterations=1)
    with pytest.raises(ClientError, match="100000 microbatches per iteration") as refused:
        GwtfClient(swarm.procs["a1"].address).submit(huge)
    assert refused.value.exit_code == 2


def test_a_job_for_a_swarm_with_an_empty_stage_is_refused(swarm: LocalSwarm) -> None:
    for node in ("z0", "z1"):
        swarm.terminate(node)
    for node in ("z0", "z1"):
        wait_for(lambda node=node: swarm.procs[node].popen.poll() is not None, 30, f"{node} to go")

    def stage_2_gone() -> bool:
        view = swarm.status("h0")
        return view is not None and not any(m["alive"] and m["stage"] == 2
                                            for m in view["members"])

    wait_for(stage_2_gone, 30, "h0 to see stage 2 empty")
    with pytest.raises(ClientError) as refused:
        GwtfClient(swarm.procs["h0"].address).submit(job_of("tiny-gpt", 1))
    assert refused.value.exit_code == 1
    assert "stage 2 of this swarm has no live node" in str(refused.value)
    assert swarm.status("h0") is not None  # and it keeps serving
    assert {p.id for p in swarm.live()} == {"h0", "h1", "a0", "a1", "a2"}


def test_a_cluster_from_gwtf_launch_trains_too(tmp_path: Path, one_thread: None) -> None:
    """What a user does: `gwtf launch`, then `gwtf submit --wait`. Another cut of the model
    (2 stages of 3 blocks), the same bits as the reference."""
    launch = subprocess.Popen(
        [sys.executable, "-m", "gwtf", "launch", "--nodes", "4", "--stages", "2", "--json",
         "--heartbeat-s", "0.25", "--failure-timeout-s", "5", "--log-dir", str(tmp_path),
         "--activation-bytes", "131072"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert launch.stdout is not None
        nodes = json.loads(launch.stdout.readline())["nodes"]
        address = nodes[-1]["address"]

        def formed() -> bool:
            status = subprocess.run(
                [sys.executable, "-m", "gwtf", "status", "--to", address, "--json"],
                cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if status.returncode != 0:
                return False
            view = json.loads(status.stdout)
            return sum(m["alive"] for m in view["members"]) == 4 and not view["unreachable"]

        wait_for(formed, 60, "the launched nodes to know each other", interval_s=0.5)
        result = subprocess.run(
            [sys.executable, "-m", "gwtf", "submit", "--to", address, "--job", "tiny-gpt",
             "--iterations", "2", "--wait", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=WAIT_S, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        ref = reference(job_of("tiny-gpt", 2))
        assert summary["loss"] == list(ref.loss)
        assert summary["param_checksum"] == ref.param_checksum
    finally:
        launch.terminate()
        launch.wait(timeout=60)


def test_the_logs_hold_no_traceback(swarm: LocalSwarm) -> None:
    for proc in swarm.procs.values():
        text = Path(proc.log).read_text()
        assert "Traceback" not in text, (proc.id, text[-2000:])
