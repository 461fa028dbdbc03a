"""Devices and precisions of the stage executor (`gwtf.train.device`).

The CPU fp32 path is the reference path (bit for bit: tests/unit/test_train_swarm.py). The 16-bit
paths are held to stated tolerances, measured on this CPU against fp32 on the same microbatch:

- the gradient sums of one microbatch through a 3-stage tiny LLaMA: relative L2 error per
  parameter at most `GRAD_TOLERANCE` (measured: bf16 0.020, fp16 0.008; a wrong dropout mask or a
  lost microbatch is an error of order 1);
- the loss: within `LOSS_TOLERANCE` of fp32's (measured: bf16 4e-4, fp16 2e-5 at a loss of 5.6).

CUDA and MPS cannot run on this machine; their refusal is tested, their paths are the same code
(autocast on the device, tensors moved at the executor's edges).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gwtf.train.data import job_microbatch, load_corpus
from gwtf.train.device import (
    FP16_LOSS_SCALE,
    DeviceError,
    Placement,
    configure,
    resolve_device,
    resolve_threads,
)
from gwtf.train.executor import MicrobatchKey, StageExecutor
from gwtf.train.job import preset

GRAD_TOLERANCE = {"bf16": 5e-2, "fp16": 2e-2}
LOSS_TOLERANCE = 2e-3


def test_auto_is_the_cpu_here_and_missing_devices_are_refused_in_one_sentence() -> None:
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("CPU") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="--device cuda:1: .*use --device cpu"):
            resolve_device("cuda:1")
    with pytest.raises(DeviceError, match="cuda or cuda:N"):
        resolve_device("cuda:first")
    with pytest.raises(DeviceError, match="choose one of auto, cpu, cuda, cuda:N, mps"):
        resolve_device("tpu")
    with pytest.raises(DeviceError, match="choose one of fp32, bf16, fp16"):
        Placement(precision="fp8")


def test_threads_auto_is_one_on_a_gpu_and_the_free_cores_on_a_cpu() -> None:
    assert resolve_threads(3, torch.device("cpu")) == 3
    assert resolve_threads(None, torch.device("cuda", 0)) == 1
    assert 1 <= resolve_threads(None, torch.device("cpu")) <= 8
    with pytest.raises(DeviceError, match="at least 1"):
        resolve_threads(0, torch.device("cpu"))
    before = torch.get_num_threads()
    try:
        assert configure("cpu", "bf16", 1).precision == "bf16"
        assert torch.get_num_threads() == 1
        with pytest.raises(DeviceError, match="fp16 has no fast kernels on a CPU"):
            configure("cpu", "fp16", 1)
    finally:
        torch.set_num_threads(before)


def _one_microbatch(precision: str) -> tuple[list[dict[str, Tensor]], float, list[Tensor]]:
    """One microbatch forward and back through 3 stages; the sums, the loss, what was sent."""
    job = preset("tiny-llama")
    tokens, labels = job_microbatch(load_corpus(), job, 0, 0)
    place = Placement(precision=precision)
    stages = [StageExecutor(job, s, 3, placement=place) for s in range(3)]
    key = MicrobatchKey(job.job_id, 0, 0)
    first = stages[0].forward(key, tokens).output
    assert first is not None
    second = stages[1].forward(key, first).output
    assert second is not None
    last = stages[2].forward(key, second, labels)
    assert last.grad_input is not None and last.loss is not None
    grad = stages[1].backward(key, last.grad_input)
    assert grad is not None
    assert stages[0].backward(key, grad) is None
    sums = [stage.contribution("n").grad_sums for stage in stages]
    return sums, last.loss, [first, second, last.grad_input, grad]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sixteen_bit_gradients_are_within_the_stated_tolerance_of_fp32(precision: str) -> None:
    exact, exact_loss, _ = _one_microbatch("fp32")
    sums, loss, sent = _one_microbatch(precision)
    assert abs(loss - exact_loss) <= LOSS_TOLERANCE
    worst = max(
        float((mine[name] - theirs[name]).norm() / theirs[name].norm())
        for mine, theirs in zip(sums, exact, strict=True)
        for name in theirs
    )
    print(f"{precision}: worst relative gradient error {worst:.4f}")
    assert 0.0 < worst <= GRAD_TOLERANCE[precision]  # 16-bit matmuls ran, and stayed close
    # What crosses the wire is float32 on the CPU whatever the precision; sums too.
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in sent)
    assert all(t.dtype == torch.float64 for stage in sums for t in stage.values())


def test_the_fp16_loss_scale_stays_inside_the_stage() -> None:
    """The sums and the gradients sent upstream are true gradients (off by FP16_LOSS_SCALE
    otherwise), so an fp16 replica mixes with fp32 and bf16 ones (test_train_swarm)."""
    assert FP16_LOSS_SCALE > 1.0
    exact, _, exact_sent = _one_microbatch("fp32")
    sums, _, sent = _one_microbatch("fp16")
    named = ((2, "head.out.weight"), (1, "blocks.3.down.weight"), (0, "embed.tok.weight"))
    for stage, name in named:
        ratio = float(sums[stage][name].norm() / exact[stage][name].norm())
        assert abs(ratio - 1.0) < 0.05, (name, ratio)
    for mine, theirs in zip(sent[2:], exact_sent[2:], strict=True):
        assert abs(float(mine.norm() / theirs.norm()) - 1.0) < 0.05


def test_a_bf16_replica_hands_a_state_that_a_fp32_joiner_loads_bit_for_bit() -> None:
    job = preset("tiny-gpt")
    donor = StageExecutor(job, 1, 3, placement=Placement(precision="bf16"))
    joiner = StageExecutor.from_state(job, 1, 3, donor.state_bytes())
    assert joiner.placement.reference and joiner.checksum() == donor.checksum()
