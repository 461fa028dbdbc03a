"""Byte-level data: the default corpus, data files, pure microbatches, sharding over holders."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from gwtf.train.data import (
    DEFAULT_CORPUS_BYTES,
    DataError,
    assign_microbatches,
    load_corpus,
    microbatch,
    stdlib_sources,
)


def test_default_corpus_is_the_stdlib_sources_capped_and_repeatable() -> None:
    corpus = load_corpus()
    assert len(corpus) == DEFAULT_CORPUS_BYTES
    assert corpus.tokens.dtype == torch.uint8
    assert corpus.source.startswith("stdlib:")
    assert load_corpus().digest == corpus.digest
    first = stdlib_sources()[0]
    assert bytes(corpus.tokens[:64].tolist()) == first.read_bytes()[:64]


def test_stdlib_sources_are_sorted_and_leave_out_installed_packages() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    sources = stdlib_sources()
    relative = [path.relative_to(root).as_posix() for path in sources]
    assert relative == sorted(relative)
    assert all(path.suffix == ".py" for path in sources)
    assert not any(
        part in ("site-packages", "dist-packages") for r in relative for part in r.split("/")
    )


def test_small_cap_and_a_data_file(tmp_path: Path) -> None:
    assert len(load_corpus(max_bytes=1000)) == 1000
    path = tmp_path / "text.txt"
    path.write_bytes(b"hello world, " * 10)
    corpus = load_corpus(path)
    assert len(corpus) == 130 and corpus.source == str(path)


def test_missing_empty_or_folder_data_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist; give an existing text file"):
        load_corpus(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="is empty; give a text file with some content"):
        load_corpus(empty)
    with pytest.raises(DataError, match="is a folder; give a text file"):
        load_corpus(tmp_path)


def test_data_too_small_for_one_sequence(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_bytes(b"0123456789")
    corpus = load_corpus(path)
    microbatch(corpus, 0, 0, 0, batch_size=2, seq_len=9)  # 9 tokens + 1 label: just fits
    with pytest.raises(DataError, match="too few for one sequence of 10 tokens plus its label"):
        microbatch(corpus, 0, 0, 0, batch_size=2, seq_len=10)


def test_microbatch_is_a_pure_function_of_seed_iteration_and_id() -> None:
    corpus = load_corpus()
    inputs, labels = microbatch(corpus, 3, 5, 7, batch_size=4, seq_len=32)
    assert inputs.shape == labels.shape == (4, 32)
    assert inputs.dtype == labels.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    again = microbatch(corpus, 3, 5, 7, batch_size=4, seq_len=32)
    assert torch.equal(again[0], inputs) and torch.equal(again[1], labels)
    for other in [(4, 5, 7), (3, 6, 7), (3, 5, 8)]:
        assert not torch.equal(microbatch(corpus, *other, batch_size=4, seq_len=32)[0], inputs)


def test_microbatches_are_dealt_round_robin_over_sorted_holders() -> None:
    assert assign_microbatches(7, ["h2", "h1", "h3"]) == {
        "h1": (0, 3, 6),
        "h2": (1, 4),
        "h3": (2, 5),
    }
    assert assign_microbatches(2, ["b", "a", "c"]) == {"a": (0,), "b": (1,), "c": ()}
    with pytest.raises(ValueError, match="no data holder"):
        assign_microbatches(3, [])
