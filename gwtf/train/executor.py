"""The stage executor: one per node, runs its stage's forward and backward per microbatch.

Life of a microbatch `key = (job_id, iteration, microbatch)` at stage s:

- `forward(key, inputs, labels)`: runs the stage (dropout seeded by the job seed, iteration,
  microbatch and model part), keeps the autograd graph until backward, returns the activation to
  send downstream. The last stage needs `labels`: it computes the loss, runs backward at once,
  accumulates, and returns the gradient w.r.t. its input (to send upstream) and the loss.
- `backward(key, grad_output)`: gradient w.r.t. this stage's parameters, added to the sums of
  the iteration; returns the gradient w.r.t. the stage input (None on stage 0). A microbatch is
  accumulated at most once per iteration: a second backward is refused, never double-counted.
- `recompute(key, inputs, labels)`: the same computation as `forward`, for a replacement node
  (docs/design.md 4 rules 2 and 3); counted apart, as replayed work.
- `drop(key)`: forget a microbatch in flight (its sender chose another route, or it was dropped).
- `abandon()`: forget the whole iteration's work, no step (the iteration starts again).
- `contribution(node_id)` -> the sums and the ids accumulated, for the stage's commit (and the
  running sum a node ships to its keeper); `adopt(kept)` adds a dead stage peer's kept running
  sum to this replica's (docs/design.md 4.9);
  `commit(aggregated)` -> one AdamW step with the combined gradient, then the next iteration.
- `steps_bytes(iteration)` -> the mean gradients of the steps from `iteration` on, kept for a
  joiner (the last `job.catch_up_steps`); `catch_up(data)` applies them to a joiner's state with
  the same `commit` (docs/design.md 3.8).

The executor does no I/O and keeps no global state: the node decides where tensors go.

Determinism. Bit for bit: on one kind of machine, with the same torch build and the same
`torch.get_num_threads()`, a forward, recompute or backward of the same key from the same weights
gives the same bits, in any order of calls and in any process. The dropout masks come from
generators seeded by name (`stage.DropoutSeeds`), never from the global RNG, and the CPU kernels
used here (matmul, SDPA, norms, embedding backward) are deterministic for a fixed thread count.
Not bit for bit: another thread count (measured: tiny-gpt's checksum after 3 reference
iterations differs between 1 and 2 threads, as CPU reductions split their work by thread),
another instruction set (AVX2 vs AVX-512), torch version, or a GPU. Such differences stay at the
level of float rounding. So nodes that must reproduce each other (a replacement recomputing a
dead node's work, a swarm compared bit for bit with the reference) should fix their thread count
(`torch.set_num_threads`) the same way. The AdamW step is elementwise, so replicas that combine
the same bytes on the same kind of CPU stay bit-identical; across CPU kinds an elementwise kernel
may round differently (fused multiply-add), which the checksum comparison at commit reveals and
`state_bytes` from one replica repairs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from gwtf.train.commit import AggregatedGradient, GradContribution
from gwtf.train.device import Placement
from gwtf.train.job import JobConfig, OptimizerConfig
from gwtf.train.partition import StageSpec, stage_spec
from gwtf.train.stage import DropoutSeeds, StageModule, build_stage, param_groups
from gwtf.train.state import (
    StageState,
    StageSteps,
    StateError,
    Step,
    pack_state,
    pack_steps,
    param_checksum,
    param_digests,
    unpack_state,
    unpack_steps,
)

__all__ = [
    "BadTensorError",
    "CapacityError",
    "DuplicateMicrobatchError",
    "ExecutorError",
    "ExecutorStats",
    "ForwardResult",
    "MicrobatchKey",
    "StageExecutor",
    "UnknownMicrobatchError",
    "make_optimizer",
]


class ExecutorError(ValueError):
    """A request the executor refuses; nothing changed. The message is one sentence."""


class DuplicateMicrobatchError(ExecutorError):
    """The microbatch is already in flight here, or already accumulated in this iteration."""


class UnknownMicrobatchError(ExecutorError):
    """A backward for a microbatch this executor holds no forward state for."""


class BadTensorError(ExecutorError):
    """A tensor with the wrong shape, dtype or values (NaN, inf, token out of range)."""


class CapacityError(ExecutorError):
    """All memory slots are taken by microbatches in flight."""


@dataclass(frozen=True, order=True)
class MicrobatchKey:
    """Names a microbatch: job, iteration (0-based), microbatch id (0..microbatches-1)."""

    job_id: str
    iteration: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.job_id}/it{self.iteration}/mb{self.microbatch}"


@dataclass(frozen=True, eq=False)
class ForwardResult:
    """What a forward (or recompute) produced.

    - `output`: the activation [B, T, width] to send downstream (every stage but the last);
    - `grad_input`: the gradient w.r.t. the stage input, to send upstream (last stage, unless it
      is also stage 0);
    - `loss`: the microbatch's mean loss (last stage).
    """

    key: MicrobatchKey
    output: Tensor | None = field(default=None, repr=False)
    grad_input: Tensor | None = field(default=None, repr=False)
    loss: float | None = None


@dataclass
class ExecutorStats:
    """Counters since the executor was built; compute seconds are wall time in this process."""

    forwards: int = 0
    recomputes: int = 0
    backwards: int = 0
    refused: int = 0
    compute_s: float = 0.0
    replayed_s: float = 0.0


@dataclass
class _InFlight:
    inputs: Tensor  # the leaf whose gradient goes upstream (token ids on stage 0)
    output: Tensor


def make_optimizer(module: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the stage's parameters; the single-tensor path, the same on every replica."""
    return torch.optim.AdamW(
        param_groups(module, config.weight_decay),
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=False,
    )


