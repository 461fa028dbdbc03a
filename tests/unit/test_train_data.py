"""Training data: the default corpus, data files, .jsonl files and folders, bytes or a tokenizer's
ids, the token cache, bounded memory, pure microbatches (the same after a resume), sharding over
holders."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gwtf.train.data import (
    DEFAULT_CORPUS_BYTES,
    Corpus,
    DataError,
    assign_microbatches,
    job_corpus,
    job_microbatch,
    load_corpus,
    microbatch,
    stdlib_sources,
)
from gwtf.train.job import JobConfig, ModelConfig, load_job
from gwtf.train.reference import train_reference


def test_default_corpus_is_the_stdlib_sources_capped_and_repeatable() -> None:
    corpus = load_corpus()
    assert len(corpus) == DEFAULT_CORPUS_BYTES
    assert corpus.tokens.dtype == np.uint8 and corpus.vocab_size == 256
    assert corpus.source.startswith("stdlib:")
    assert load_corpus().digest == corpus.digest
    first = stdlib_sources()[0]
    assert bytes(corpus.tokens[:64]) == first.read_bytes()[:64]
    assert corpus.digest == hashlib.sha256(corpus.tokens.tobytes()).hexdigest()


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


def test_missing_or_empty_data_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist; give an existing text file"):
        load_corpus(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="is empty; give a text file with some content"):
        load_corpus(empty)


def test_data_too_small_for_one_sequence(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_bytes(b"0123456789")
    corpus = load_corpus(path)
    microbatch(corpus, 0, 0, 0, batch_size=2, seq_len=9)  # 9 tokens + 1 label: just fits
    with pytest.raises(DataError, match="too few for one sequence of 10 tokens plus its label"):
        microbatch(corpus, 0, 0, 0, batch_size=2, seq_len=10)
    # The job's corpus, as a node's prepare and `gwtf reference` read it, is refused at once.
    job = JobConfig(model=ModelConfig("gpt", layers=1, width=8, heads=1, seq_len=16),
                    iterations=1, microbatches=1, microbatch_size=1, data=str(path))  # fmt: skip
    with pytest.raises(DataError) as refused:
        job_corpus(job)
    assert str(refused.value) == (
        f"data {path} has 10 tokens, too few for one sequence of 16 tokens plus its label; give "
        "at least 17 tokens"
    )


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


# ---------------------------------------------------------------- formats, tokenizers, the cache

WORDS = "the quick brown fox jumps over a lazy dog while seven small cats watch from far".split()
VOCAB = len(WORDS) + 2  # the words, unknown and end-of-text


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's token caches in its own folder, never the user's."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("GWTF_CACHE", str(folder))
    return folder


def make_tokenizer(folder: Path, *, eot: bool = True) -> Path:
    """A word-level tokenizer trained on WORDS, saved as folder/tokenizer.json."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import WordLevelTrainer

    tokenizer = Tokenizer(WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    specials = ["[UNK]", "<|endoftext|>"] if eot else ["[UNK]"]
    tokenizer.train_from_iterator([" ".join(WORDS)], WordLevelTrainer(special_tokens=specials))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def encode(path: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids)


def sentences(count: int, seed: int = 0, per_line: int = 12) -> str:
    rng = np.random.default_rng(seed)
    return "".join(" ".join(rng.choice(WORDS, per_line)) + "\n" for _ in range(count))


def builds(caplog: pytest.LogCaptureFixture) -> int:
    return sum("building token cache" in r.getMessage() for r in caplog.records)


def one_sentence(error: pytest.ExceptionInfo[DataError], *words: str) -> None:
    text = str(error.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_byte_level_file_is_memory_mapped_with_the_digest_of_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "text.md"
    path.write_bytes(b"some text\n" * 100)
    corpus = load_corpus(path)
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint8
    assert corpus.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert corpus.tokenizer is None and corpus.vocab_size == 256
    assert not (tmp_path / "cache").exists()  # a plain file needs no cache


def test_a_tokenized_file_is_the_tokenizers_ids_in_a_cache(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path)
    text = sentences(20)
    (tmp_path / "text.txt").write_text(text)
    corpus = load_corpus(tmp_path / "text.txt", tokenizer=tokenizer)
    ids = encode(tokenizer, text)
    assert corpus.tokens.tolist() == ids and len(set(ids)) > 5
    assert corpus.tokens.dtype == np.uint16 and isinstance(corpus.tokens, np.memmap)
    assert corpus.vocab_size == VOCAB and corpus.tokenizer == str(tokenizer)
    # The digest is that of the token stream: ids as little-endian uint16.
    assert corpus.digest == hashlib.sha256(np.array(ids, dtype="<u2").tobytes()).hexdigest()
    inputs, labels = microbatch(corpus, 0, 0, 0, batch_size=3, seq_len=8)
    assert int(inputs.max()) < corpus.vocab_size and torch.equal(inputs[:, 1:], labels[:, :-1])


def test_the_default_corpus_through_a_tokenizer(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path)
    corpus = load_corpus(tokenizer=tokenizer, max_bytes=20_000)
    raw = b"".join(path.read_bytes() for path in stdlib_sources()[:40])[:20_000]
    assert corpus.tokens.tolist() == encode(tokenizer, raw.decode("utf-8", errors="replace"))
    assert corpus.source.startswith("stdlib:") and corpus.tokenizer == str(tokenizer)
    assert load_corpus(tokenizer=tokenizer, max_bytes=20_000).digest == corpus.digest


def test_long_documents_are_encoded_in_pieces_with_the_same_tokens(tmp_path: Path) -> None:
    from gwtf.train.data import _PIECE_CHARS

    tokenizer = make_tokenizer(tmp_path)
    lines = sentences(3000)  # many pieces, cut after newlines
    one_line = lines.replace("\n", " ")  # no newline at all: cut after spaces
    assert len(lines) > 5 * _PIECE_CHARS
    for name, text in (("lines.txt", lines), ("line.txt", one_line)):
        (tmp_path / name).write_text(text)
        corpus = load_corpus(tmp_path / name, tokenizer=tokenizer)
        assert corpus.tokens.tolist() == encode(tokenizer, text), name


def test_pieces_depend_on_the_text_only_not_on_how_it_was_read() -> None:
    from gwtf.train.data import _PIECE_CHARS, _pieces

    text = ("héllo wörld ünïcode " * 5000 + "\n") * 4 + "tail without newline " * 3000
    raw = text.encode("utf-8")
    reads = [[raw[i : i + size] for i in range(0, len(raw), size)] for size in (1 << 20, 4097, 3)]
    cut = [list(_pieces(chunks)) for chunks in reads]
    assert cut[0] == cut[1] == cut[2]
    assert "".join(cut[0]) == text and max(map(len, cut[0])) <= _PIECE_CHARS
    assert all(piece.endswith(("\n", " ")) for piece in cut[0][:-1])


def test_jsonl_documents_are_joined_by_end_of_text(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path)
    docs = ["the quick fox", "a lazy dog", "seven cats"]
    lines = [json.dumps({"body": d, "id": i}) for i, d in enumerate(docs)]
    path = tmp_path / "docs.jsonl"
    path.write_text(lines[0] + "\n\n" + lines[1] + "\n" + lines[2] + "\n")  # a blank line
    corpus = load_corpus(path, tokenizer=tokenizer, data_field="body")
    eot = encode(tokenizer, "<|endoftext|>")[0]
    expected = [*encode(tokenizer, docs[0]), eot, *encode(tokenizer, docs[1]), eot,
                *encode(tokenizer, docs[2])]  # fmt: skip
    assert corpus.tokens.tolist() == expected
    # Byte-level: the UTF-8 text, documents joined by the ASCII end-of-text byte.
    as_bytes = load_corpus(path, data_field="body")
    assert bytes(as_bytes.tokens) == "\x03".join(docs).encode()
    assert as_bytes.digest == hashlib.sha256("\x03".join(docs).encode()).hexdigest()
    # A tokenizer without an end-of-text token: documents follow one another.
    plain = make_tokenizer(tmp_path / "plain", eot=False)
    joined = load_corpus(path, tokenizer=plain, data_field="body")
    assert joined.tokens.tolist() == encode(plain, " ".join(docs))


def test_a_folder_is_its_text_and_jsonl_files_in_sorted_relative_path_order(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    files = {
        "b.txt": "bee",
        "a/z.md": "zed",
        "a.rst": "ay",
        "c.jsonl": '{"text": "one"}\n{"text": "two"}\n',
        "notes.csv": "left out",
        ".hidden.txt": "left out",
        ".git/x.txt": "left out",
        "empty.txt": "",
    }
    for name, text in files.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(text)
    corpus = load_corpus(data)
    # "a.rst" < "a/z.md" ('.' sorts before '/'); the empty file adds no document.
    assert bytes(corpus.tokens) == b"ay\x03zed\x03bee\x03one\x03two"
    assert corpus.source == str(data) and len(list((tmp_path / "cache").rglob("*.bin"))) == 1
    tokenizer = make_tokenizer(tmp_path)
    (data / "b.txt").write_text("the fox")
    ids = load_corpus(data, tokenizer=tokenizer).tokens.tolist()
    eot = encode(tokenizer, "<|endoftext|>")[0]
    assert ids.count(eot) == 4 and ids[ids.index(eot) + 3 : ids.index(eot) + 5] == encode(
        tokenizer, "the fox"
    )


def test_the_cache_is_reused_and_follows_the_sources(
    tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.train.data")
    tokenizer = make_tokenizer(tmp_path)
    path = tmp_path / "text.txt"
    path.write_text(sentences(50))
    first = load_corpus(path, tokenizer=tokenizer)
    (built,) = (cache / "tokens").glob("*.bin")
    stamp = built.stat().st_mtime_ns, built.stat().st_ino
    second = load_corpus(path, tokenizer=tokenizer)
    assert builds(caplog) == 1 and (built.stat().st_mtime_ns, built.stat().st_ino) == stamp
    assert second.digest == first.digest and np.array_equal(second.tokens, first.tokens)
    # Other content, another cache and another digest; the tokenizer's own file counts too.
    path.write_text(sentences(50, seed=1))
    assert load_corpus(path, tokenizer=tokenizer).digest != first.digest
    assert builds(caplog) == 2 and len(list((cache / "tokens").glob("*.bin"))) == 2
    assert not list((cache / "tokens").glob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_damaged_cache_is_built_again(
    tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.train.data")
    tokenizer = make_tokenizer(tmp_path)
    path = tmp_path / "text.txt"
    path.write_text(sentences(50))
    good = load_corpus(path, tokenizer=tokenizer)
    expected = good.tokens.tolist()
    (built,) = (cache / "tokens").glob("*.bin")
    raw = bytearray(built.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "flipped":  # header and size intact: only the ids' digest tells
        raw[-1] ^= 0x01
    elif damage == "garbage":
        raw = bytearray(b"not a cache" * 10)
    else:
        raw = bytearray()
    built.write_bytes(bytes(raw))
    again = load_corpus(path, tokenizer=tokenizer)
    assert again.tokens.tolist() == expected and again.digest == good.digest
    assert builds(caplog) == 2 and any("damaged" in r.getMessage() for r in caplog.records)
    load_corpus(path, tokenizer=tokenizer)
    assert builds(caplog) == 2  # whole again


def test_two_builders_at_once_both_end_with_the_whole_cache(
    tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gwtf.train.data")
    tokenizer = make_tokenizer(tmp_path)
    path = tmp_path / "text.txt"
    path.write_text(sentences(40_000))  # about 2.5 MB: the builds overlap
    start = threading.Barrier(2)
    results: list[Corpus] = []

    def build() -> None:
        start.wait()
        results.append(load_corpus(path, tokenizer=tokenizer))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2 and builds(caplog) == 2  # both really built
    assert results[0].digest == results[1].digest
    assert np.array_equal(results[0].tokens, results[1].tokens)
    assert not list((cache / "tokens").glob("*.tmp"))
    third = load_corpus(path, tokenizer=tokenizer)  # the file left in place is whole
    assert builds(caplog) == 2 and third.digest == results[0].digest


def test_loading_takes_bounded_memory_whatever_the_data_size(tmp_path: Path) -> None:
    """Linux only (it reads /proc; CI runs Linux). A fresh process's peak resident memory
    (VmHWM: everything, numpy, torch, the tokenizer's Rust side, mapped file pages) while it
    loads 64 MB of .jsonl through a tokenizer and 96 MB of bytes, against its resident memory
    just before. A control run that reads the 96 MB whole shows that the measure sees a whole
    read."""
    limit = 24 << 20
    tokenizer = make_tokenizer(tmp_path)
    rng = np.random.default_rng(0)
    # Long words the tokenizer does not know: few tokens per byte, so the test stays fast.
    words = ["".join(rng.choice(list("abcdefghij"), 60)) for _ in range(50)]
    line = " ".join(words[:8]) + "\n"
    with open(tmp_path / "big.jsonl", "w") as file:
        for i in range((64 << 20) // (len(line) + 12)):
            file.write(json.dumps({"text": line if i % 2 else line[::-1]}) + "\n")
    with open(tmp_path / "big.bin", "wb") as file:
        for _ in range(96):
            file.write(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    (tmp_path / "warm.txt").write_text("the quick fox\n" * 100)
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    runs = {}
    for mode in ("load", "whole"):
        out = subprocess.run(
            [sys.executable, str(script), str(tmp_path), str(tokenizer), mode],
            capture_output=True, text=True, timeout=240, check=True,
        )  # fmt: skip
        runs[mode] = json.loads(out.stdout)
    loaded, whole = runs["load"], runs["whole"]
    assert loaded["jsonl_tokens"] > 1_000_000 and loaded["bytes"] == whole["bytes"] == 96 << 20
    assert loaded["growth"] < limit, loaded
    assert whole["growth"] > 90 << 20, whole


# ru_maxrss would not do: Linux carries it over exec from the parent's (pytest's) memory. VmHWM is
# the peak of this process's own memory, reset (clear_refs 5) just before the load.
MEASURE = """
import json, sys
from pathlib import Path

from gwtf.train.data import load_corpus, microbatch


def kib(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key + ":")) * 1024


folder, tokenizer, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
load_corpus(folder / "warm.txt", tokenizer=tokenizer)  # first-use costs out: code, threads
microbatch(load_corpus(folder / "warm.txt"), 0, 0, 0, 4, 16)
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass  # the peak then counts from the start: a larger growth, never a smaller one
before = kib("VmRSS")
out = {}
if mode == "whole":
    out["bytes"] = len((folder / "big.bin").read_bytes())
else:
    corpus = load_corpus(folder / "big.jsonl", tokenizer=tokenizer)
    microbatch(corpus, 0, 0, 0, 8, 64)
    out["jsonl_tokens"] = len(corpus)
    corpus = load_corpus(folder / "big.bin")
    microbatch(corpus, 0, 0, 0, 8, 64)
    out["bytes"] = len(corpus)
out["growth"] = kib("VmHWM") - before
print(json.dumps(out))
"""


@pytest.mark.parametrize("order", ["random", "sequential"])
def test_a_resumed_job_feeds_the_microbatches_an_uninterrupted_run_does(
    tmp_path: Path, order: str
) -> None:
    make_tokenizer(tmp_path)
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": sentences(3, seed=i)}) + "\n" for i in range(40))
    )
    job = load_job(write_job(tmp_path, vocab=VOCAB, extra=f'data_order = "{order}"\n'))
    corpus = job_corpus(job)
    uninterrupted = {
        (k, m): job_microbatch(corpus, job, k, m)
        for k in range(job.iterations)
        for m in range(job.microbatches)
    }
    del corpus
    # A restart at iteration 3: a new process loads the data again (here from the cache) and
    # knows nothing but the iteration it resumes at.
    resumed = job_corpus(load_job(tmp_path / "job.toml"))
    for k in range(3, job.iterations):
        for m in reversed(range(job.microbatches)):  # any order of building
            inputs, labels = job_microbatch(resumed, job, k, m)
            assert torch.equal(inputs, uninterrupted[k, m][0])
            assert torch.equal(labels, uninterrupted[k, m][1])
    distinct = {uninterrupted[k, m][0].numpy().tobytes() for k, m in uninterrupted}
    assert len(distinct) == len(uninterrupted)


def test_sequential_order_reads_consecutive_windows_and_wraps(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(bytes(range(256)) * 4)  # 1024 tokens: 127 windows of 8 plus a label
    corpus = load_corpus(path)
    tokens = torch.tensor(corpus.tokens.tolist())
    window = 0
    for k in range(20):  # 20 * 2 * 4 = 160 windows: past the end, so it wraps
        for m in range(2):
            inputs, labels = microbatch(corpus, 0, k, m, 4, 8, order="sequential", microbatches=2)
            for row in range(4):
                start = (window % 127) * 8
                assert torch.equal(inputs[row], tokens[start : start + 8])
                assert torch.equal(labels[row], tokens[start + 1 : start + 9])
                window += 1
    with pytest.raises(ValueError, match="sequential order needs the microbatches"):
        microbatch(corpus, 0, 0, 2, 4, 8, order="sequential", microbatches=2)


def write_job(folder: Path, *, vocab: int, extra: str = "") -> Path:
    path = folder / "job.toml"
    path.write_text(
        'data = "docs.jsonl"\ntokenizer = "tokenizer.json"\n' + extra
        + "iterations = 6\nmicrobatches = 3\nmicrobatch_size = 4\n"
        + '[model]\nkind = "gpt"\nlayers = 2\nwidth = 16\nheads = 2\nseq_len = 8\n'
        + f"vocab = {vocab}\n"
    )  # fmt: skip
    return path


def test_bad_data_is_one_sentence(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path)
    with pytest.raises(DataError) as error:
        load_corpus(tmp_path / "tokenizer.json", tokenizer=tmp_path / "missing.json")
    one_sentence(error, "tokenizer file", "does not exist; give the path of a tokenizer.json")
    with pytest.raises(DataError) as error:
        load_corpus(tokenizer=tmp_path)
    one_sentence(error, "is a folder; give the tokenizer.json file in it")
    (tmp_path / "broken.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(DataError) as error:
        load_corpus(tokenizer=tmp_path / "broken.json")
    one_sentence(error, "is not a Hugging Face tokenizer.json")
    for line, words in [
        ("{not json", ["line 2 is not valid JSON", "give one JSON object per line"]),
        ("[1, 2]", ["line 2 is not a JSON object"]),
        ('{"body": "x"}', ["line 2 has no 'text' key; set data_field"]),
        ('{"text": 3}', ["line 2: 'text' is a int, not a string"]),
    ]:
        (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
        for tok in (None, tokenizer):
            with pytest.raises(DataError) as error:
                load_corpus(tmp_path / "bad.jsonl", tokenizer=tok)
            one_sentence(error, str(tmp_path / "bad.jsonl"), *words)
    assert not list((tmp_path / "cache" / "tokens").glob("*"))  # nothing half-built left
    (tmp_path / "folder" / "sub").mkdir(parents=True)
    (tmp_path / "folder" / "sub" / "table.csv").write_text("a,b\n")
    with pytest.raises(DataError) as error:
        load_corpus(tmp_path / "folder")
    one_sentence(error, "has no .markdown, .md, .rst, .text, .txt or .jsonl files")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataError) as error:
        load_corpus(tmp_path / "blank.jsonl")
    one_sentence(error, "holds no text")


def test_a_model_vocab_smaller_than_the_tokenizer_is_one_sentence(tmp_path: Path) -> None:
    make_tokenizer(tmp_path)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": sentences(5)}) + "\n")
    job = load_job(write_job(tmp_path, vocab=10))
    with pytest.raises(DataError) as error:
        job_corpus(job)
    one_sentence(error, f"tokenizer {tmp_path / 'tokenizer.json'} has {VOCAB} tokens, more "
                 f"than model.vocab = 10; set model.vocab to at least {VOCAB}")  # fmt: skip
    assert not (tmp_path / "cache").exists()  # refused before any work
    # A corpus handed to the reference is checked the same way.
    corpus = job_corpus(dataclasses.replace(job, model=dataclasses.replace(job.model, vocab=VOCAB)))
    with pytest.raises(DataError, match="more than model.vocab = 10"):
        train_reference(job, corpus)


def test_the_cache_folder_must_be_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("GWTF_CACHE", str(tmp_path / "a-file" / "cache"))
    (tmp_path / "docs.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(DataError) as error:
        load_corpus(tmp_path / "docs.jsonl")
    one_sentence(error, "cannot write the token cache in", "set GWTF_CACHE to a writable folder")


def test_a_job_with_a_tokenizer_trains_in_the_reference(tmp_path: Path) -> None:
    make_tokenizer(tmp_path)
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": sentences(4, seed=i)}) + "\n" for i in range(30))
    )
    job = load_job(write_job(tmp_path, vocab=VOCAB))
    result = train_reference(job)
    assert result.iterations_completed == 6 and all(math.isfinite(x) for x in result.loss)
    # The model's output is the tokenizer's ids: its first loss is about ln 18, not ln 256.
    assert abs(result.loss[0] - math.log(VOCAB)) < 0.5, result.loss
    assert result.loss[-1] < result.loss[0]
    assert result.parameters["embed.tok.weight"].shape[0] == VOCAB
    assert train_reference(job).param_checksum == result.param_checksum
