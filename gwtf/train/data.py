"""Byte-level training data: the corpus, the microbatch of (iteration, id), its data holder.

- `load_corpus(None)` reads the Python standard library's `.py` sources of the running
  interpreter (`sysconfig.get_paths()["stdlib"]`, without `site-packages`/`dist-packages`), in
  sorted relative-path order, as bytes, up to `DEFAULT_CORPUS_BYTES`; no download. Another Python
  version has other sources: data holders must agree on `Corpus.digest` (compare it at join).
- `load_corpus(PATH)` reads any file as bytes.
- `microbatch(corpus, seed, iteration, microbatch_id, batch_size, seq_len)` is a pure function:
  random windows of the corpus drawn from a generator seeded by (seed, "data", iteration, id), so
  whoever holds microbatch m of iteration k builds exactly the same tokens and labels.
- `assign_microbatches(count, holders)` shards an iteration's ids over the live data holders.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from gwtf.train.job import JobConfig
from gwtf.train.seeds import seeded_generator

__all__ = [
    "DEFAULT_CORPUS_BYTES",
    "Corpus",
    "DataError",
    "assign_microbatches",
    "check_corpus",
    "job_microbatch",
    "load_corpus",
    "microbatch",
    "stdlib_sources",
]

# 4 MiB: about 1,200 stdlib files, read in tens of milliseconds, far more text than a tiny model
# sees in a few thousand microbatches.
DEFAULT_CORPUS_BYTES = 4 * 1024 * 1024

_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


class DataError(ValueError):
    """The data cannot be used; the message says what to give instead."""


@dataclass(frozen=True)
class Corpus:
    """A byte string as a uint8 tensor, with where it came from and a sha256 to compare."""

    tokens: Tensor = field(repr=False)
    source: str
    digest: str

    def __len__(self) -> int:
        return int(self.tokens.numel())


def stdlib_sources(root: str | None = None) -> list[Path]:
    """The `.py` files under the stdlib folder, sorted by relative path, site-packages excluded."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in _NOT_STDLIB]
        found.extend(Path(folder, name) for name in files if name.endswith(".py"))
    return sorted(found, key=lambda path: path.relative_to(base).as_posix())


def _corpus(raw: bytes, source: str) -> Corpus:
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return Corpus(tokens=tokens, source=source, digest=hashlib.sha256(raw).hexdigest())


def load_corpus(path: str | Path | None = None, *, max_bytes: int = DEFAULT_CORPUS_BYTES) -> Corpus:
    """The training text: `path` (all of it), or the stdlib sources capped at `max_bytes`."""
    if path is not None:
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise DataError(
                f"data file {path} does not exist; give an existing text file"
            ) from None
        except IsADirectoryError:
            raise DataError(f"data path {path} is a folder; give a text file") from None
        except OSError as exc:
            raise DataError(f"cannot read data file {path}: {exc.strerror or exc}") from None
        if not raw:
            raise DataError(f"data file {path} is empty; give a text file with some content")
        return _corpus(raw, str(path))
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
    return _corpus(b"".join(chunks), f"stdlib:{root}")


def check_corpus(corpus: Corpus, seq_len: int) -> None:
    """Raise DataError if the corpus cannot give one sequence of `seq_len` tokens plus a label."""
    if len(corpus) < seq_len + 1:
        raise DataError(
            f"data {corpus.source} has {len(corpus)} bytes, too few for one sequence of "
            f"{seq_len} tokens plus its label; give at least {seq_len + 1} bytes"
        )


def microbatch(
    corpus: Corpus,
    seed: int,
    iteration: int,
    microbatch_id: int,
    batch_size: int,
    seq_len: int,
) -> tuple[Tensor, Tensor]:
    """Inputs and labels, int64 [batch_size, seq_len]: windows at random offsets, labels shifted.

    The offsets depend only on the arguments (and the corpus length), never on the caller.
    """
    check_corpus(corpus, seq_len)
    generator = seeded_generator(seed, "data", iteration, microbatch_id)
    starts = torch.randint(0, len(corpus) - seq_len, (batch_size,), generator=generator)
    windows = corpus.tokens[starts[:, None] + torch.arange(seq_len + 1)].to(torch.int64)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def job_microbatch(
    corpus: Corpus, job: JobConfig, iteration: int, microbatch_id: int
) -> tuple[Tensor, Tensor]:
    """`microbatch` with the job's seed and sizes."""
    return microbatch(
        corpus, job.seed, iteration, microbatch_id, job.microbatch_size, job.model.seq_len
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
