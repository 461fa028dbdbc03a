"""Parameter checksums, and a stage's weights and optimizer state as bytes for a joiner.

Checksums. `param_digests` hashes each parameter on its own (name, dtype, shape, raw bytes) and
`checksum_of_digests` hashes the per-parameter digests in the canonical order (embedding, blocks
by global index, head; `stage.canonical_order`). So the checksum of any set of parameters is
defined the same way: a stage's checksum is over its parameters, the model's over all of them,
and a swarm can compute the model checksum from each stage's small digest map without moving any
weights (`checksum_of_digests` of the union), to compare with the one-process reference.

State bytes. `pack_state` writes a versioned `torch.save` archive of the stage's `state_dict`,
its AdamW `state_dict` and the iteration the state is at; `unpack_state` reads it back with
`torch.load(weights_only=True)`, which refuses anything but tensors and plain containers, so
bytes from a peer cannot run code, and checks it is the expected job and stage.

Steps. `pack_steps` writes, in the same way, the mean gradients of a replica's last steps, for a
joiner whose state they made stale (docs/design.md 3.8): each step's iteration, microbatch ids
and gradients, with the checksum of the parameters before the first step and after the last, so
that the joiner applies them only to the state they were taken from and can tell it got the
replica's bits.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gwtf.train.stage import canonical_order

__all__ = [
    "STATE_FORMAT",
    "STEPS_FORMAT",
    "StageState",
    "StageSteps",
    "Step",
    "StateError",
    "checksum_of_digests",
    "pack_state",
    "pack_steps",
    "param_checksum",
    "param_digests",
    "unpack_state",
    "unpack_steps",
]

STATE_FORMAT = "gwtf-train-stage/1"
STEPS_FORMAT = "gwtf-train-steps/1"


class StateError(ValueError):
    """State bytes that cannot be loaded into this stage; the message says why."""


def _tensor_bytes(tensor: Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().numpy().tobytes()


def param_digests(params: Mapping[str, Tensor]) -> dict[str, str]:
    """sha256 of each parameter: its name, dtype, shape and bytes."""
    digests = {}
    for name, tensor in params.items():
        sha = hashlib.sha256()
        sha.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        sha.update(_tensor_bytes(tensor))
        digests[name] = sha.hexdigest()
    return digests


def checksum_of_digests(digests: Mapping[str, str]) -> str:
    """sha256 over `name digest` lines in the canonical parameter order."""
    sha = hashlib.sha256()
    for name in canonical_order(list(digests)):
        sha.update(f"{name} {digests[name]}\n".encode())
    return sha.hexdigest()


def param_checksum(params: Mapping[str, Tensor]) -> str:
    """The checksum replicas compare at every commit (hex sha256)."""
    return checksum_of_digests(param_digests(params))


@dataclass(frozen=True, eq=False)
class StageState:
    """What `unpack_state` read: the iteration the state is at, and the two state dicts."""

    job_id: str
    first_layer: int
    end_layer: int
    num_stages: int
    stage: int
    iteration: int
    model: Mapping[str, Tensor] = field(repr=False)
    optimizer: Mapping[str, Any] = field(repr=False)


def _save(fmt: str, fields: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save({"format": fmt, **fields}, buffer)
    return buffer.getvalue()


def _load(data: bytes, fmt: str, what: str) -> dict[str, Any]:
    """`_save` bytes of format `fmt` back (tensors and plain containers only); StateError if
    they cannot be read or are of another format."""
    try:
        raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for truncated or foreign bytes
        raise StateError(f"{what} bytes cannot be read ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        raise StateError(f"{what} bytes are not in the {fmt} format")
    return raw


def pack_state(state: StageState) -> bytes:
    return _save(STATE_FORMAT, {
        "job_id": state.job_id,
        "stage": state.stage,
        "num_stages": state.num_stages,
        "first_layer": state.first_layer,
        "end_layer": state.end_layer,
        "iteration": state.iteration,
        "model": dict(state.model),
        "optimizer": dict(state.optimizer),
    })


def unpack_state(data: bytes) -> StageState:
    """Read `pack_state` bytes; StateError if they are not a stage state of this format."""
    raw = _load(data, STATE_FORMAT, "stage state")
    try:
        return StageState(
            job_id=str(raw["job_id"]),
            stage=int(raw["stage"]),
            num_stages=int(raw["num_stages"]),
            first_layer=int(raw["first_layer"]),
            end_layer=int(raw["end_layer"]),
            iteration=int(raw["iteration"]),
            model=raw["model"],
            optimizer=raw["optimizer"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"stage state bytes lack a field ({exc})") from None


@dataclass(frozen=True, eq=False)
class Step:
    """One optimizer step of a stage: its iteration, the microbatches in its mean gradient, and
    the gradient by parameter name (empty when the iteration trained no microbatch)."""

    iteration: int
    microbatch_ids: tuple[int, ...]
    grads: Mapping[str, Tensor] = field(repr=False)


@dataclass(frozen=True, eq=False)
class StageSteps:
    """What `unpack_steps` read: consecutive steps of one stage, the parameters' checksum before
    the first (`base`) and after the last (`end`)."""

    job_id: str
    stage: int
    first_layer: int
    end_layer: int
    base: str
    end: str
    steps: tuple[Step, ...]


def pack_steps(steps: StageSteps) -> bytes:
    return _save(STEPS_FORMAT, {
        "job_id": steps.job_id,
        "stage": steps.stage,
        "first_layer": steps.first_layer,
        "end_layer": steps.end_layer,
        "base": steps.base,
        "end": steps.end,
        "steps": [
            {"iteration": s.iteration, "microbatch_ids": list(s.microbatch_ids),
             "grads": dict(s.grads)}
            for s in steps.steps
        ],
    })


def unpack_steps(data: bytes) -> StageSteps:
    """Read `pack_steps` bytes; StateError if they are not steps of this format, or if their
    iterations do not follow each other."""
    raw = _load(data, STEPS_FORMAT, "stage steps")
    try:
        steps = tuple(
            Step(int(s["iteration"]), tuple(int(i) for i in s["microbatch_ids"]),
                 dict(s["grads"]))
            for s in raw["steps"]
        )
        read = StageSteps(
            job_id=str(raw["job_id"]),
            stage=int(raw["stage"]),
            first_layer=int(raw["first_layer"]),
            end_layer=int(raw["end_layer"]),
            base=str(raw["base"]),
            end=str(raw["end"]),
            steps=steps,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"stage steps bytes lack a field ({exc})") from None
    if any(b.iteration != a.iteration + 1 for a, b in zip(steps, steps[1:], strict=False)):
        raise StateError("stage steps bytes hold steps that do not follow each other")
    if any(not isinstance(t, Tensor) for s in steps for t in s.grads.values()):
        raise StateError("stage steps bytes hold a gradient that is not a tensor")
    return read
