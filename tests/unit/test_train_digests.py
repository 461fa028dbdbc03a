"""A job's id is what its files hold, never where they are; a node checks its copies against it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from gwtf.train.checkpoints.checkpoint import job_toml
from gwtf.train.data import DataError, job_corpus, local_files
from gwtf.train.digests import data_digest, file_sha256
from gwtf.train.job import JobError, job_from_dict, load_job

JOB = """
iterations = 3
microbatches = 4
microbatch_size = 2
data = "data/corpus.txt"
tokenizer = "tokenizer.json"

[model]
kind = "gpt"
layers = 2
width = 16
heads = 2
seq_len = 8
vocab = 300
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "cache"))


def a_job(folder: Path, text: bytes = b"the same words, wherever they are kept\n" * 20) -> Path:
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "corpus.txt").write_bytes(text)
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    (folder / "job.toml").write_text(JOB)
    return folder / "job.toml"


def test_the_same_job_copied_to_another_folder_has_the_same_id(tmp_path: Path) -> None:
    first = load_job(a_job(tmp_path / "alice"))
    shutil.copytree(tmp_path / "alice", tmp_path / "elsewhere" / "bob")
    second = load_job(tmp_path / "elsewhere" / "bob" / "job.toml")
    assert first.data != second.data and first.tokenizer != second.tokenizer
    assert first.job_id == second.job_id
    # The job as it travels (pinned, paths and digests) and as a checkpoint keeps it: same id,
    # read back without the files.
    pinned = first.pinned()
    assert pinned.data_sha256 == data_digest(first.data or "")
    assert job_from_dict(pinned.to_dict()).job_id == first.job_id
    (tmp_path / "saved.toml").write_text(job_toml(pinned))
    shutil.rmtree(tmp_path / "alice")
    assert load_job(tmp_path / "saved.toml").job_id == first.job_id


def test_changed_data_bytes_or_tokenizer_make_a_new_job(tmp_path: Path) -> None:
    path = a_job(tmp_path)
    before = load_job(path).job_id
    corpus = tmp_path / "data" / "corpus.txt"
    text = corpus.read_bytes()
    corpus.write_bytes(text.replace(b"same", b"SAME"))  # the same size, other bytes
    assert load_job(path).job_id != before
    corpus.write_bytes(text)
    assert load_job(path).job_id == before
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    assert load_job(path).job_id != before
    # The same bytes read as .jsonl are other documents: another job.
    assert data_digest(corpus) != data_digest(shutil.copy(corpus, tmp_path / "corpus.jsonl"))


def test_a_file_hashed_once_is_known_by_its_identity_until_it_changes(tmp_path: Path) -> None:
    file = tmp_path / "big.txt"
    file.write_bytes(b"a" * 4096)
    old = time.time() - 60  # settled: not written within the racy window
    os.utime(file, (old, old))
    digest = file_sha256(file)
    assert list((tmp_path / "cache" / "digests").iterdir())  # kept for the next process too
    # Its bytes changed under the same identity (a test can do that; an editor cannot): the
    # cache answers, which shows it is used.
    with open(file, "r+b") as handle:
        handle.write(b"b")
    os.utime(file, (old, old))
    assert file_sha256(file) == digest
    os.utime(file, None)  # a write moves mtime: hashed again
    assert file_sha256(file) != digest


