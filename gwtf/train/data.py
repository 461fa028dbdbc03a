"""Training data: the corpus (bytes or a tokenizer's ids), the microbatch of (iteration, id).

Sources, the job's `data` key (`load_corpus(path)`):

- none: the Python standard library's `.py` sources of the running interpreter
  (`sysconfig.get_paths()["stdlib"]`, without `site-packages`/`dist-packages`), in sorted
  relative-path order, concatenated, up to `DEFAULT_CORPUS_BYTES`; no download. Another Python
  version has other sources: data holders must agree on `Corpus.digest` (compared at prepare).
- a file whose name ends in `.jsonl`: one JSON object per line, a document each, its text under
  the job's `data_field` (default "text"); blank lines are skipped.
- any other file: one document, its bytes as UTF-8 text.
- a folder: its files ending in `TEXT_SUFFIXES` (a document each) and `.jsonl` (as above), found
  recursively, names starting with "." skipped, in sorted relative-path order.

Tokens:

- byte-level (no tokenizer): a token is a byte (vocabulary 256). A single text file is
  memory-mapped as it is, and the default corpus is its bytes, both exactly as before tokenizers
  existed. The documents of a .jsonl file or a folder are joined by `BYTE_EOT` (0x03, ASCII "end
  of text").
- a tokenizer (the job's `tokenizer`, a Hugging Face `tokenizer.json`): each document is encoded
  without the tokenizer's own special tokens, in pieces of about `_PIECE_CHARS` characters cut
  after a newline where there is one (so memory stays bounded whatever the document's size), and
  documents are joined by the first of `EOT_TOKENS` the tokenizer knows (by nothing if it knows
  none). The ids are stored as uint16 where the vocabulary fits, else uint32.

Everything but a single byte-level file and the default corpus goes through a token cache: one
streamed pass writes the ids to a file that is then memory-mapped, so no source is ever read
whole into memory. The cache lives in `$GWTF_CACHE` (default `$XDG_CACHE_HOME/gwtf`, else
`~/.cache/gwtf`), under `tokens/`, named by a sha256 of the sources' contents and names, the
tokenizer file, `data_field`, the tokenizers release and this module's format. A builder writes
to a temporary name and renames it into place (`os.replace`), so two processes building the same
cache at once both end with a whole one; a cache whose header, size or content digest is wrong is
rebuilt.

`Corpus.digest` is the sha256 of the token stream (ids as little-endian integers of the stored
width; for bytes, the sha256 of the bytes): the same on every machine with the same data and
tokenizer, which the data holders compare at prepare.

`microbatch(corpus, seed, iteration, microbatch_id, batch_size, seq_len)` is a pure function of
its arguments and the corpus: whoever holds microbatch m of iteration k builds exactly the same
tokens and labels, and the data position is the iteration itself. A job restarted at iteration
k (a fresh process, a new `Corpus` of the same data) feeds exactly the microbatches an
uninterrupted run feeds at k, with no data state to save or restore.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import struct
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from gwtf.train.digests import (
    JSONL_SUFFIX,
    TEXT_SUFFIXES,
    DigestError,
    cache_dir,
    data_digest,
    data_files,
    file_sha256,
    tokenizer_digest,
)
from gwtf.train.job import BYTE_VOCAB, DATA_ORDERS, JobConfig
from gwtf.train.remote import data_location, tokenizer_location
from gwtf.train.seeds import seeded_generator

__all__ = [
    "BYTE_EOT",
    "DEFAULT_CORPUS_BYTES",
    "EOT_TOKENS",
    "JSONL_SUFFIX",
    "TEXT_SUFFIXES",
    "Corpus",
    "DataError",
    "assign_microbatches",
    "cache_dir",
    "check_corpus",
    "job_corpus",
    "job_microbatch",
    "load_corpus",
    "microbatch",
    "stdlib_sources",
]

log = logging.getLogger(__name__)

# 4 MiB: about 1,200 stdlib files, read in tens of milliseconds, far more text than a tiny model
# sees in a few thousand microbatches.
DEFAULT_CORPUS_BYTES = 4 * 1024 * 1024

# Files of a folder read as one text document each; `.jsonl` files as one document per line.

# Byte-level documents are joined by ASCII ETX ("end of text"), a byte plain text never holds.
BYTE_EOT = 0x03
# The end-of-text tokens looked up in a tokenizer, first found wins (GPT-2, Llama 3, Llama 2 and
# T5, Gemma, others).
EOT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")

_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}

_READ_BYTES = 1 << 20  # one read of a source or of the cache: memory per step of a pass
_PIECE_CHARS = 1 << 14  # text encoded by one tokenizer call
_BATCH_CHARS = 1 << 18  # text handed to the tokenizer at once (it works in parallel)
# The cache file: magic, id width in bytes, token count, sha256 of the ids; ids from byte 64 on.
_MAGIC = b"GWTFTOK\x01"
_HEADER = struct.Struct("<8sB7xQ32s8x")
_FORMAT = 1  # bump when what is written for the same sources changes


class DataError(ValueError):
    """The data cannot be used; the message says what to give instead."""


TokenArray = NDArray[np.unsignedinteger[Any]]


@dataclass(frozen=True, eq=False)
class Corpus:
    """A token stream, memory-mapped or small enough to hold, with a sha256 to compare.

    `tokens` is a read-only 1-D array of uint8 (bytes), uint16 or uint32 ids below `vocab_size`;
    a memory-mapped one reads from disk only the windows a microbatch takes.
    """

    tokens: TokenArray = field(repr=False)
    source: str
    digest: str
    vocab_size: int = BYTE_VOCAB
    tokenizer: str | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def windows(self, starts: Sequence[int] | NDArray[np.int64], length: int) -> Tensor:
        """int64 [len(starts), length]: `tokens[s : s + length]` for each start `s`."""
        offsets = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
        return torch.from_numpy(self.tokens[offsets].astype(np.int64))


def stdlib_sources(root: str | None = None) -> list[Path]:
    """The `.py` files under the stdlib folder, sorted by relative path, site-packages excluded."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in _NOT_STDLIB]
        found.extend(Path(folder, name) for name in files if name.endswith(".py"))
    return sorted(found, key=lambda path: path.relative_to(base).as_posix())


