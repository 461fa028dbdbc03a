"""Where a node computes: the torch device, the precision of its matmuls, its CPU threads.

- `--device auto|cpu|cuda|cuda:N|mps`: `auto` takes the first CUDA GPU, else Apple's MPS, else
  the CPU. A device this machine does not have is refused with one sentence (`DeviceError`).
- `--precision fp32|bf16|fp16`: the weights, the AdamW state and the gradient sums stay float32
  (or float64 sums, `grad_accum`) whatever the precision; `bf16` and `fp16` run the stage's
  forward and backward under `torch.autocast`, so matmuls and attention run in 16 bits where the
  device has fast kernels for it. `fp16` has a narrow exponent: an fp16 stage multiplies what
  its backward starts from (the loss on the last stage, the incoming gradient elsewhere) by a
  fixed `FP16_LOSS_SCALE` and divides the gradients it produces (its parameters' and the one it
  sends upstream) by it, so small gradients do not flush to zero inside its 16-bit kernels. The
  scale is local to the stage: the wire carries true float32 gradients, so fp16, bf16 and fp32
  replicas mix in one swarm. A power of two scales exactly. It is fixed, not dynamic: skipping a
  step on overflow would need the whole swarm to agree, and a non-finite gradient is refused as
  any other, so prefer bf16 where the device has it.
- Threads: `--threads N|auto`. Replicas that must reproduce each other bit for bit (a
  replacement recomputing a dead node's microbatch, a swarm compared with the one-process
  reference) need the same thread count (`gwtf.train.executor`). `auto` is 1 on a GPU (the CPU
  only feeds it) and, on a CPU, the cores this process may run on, at most `MAX_AUTO_THREADS`;
  several nodes on one machine (`gwtf launch`, the tests) run with 1 each.

What crosses the wire never depends on the device: activations and gradients travel as float32
CPU tensors (`to_wire`), and come back onto the device on arrival (`to_device`).

Tolerance (`docs/design.md` 10): the CPU fp32 path is the reference path, bit for bit. Another
device or a 16-bit precision computes each microbatch to within float rounding of it (bf16:
about 3 significant digits per matmul), so a swarm with such nodes ends close to the reference,
not equal to it; the replicas of a stage still end bit-identical to each other, because they step
with the same combined gradient bytes and the AdamW step runs in float32.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "DEVICES",
    "FP16_LOSS_SCALE",
    "MAX_AUTO_THREADS",
    "PRECISIONS",
    "DeviceError",
    "Placement",
    "configure",
    "resolve_device",
    "resolve_threads",
]

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
PRECISIONS = ("fp32", "bf16", "fp16")
# 2**10: small enough that a transformer's activation gradients do not overflow fp16's 65,504 in
# practice, large enough to lift gradients of about 1e-8 (fp16's smallest normal is 6e-5).
FP16_LOSS_SCALE = 1024.0
MAX_AUTO_THREADS = 8

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceError(ValueError):
    """A device, precision or thread count this machine cannot run (one sentence)."""


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: str) -> torch.device:
    """The torch device `name` asks for, on this machine; DeviceError if it has none."""
    text = name.strip().lower()
    if text == "auto":
        if _cuda_count():
            return torch.device("cuda", 0)
        return torch.device("mps") if _mps() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not _mps():
            raise DeviceError("--device mps: this machine has no Apple MPS device; use cpu")
        return torch.device("mps")
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise DeviceError(f"--device {name}: a CUDA device is cuda or cuda:N (N = 0, 1, ...)")
        count = _cuda_count()
        if count == 0:
            why = "this torch is a CPU-only build" if torch.version.cuda is None else (
                "no CUDA GPU is visible")
            raise DeviceError(f"--device {name}: {why}; use --device cpu (or auto)")
        index = int(index_text)
        if index >= count:
            raise DeviceError(
                f"--device {name}: this machine has {count} CUDA device(s), "
                f"cuda:0..cuda:{count - 1}"
            )
        return torch.device("cuda", index)
    raise DeviceError(f"--device {name!r}: choose one of {', '.join(DEVICES)}")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None, device: torch.device) -> int:
    """`threads` (None: auto, see the module docstring) as a torch thread count."""
    if threads is not None:
        if threads < 1:
            raise DeviceError(f"--threads must be at least 1, got {threads}")
        return threads
    if device.type != "cpu":
        return 1
    return min(available_cores(), MAX_AUTO_THREADS)


@dataclass(frozen=True)
class Placement:
    """A stage's device and precision. The default is the CPU at fp32: the reference path."""

    device: torch.device = torch.device("cpu")
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise DeviceError(
                f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        if self.precision == "fp16" and self.device.type == "cpu" and not _cpu_fp16_autocast():
            raise DeviceError("--precision fp16 is not available on this CPU; use bf16 or fp32")

    @classmethod
    def of(cls, device: str = "cpu", precision: str = "fp32") -> Placement:
        """From the flags' words (`--device`, `--precision`)."""
        return cls(resolve_device(device), precision)

    @property
    def reference(self) -> bool:
        """The CPU fp32 path, bit for bit equal to the one-process reference."""
        return self.device.type == "cpu" and self.precision == "fp32"

    @property
    def loss_scale(self) -> float:
        return FP16_LOSS_SCALE if self.precision == "fp16" else 1.0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The stage's forward (and its backward's recorded casts) under this precision."""
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=dtype):
            yield

    def to_device(self, tensor: Tensor) -> Tensor:
        """A tensor from the wire (CPU) onto this device; the same tensor on the CPU."""
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)

    @staticmethod
    def to_wire(tensor: Tensor) -> Tensor:
        """What travels: float32 (ids stay int64) on the CPU, whatever the device computed."""
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            tensor = tensor.float()
        return tensor if tensor.device.type == "cpu" else tensor.cpu()

    def synchronize(self) -> None:
        """Wait for the device's queued work (timing a GPU needs it)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def __str__(self) -> str:
        return f"{self.device} {self.precision}"


def configure(
    device: str = "auto", precision: str = "fp32", threads: int | None = None
) -> Placement:
    """A node's placement from its flags, with torch's thread count set for the process (once,
    before any work: the count is process-wide). DeviceError if this machine cannot run it."""
    placement = Placement.of(device, precision)
    if placement.device.type == "cpu" and placement.precision == "fp16":
        # Measured (benchmarks/RESULTS.md, device): fp16 autocast on a CPU ran a stage 28x
        # slower than fp32, where bf16 ran 1.9x faster. The executor still runs it (tests do).
        raise DeviceError("--precision fp16 has no fast kernels on a CPU (28x slower than fp32 "
                          "here); use bf16 or fp32 there")
    torch.set_num_threads(resolve_threads(threads, placement.device))
    return placement


def _cpu_fp16_autocast() -> bool:
    try:
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            return bool(torch.ones(2, 2) @ torch.ones(2, 2) is not None)
    except (RuntimeError, ValueError):
        return False
