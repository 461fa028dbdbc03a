"""What a node tells the router about its stage: compute time per microbatch, activation size.

docs/design.md 1 and 2: node capacity is `1 / c_i`, with `c_i` the seconds of forward + backward of
one microbatch through the node's stage, "measured by a short warm-up on real hardware"; arc
costs and capacities need the bytes of one activation. Both come from here.
"""

from __future__ import annotations

import statistics
from time import perf_counter

import torch

from gwtf.train.device import Placement
from gwtf.train.job import JobConfig
from gwtf.train.partition import partition
from gwtf.train.seeds import seeded_generator
from gwtf.train.stage import DropoutSeeds, StageModule

__all__ = ["activation_bytes", "measure_stage_compute", "stage_profile"]

_FLOAT32_BYTES = 4


def activation_bytes(job: JobConfig) -> int:
    """Bytes of one activation (or of the gradient going back), float32 [B, T, width]."""
    return job.microbatch_size * job.model.seq_len * job.model.width * _FLOAT32_BYTES


_STATE_COPIES = 3
"""A stage's state per parameter: the fp32 weight and AdamW's two moments."""


def stage_profile(job: JobConfig, num_stages: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(FLOPs of one microbatch's forward and backward through each stage, bytes of each
    stage's state), from the job's model cut into `num_stages` (docs/design.md 2.11: what the
    coordinator estimates a node's speed at another stage and a move's download from). The
    stages are built on the meta device: nothing is allocated or initialised.

    FLOPs: 6 per weight of every linear layer per token (2 forward, 4 backward) and, per block,
    12 per position and width unit per token for the attention scores (QK and AV, forward and
    backward); an embedding is a lookup and costs nothing. State: 4 bytes per parameter for
    the weight and each of AdamW's moments."""
    tokens = job.microbatch_size * job.model.seq_len
    costs: list[float] = []
    sizes: list[int] = []
    for spec in partition(job.model.layers, num_stages):
        with torch.device("meta"):
            module = StageModule(job.model, spec)
        flops = 0.0
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear):
                flops += 6.0 * sub.in_features * sub.out_features
        flops += 12.0 * len(spec.layers) * job.model.seq_len * job.model.width
        costs.append(flops * tokens)
        params = sum(p.numel() for p in module.parameters())
        sizes.append(_STATE_COPIES * _FLOAT32_BYTES * params)
    return tuple(costs), tuple(sizes)


def measure_stage_compute(
    module: StageModule, job: JobConfig, *, repeats: int = 5, placement: Placement | None = None
) -> float:
    """Median seconds of forward + backward of one microbatch through `module`, after one
    untimed warm-up run, on `placement`'s device and precision (default: the CPU at fp32; the
    module is moved there). Inputs are synthetic (seeded); parameter gradients are computed and
    thrown away, so the module and any executor holding it are left as they were."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    place = placement if placement is not None else Placement()
    module.to(place.device)
    generator = seeded_generator(job.seed, "warm-up")
    shape = (job.microbatch_size, job.model.seq_len)
    if module.spec.is_first:
        inputs = torch.randint(0, job.model.vocab, shape, generator=generator)
    else:
        inputs = torch.randn(*shape, job.model.width, generator=generator)
    labels = place.to_device(torch.randint(0, job.model.vocab, shape, generator=generator))
    inputs = place.to_device(inputs)
    if not module.spec.is_first:
        inputs.requires_grad_(True)
    params = list(module.parameters())
    wanted = params if module.spec.is_first else [*params, inputs]
    times = []
    for run in range(repeats + 1):
        place.synchronize()
        start = perf_counter()
        with torch.enable_grad(), place.autocast():
            output = module(inputs, DropoutSeeds(job.seed, -1, run, place.device))
            target = StageModule.loss(output, labels) if module.spec.is_last else output
        grad = None if module.spec.is_last else torch.ones_like(target)
        torch.autograd.grad(target, wanted, grad_outputs=grad)
        place.synchronize()
        times.append(perf_counter() - start)
    return statistics.median(times[1:])