def load_corpus(
    path: str | Path | None = None,
    *,
    tokenizer: str | Path | None = None,
    data_field: str = "text",
    max_vocab: int | None = None,
    max_bytes: int = DEFAULT_CORPUS_BYTES,
    pretrained: str | None = None,
) -> Corpus:
    """The training tokens of `path` (a file, a .jsonl file or a folder; default: the stdlib
    sources capped at `max_bytes`), bytes or the ids of the `tokenizer` file.

    `max_vocab` is the model's vocabulary: a tokenizer with more ids is refused before any work
    (`pretrained`: the folder the vocabulary comes from, which the refusal then names, since
    model.vocab is not the user's to change there). Raises DataError.
    """
    encoder = _ByteEncoder() if tokenizer is None else _TokenizerEncoder.load(Path(tokenizer))
    if max_vocab is not None and encoder.vocab_size > max_vocab:
        what = "byte-level data has" if tokenizer is None else f"tokenizer {tokenizer} has"
        raise DataError(f"{what} {encoder.vocab_size} tokens, "
                        f"{_vocab_fix(max_vocab, encoder.vocab_size, pretrained)}")  # fmt: skip
    if path is None:
        raw, root = _stdlib_bytes(max_bytes)
        if isinstance(encoder, _ByteEncoder):
            tokens = np.frombuffer(raw, dtype=np.uint8)
            return Corpus(tokens, f"stdlib:{root}", hashlib.sha256(raw).hexdigest())
        sources: list[_Source] = [_Source(None, "stdlib", jsonl=False, raw=raw)]
        return _cached(sources, encoder, f"stdlib:{root}", data_field)
    path = Path(path)
    sources = _sources(path)
    if isinstance(encoder, _ByteEncoder) and path.is_file() and not sources[0].jsonl:
        return _mapped_file(path)
    return _cached(sources, encoder, str(path), data_field)


