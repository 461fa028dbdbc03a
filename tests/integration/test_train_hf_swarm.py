"""A Hugging Face LLaMA folder trained by a swarm of real `gwtf node` processes, and exported.

Three nodes, one per stage. A tiny LLaMA with grouped-query attention and random weights is
written by transformers' `save_pretrained` into the test's folder; the job names it
(`[model] pretrained`), and each node reads its own stage's tensors from it (the same path: one
machine); a job whose folder the nodes lack is refused in one sentence. The swarm's model,
downloaded and written as a Hugging Face folder by `gwtf export`, loads in transformers and
equals, tensor for tensor, the one-process reference of the same job (`train_reference`) under
the same names. Bit for bit, as tests/integration/test_train_cluster.py explains: float64
gradient sums and one torch thread on every node and here.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cluster import REPO, LocalSwarm
from hfmodels import write_llama
from transformers import LlamaForCausalLM

from gwtf.client import ClientError, GwtfClient
from gwtf.train import train_reference
from gwtf.train.job import load_job
from gwtf.train.models.hf import hf_tensors
from gwtf.train.stage import build_model

pytestmark = pytest.mark.integration

NODES = [("h0", 0, 0.05), ("a0", 1, 0.05), ("z0", 2, 0.05)]
ITERATIONS = 3
WAIT_S = 240.0

JOB = f"""
iterations = {ITERATIONS}
microbatches = 4
microbatch_size = 2

[model]
pretrained = "llama"
seq_len = 16
dropout = 0.1

[optimizer]
lr = 0.01
"""



def test_a_swarm_trains_a_hugging_face_llama_and_exports_the_reference_s_tensors(
    tmp_path: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gwtf.client.WATCH_CALL_S", 2.0)
    start = write_llama(tmp_path / "llama").state_dict()
    (tmp_path / "job.toml").write_text(JOB)
    job = load_job(tmp_path / "job.toml")
    assert job.model.key_value_heads == 2 and job.model.pretrained == str(tmp_path / "llama")
    (tmp_path / "logs").mkdir()
    with LocalSwarm(tmp_path / "logs", heartbeat_s=0.25, failure_timeout_s=5.0, train=True) as s:
        s.start(NODES, num_stages=3)
        s.wait_formed(30)
        client = GwtfClient(s.procs["h0"].address)
        job_id = client.submit(job)
        result = client.wait(job_id, timeout_s=WAIT_S)
        assert result.state == "completed", result.error
        saved = client.download(job_id, tmp_path / "checkpoint")
        # A job whose folder is nowhere: refused at submission, in one sentence; one whose folder
        # the submitter pins but the nodes do not have: refused by them, in one sentence.
        gone = dataclasses.replace(job.model, pretrained=str(tmp_path / "gone"))
        with pytest.raises(ClientError) as refused:
            client.submit(dataclasses.replace(job, model=gone, iterations=1))
        assert f"pretrained folder {tmp_path / 'gone'} does not exist" in str(refused.value)
        gone = dataclasses.replace(gone, pretrained_sha256=job.pinned().model.pretrained_sha256)
        with pytest.raises(ClientError) as refused_there:
            client.submit(dataclasses.replace(job, model=gone, iterations=1))
        assert f"{tmp_path / 'gone'} does not exist" in str(refused_there.value)
        assert "\n" not in str(refused.value) + str(refused_there.value)
        for proc in s.procs.values():
            assert "Traceback" not in proc.log.read_text(), proc.id
    ref = train_reference(job)
    assert result.loss == ref.loss and result.param_checksum == ref.param_checksum
    assert result.checksum_mismatches == 0

    export = subprocess.run(
        [sys.executable, "-m", "gwtf", "export", str(saved.parent), "--hf", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    back = LlamaForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    expected = hf_tensors(ref.parameters, job.model)
    assert sorted(back) == sorted(expected) == sorted(start)
    assert all(torch.equal(back[name], expected[name]) for name in expected)
    # Trained from the folder's weights: moved away from them, every tensor.
    first = hf_tensors(dict(build_model(job.model, job.seed).named_parameters()), job.model)
    assert all(torch.equal(first[name], start[name]) for name in start)
    assert not any(torch.equal(back[name], start[name]) for name in start)

