"""The trained model out: a whole model as `DIR/model.safetensors`, with its job file beside it.

A stage's parameters carry their global names (`gwtf.train.stage`: `blocks.3.attn.qkv.weight` is
block 3 wherever it lives), so the parts of every stage merge into exactly the names of the whole
model, and the swarm and the one-process reference write the same file for the same training.

- `weights_bytes` / `weights_from_bytes`: one stage's parameters as safetensors bytes (what a
  node streams to a client; safetensors holds tensors only, so bytes from a peer run no code).
- `merge_stages`: the stages' parameter maps into one, refusing overlaps and missing stages.
- `save_model` writes `model.safetensors` (metadata: job id, iteration, parameter checksum, the
  `param_checksum` of `gwtf.train.state`, checked on the way in and out) and `job.toml` (the job,
  readable by `load_job`: the same job, the same id). `load_model` reads the weights back.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load, load_file, save, save_file
from torch import Tensor

from gwtf.train.job import JobConfig, JobError, load_job
from gwtf.train.stage import canonical_order
from gwtf.train.state import param_checksum

__all__ = [
    "MODEL_FILE",
    "JOB_FILE",
    "CheckpointError",
    "SavedModel",
    "check_writable",
    "ids_of",
    "job_toml",
    "load_model",
    "merge_stages",
    "save_model",
    "weights_bytes",
    "weights_from_bytes",
]

MODEL_FILE = "model.safetensors"
MODEL_FORMAT = "gwtf-model/1"
JOB_FILE = "job.toml"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, read or trusted (one sentence)."""


@dataclass(frozen=True, eq=False)
class SavedModel:
    """What `load_model` finds in a checkpoint folder."""

    parameters: dict[str, Tensor]
    job: JobConfig
    iteration: int
    """Iterations trained into these weights."""
    checksum: str


def weights_bytes(params: Mapping[str, Tensor]) -> bytes:
    """Parameters as safetensors bytes (contiguous CPU copies; the originals are untouched)."""
    return save({name: t.detach().to("cpu").contiguous() for name, t in params.items()})


def weights_from_bytes(data: bytes) -> dict[str, Tensor]:
    try:
        return _canonical(load(data))
    except (SafetensorError, ValueError) as err:
        raise CheckpointError(f"the weights are not a safetensors archive: {err}") from None


