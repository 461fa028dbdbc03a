"""What a job's files contain, as sha256 digests: the job's id is made of these, never of paths.

A job names its model weights (`model.pretrained`), its tokenizer and its data by paths, which
differ from machine to machine; what makes two jobs the same is what those paths hold. Each is
summed here into one digest:

- a file (a tokenizer, a data file): the sha256 of its bytes; a data file's digest also says
  whether it is read as `.jsonl` (one document per line) or as one text, since the same bytes give
  other tokens either way;
- a folder: the sha256 of the sorted list of (relative name, sha256) of the files that are read
  from it, the names being part of the content (they order the documents of a data folder and say
  which file is the config of a model folder). A data folder's files are those `gwtf.train.data`
  reads; a pretrained folder's are `config.json` and its safetensors files (and their index).

Files are read in 1 MiB pieces, never whole. A file's sha256 is cached by its identity (resolved
path, size, mtime_ns, inode), in memory and in `digests/` of the gwtf cache folder, so a job file
submitted again, or a node preparing its next job, reads a large file once. As git does with its
index, a file modified within `RACY_S` of being hashed is not cached: a write that lands within
the file system's timestamp granularity could leave size and mtime unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "JSONL_SUFFIX",
    "TEXT_SUFFIXES",
    "DigestError",
    "cache_dir",
    "data_digest",
    "data_files",
    "file_sha256",
    "is_data_file",
    "is_pretrained_file",
    "pretrained_digest",
    "tokenizer_digest",
]

TEXT_SUFFIXES = (".markdown", ".md", ".rst", ".text", ".txt")
JSONL_SUFFIX = ".jsonl"
READ_BYTES = 1 << 20
RACY_S = 2.0
_FORMAT = "gwtf-digest/1"  # part of every folder digest: bump if what is summed changes

_known: dict[tuple[str, int, int, int], str] = {}


class DigestError(ValueError):
    """A file or folder whose content cannot be read; one sentence that names it."""


def cache_dir() -> Path:
    """Where gwtf caches: `$GWTF_CACHE`, else `$XDG_CACHE_HOME/gwtf`, else ~/.cache/gwtf."""
    if os.environ.get("GWTF_CACHE"):
        return Path(os.environ["GWTF_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "gwtf"
    return Path.home() / ".cache" / "gwtf"


def file_sha256(path: str | Path, what: str = "file") -> str:
    """The sha256 of a file's bytes, streamed, cached by the file's identity. DigestError (one
    sentence, naming it as `what`) if it cannot be read."""
    try:
        real = Path(path).resolve()
        stat = real.stat()
    except FileNotFoundError:
        raise DigestError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise DigestError(f"cannot read {what} {path}: {err.strerror or err}") from None
    identity = (str(real), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if identity in _known:
        return _known[identity]
    stored = _stored(identity)
    if stored is not None:
        _known[identity] = stored
        return stored
    started = time.time_ns()
    hasher = hashlib.sha256()
    try:
        with open(real, "rb") as file:
            while chunk := file.read(READ_BYTES):
                hasher.update(chunk)
    except OSError as err:
        raise DigestError(f"cannot read {what} {path}: {err.strerror or err}") from None
    digest = hasher.hexdigest()
    if stat.st_mtime_ns < started - int(RACY_S * 1e9):
        _known[identity] = digest
        _store(identity, digest)
    return digest


def _entry(identity: tuple[str, int, int, int]) -> Path:
    key = hashlib.sha256(json.dumps(identity).encode("utf-8")).hexdigest()[:32]
    return cache_dir() / "digests" / key


def _stored(identity: tuple[str, int, int, int]) -> str | None:
    try:
        text = _entry(identity).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    listed, _, digest = text.strip().rpartition(" ")
    if listed != json.dumps(identity) or len(digest) != 64:
        return None
    return digest


def _store(identity: tuple[str, int, int, int], digest: str) -> None:
    """Best effort: a cache folder that cannot be written costs a read next time, nothing else."""
    path = _entry(identity)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{json.dumps(identity)} {digest}\n", encoding="ascii")
        os.replace(tmp, path)
    except OSError:
        pass


def _summed(entries: list[tuple[str, str]], kind: str) -> str:
    text = json.dumps({"format": _FORMAT, "kind": kind, "files": entries},
                      separators=(",", ":"))  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_data_file(relative: str) -> bool:
    """A file of a data folder that is read, by its path relative to the folder: `.txt`,
    `.text`, `.md`, `.markdown`, `.rst` or `.jsonl`, no part of the path starting with `.`."""
    parts = relative.split("/")
    return (not any(part.startswith(".") for part in parts)
            and Path(parts[-1]).suffix.lower() in (*TEXT_SUFFIXES, JSONL_SUFFIX))  # fmt: skip


def is_pretrained_file(relative: str) -> bool:
    """A file of a pretrained folder that is read: config.json and the safetensors files (and
    their index), at its top level."""
    return "/" not in relative and not relative.startswith(".") and (
        relative == "config.json" or relative.endswith((".safetensors", ".safetensors.index.json"))
    )


def data_files(folder: Path, on_error: Callable[[OSError], None] | None = None) -> list[Path]:
    """The files a data folder contributes, sorted by relative path: `.txt`, `.text`, `.md`,
    `.markdown`, `.rst` and `.jsonl`, found recursively, names starting with `.` left out."""
    found: list[Path] = []
    for where, dirs, files in os.walk(folder, onerror=on_error):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(where, name) for name in files if is_data_file(name))
    return sorted(found, key=lambda file: file.relative_to(folder).as_posix())


def data_digest(path: str | Path) -> str:
    """The digest of a job's `data`: a file (as .jsonl or as one text) or a folder."""
    root = Path(path)
    if root.is_dir():
        files = data_files(root)
        if not files:
            raise DigestError(
                f"data folder {root} has no {', '.join(TEXT_SUFFIXES)} or {JSONL_SUFFIX} files; "
                "put the training text in such files"
            )
        entries = [(file.relative_to(root).as_posix(), file_sha256(file, "data file"))
                   for file in files]  # fmt: skip
        return _summed(entries, "data-folder")
    if not root.exists():
        raise DigestError(
            f"data path {root} does not exist; give an existing text file, .jsonl file or folder"
        )
    kind = "jsonl" if root.suffix.lower() == JSONL_SUFFIX else "text"
    return _summed([("", file_sha256(root, "data file"))], kind)


def tokenizer_digest(path: str | Path) -> str:
    """The digest of a job's `tokenizer` file: the sha256 of its bytes."""
    return file_sha256(path, "tokenizer file")


def pretrained_digest(path: str | Path) -> str:
    """The digest of a pretrained folder: its config.json and safetensors files (and index)."""
    root = Path(path)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise DigestError(
            f"pretrained folder {root} {what}; give a Hugging Face model folder (config.json and "
            "model.safetensors)"
        )
    names = sorted(entry.name for entry in root.iterdir()
                   if entry.is_file() and is_pretrained_file(entry.name))  # fmt: skip
    entries = [(name, file_sha256(root / name, "pretrained file")) for name in names]
    return _summed(entries, "pretrained")
