"""Files a job names by URL: fetched once into the cache, under the digest the job pins.

A job's `data`, `tokenizer` and `model.pretrained` may each be a URL (`scheme://...`) that
fsspec opens (`file://`, `https://`, `s3://` with s3fs installed, `hf://`, ...) instead of a local
path, so that volunteers need not keep the files at the path the submitter used. What a URL holds
is read the way a local path's content is (`gwtf.train.digests`), and the job pins its digest: the
submitter fetches it once to pin the job (`JobConfig.pinned`), and each node that needs it fetches
it into `remote/<digest>/` of the cache folder and checks the digest before training; a node that
already holds that digest uses its copy and fetches nothing. A URL whose content is not the pinned
one (changed since, or another server's) refuses the job on that node, in one sentence.

A file is streamed (1 MiB reads) into a temporary folder of the cache, hashed, and renamed into
place only once its digest is known (and matches the pin), so a cut download leaves nothing that
looks whole. A folder URL (a pretrained model, a data folder) needs a protocol that lists folders
(`file`, `s3`, `gcs`, `hf`; `http(s)` where the server answers a folder with an index page of
links, as `python -m http.server` and nginx's autoindex do): the files a folder contributes are
listed and fetched, keeping their relative names, since the names are part of its digest
(tests/integration/test_train_shared_nothing.py: volunteers that share nothing, files by
`http://`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gwtf.train.digests import (
    READ_BYTES,
    DigestError,
    cache_dir,
    data_digest,
    is_data_file,
    is_pretrained_file,
    pretrained_digest,
    tokenizer_digest,
)

__all__ = ["data_location", "is_url", "located", "pretrained_location", "tokenizer_location"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location: str) -> bool:
    """`scheme://...`: a URL for fsspec, not a path on this machine."""
    return _URL.match(location) is not None


def located(
    location: str, pinned: str | None, digest_of: Callable[[Path], str],
    wanted: Callable[[str], bool], what: str,
) -> tuple[Path, str | None]:
    """Where `location`'s content is on this machine, and its digest if it had to be fetched
    (None for a local path, which is returned as it is). A URL is fetched into the cache unless
    the copy of digest `pinned` is there already; `digest_of` sums what was fetched (a file or a
    folder, of which only the files whose relative names `wanted` accepts are fetched).
    DigestError (one sentence naming it as `what`) if it cannot be fetched or is not `pinned`."""
    if not is_url(location):
        return Path(location), None
    store = cache_dir() / "remote"
    if pinned is not None:
        kept = _kept(store / pinned)
        if kept is not None:
            return kept, pinned
    try:
        store.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".fetch-", dir=store))
    except OSError as err:
        raise DigestError(f"cannot write the fetched {what} into {store}: {err.strerror or err}; "
                          "set GWTF_CACHE to a writable folder") from None  # fmt: skip
    try:
        local = _fetch(location, scratch, wanted, what)
        digest = digest_of(local)
        if pinned is not None and digest != pinned:
            raise DigestError(
                f"{what} {location} now has digest {digest[:12]}, not the {pinned[:12]} the job "
                "pins: it changed since the job was submitted; submit the job again to train on "
                "what it holds now"
            )
        place = store / digest
        try:
            os.rename(scratch, place)
        except OSError:  # fetched meanwhile by another process: its copy is the same content
            pass
        kept = _kept(place)
        if kept is None:
            raise DigestError(f"cannot keep the fetched {what} in {place}")
        return kept, digest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def data_location(data: str, pinned: str | None) -> tuple[Path, str | None]:
    """`located` for a job's `data` (a file, or a folder's data files)."""
    return located(data, pinned, lambda p: data_digest(p), is_data_file, "data")


def tokenizer_location(tokenizer: str, pinned: str | None) -> tuple[Path, str | None]:
    """`located` for a job's `tokenizer` file."""
    return located(tokenizer, pinned, lambda p: tokenizer_digest(p), lambda _: False,
                   "tokenizer")  # fmt: skip


def pretrained_location(folder: str, pinned: str | None) -> tuple[Path, str | None]:
    """`located` for a job's `model.pretrained` folder (its config.json and safetensors)."""
    return located(folder, pinned, lambda p: pretrained_digest(p), is_pretrained_file,
                   "pretrained folder")  # fmt: skip


def _kept(folder: Path) -> Path | None:
    """The one file or folder fetched into `folder`, if it is there."""
    try:
        entries = [entry for entry in folder.iterdir() if not entry.name.startswith(".")]
    except OSError:
        return None
    return entries[0] if len(entries) == 1 else None


def _fetch(url: str, into: Path, wanted: Callable[[str], bool], what: str) -> Path:
    """`url`'s file, or its folder's wanted files, copied under `into`; the local path."""
    import fsspec  # type: ignore[import-untyped]

    try:
        fs, root = fsspec.core.url_to_fs(url)
        root = root.rstrip("/")
        name = root.rsplit("/", 1)[-1] or "content"
        if not fs.isdir(root):
            if not fs.exists(root):
                raise DigestError(f"{what} {url} does not exist")
            _copy(fs, root, into / name)
            return into / name
        files = {}
        for path in fs.find(root):
            relative = path[len(root):].lstrip("/")
            if relative and wanted(relative):
                files[relative] = path
        if not files:
            raise DigestError(f"{what} {url} is a folder that holds none of the files gwtf reads")
        for relative, path in sorted(files.items()):
            _copy(fs, path, into / name / relative)
        return into / name
    except DigestError:
        raise
    except ImportError as err:  # a protocol whose fsspec backend is not installed
        raise DigestError(f"cannot fetch {what} {url}: {err}") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        raise DigestError(f"cannot fetch {what} {url}: {reason}") from None


def _copy(fs: object, path: str, to: Path) -> None:
    to.parent.mkdir(parents=True, exist_ok=True)
    with fs.open(path, "rb") as source, open(to, "wb") as target:  # type: ignore[attr-defined]
        while chunk := source.read(READ_BYTES):
            target.write(chunk)