def _canonical(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """In the model's order (safetensors files list their tensors by name)."""
    return {name: params[name] for name in canonical_order(list(params))}


def merge_stages(stages: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """One model from its stages' parameters (in stage order); CheckpointError if two stages
    name the same parameter."""
    merged: dict[str, Tensor] = {}
    for index, params in enumerate(stages):
        for name, tensor in params.items():
            if name in merged:
                raise CheckpointError(f"stage {index} and an earlier stage both hold {name}")
            merged[name] = tensor
    return _canonical(merged)


def job_toml(job: JobConfig) -> str:
    """The job as a TOML job file (`load_job` reads it back as the same job)."""
    table = job.to_dict()
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    lines = [f"{k} = {_toml_value(v)}" for k, v in scalars]
    for name, sub in tables:
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in sub.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if abs(value) == float("inf"):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (a compression plan: block -> codec)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise CheckpointError(f"cannot write {value!r} in a job file")


def write_tensors(path: Path, tensors: Mapping[str, Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file written through a temporary file renamed into place, so a reader
    never sees half of it. Raises OSError (the caller says which file in its own words)."""
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({name: tensors[name].detach().to("cpu").contiguous() for name in tensors},
              str(tmp), metadata=metadata)  # fmt: skip
    os.replace(tmp, path)


def read_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A safetensors file's tensors and metadata. FileNotFoundError passes through (the caller
    says what is missing); anything unreadable is a CheckpointError."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
        return load_file(str(path)), meta
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err}") from None


def check_writable(directory: str | Path) -> None:
    """CheckpointError (one sentence) if a checkpoint could not be written into `directory`: it,
    or the nearest of its parents that exists, is a file or cannot be written. Nothing is made:
    called before a job trains, so that a job is not trained for a folder that cannot take it."""
    folder = Path(directory)
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == folder.absolute():
            raise CheckpointError(f"{folder} is a file; a checkpoint is a folder (made if missing)")
        raise CheckpointError(f"{folder} cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write the checkpoint into {folder}: {existing} is not "
                              "writable by this user")  # fmt: skip


def save_model(
    directory: str | Path, params: Mapping[str, Tensor], job: JobConfig, iteration: int,
    *, expect_checksum: str | None = None,
) -> Path:
    """Write `model.safetensors` and `job.toml` into `directory` (made if missing), each
    through a temporary file renamed into place, so a reader never sees half a checkpoint.
    `expect_checksum`: the checksum the swarm reported for these weights; CheckpointError if
    they are not those weights. The path of the model file."""
    try:
        job = job.pinned()  # job.toml states what its files held, so it never needs them again
    except JobError as err:
        raise CheckpointError(f"cannot write the checkpoint's job: {err}") from None
    checksum = param_checksum(params)
    if expect_checksum is not None and checksum != expect_checksum:
        raise CheckpointError(
            f"the weights gathered from the stages have checksum {checksum[:16]}, not the "
            f"job's {expect_checksum[:16]}: a stage answered with weights of another iteration"
        )
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        model = folder / MODEL_FILE
        write_tensors(model, {n: params[n] for n in canonical_order(list(params))}, {
            "format": MODEL_FORMAT, "job_id": job.job_id, "iteration": str(iteration),
            "param_checksum": checksum,
        })  # fmt: skip
        tmp_job = folder / f".{JOB_FILE}.tmp"
        tmp_job.write_text(job_toml(job), encoding="utf-8")
        os.replace(tmp_job, folder / JOB_FILE)
    except OSError as err:
        raise CheckpointError(
            f"cannot write the checkpoint into {folder}: {err.strerror or err}"
        ) from None
    return model


def ids_of(job: JobConfig) -> set[str]:
    """The job ids a checkpoint of `job` may carry: its id, and for a job.toml that states no
    digests of its files (written before ids were made of them) the id of that time, a hash of
    the job as stated, paths included, so that older checkpoints still export and resume."""
    ids: set[str] = set()
    if not job.is_pinned:
        text = json.dumps(job.to_dict(), sort_keys=True, separators=(",", ":"))
        ids.add("job-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16])
    try:
        ids.add(job.job_id)
    except JobError:  # an older job whose files are gone: its older id is all there is
        if not ids:
            raise
    return ids


def load_model(directory: str | Path) -> SavedModel:
    """The weights and job of a checkpoint folder; CheckpointError if it is missing, damaged,
    or its weights are not the ones it says it holds."""
    folder = Path(directory)
    model = folder / MODEL_FILE
    if not folder.is_dir():
        what = "is a file, not" if folder.exists() else "does not exist; give"
        raise CheckpointError(f"{folder} {what} a checkpoint folder (model.safetensors and "
                              f"{JOB_FILE})")  # fmt: skip
    try:
        tensors, meta = read_tensors(model)
    except FileNotFoundError:
        raise CheckpointError(f"{folder} holds no {MODEL_FILE}") from None
    if meta.get("format") not in (None, MODEL_FORMAT):
        # transformers and `gwtf export` write {"format": "pt"}: a folder exported over.
        raise CheckpointError(
            f"{model} is not a gwtf checkpoint's weights but a {meta['format']!r} file, as "
            "`gwtf export --hf` and transformers write; the checkpoint was overwritten, export or "
            "resume from another copy of it"
        )
    params = _canonical(tensors)
    job = load_job(folder / JOB_FILE)
    checksum = param_checksum(params)
    if meta.get("param_checksum") not in (None, checksum):
        raise CheckpointError(f"{model} is damaged: its weights do not match its checksum")
    if meta.get("job_id") is not None and meta["job_id"] not in ids_of(job):
        raise CheckpointError(f"{model} is of job {meta.get('job_id')}, not of {JOB_FILE}'s")
    try:
        iteration = int(meta.get("iteration", "0"))
    except ValueError:
        raise CheckpointError(f"{model} names no valid iteration") from None
    return SavedModel(params, job, iteration, checksum)

