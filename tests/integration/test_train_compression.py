"""Compression in a real swarm (docs/design.md 2.15): node processes on loopback whose declared
uplinks make the links bind. The submitting node plans the job's codecs from its view of the
swarm; the stages send each other the codecs' bytes; the swarm ends equal to the one-process
reference with the same plan, bit for bit; a peer's compressed tensor that does not decode is
refused like any bad tensor."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from cluster import LocalSwarm, send_as_peer, wait_for

from gwtf.client import GwtfClient
from gwtf.train import PRESETS, JobConfig, train_reference
from gwtf.train.codecs import pack
from gwtf.train.job import CompressionConfig

pytestmark = pytest.mark.integration

# Two nodes a stage, each declaring a 4 Mbit/s uplink: a stage-1 node's uplink carries 1.9
# microbatches/s of tiny-gpt's float32 activations and gradients (128 KiB each), where its
# compute takes 20; so the links bind, and 8-bit codecs on both boundaries lift the flow 3.8x.
NODES = [
    ("h0", 0, 0.05), ("h1", 0, 0.05), ("a0", 1, 0.05), ("a1", 1, 0.05),
    ("z0", 2, 0.05), ("z1", 2, 0.05),
]  # fmt: skip
ITERATIONS = 5
WAIT_S = 240.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("compression")
    with LocalSwarm(logs, heartbeat_s=0.25, failure_timeout_s=5.0, train=True,
                    extra=("--uplink-mbps", "4")) as s:  # fmt: skip
        s.start(NODES, 3, "--activation-bytes", "131072")
        everyone = {n[0] for n in NODES}

        def formed() -> bool:
            for proc in s.live():
                view = s.status(proc.id, swarm=False)
                if view is None or {m["id"] for m in view["members"] if m["alive"]} != everyone:
                    return False
            return True

        wait_for(formed, 30, "every node to know every member")
        yield s


def _job(**compression: object) -> JobConfig:
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=ITERATIONS)
    if compression:
        job = dataclasses.replace(job, compression=CompressionConfig(**compression))  # type: ignore[arg-type]
    return job


def test_the_swarm_plans_8_bit_where_its_links_bind_and_equals_the_reference(
    swarm: LocalSwarm, one_thread: None
) -> None:
    job = _job()
    assert not job.is_planned
    client = GwtfClient(swarm.procs["a1"].address)
    job_id = client.submit(job)
    planned = job.planned({2: "int8", 4: "int8"})
    # The plan is part of what the job computes, so of its id.
    assert job_id == planned.job_id != job.job_id
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    assert result.compression == ((2, "int8"), (4, "int8"))
    numel = 8 * 64 * 64
    per_crossing = 4 * numel - (numel + 4 * numel // 64)
    assert result.bytes_saved == 2 * 2 * per_crossing * ITERATIONS * job.microbatches
    ref = train_reference(planned)
    assert result.loss == ref.loss and result.param_checksum == ref.param_checksum
    # Both boundaries are between stages here, so the codecs ran on the wire only: float32
    # there would have given the uncompressed reference.
    assert result.param_checksum != train_reference(job).param_checksum
    # While the plan held, the routing priced the boundaries with the codec's bytes, and a
    # stage-1 node's record said what its 4 Mbit/s uplink carries of them (7.2 microbatches/s
    # where float32 gives 1.9); at the job's end it said float32's again.
    said = swarm.procs["a0"].log.read_text()
    assert "routes: boundaries send [34816, 34816] bytes a microbatch; capacity 7.18" in said
    assert "routes: boundaries send 131072 bytes a microbatch; capacity 1.91" in said


def _bad(address: str, job_id: str) -> list[tuple[grpc.StatusCode, str]]:
    """What a faulty peer could send a stage-1 node of a job whose boundary after block 2 is
    int4: parts of the wrong size, a scale below zero, float32 where the plan says int4."""
    from gwtf.node.dataplane.tensors import MicrobatchTag

    labels = torch.zeros(8, 64, dtype=torch.int64)
    good = pack("int4", "activation", torch.randn(8, 64, 64))
    tag = MicrobatchTag(job_id, 0, 0, "forward", "h0", ("h0",))
    cases = [
        {**good, "activation.q": good["activation.q"][:-2], "labels": labels},
        {**good, "activation.scale": -good["activation.scale"], "labels": labels},
        {"activation": torch.zeros(8, 64, 64), "labels": labels},
    ]

    return send_as_peer(address, [(tag, tensors) for tensors in cases])


def test_a_stated_plan_is_kept_even_inside_a_stage_and_bad_parts_are_refused(
    swarm: LocalSwarm, one_thread: None
) -> None:
    # int4 at the boundary after block 2 (a stage boundary of this 3-stage swarm), int8 after
    # block 3, inside stage 1 (blocks 2 and 3): that one is the stage's own round trip.
    job = _job(allow=("int8", "int4"), after=((2, "int4"), (3, "int8")))
    client = GwtfClient(swarm.procs["z0"].address)
    job_id = client.submit(job)
    assert job_id == job.job_id
    refused = _bad(swarm.procs["a0"].address, job_id)
    assert [code for code, _ in refused] == [grpc.StatusCode.INVALID_ARGUMENT] * 3, refused
    for (_, details), words in zip(refused, (["activation.q", "shape"], ["decode", "scale"],
                                             ["activation"]), strict=True):  # fmt: skip
        assert all(w in details for w in words) and "\n" not in details, details
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    assert result.compression == ((2, "int4"), (3, "int8"))
    ref = train_reference(job)
    assert result.loss == ref.loss and result.param_checksum == ref.param_checksum


def test_a_job_that_turns_compression_off_sends_float32(
    swarm: LocalSwarm, one_thread: None, tmp_path: Path
) -> None:
    job = _job(allow=())
    client = GwtfClient(swarm.procs["h0"].address)
    job_id = client.submit(job)
    assert job_id == job.job_id
    result = client.wait(job_id, timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    assert result.compression == () and result.bytes_saved == 0
    assert result.param_checksum == train_reference(job).param_checksum