def job_corpus(job: JobConfig) -> Corpus:
    """The job's corpus: its `data`, `tokenizer` and `data_field`, the tokenizer checked against
    `model.vocab`, the files checked against the digests the job pins (and fetched first where
    the job names them by URL, `gwtf.train.remote`). Raises DataError."""
    data, tokenizer = local_files(job)
    corpus = load_corpus(
        data, tokenizer=tokenizer, data_field=job.data_field, max_vocab=job.model.vocab,
        pretrained=job.model.pretrained,
    )
    check_corpus(corpus, job.model.seq_len, vocab=job.model.vocab,
                 pretrained=job.model.pretrained)  # fmt: skip
    return corpus


def _vocab_fix(vocab: int, needed: int, pretrained: str | None) -> str:
    """The end of a refusal of `needed` token ids for a model of `vocab`: what to change."""
    if pretrained is None:
        return f"more than model.vocab = {vocab}; set model.vocab to at least {needed}"
    return (
        f"more than the {vocab} token embeddings of the pretrained model {pretrained} "
        f"(vocab_size in its config.json, which model.vocab must equal); give a tokenizer of at "
        "most that many tokens, such as the one the model was trained with"
    )


def local_files(job: JobConfig) -> tuple[str | None, str | None]:
    """The job's data and tokenizer on this machine (a URL fetched into the cache first); DataError
    if either is not what the job pins (another copy, or a file changed since the job was
    submitted)."""
    pins = (("data", job.data, job.data_sha256, data_location, data_digest),
            ("tokenizer", job.tokenizer, job.tokenizer_sha256, tokenizer_location,
             tokenizer_digest))  # fmt: skip
    found: list[str | None] = []
    for key, location, pinned, locate, digest_of in pins:
        if location is None:
            found.append(None)
            continue
        try:
            path, fetched = locate(location, pinned)  # a fetched URL is checked as it comes
            here = fetched or (digest_of(path) if pinned is not None else None)
        except DigestError as err:
            raise DataError(str(err)) from None
        if pinned is not None and here != pinned:
            raise DataError(
                f"{key} {location} here has digest {(here or '')[:12]}, not the job's "
                f"{key}_sha256 {pinned[:12]}: it is not the file the job was submitted with; give "
                "this machine the same file, or submit the job again to train on this one"
            )
        found.append(str(path))
    return found[0], found[1]


def check_corpus(
    corpus: Corpus, seq_len: int, *, vocab: int | None = None, pretrained: str | None = None
) -> None:
    """Raise DataError if the corpus cannot give one sequence of `seq_len` tokens plus a label,
    or if its ids do not fit a model of `vocab` tokens (from the `pretrained` folder if given)."""
    if len(corpus) < seq_len + 1:
        raise DataError(
            f"data {corpus.source} has {len(corpus)} tokens, too few for one sequence of "
            f"{seq_len} tokens plus its label; give at least {seq_len + 1} tokens"
        )
    if vocab is not None and corpus.vocab_size > vocab:
        raise DataError(
            f"data {corpus.source} has a vocabulary of {corpus.vocab_size} tokens, "
            f"{_vocab_fix(vocab, corpus.vocab_size, pretrained)}"
        )


