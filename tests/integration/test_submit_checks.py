"""What `gwtf reference` refuses, a swarm refuses at submission, in the same sentence, before any
node trains; a --checkpoint-dir that cannot be written is refused before the job is submitted; a
swarm whose activation size is far from the job's says so at submission."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import LocalSwarm

from gwtf.cli import main
from gwtf.client import GwtfClient

pytestmark = pytest.mark.integration

NODES = [("h0", 0, 0.01), ("z0", 1, 0.01)]
JOB = """
iterations = 2
microbatches = 2
microbatch_size = 2
data = "{data}"

[model]
kind = "gpt"
layers = 2
width = 16
heads = 2
seq_len = 16
"""


def test_the_swarm_refuses_what_the_reference_refuses_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "cache"))
    (tmp_path / "short.txt").write_bytes(b"0123456789")  # 10 tokens, one sequence takes 17
    (tmp_path / "short.toml").write_text(JOB.format(data="short.txt"))
    (tmp_path / "text.txt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "job.toml").write_text(JOB.format(data="text.txt"))
    (tmp_path / "a-file").write_text("")
    short = tmp_path / "short.txt"
    too_short = (f"data {short} has 10 tokens, too few for one sequence of 16 tokens plus its "
                 "label; give at least 17 tokens")  # fmt: skip

    assert main(["reference", "--job", str(tmp_path / "short.toml"), "--threads", "1"]) == 2
    assert capsys.readouterr().err == f"gwtf reference: {too_short}\n"
    command = f"reference --job {tmp_path / 'job.toml'} --checkpoint-dir {tmp_path / 'a-file'}"
    assert main(command.split()) == 2
    assert capsys.readouterr() == ("", f"gwtf reference: --checkpoint-dir: {tmp_path / 'a-file'} "
                                   "is a file; a checkpoint is a folder (made if missing)\n")

    (tmp_path / "logs").mkdir()
    with LocalSwarm(tmp_path / "logs", train=True) as swarm:
        swarm.start(NODES, num_stages=2)
        swarm.wait_formed()
        to = swarm.procs["h0"].address

        assert main(["submit", "--to", to, "--job", str(tmp_path / "short.toml")]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and too_short in err and "warning" not in err, err

        command = (f"submit --to {to} --job {tmp_path / 'job.toml'} --wait "
                   f"--checkpoint-dir {tmp_path / 'a-file' / 'ck'}")  # fmt: skip
        assert main(command.split()) == 2
        assert capsys.readouterr() == ("", f"gwtf submit: --checkpoint-dir: "
                                       f"{tmp_path / 'a-file' / 'ck'} cannot be made: "
                                       f"{tmp_path / 'a-file'} is a file\n")
        client = GwtfClient(to)
        assert client.jobs() == []  # neither was taken

        # 2 x 16 x 16 x 4 bytes against the swarm's 8 MiB: trained, and said once.
        assert main(["submit", "--to", to, "--job", str(tmp_path / "job.toml"), "--wait"]) == 0
        err = capsys.readouterr().err
        warning = (
            "gwtf submit: warning: this swarm computes its routes for activations of 8 MiB (the "
            "--activation-bytes its first node was started with) but this job's are 2 KiB "
            "(microbatch_size x seq_len x width x 4 bytes), so its flows are those of other "
            "transfers; start the swarm with --activation-bytes 2048 to route this job's\n"
        )
        assert err.startswith(warning) and err.count("warning") == 1, err
        for proc in swarm.procs.values():
            assert "Traceback" not in proc.log.read_text(), proc.id
