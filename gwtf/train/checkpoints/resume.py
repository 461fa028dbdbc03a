"""Resuming a job from a checkpoint: the optimizer state beside the weights, and stage states.

A checkpoint folder that a job can resume from (`gwtf submit --resume DIR`) holds, beside
`model.safetensors` and `job.toml` (`gwtf.train.checkpoints.checkpoint`), `optimizer.safetensors`:
AdamW's state of every parameter under the whole model's names, `exp_avg/NAME`, `exp_avg_sq/NAME`
and `step/NAME`, with the iteration in its metadata. Weights and optimizer state are read from the
stages' replicas together (`StageExecutor.state_bytes`: the state at an iteration boundary), so the
two files describe the same moment of training; a checkpoint whose two files name different
iterations (a write cut between the two renames) is refused.

Names, not positions: torch's optimizer `state_dict` numbers parameters by their position in the
stage, and a swarm restarted with another number of stages cuts the model elsewhere. Stored by the
whole model's names, the state re-cuts into any partition: `stage_state` builds the exact
`gwtf.train.state` bytes that a replica of stage `s` of `S` would hand a joiner at that iteration,
and a node builds its stage from them as a joiner does (`StageExecutor.from_state`). So a resumed
job continues exactly where it stopped: the data of iteration k is a function of k
(`gwtf.train.data`), the dropout masks too (`gwtf.train.stage`), and the swarm ends equal bit for
bit to an uninterrupted run (tests/integration/test_resume_swarm.py).

At iteration 0 AdamW has no state yet: an empty optimizer file resumes as the seeded start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gwtf.train.checkpoints.checkpoint import (
    CheckpointError,
    SavedModel,
    ids_of,
    load_model,
    read_tensors,
    write_tensors,
)
from gwtf.train.executor import make_optimizer
from gwtf.train.job import JobConfig
from gwtf.train.partition import stage_spec
from gwtf.train.stage import StageModule, param_groups
from gwtf.train.state import StageState, StateError, pack_state, unpack_state

__all__ = [
    "ADAM_KEYS",
    "OPTIMIZER_FILE",
    "Resumable",
    "load_resumable",
    "optimizer_by_name",
    "remove_optimizer",
    "save_optimizer",
    "stage_state",
    "unpack_stage",
]

OPTIMIZER_FILE = "optimizer.safetensors"
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")


def _meta_stage(job: JobConfig, stage: int, num_stages: int) -> StageModule:
    with torch.device("meta"):
        return StageModule(job.model, stage_spec(job.model.layers, num_stages, stage))


def _positions(module: StageModule, job: JobConfig) -> list[str]:
    """Parameter names in the order torch's optimizer numbers them (its param groups)."""
    names = {id(p): name for name, p in module.named_parameters()}
    groups = param_groups(module, job.optimizer.weight_decay)
    return [names[id(p)] for group in groups for p in group["params"]]  # type: ignore[attr-defined]


def _state_positions(model: Mapping[str, Tensor]) -> list[str]:
    """`_positions` from a stage's `state_dict` alone: a stage has parameters and no buffers, so
    its state_dict lists them in `named_parameters` order, and `param_groups` puts those of 2 or
    more dimensions first. No module is built: building one on the meta device imports torch's
    reference ops the first time (1.6 s, 5 s on a loaded machine), which held up a client's first
    checkpoint while the job trained on (tests/unit/test_train_resume.py holds the two equal)."""
    return ([name for name, t in model.items() if t.dim() >= 2]
            + [name for name, t in model.items() if t.dim() < 2])  # fmt: skip


def optimizer_by_name(state: StageState) -> dict[str, Tensor]:
    """A stage state's AdamW state keyed `KEY/NAME` (see the module docstring)."""
    positions = _state_positions(state.model)
    out: dict[str, Tensor] = {}
    per_param: Mapping[Any, Any] = state.optimizer.get("state", {})
    for index, values in per_param.items():
        if not isinstance(index, int) or not 0 <= index < len(positions):
            raise StateError(f"the optimizer state names parameter {index!r}, not in the stage")
        for key in ADAM_KEYS:
            value = values.get(key)
            if not isinstance(value, Tensor):
                raise StateError(f"the optimizer state of {positions[index]} lacks {key}")
            out[f"{key}/{positions[index]}"] = value.detach().to("cpu").contiguous()
    return out


