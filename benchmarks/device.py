"""Stage compute per device and precision: seconds of one microbatch's forward and backward
through one pipeline stage (`gwtf.train.costs.measure_stage_compute`, the node's own warm-up),
at fp32, bf16 and fp16 on every device this machine has, as a ratio against fp32 on the same
device in the same run, and as model FLOP/s (and the fraction of the device's dense bf16 peak
where the device is known).

The stage: on a CUDA GPU, a ~1 B-parameter LLaMA-like middle stage (20 blocks of width 2048,
16 heads, SwiGLU 5632, sequences of 2048 tokens, 4 per microbatch); on the CPU a 4-block stage of
width 512 (sequences of 256), which the CPU runs in seconds. `--quick` halves both.

FLOPs per microbatch: 6 N T + 12 L T s d (N parameters of the stage, T tokens, L blocks, s the
sequence length, d the width): the matmuls of the forward and twice that in the backward, and the
attention scores (the PaLM paper's model-FLOPs count; recomputation not counted).

`python -m benchmarks device [--quick]`.
"""

from __future__ import annotations

import time

import torch

from benchmarks.report import machine, write_section
from gwtf.train.costs import measure_stage_compute
from gwtf.train.device import DeviceError, Placement
from gwtf.train.job import JobConfig, ModelConfig
from gwtf.train.partition import StageSpec
from gwtf.train.stage import build_stage

# Dense bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets (no sparsity).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0,
                    "RTX 4090": 165.0, "V100": 125.0}  # fmt: skip


def _stage_job(device: torch.device, quick: bool) -> tuple[JobConfig, StageSpec]:
    if device.type == "cuda":
        blocks, width, heads, seq, batch = (10 if quick else 20), 2048, 16, 2048, 4
        model = ModelConfig(kind="llama", layers=blocks + 2, width=width, heads=heads,
                            seq_len=seq, vocab=32000, dropout=0.0, mlp_hidden=5632)  # fmt: skip
    else:
        blocks, width, heads, seq, batch = (2 if quick else 4), 512, 8, 256, 4
        model = ModelConfig(kind="llama", layers=blocks + 2, width=width, heads=heads,
                            seq_len=seq, vocab=32000, dropout=0.0)  # fmt: skip
    job = JobConfig(model=model, iterations=1, microbatches=1, microbatch_size=batch)
    return job, StageSpec(stage=1, num_stages=3, first_layer=1, end_layer=1 + blocks)


def _peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def _devices() -> list[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda", 0))
    return found


def run(quick: bool = False) -> str:
    started = time.strftime("%Y-%m-%d %H:%M")
    torch.set_num_threads(min(torch.get_num_threads(), 8))
    rows = []
    for device in _devices():
        job, spec = _stage_job(device, quick)
        module = build_stage(job.model, job.seed, spec)
        params = sum(p.numel() for p in module.parameters())
        model = job.model
        tokens = job.microbatch_size * model.seq_len
        blocks = spec.end_layer - spec.first_layer
        flops = 6 * params * tokens + 12 * blocks * tokens * model.seq_len * model.width
        base: float | None = None
        peak = _peak(device)
        rows.append(f"| {device}: stage of {params / 1e6:.0f} M parameters, {blocks} blocks of "
                    f"width {model.width}, {job.microbatch_size} x {model.seq_len} tokens "
                    "| | | | | |")  # fmt: skip
        for precision in ("fp32", "bf16", "fp16"):
            try:
                placement = Placement(device, precision)
            except DeviceError as err:
                rows.append(f"| {device} | {precision} | not run: {err} | | | |")
                continue
            repeats = 2 if quick or device.type == "cpu" else 5
            seconds = measure_stage_compute(module, job, repeats=repeats, placement=placement)
            base = seconds if precision == "fp32" else base
            ratio = f"{base / seconds:.2f}x" if base else "-"
            tflops = flops / seconds / 1e12
            of_peak = f"{100 * tflops / peak:.0f}%" if peak else "(peak unknown)"
            rows.append(
                f"| {device} | {precision} | {seconds:.3f} | {ratio} | {tflops:.2f} | {of_peak} |"
            )
        del module
    gpu = "" if torch.cuda.is_available() else (
        "\nNo CUDA GPU on this machine: only the CPU was measured.\n"
    )
    command = "python -m benchmarks device" + (" --quick" if quick else "")
    body = f"""## Stage compute per device and precision (`{command}`)

Measured {started} on {machine()}; torch {torch.__version__}, {torch.get_num_threads()} CPU
threads. Seconds of one microbatch's forward and backward through the stage (median of the
node's warm-up runs); speed-up against fp32 on the same device in this run; model TFLOP/s
(6 N T + 12 L T s d) and their share of the device's dense bf16 peak.
{gpu}
| device | precision | s per microbatch | vs fp32 | TFLOP/s | of bf16 peak |
|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    write_section("device", body)
    return body
