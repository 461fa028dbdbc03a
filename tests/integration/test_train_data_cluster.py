"""A job with its own tokenizer and .jsonl data across a small swarm of real `gwtf node`
processes: the two data holders build the token cache (the same one, at the same time), agree on
its digest at prepare, and the swarm ends equal to `train_reference` bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cluster import LocalSwarm

from gwtf.client import GwtfClient
from gwtf.train import load_job, train_reference

pytestmark = pytest.mark.integration

WORDS = "the quick brown fox jumps over a lazy dog while seven small cats watch from far".split()
NODES = [("h0", 0, 0.01), ("h1", 0, 0.01), ("z0", 1, 0.01)]
WAIT_S = 180.0


def make_tokenizer(path: Path) -> int:
    """A word-level tokenizer of WORDS saved at `path`; its vocabulary size."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import WordLevelTrainer

    tokenizer = Tokenizer(WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    trainer = WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"])
    tokenizer.train_from_iterator([" ".join(WORDS)], trainer)
    tokenizer.save(str(path))
    return int(tokenizer.get_vocab_size())



def test_a_tokenized_jsonl_job_equals_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    vocab = make_tokenizer(tmp_path / "tokenizer.json")
    rng = np.random.default_rng(0)
    with open(tmp_path / "docs.jsonl", "w") as file:
        for _ in range(200):
            text = " ".join(rng.choice(WORDS, int(rng.integers(5, 40))))
            file.write(json.dumps({"body": text}) + "\n")
    (tmp_path / "job.toml").write_text(
        'name = "tokenized"\ndata = "docs.jsonl"\ntokenizer = "tokenizer.json"\n'
        'data_field = "body"\niterations = 4\nmicrobatches = 4\nmicrobatch_size = 4\n'
        '[model]\nkind = "gpt"\nlayers = 2\nwidth = 16\nheads = 2\nseq_len = 16\n'
        f"vocab = {vocab}\n"
        "[optimizer]\nlr = 0.01\n"
    )
    job = load_job(tmp_path / "job.toml")
    # The nodes and this process share one cache folder: both holders build it at prepare.
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "cache"))
    (tmp_path / "logs").mkdir()
    with LocalSwarm(tmp_path / "logs", train=True) as swarm:
        swarm.start(NODES, num_stages=2)
        swarm.wait_formed()
        client = GwtfClient(swarm.procs["z0"].address)
        job_id = client.submit(job)
        result = client.wait(job_id, timeout_s=WAIT_S)
    assert result.state == "completed", result.error
    reference = train_reference(job)
    assert result.loss == reference.loss
    assert result.param_checksum == reference.param_checksum
    assert result.microbatches_trained == 4 * 4 and result.dropped_microbatches == 0
    assert len(list((tmp_path / "cache" / "tokens").glob("*.bin"))) == 1