_ACCUM_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class StageExecutor:
    """Runs stage `stage` of `num_stages` of `job` for one node. Not thread-safe.

    `capacity` bounds the microbatches in flight (the node's memory slots); None: unbounded.
    """

    def __init__(
        self,
        job: JobConfig,
        stage: int,
        num_stages: int,
        *,
        capacity: int | None = None,
        placement: Placement | None = None,
        _module: StageModule | None = None,
        _iteration: int = 0,
    ) -> None:
        self.job = job
        self.placement = placement if placement is not None else Placement()
        self.job_id = job.job_id
        self.spec: StageSpec = stage_spec(job.model.layers, num_stages, stage)
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1 microbatch, got {capacity}")
        self.capacity = capacity
        self.module = (
            _module if _module is not None else build_stage(job.model, job.seed, self.spec)
        )
        self.module.plan_boundaries(job.compression)
        # Built and initialised on the CPU (the same bits on every device), then moved; the
        # optimizer is made after the move so that its state lives beside the parameters.
        self.module.to(self.placement.device)
        self.optimizer = make_optimizer(self.module, job.optimizer)
        self.iteration = _iteration
        self.stats = ExecutorStats()
        self._accum_dtype = _ACCUM_DTYPES[job.grad_accum]
        # MPS has no float64: float64 sums are kept on the CPU there.
        self._accum_device = (
            torch.device("cpu")
            if self.placement.device.type == "mps" and self._accum_dtype == torch.float64
            else self.placement.device
        )
        self._loss_scale = self.placement.loss_scale
        self._params = dict(self.module.named_parameters())
        self._in_flight: dict[MicrobatchKey, _InFlight] = {}
        self._accumulated: dict[int, None] = {}  # an ordered set: the accumulation order
        self._sums: dict[str, Tensor] = {}
        self._checksum: str | None = None
        """The parameters' checksum as the last `commit` left them (None: not known)."""
        self._steps: deque[tuple[Step, str]] = deque()
        """The last `job.catch_up_steps` steps of this replica's own history, consecutive and
        ending at `self.iteration`, each with the parameters' checksum before it: what a joiner
        catches up with (`steps_bytes`)."""

    # -- what the node asks ------------------------------------------------------------------

    @property
    def stage(self) -> int:
        return self.spec.stage

    @property
    def num_stages(self) -> int:
        return self.spec.num_stages

    @property
    def in_flight(self) -> int:
        """Microbatches whose forward state is kept here, waiting for backward."""
        return len(self._in_flight)

    def in_flight_keys(self) -> tuple[MicrobatchKey, ...]:
        return tuple(sorted(self._in_flight))

    def is_in_flight(self, key: MicrobatchKey) -> bool:
        return key in self._in_flight

    @property
    def accumulated(self) -> tuple[int, ...]:
        """Ids accumulated in the current iteration, in the order they were accumulated."""
        return tuple(self._accumulated)

    def checksum(self) -> str:
        """sha256 of the stage's parameters (see state.param_checksum)."""
        return param_checksum(self._params)

    def digests(self) -> dict[str, str]:
        """Per-parameter digests, to build the whole model's checksum across stages."""
        return param_digests(self._params)

    def parameters(self) -> dict[str, Tensor]:
        """The stage's parameters by name (the live tensors; do not modify)."""
        return dict(self._params)

    # -- the microbatch path -----------------------------------------------------------------

    def forward(
        self, key: MicrobatchKey, inputs: Tensor, labels: Tensor | None = None
    ) -> ForwardResult:
        """Run the stage on a microbatch (see the module docstring). Labels: last stage only."""
        return self._run(key, inputs, labels, replay=False)

    def recompute(
        self, key: MicrobatchKey, inputs: Tensor, labels: Tensor | None = None
    ) -> ForwardResult:
        """`forward` again on a replacement node: bit-identical to what the dead node computed."""
        return self._run(key, inputs, labels, replay=True)

    def backward(self, key: MicrobatchKey, grad_output: Tensor) -> Tensor | None:
        """Accumulate the parameter gradient of `key`; the gradient w.r.t. the stage input."""
        self._check_key(key)
        if key.microbatch in self._accumulated:
            self._refuse(
                DuplicateMicrobatchError(
                    f"microbatch {key} is already accumulated on stage {self.stage}; a second "
                    "backward would count it twice"
                )
            )
        saved = self._in_flight.get(key)
        if saved is None:
            self._refuse(
                UnknownMicrobatchError(
                    f"no forward state for microbatch {key} on stage {self.stage}; its "
                    "activation must be recomputed here before its backward"
                )
            )
        self._check_tensor("gradient", grad_output, tuple(saved.output.shape), torch.float32)
        del self._in_flight[key]
        start = perf_counter()
        grad = self.placement.to_device(grad_output).to(saved.output.dtype)
        if self._loss_scale != 1.0:
            grad = grad * self._loss_scale
        grad_input = self._backprop(saved, grad, key.microbatch)
        self.stats.backwards += 1
        self.stats.compute_s += perf_counter() - start
        return grad_input

    def drop(self, key: MicrobatchKey) -> bool:
        """Forget `key`'s forward state; False if none was kept. Accumulated sums are kept."""
        return self._in_flight.pop(key, None) is not None

    # -- the commit --------------------------------------------------------------------------

    def contribution(self, node_id: str) -> GradContribution:
        """This replica's gradient sums and ids for the current iteration (for the stage peers)."""
        return GradContribution(
            node_id=node_id,
            stage=self.stage,
            iteration=self.iteration,
            microbatch_ids=tuple(sorted(self._accumulated)),
            # On the CPU whatever the device: what the node sends is device-independent.
            grad_sums={name: total.cpu() for name, total in self._sums.items()},
        )

    def adopt(self, kept: GradContribution) -> None:
        """Add a dead stage peer's running gradient sum, kept here (bounded replay,
        docs/design.md 4.9), to this replica's: its microbatches count as accumulated here from
        now on. Refused (nothing changes) if one of them is accumulated here already, or if the
        sums are of another stage or iteration or do not fit this stage's parameters."""
        if (kept.stage, kept.iteration) != (self.stage, self.iteration):
            raise ExecutorError(
                f"a kept sum of stage {kept.stage} iteration {kept.iteration} cannot be adopted "
                f"at stage {self.stage} iteration {self.iteration}"
            )
        twice = set(kept.microbatch_ids) & set(self._accumulated)
        if twice:
            raise DuplicateMicrobatchError(
                f"microbatch {min(twice)} of a kept sum is already accumulated on stage "
                f"{self.stage}"
            )
        if not kept.microbatch_ids:
            return
        if set(kept.grad_sums) != set(self._params) or any(
            kept.grad_sums[name].shape != param.shape for name, param in self._params.items()
        ):
            raise ExecutorError(f"a kept sum does not fit stage {self.stage}'s parameters")
        for name, grad in kept.grad_sums.items():
            grad = grad.to(self._accum_device, self._accum_dtype)
            total = self._sums.get(name)
            self._sums[name] = grad.clone() if total is None else total + grad
        for mb in kept.microbatch_ids:
            self._accumulated[mb] = None

    def commit(self, aggregated: AggregatedGradient) -> str:
        """Step AdamW with the stage's combined gradient and start the next iteration.

        Refused if the aggregate is for another stage or iteration, or leaves out a microbatch
        this replica accumulated. With no microbatch at all, no step is taken (nothing was
        learned) but the iteration still advances. Forward state still in flight is dropped.
        Returns the new parameter checksum.
        """
        if (aggregated.stage, aggregated.iteration) != (self.stage, self.iteration):
            raise ExecutorError(
                f"aggregate for stage {aggregated.stage} iteration {aggregated.iteration} "
                f"cannot commit stage {self.stage} iteration {self.iteration}"
            )
        left_out = set(self._accumulated) - set(aggregated.microbatch_ids)
        if left_out:
            raise ExecutorError(
                f"aggregate leaves out microbatches {sorted(left_out)} that stage {self.stage} "
                "accumulated here; combine every replica's contribution"
            )
        keep = self.job.catch_up_steps
        base = (self._checksum or self.checksum()) if keep else ""
        if aggregated.count:
            if set(aggregated.grads) != set(self._params):
                raise ExecutorError(
                    f"aggregate's parameters do not match stage {self.stage}'s; "
                    "was it built for another model or cut?"
                )
            for name, param in self._params.items():
                grad = aggregated.grads[name]
                if grad.shape != param.shape or grad.dtype != param.dtype:
                    raise ExecutorError(
                        f"aggregate's gradient for {name} is {grad.dtype}{list(grad.shape)}, "
                        f"expected {param.dtype}{list(param.shape)}"
                    )
            for name, param in self._params.items():
                param.grad = aggregated.grads[name].to(param.device, copy=True)
            self.optimizer.step()
            for param in self._params.values():
                param.grad = None
        self._in_flight.clear()
        self._accumulated = {}
        self._sums = {}
        self.iteration += 1
        self._checksum = self.checksum()
        if keep:
            if self._steps and self._steps[-1][0].iteration != aggregated.iteration - 1:
                self._steps.clear()
            grads = {name: grad.detach().to("cpu") for name, grad in aggregated.grads.items()}
            self._steps.append((Step(aggregated.iteration, aggregated.microbatch_ids, grads), base))
            while len(self._steps) > keep:
                self._steps.popleft()
        return self._checksum

    def abandon(self) -> None:
        """Forget the iteration's work, forward state and gradient sums, without a step.

        For an iteration started again from scratch (its coordinator died, or a microbatch could
        not be recovered): what was accumulated here would be accumulated again, so it must go.
        The parameters and the iteration stay as they are.
        """
        self._in_flight.clear()
        self._accumulated = {}
        self._sums = {}

    # -- state transfer ----------------------------------------------------------------------

    def weights(self) -> tuple[int, bytes]:
        """(iterations trained into them, this stage's parameters as safetensors bytes): what a
        user downloads (`gwtf.train.checkpoints.checkpoint`). Read together, so they always
        match."""
        from gwtf.train.checkpoints.checkpoint import weights_bytes

        return self.iteration, weights_bytes(self.parameters())

    def state_bytes(self) -> bytes:
        """Weights and AdamW state at the start of `self.iteration`, for a joiner of this stage.

        Parameters only change at commit, so this is the state of an iteration boundary even when
        microbatches of the current iteration are in flight (they are not included).
        """
        return pack_state(
            StageState(
                job_id=self.job_id,
                stage=self.stage,
                num_stages=self.num_stages,
                first_layer=self.spec.first_layer,
                end_layer=self.spec.end_layer,
                iteration=self.iteration,
                model=_on_cpu(self.module.state_dict()),
                optimizer=_on_cpu(self.optimizer.state_dict()),
            )
        )

    def restore(self, data: bytes) -> None:
        """Go back to this stage's own earlier `state_bytes()` (a rollback, docs/design.md 4.6):
        its parameters, AdamW state and iteration; the iteration's work in progress is
        forgotten. Raises StateError for a state of another job or stage."""
        state = unpack_state(data)
        if (state.job_id, state.stage, state.first_layer, state.end_layer) != (
            self.job_id, self.stage, self.spec.first_layer, self.spec.end_layer,
        ):
            raise StateError(f"state of {state.job_id} stage {state.stage} cannot restore "
                             f"{self.job_id} stage {self.stage}")
        try:
            self.module.load_state_dict(state.model, strict=True)
            self.optimizer.load_state_dict(dict(state.optimizer))
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise StateError(f"state does not fit stage {self.stage}: {exc}") from None
        self.abandon()
        self.iteration = state.iteration
        self._checksum = None
        self._steps.clear()  # another history from here on: its steps must not be served

    def steps_bytes(self, iteration: int) -> bytes:
        """The steps of this replica from `iteration` to `self.iteration` (`pack_steps`), for a
        joiner holding the state of `iteration`. StateError if it does not keep them all."""
        held = [(step, base) for step, base in self._steps if step.iteration >= iteration]
        if iteration >= self.iteration or not held or held[0][0].iteration != iteration:
            first = self._steps[0][0].iteration if self._steps else self.iteration
            raise StateError(
                f"stage {self.stage} keeps the steps of iterations {first}..{self.iteration - 1}, "
                f"not from {iteration}"
            )
        assert self._checksum is not None  # a commit stored the steps
        return pack_steps(StageSteps(
            job_id=self.job_id, stage=self.stage, first_layer=self.spec.first_layer,
            end_layer=self.spec.end_layer, base=held[0][1], end=self._checksum,
            steps=tuple(step for step, _ in held),
        ))

    def catch_up(self, data: bytes) -> int:
        """Apply a replica's `steps_bytes` to this state with `commit`, as the replica did: the
        same bits. Returns the iteration reached. StateError if they are of another job, stage
        or state, or end elsewhere than the replica's parameters did; the executor is then
        unusable (a joiner builds another from a state)."""
        read = unpack_steps(data)
        if (read.job_id, read.stage, read.first_layer, read.end_layer) != (
            self.job_id, self.stage, self.spec.first_layer, self.spec.end_layer,
        ):
            raise StateError(f"steps of {read.job_id} stage {read.stage} cannot catch up "
                             f"{self.job_id} stage {self.stage}")
        if not read.steps or read.steps[0].iteration != self.iteration:
            first = read.steps[0].iteration if read.steps else None
            raise StateError(f"steps from iteration {first} cannot catch up a state of "
                             f"iteration {self.iteration}")
        if (self._checksum or self.checksum()) != read.base:
            raise StateError(f"the steps were taken from another state of iteration "
                             f"{self.iteration} (a rolled-back history)")
        for step in read.steps:
            try:
                self.commit(AggregatedGradient(self.stage, step.iteration, step.microbatch_ids,
                                               step.grads))
            except ExecutorError as err:
                raise StateError(f"a step of iteration {step.iteration} does not fit: {err}"
                                 ) from None
        if self._checksum != read.end:
            raise StateError(f"after catching up to iteration {self.iteration} the parameters "
                             "differ from the replica's")
        return self.iteration

    @classmethod
    def from_state(
        cls,
        job: JobConfig,
        stage: int,
        num_stages: int,
        data: bytes,
        *,
        capacity: int | None = None,
        placement: Placement | None = None,
    ) -> StageExecutor:
        """An executor for a node joining the stage, from a peer's `state_bytes()`."""
        state = unpack_state(data)
        spec = stage_spec(job.model.layers, num_stages, stage)
        if state.job_id != job.job_id:
            raise StateError(f"state is for job {state.job_id}, not {job.job_id}")
        if (state.first_layer, state.end_layer, state.stage) != (
            spec.first_layer,
            spec.end_layer,
            spec.stage,
        ):
            raise StateError(
                f"state holds stage {state.stage} (blocks {state.first_layer}.."
                f"{state.end_layer - 1}), not stage {stage} (blocks {spec.first_layer}.."
                f"{spec.end_layer - 1})"
            )
        with torch.device("meta"):
            module = StageModule(job.model, spec)
        module.to_empty(device="cpu")
        try:
            module.load_state_dict(state.model, strict=True)
        except (RuntimeError, TypeError) as exc:
            raise StateError(f"state weights do not fit stage {stage}: {exc}") from None
        executor = cls(
            job,
            stage,
            num_stages,
            capacity=capacity,
            placement=placement,
            _module=module,
            _iteration=state.iteration,
        )
        try:
            executor.optimizer.load_state_dict(dict(state.optimizer))
        except (KeyError, ValueError, TypeError) as exc:
            raise StateError(f"state's optimizer does not fit stage {stage}: {exc}") from None
        return executor

    # -- inside --------------------------------------------------------------------------------

    def _refuse(self, error: ExecutorError) -> NoReturn:
        self.stats.refused += 1
        raise error

    def _check_key(self, key: MicrobatchKey) -> None:
        if key.job_id != self.job_id:
            self._refuse(ExecutorError(f"microbatch {key} is for another job than {self.job_id}"))
        if key.iteration != self.iteration:
            self._refuse(
                ExecutorError(
                    f"microbatch {key} is for iteration {key.iteration} but stage {self.stage} is "
                    f"at iteration {self.iteration}"
                )
            )
        if not 0 <= key.microbatch < self.job.microbatches:
            self._refuse(
                ExecutorError(
                    f"microbatch id {key.microbatch} is outside 0..{self.job.microbatches - 1}"
                )
            )

    def _check_tensor(
        self, what: str, tensor: object, shape: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        if not isinstance(tensor, Tensor):
            self._refuse(BadTensorError(f"{what} must be a tensor, got {type(tensor).__name__}"))
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            self._refuse(
                BadTensorError(
                    f"{what} on stage {self.stage} must be {dtype} of shape {list(shape)}, "
                    f"got {tensor.dtype} of shape {list(tensor.shape)}"
                )
            )
        if tensor.device.type != "cpu":
            self._refuse(BadTensorError(f"{what} must be on the CPU, got {tensor.device}"))
        if dtype.is_floating_point:
            if not bool(torch.isfinite(tensor).all()):
                self._refuse(BadTensorError(f"{what} on stage {self.stage} contains NaN or inf"))
        elif tensor.numel() and (
            int(tensor.min()) < 0 or int(tensor.max()) >= self.job.model.vocab
        ):
            self._refuse(
                BadTensorError(f"{what} has token ids outside 0..{self.job.model.vocab - 1}")
            )

    def _run(
        self, key: MicrobatchKey, inputs: Tensor, labels: Tensor | None, *, replay: bool
    ) -> ForwardResult:
        self._check_key(key)
        if key in self._in_flight:
            self._refuse(
                DuplicateMicrobatchError(
                    f"microbatch {key} is already in flight on stage "
                    f"{self.stage}; drop it before running it again"
                )
            )
        if key.microbatch in self._accumulated:
            self._refuse(
                DuplicateMicrobatchError(
                    f"microbatch {key} is already accumulated on stage {self.stage} in this "
                    "iteration"
                )
            )
        model = self.job.model
        tokens = (self.job.microbatch_size, model.seq_len)
        if self.spec.is_first:
            self._check_tensor("input token ids", inputs, tokens, torch.int64)
        else:
            self._check_tensor("input activation", inputs, (*tokens, model.width), torch.float32)
        if self.spec.is_last:
            if labels is None:
                self._refuse(BadTensorError(f"the last stage needs the labels of {key}"))
            self._check_tensor("labels", labels, tokens, torch.int64)
        elif self.capacity is not None and len(self._in_flight) >= self.capacity:
            self._refuse(
                CapacityError(
                    f"stage {self.stage} holds {len(self._in_flight)} microbatches, its "
                    f"capacity; {key} must wait or go to another node"
                )
            )
        start = perf_counter()
        place = self.placement
        seeds = DropoutSeeds(self.job.seed, key.iteration, key.microbatch, place.device)
        inputs = place.to_device(inputs)
        leaf = inputs if self.spec.is_first else inputs.detach().requires_grad_(True)
        with torch.enable_grad(), place.autocast():
            output = self.module(leaf, seeds)
            if self.spec.is_last:
                assert labels is not None
                loss = StageModule.loss(output, place.to_device(labels))
                if not bool(torch.isfinite(loss)):
                    self._refuse(
                        ExecutorError(
                            f"the loss of {key} is {float(loss.detach())}: the training diverged; "
                            "lower optimizer.lr"
                        )
                    )
        # The backward runs outside autocast (autograd replays the casts the forward recorded).
        if self.spec.is_last:
            scaled = loss if self._loss_scale == 1.0 else loss * self._loss_scale
            grad_input = self._backprop(_InFlight(leaf, scaled), None, key.microbatch)
            result = ForwardResult(key, grad_input=grad_input, loss=float(loss.detach()))
        else:
            self._in_flight[key] = _InFlight(leaf, output)
            result = ForwardResult(key, output=Placement.to_wire(output.detach()))
        elapsed = perf_counter() - start
        self.stats.compute_s += elapsed
        if replay:
            self.stats.recomputes += 1
            self.stats.replayed_s += elapsed
        else:
            self.stats.forwards += 1
        if self.spec.is_last:
            self.stats.backwards += 1
        return result

    def _backprop(
        self, saved: _InFlight, grad_output: Tensor | None, microbatch: int
    ) -> Tensor | None:
        names = list(self._params)
        wanted: list[Tensor] = [self._params[name] for name in names]
        needs_input = not self.spec.is_first
        if needs_input:
            wanted.append(saved.inputs)
        grads = torch.autograd.grad(saved.output, wanted, grad_outputs=grad_output)
        for name, grad in zip(names, grads, strict=False):
            total = self._sums.get(name)
            grad = grad.to(self._accum_device, self._accum_dtype)
            if self._loss_scale != 1.0:
                grad = grad / self._loss_scale
            # Out of place: a contribution handed to the node never changes under its feet.
            self._sums[name] = grad.clone() if total is None else total + grad
        self._accumulated[microbatch] = None
        if not needs_input:
            return None
        grad_input = grads[-1] if self._loss_scale == 1.0 else grads[-1] / self._loss_scale
        return Placement.to_wire(grad_input)

    def __repr__(self) -> str:
        return (
            f"StageExecutor(job={self.job_id}, stage={self.stage}/{self.num_stages}, "
            f"blocks={self.spec.first_layer}..{self.spec.end_layer - 1}, "
            f"iteration={self.iteration}, in_flight={self.in_flight}, "
            f"accumulated={len(self._accumulated)})"
        )


def _on_cpu(value: Any) -> Any:
    """A state_dict (nested dicts and lists of tensors) with every tensor on the CPU."""
    if isinstance(value, Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(item) for item in value)
    return value
