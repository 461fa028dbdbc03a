"""A job whose data is named by URL across real `gwtf node` processes: the holders fetch it into
their cache, the swarm ends equal to the reference on the same bytes at a local path (the same
job, one id), and a URL that no longer holds the pinned bytes is refused at submission."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cluster import LocalSwarm

from gwtf.client import ClientError, GwtfClient
from gwtf.train import load_job, train_reference
from gwtf.train.digests import data_digest

pytestmark = pytest.mark.integration

NODES = [("h0", 0, 0.01), ("h1", 0, 0.01), ("z0", 1, 0.01)]
WAIT_S = 180.0
JOB = """
iterations = 3
microbatches = 4
microbatch_size = 2
data = "{data}"

[model]
kind = "gpt"
layers = 2
width = 16
heads = 2
seq_len = 16
"""


def test_data_named_by_url_trains_as_the_same_bytes_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "cache"))  # the nodes' cache too
    served = tmp_path / "server" / "corpus.txt"
    served.parent.mkdir()
    served.write_bytes(bytes(range(256)) * 16)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "corpus.txt").write_bytes(served.read_bytes())
    (tmp_path / "url.toml").write_text(JOB.format(data=f"file://{served}"))
    (tmp_path / "here.toml").write_text(JOB.format(data="here/corpus.txt"))
    by_url, here = load_job(tmp_path / "url.toml"), load_job(tmp_path / "here.toml")
    assert by_url.job_id == here.job_id
    (tmp_path / "logs").mkdir()
    with LocalSwarm(tmp_path / "logs", train=True) as swarm:
        swarm.start(NODES, num_stages=2)
        swarm.wait_formed()
        client = GwtfClient(swarm.procs["z0"].address)
        result = client.wait(client.submit(by_url), timeout_s=WAIT_S)
        assert result.state == "completed", result.error
        # Pinned to bytes the URL no longer serves, and that no node holds (a node that holds
        # them trains on its copy): refused at submission, not trained.
        (tmp_path / "here" / "corpus.txt").write_bytes(b"the bytes the job was pinned to " * 40)
        pinned = data_digest(tmp_path / "here" / "corpus.txt")
        served.write_bytes(b"other bytes at the same URL " * 40)
        stale = dataclasses.replace(by_url, data_sha256=pinned)
        with pytest.raises(ClientError) as refused:
            client.submit(stale)
        assert f"data file://{served} now has digest " in str(refused.value)
        assert "\n" not in str(refused.value)
        for proc in swarm.procs.values():
            assert "Traceback" not in proc.log.read_text(), proc.id
    (tmp_path / "here" / "corpus.txt").write_bytes(bytes(range(256)) * 16)
    reference = train_reference(load_job(tmp_path / "here.toml"))
    assert result.loss == reference.loss and result.param_checksum == reference.param_checksum