def test_a_node_whose_copy_differs_from_the_pinned_job_refuses_it(tmp_path: Path) -> None:
    path = a_job(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    text = JOB.replace('tokenizer = "tokenizer.json"\n', "")
    path.write_text(text)
    job = load_job(path).pinned()
    job_corpus(job)  # the file it was pinned from
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.write_bytes(corpus.read_bytes()[::-1])
    with pytest.raises(DataError) as refused:
        job_corpus(job)
    assert str(refused.value) == (
        f"data {corpus} here has digest {data_digest(corpus)[:12]}, not the job's data_sha256 "
        f"{job.data_sha256[:12] if job.data_sha256 else ''}: it is not the file the job was "
        "submitted with; give this machine the same file, or submit the job again to train on "
        "this one"
    )


def test_a_missing_file_or_a_bad_digest_is_one_sentence(tmp_path: Path) -> None:
    path = a_job(tmp_path)
    (tmp_path / "data" / "corpus.txt").unlink()
    with pytest.raises(JobError) as missing:
        load_job(path).pinned()
    assert str(missing.value) == (
        f"data path {tmp_path / 'data' / 'corpus.txt'} does not exist; give an existing text "
        "file, .jsonl file or folder"
    )
    path.write_text('data_sha256 = "abc"\n' + JOB)
    with pytest.raises(JobError, match="data_sha256 must be 64 lowercase hex digits"):
        load_job(path)
    path.write_text(f'data_sha256 = "{"0" * 64}"\n' + JOB.replace('data = "data/corpus.txt"\n', ""))
    with pytest.raises(JobError, match="data_sha256 pins the content of data, which the job"):
        load_job(path)


def test_files_named_by_url_are_the_same_job_as_the_same_files_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A volunteer need not keep the files at the submitter's path: a URL names them (fsspec;
    file:// here, as nothing may be downloaded), fetched into the cache under the pinned digest."""
    here = load_job(a_job(tmp_path / "here"))
    served = a_job(tmp_path / "server")
    text = (JOB.replace('"data/corpus.txt"', f'"file://{served.parent}/data/corpus.txt"')
            .replace('"tokenizer.json"', f'"file://{served.parent}/tokenizer.json"'))  # fmt: skip
    (tmp_path / "url.toml").write_text(text)
    by_url = load_job(tmp_path / "url.toml")
    assert by_url.data == f"file://{served.parent}/data/corpus.txt"  # not joined to a folder
    assert by_url.job_id == here.job_id
    pinned = by_url.pinned()
    (tmp_path / "pinned.toml").write_text(job_toml(pinned))
    # A node reads the pinned job: the fetched copy, checked; the bytes are the local file's.
    data, tokenizer = local_files(load_job(tmp_path / "pinned.toml"))
    assert data is not None and tokenizer is not None
    assert Path(data).read_bytes() == (served.parent / "data" / "corpus.txt").read_bytes()
    assert Path(data).is_relative_to(tmp_path / "cache" / "remote")
    # Once fetched, a node needs the server no more; another node, with no copy yet, that finds
    # the URL changed refuses the job.
    shutil.rmtree(served.parent / "data")
    assert local_files(pinned)[0] == data
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "another-node"))
    with pytest.raises(DataError) as gone:
        local_files(pinned)
    assert str(gone.value) == f"data {pinned.data} does not exist"
    (served.parent / "data").mkdir()
    (served.parent / "data" / "corpus.txt").write_bytes(b"other words " * 50)
    with pytest.raises(DataError) as changed:
        local_files(pinned)
    assert str(changed.value).startswith(f"data {pinned.data} now has digest ")
    assert str(changed.value).endswith(
        f"not the {(pinned.data_sha256 or '')[:12]} the job pins: it changed since the job was "
        "submitted; submit the job again to train on what it holds now"
    )
    assert not list((tmp_path / "another-node" / "remote").iterdir())  # nothing half kept


def test_a_url_gwtf_cannot_fetch_is_one_sentence(tmp_path: Path) -> None:
    path = a_job(tmp_path)
    path.write_text(JOB.replace('"data/corpus.txt"', '"nosuchscheme://host/corpus.txt"'))
    with pytest.raises(JobError) as refused:
        load_job(path).pinned()
    assert str(refused.value).startswith("cannot fetch data nosuchscheme://host/corpus.txt: ")
    assert "\n" not in str(refused.value)


def test_a_checkpoint_written_before_ids_were_digests_still_loads(tmp_path: Path) -> None:
    import hashlib
    import json

    from gwtf.train.checkpoints.checkpoint import (
        MODEL_FILE,
        MODEL_FORMAT,
        CheckpointError,
        load_model,
        write_tensors,
    )
    from gwtf.train.stage import build_model

    job = load_job(a_job(tmp_path / "job"))
    params = dict(build_model(job.model, job.seed).named_parameters())
    # As it was written then: the job as stated, and the id that hashed it, paths included.
    then = "job-" + hashlib.sha256(json.dumps(job.to_dict(), sort_keys=True, separators=(
        ",", ":")).encode()).hexdigest()[:16]  # fmt: skip
    assert then != job.job_id
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "job.toml").write_text(job_toml(job))
    meta = {"format": MODEL_FORMAT, "job_id": then, "iteration": "2"}
    write_tensors(tmp_path / "old" / MODEL_FILE, params, meta)
    saved = load_model(tmp_path / "old")
    assert saved.iteration == 2 and saved.job.job_id == job.job_id
    write_tensors(tmp_path / "old" / MODEL_FILE, params, {**meta, "job_id": "job-0123456789abcdef"})
    with pytest.raises(CheckpointError, match="is of job job-0123456789abcdef, not of job.toml's"):
        load_model(tmp_path / "old")


def test_reference_with_other_data_drops_the_pinned_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gwtf.cli import main

    path = a_job(tmp_path)
    path.write_text(JOB.replace('tokenizer = "tokenizer.json"\n', "").replace("vocab = 300", ""))
    (tmp_path / "pinned.toml").write_text(job_toml(load_job(path).pinned()))
    (tmp_path / "other.txt").write_bytes(b"some other text to train on " * 10)
    command = (f"reference --job {tmp_path / 'pinned.toml'} --data {tmp_path / 'other.txt'} "
               "--iterations 1 --threads 1 --json")  # fmt: skip
    assert main(command.split()) == 0, capsys.readouterr().err