def unpack_stage(data: bytes, job: JobConfig) -> tuple[int, dict[str, Tensor], dict[str, Tensor]]:
    """(iteration, parameters, optimizer state by name) from a replica's `state_bytes`."""
    state = unpack_state(data)
    if state.job_id != job.job_id:
        raise StateError(f"the state is of job {state.job_id}, not {job.job_id}")
    params = {name: t.detach().to("cpu") for name, t in state.model.items()}
    return state.iteration, params, optimizer_by_name(state)


def save_optimizer(
    directory: str | Path, tensors: Mapping[str, Tensor], job: JobConfig, iteration: int
) -> Path:
    """Write `optimizer.safetensors` into `directory` (through a temporary file renamed into
    place). Call it before `checkpoint.save_model`, whose rename then completes the pair."""
    folder = Path(directory)
    path = folder / OPTIMIZER_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_tensors(path, {name: tensors[name] for name in sorted(tensors)},
                      {"format": "gwtf-optimizer/1", "job_id": job.job_id,
                       "iteration": str(iteration)})  # fmt: skip
    except OSError as err:
        raise CheckpointError(
            f"cannot write the optimizer state into {folder}: {err.strerror or err}"
        ) from None
    return path


def remove_optimizer(directory: str | Path) -> None:
    """Remove `optimizer.safetensors` from `directory` (weights written without it)."""
    path = Path(directory) / OPTIMIZER_FILE
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise CheckpointError(f"cannot remove the old {path}: {err.strerror or err}") from None


class Resumable:
    """A checkpoint folder a job can resume from: its weights, job, iteration and AdamW state."""

    def __init__(self, saved: SavedModel, optimizer: Mapping[str, Tensor]) -> None:
        self.saved = saved
        self.optimizer = dict(optimizer)

    @property
    def job(self) -> JobConfig:
        return self.saved.job

    @property
    def iteration(self) -> int:
        return self.saved.iteration


def load_resumable(directory: str | Path) -> Resumable:
    """The checkpoint in `directory`, with its optimizer state; CheckpointError if it has none
    (a checkpoint of a completed job: only its weights), or the two files disagree."""
    folder = Path(directory)
    saved = load_model(folder)
    path = folder / OPTIMIZER_FILE
    try:
        tensors, meta = read_tensors(path)
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} holds no {OPTIMIZER_FILE}: only a checkpoint written while the job ran "
            "(gwtf submit --checkpoint-every) can be resumed from"
        ) from None
    if meta.get("job_id") not in ids_of(saved.job):
        raise CheckpointError(f"{path} is of job {meta.get('job_id')}, not of the model's")
    if meta.get("iteration") != str(saved.iteration):
        raise CheckpointError(
            f"{path} is of iteration {meta.get('iteration')} but the weights of iteration "
            f"{saved.iteration}: the checkpoint was cut while written; take an earlier one"
        )
    for name in tensors:
        key, _, param = name.partition("/")
        if key not in ADAM_KEYS or param not in saved.parameters:
            raise CheckpointError(f"{path} holds {name!r}, which no parameter of the model has")
    return Resumable(saved, tensors)


def stage_state(checkpoint: Resumable, stage: int, num_stages: int) -> bytes:
    """The state bytes of stage `stage` of `num_stages` at the checkpoint's iteration, as one of
    its replicas would hand a joiner (`StageExecutor.from_state` builds the stage from them)."""
    job = checkpoint.job
    module = _meta_stage(job, stage, num_stages)
    positions = _positions(module, job)
    params = checkpoint.saved.parameters
    model: dict[str, Tensor] = {}
    for name, _ in module.named_parameters():
        if name not in params:
            raise CheckpointError(f"the checkpoint has no {name}, which stage {stage} needs")
        model[name] = params[name]
    optimizer: dict[str, Any] = make_optimizer(module, job.optimizer).state_dict()
    per_param: dict[int, dict[str, Tensor]] = {}
    for index, name in enumerate(positions):
        found = {key: checkpoint.optimizer.get(f"{key}/{name}") for key in ADAM_KEYS}
        present = [key for key, value in found.items() if value is not None]
        if not present:
            continue  # no step taken yet: AdamW starts this parameter's state afresh
        if len(present) != len(ADAM_KEYS):
            raise CheckpointError(f"the optimizer state of {name} lacks some of {ADAM_KEYS}")
        per_param[index] = {key: value for key, value in found.items() if value is not None}
    optimizer["state"] = per_param
    spec = module.spec
    return pack_state(StageState(
        job_id=job.job_id, stage=stage, num_stages=num_stages, first_layer=spec.first_layer,
        end_layer=spec.end_layer, iteration=checkpoint.iteration, model=model,
        optimizer=optimizer,
    ))  # fmt: skip