def microbatch(
    corpus: Corpus,
    seed: int,
    iteration: int,
    microbatch_id: int,
    batch_size: int,
    seq_len: int,
    *,
    order: str = "random",
    microbatches: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Inputs and labels, int64 [batch_size, seq_len]: windows of the corpus, labels shifted.

    `order="random"`: offsets drawn from a generator seeded by (seed, "data", iteration, id).
    `order="sequential"`: row r of microbatch id of iteration k is window
    `w = (k * microbatches + id) * batch_size + r` of the corpus cut into consecutive windows of
    `seq_len` tokens plus a label, counted modulo their number (each epoch the same windows).

    The windows depend only on the arguments and the corpus, never on the caller or on what was
    built before: the data position is the iteration, so a job resumed at iteration k feeds the
    same microbatches an uninterrupted run does.
    """
    check_corpus(corpus, seq_len)
    if order == "random":
        generator = seeded_generator(seed, "data", iteration, microbatch_id)
        drawn = torch.randint(0, len(corpus) - seq_len, (batch_size,), generator=generator)
        starts: NDArray[np.int64] = drawn.numpy()
    elif order == "sequential":
        if microbatches is None or not 0 <= microbatch_id < microbatches:
            raise ValueError(
                f"sequential order needs the microbatches per iteration and an id below it, "
                f"got id {microbatch_id} of {microbatches}"
            )
        count = (len(corpus) - 1) // seq_len
        first = (iteration * microbatches + microbatch_id) * batch_size
        starts = np.array(
            [((first + row) % count) * seq_len for row in range(batch_size)], dtype=np.int64
        )
    else:
        raise ValueError(f"data order must be one of {', '.join(DATA_ORDERS)}, got {order!r}")
    windows = corpus.windows(starts, seq_len + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def job_microbatch(
    corpus: Corpus, job: JobConfig, iteration: int, microbatch_id: int
) -> tuple[Tensor, Tensor]:
    """`microbatch` with the job's seed, sizes and data order."""
    return microbatch(
        corpus,
        job.seed,
        iteration,
        microbatch_id,
        job.microbatch_size,
        job.model.seq_len,
        order=job.data_order,
        microbatches=job.microbatches,
    )


def assign_microbatches(count: int, holders: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Microbatch ids `0..count-1` dealt round-robin over the data holders sorted by id.

    Holder `sorted(holders)[j]` gets ids j, j + H, j + 2H, ... (H holders). Every holder is a key,
    possibly with no ids. The batch of an id does not depend on its holder, so any assignment
    trains the same model; this one is only balanced and deterministic.
    """
    ordered = sorted(set(holders))
    if not ordered:
        raise ValueError("no data holder to assign microbatches to")
    if count < 0:
        raise ValueError(f"microbatch count must be zero or positive, got {count}")
    return {holder: tuple(range(j, count, len(ordered))) for j, holder in enumerate(ordered)}


# ---------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class _Source:
    """One file of the data (or the default corpus's bytes, `raw`), by its name in the data."""

    path: Path | None
    name: str
    jsonl: bool
    raw: bytes | None = None


def _stdlib_bytes(max_bytes: int) -> tuple[bytes, str]:
    root = sysconfig.get_paths()["stdlib"]
    chunks: list[bytes] = []
    size = 0
    for source in stdlib_sources(root):
        if size >= max_bytes:
            break
        try:
            data = source.read_bytes()
        except OSError:
            continue  # an unreadable file is skipped the same way on every machine that has it
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
    if size == 0:
        raise DataError(
            f"found no Python sources under {root} for the default data; give a data file"
        )
    return b"".join(chunks), root


def _sources(path: Path) -> list[_Source]:
    """The files of `path` in their order; DataError if there is none."""
    if path.is_dir():
        found = [_Source(file, file.relative_to(path).as_posix(),
                         jsonl=file.suffix.lower() == JSONL_SUFFIX)
                 for file in data_files(path, on_error=_unreadable)]  # fmt: skip
        if not found:
            raise DataError(
                f"data folder {path} has no {', '.join(TEXT_SUFFIXES)} or {JSONL_SUFFIX} files; "
                "put the training text in such files"
            )
        return found
    if not path.exists():
        raise DataError(
            f"data path {path} does not exist; give an existing text file, .jsonl file or folder"
        )
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read data file {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise DataError(f"data file {path} is empty; give a text file with some content")
    return [_Source(path, path.name, jsonl=path.suffix.lower() == JSONL_SUFFIX)]


def _unreadable(error: OSError) -> None:
    """A data folder that cannot be listed is refused, not skipped: machines would differ."""
    raise DataError(f"cannot read data folder {error.filename}: {error.strerror or error}")


def _chunks(source: _Source) -> Iterator[bytes]:
    """The bytes of a source, `_READ_BYTES` at a time."""
    if source.raw is not None:
        yield source.raw
        return
    assert source.path is not None
    try:
        with open(source.path, "rb") as file:
            while chunk := file.read(_READ_BYTES):
                yield chunk
    except OSError as exc:
        raise DataError(f"cannot read data file {source.path}: {exc.strerror or exc}") from None


def _documents(source: _Source, data_field: str) -> Iterator[Iterable[bytes]]:
    """The documents of a source, each as UTF-8 chunks: the whole file, or one per .jsonl line."""
    if not source.jsonl:
        yield _chunks(source)
        return
    assert source.path is not None
    try:
        with open(source.path, "rb") as file:
            for number, line in enumerate(file, start=1):
                if line.strip():
                    text = _jsonl_text(source.path, number, line, data_field)
                    yield (text.encode("utf-8", errors="replace"),)
    except OSError as exc:
        raise DataError(f"cannot read data file {source.path}: {exc.strerror or exc}") from None


def _jsonl_text(path: Path, number: int, line: bytes, data_field: str) -> str:
    try:
        record = json.loads(line)
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise DataError(
            f"{path} line {number} is not valid JSON ({reason}); give one JSON object per line"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"{path} line {number} is not a JSON object; give one object per line")
    if data_field not in record:
        raise DataError(
            f"{path} line {number} has no {data_field!r} key; set data_field to the key that "
            "holds the text"
        )
    text = record[data_field]
    if not isinstance(text, str):
        raise DataError(
            f"{path} line {number}: {data_field!r} is a {type(text).__name__}, not a string; "
            "set data_field to the key that holds the text"
        )
    return text


def _sha256_of(chunks: Iterable[bytes]) -> str:
    hasher = hashlib.sha256()
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()


def _source_sha256(source: _Source) -> str:
    """A source's sha256, a file's cached by its identity (`gwtf.train.digests.file_sha256`)."""
    if source.path is None:
        return _sha256_of(_chunks(source))
    try:
        return file_sha256(source.path, "data file")
    except DigestError as err:
        raise DataError(str(err)) from None


def _mapped_file(path: Path) -> Corpus:
    """A byte-level file as it is: memory-mapped, its sha256 computed in one streamed read."""
    digest = _source_sha256(_Source(path, path.name, jsonl=False))
    try:
        tokens = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot map data file {path}: {exc}") from None
    return Corpus(tokens, str(path), digest)


# ---------------------------------------------------------------------------- encoders


class _TokenWriter:
    """Appends ids to the cache file, hashing and counting them; joins documents by `eot`."""

    def __init__(self, file: IO[bytes], dtype: np.dtype[Any], eot: int | None) -> None:
        self._file = file
        self._dtype = dtype
        self._eot = eot
        self._hasher = hashlib.sha256()
        self._pending = False
        self.count = 0

    def begin_document(self) -> None:
        """The next ids start a document: an end-of-text goes first if anything came before."""
        self._pending = self.count > 0 and self._eot is not None

    def write(self, ids: Sequence[int] | bytes) -> None:
        if len(ids) == 0:
            return
        if self._pending:
            self._pending = False
            assert self._eot is not None
            self._put(np.array([self._eot], dtype=self._dtype).tobytes())
        if isinstance(ids, bytes):
            assert self._dtype.itemsize == 1
            self._put(ids)
        else:
            self._put(np.asarray(ids, dtype=self._dtype).tobytes())

    def _put(self, data: bytes) -> None:
        self._file.write(data)
        self._hasher.update(data)
        self.count += len(data) // self._dtype.itemsize

    @property
    def digest(self) -> bytes:
        return self._hasher.digest()


class _ByteEncoder:
    """Byte-level: a token is a byte; documents joined by BYTE_EOT."""

    vocab_size = BYTE_VOCAB
    dtype: np.dtype[Any] = np.dtype(np.uint8)
    eot: int | None = BYTE_EOT
    identity: dict[str, Any] = {"tokens": "bytes"}

    def encode(self, documents: Iterable[Iterable[bytes]], out: _TokenWriter) -> None:
        for chunks in documents:
            out.begin_document()
            for chunk in chunks:
                out.write(chunk)


class _TokenizerEncoder:
    """A Hugging Face tokenizer: documents cut into pieces, pieces encoded in batches."""

    def __init__(self, tokenizer: Any, path: Path, text: bytes) -> None:
        import tokenizers

        self._tokenizer = tokenizer
        self.path = path
        vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
        if not vocab:
            raise DataError(f"tokenizer {path} has an empty vocabulary; give a trained tokenizer")
        self.vocab_size = max(max(vocab.values()) + 1, tokenizer.get_vocab_size(True))
        self.dtype: np.dtype[Any] = np.dtype("<u2" if self.vocab_size <= 1 << 16 else "<u4")
        self.eot: int | None = next((vocab[t] for t in EOT_TOKENS if t in vocab), None)
        self.identity = {
            "tokenizer": hashlib.sha256(text).hexdigest(),
            "tokenizers": tokenizers.__version__,
            "piece": _PIECE_CHARS,
        }

    @classmethod
    def load(cls, path: Path) -> _TokenizerEncoder:
        """Read a tokenizer.json; DataError if missing or not a tokenizer."""
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise DataError(
                f"tokenizer file {path} does not exist; give the path of a tokenizer.json "
                "(Hugging Face tokenizers)"
            ) from None
        except IsADirectoryError:
            raise DataError(
                f"tokenizer path {path} is a folder; give the tokenizer.json file in it"
            ) from None
        except OSError as exc:
            raise DataError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from None
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_str(text.decode("utf-8"))
        except Exception as exc:  # the Rust side raises a plain Exception with its reason
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(
                f"tokenizer file {path} is not a Hugging Face tokenizer.json ({reason}); give "
                "one saved by the tokenizers package"
            ) from None
        # A saved padding or truncation setting would change or cut the pieces.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(tokenizer, path, text)

    def encode(self, documents: Iterable[Iterable[bytes]], out: _TokenWriter) -> None:
        # Items in stream order: a piece of text, or None where a document begins.
        batch: list[str | None] = []
        chars = 0
        for chunks in documents:
            batch.append(None)
            for piece in _pieces(chunks):
                batch.append(piece)
                chars += len(piece)
                if chars >= _BATCH_CHARS:
                    self._flush(batch, out)
                    batch, chars = [], 0
        self._flush(batch, out)

    def _flush(self, batch: list[str | None], out: _TokenWriter) -> None:
        texts = [item for item in batch if item is not None]
        encoded = iter(self._tokenizer.encode_batch_fast(texts, add_special_tokens=False))
        for item in batch:
            if item is None:
                out.begin_document()
            else:
                out.write(next(encoded).ids)


def _pieces(chunks: Iterable[bytes]) -> Iterator[str]:
    """A document's text in pieces of at most `_PIECE_CHARS`, each cut after its last newline
    (else its last space) where it has one. The cuts depend only on the text, not on how it was
    read, so every machine encodes the same pieces."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer = ""
    chunks = iter(chunks)
    done = False
    while not done:
        chunk = next(chunks, None)
        done = chunk is None
        buffer += decoder.decode(chunk or b"", final=done)
        start = 0
        while len(buffer) - start >= _PIECE_CHARS or (done and start < len(buffer)):
            end = min(start + _PIECE_CHARS, len(buffer))
            if end - start == _PIECE_CHARS:
                cut = buffer.rfind("\n", start, end)
                if cut < 0:
                    cut = buffer.rfind(" ", start, end)
                end = cut + 1 if cut >= start else end
            yield buffer[start:end]
            start = end
        buffer = buffer[start:]


# ---------------------------------------------------------------------------- the cache

_Encoder = _ByteEncoder | _TokenizerEncoder


def _cached(sources: list[_Source], encoder: _Encoder, label: str, data_field: str) -> Corpus:
    """The sources' tokens from the cache, built first if missing or damaged."""
    key = _cache_key(sources, encoder, data_field)
    folder = cache_dir() / "tokens"
    path = folder / f"{key}.bin"
    tokenizer = str(encoder.path) if isinstance(encoder, _TokenizerEncoder) else None
    opened = _open_cache(path, encoder.dtype)
    if opened is None:
        if path.exists():
            log.warning("token cache %s is damaged; building it again", path)
        opened = _build_cache(path, sources, encoder, label, data_field)
    tokens, digest = opened
    return Corpus(tokens, label, digest, encoder.vocab_size, tokenizer)


def _cache_key(sources: list[_Source], encoder: _Encoder, data_field: str) -> str:
    listed = [[s.name, s.jsonl, _source_sha256(s)] for s in sources]
    identity = {
        "format": _FORMAT,
        "encoder": encoder.identity,
        "data_field": data_field,
        "sources": listed,
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _open_cache(path: Path, dtype: np.dtype[Any]) -> tuple[TokenArray, str] | None:
    """The cache's ids memory-mapped and its digest, or None if it is missing or damaged: a
    wrong header, a wrong size, or ids whose sha256 is not the recorded one."""
    try:
        with open(path, "rb") as file:
            header = file.read(_HEADER.size)
            if len(header) != _HEADER.size:
                return None
            magic, width, count, digest = _HEADER.unpack(header)
            size = os.fstat(file.fileno()).st_size
            if (magic, width) != (_MAGIC, dtype.itemsize) or count == 0:
                return None
            if size != _HEADER.size + count * width:
                return None
            hasher = hashlib.sha256()
            while chunk := file.read(_READ_BYTES):
                hasher.update(chunk)
            if hasher.digest() != digest:
                return None
        tokens = np.memmap(path, dtype=dtype, mode="r", offset=_HEADER.size, shape=(count,))
    except (OSError, ValueError):
        return None
    return tokens, digest.hex()


def _build_cache(
    path: Path, sources: list[_Source], encoder: _Encoder, label: str, data_field: str
) -> tuple[TokenArray, str]:
    """Encode the sources into `path` in one streamed pass; DataError if they hold no text."""
    log.info("building token cache %s from %s", path, label)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    except OSError as exc:
        raise DataError(
            f"cannot write the token cache in {path.parent}: {exc.strerror or exc}; set "
            "GWTF_CACHE to a writable folder"
        ) from None
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(bytes(_HEADER.size))
            out = _TokenWriter(file, encoder.dtype, encoder.eot)
            documents = (doc for source in sources for doc in _documents(source, data_field))
            encoder.encode(documents, out)
            if out.count == 0:
                raise DataError(f"data {label} holds no text; give files with some content")
            file.seek(0)
            file.write(_HEADER.pack(_MAGIC, encoder.dtype.itemsize, out.count, out.digest))
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, 0o644)
        # Mapped before the rename: these are this builder's ids whatever another one renames.
        tokens = np.memmap(temp, dtype=encoder.dtype, mode="r", offset=_HEADER.size)
        os.replace(temp, path)
    except OSError as exc:
        raise DataError(
            f"cannot write the token cache in {path.parent}: {exc.strerror or exc}; set "
            "GWTF_CACHE to a writable folder with room for it"
        ) from None
    finally:
        Path(temp).unlink(missing_ok=True)
    return tokens, out.digest.hex()
