"""Volunteers that share nothing: each node on its own network stack (a network namespace) and in
its own folder with its own cache, the pretrained model and the data only on a file server that
they reach by URL. The job names both by `http://` URL; the submitter pins their digests; each
node fetches what its stage needs into its own cache and checks it. The swarm ends equal to the
one-process reference bit for bit, and after the data changes on the server the same job file is
a new job (a new id) that trains on the new bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cluster import LocalSwarm, wait_for
from hfmodels import write_llama

from gwtf.client import GwtfClient
from gwtf.local.netns import Hosts, available
from gwtf.train import train_reference
from gwtf.train.job import load_job

NODES = [("h0", 0, 0.05), ("a0", 1, 0.05), ("z0", 2, 0.05)]
WAIT_S = 240.0
PORT = 8000
JOB = """
iterations = 3
microbatches = 4
microbatch_size = 2
data = "{url}/corpus.txt"

[model]
pretrained = "{url}/llama"
seq_len = 16
dropout = 0.1

[optimizer]
lr = 0.01
"""


def _why_not() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root"
    return available()


pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/corpus.txt", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_volunteers_sharing_nothing_train_a_job_named_by_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    served = tmp_path / "server"
    write_llama(served / "llama")
    (served / "corpus.txt").write_bytes(bytes(range(256)) * 24)
    # The submitter's own cache; no node sees this folder.
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "submitter" / "cache"))
    (tmp_path / "logs").mkdir()
    with Hosts(["files", *(n for n, _, _ in NODES)], tag="gwtfsn", prefix="10.78.0") as hosts:
        url = f"http://{hosts.address('files')}:{PORT}"
        hosts.popen("files", [sys.executable, "-m", "http.server", str(PORT), "--bind",
                              hosts.address("files"), "--directory", str(served)],
                    stdout=open(tmp_path / "logs" / "files.log", "w"),  # noqa: SIM115
                    stderr=subprocess.STDOUT)  # fmt: skip
        wait_for(lambda: _serving(url), 30, "the file server")
        (tmp_path / "submitter").mkdir(exist_ok=True)
        (tmp_path / "submitter" / "job.toml").write_text(JOB.format(url=url))
        job = load_job(tmp_path / "submitter" / "job.toml").pinned()
        sent = json.dumps(job.to_dict())
        assert str(tmp_path) not in sent  # nothing in the job is a path on this machine
        with LocalSwarm(tmp_path / "logs", heartbeat_s=0.25, failure_timeout_s=5.0, train=True,
                        hosts=hosts, homes=tmp_path / "homes",
                        extra=("--emulate-compute",)) as swarm:  # fmt: skip
            swarm.start(NODES, num_stages=3)
            swarm.wait_formed(60)
            client = GwtfClient(swarm.procs["h0"].address)
            assert client.submit(job) == job.job_id
            first = client.wait(job.job_id, timeout_s=WAIT_S)
            assert first.state == "completed", first.error
            # Each node fetched what it trains on into its own cache: the pretrained folder
            # (its stage's tensors) on every node, the data where microbatches start.
            for node, _, _ in NODES:
                fetched = list((tmp_path / "homes" / node / "cache" / "remote").iterdir())
                assert fetched, node
            # The data changes on the server: the same job file is another job.
            (served / "corpus.txt").write_bytes(bytes(reversed(range(256))) * 24)
            changed = load_job(tmp_path / "submitter" / "job.toml").pinned()
            assert changed.job_id != job.job_id
            assert changed.data_sha256 != job.data_sha256
            assert changed.model.pretrained_sha256 == job.model.pretrained_sha256
            assert client.submit(changed) == changed.job_id
            second = client.wait(changed.job_id, timeout_s=WAIT_S)
            assert second.state == "completed", second.error
            for proc in swarm.procs.values():
                assert "Traceback" not in proc.log.read_text(), proc.id
    for result, submitted in ((first, job), (second, changed)):
        ref = train_reference(submitted)
        assert result.loss == ref.loss and result.param_checksum == ref.param_checksum
        assert result.checksum_mismatches == 0
    assert second.param_checksum != first.param_checksum

