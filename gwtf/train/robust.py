"""Robust aggregation within a stage: what a swarm of strangers does against a poisoning replica.

`combine_contributions` (gwtf/train/commit.py) takes the exact mean of the replicas' gradients,
weighted by their microbatch counts: the right answer when every replica is honest, and the one
the reference reproduces bit for bit. One replica that sends garbage moves that mean anywhere.
The job can choose instead (`aggregation` in the job file):

- `mean`: the exact weighted mean (default; equal to the reference).
- `trimmed-mean`: per coordinate, drop the `trim` fraction of the replicas' values at each end
  (at least one at each end when there are 3 or more replicas) and average the rest, weighted by
  microbatch count. Bounded influence of up to `trim * n` bad replicas per coordinate (Yin et
  al., 2018).
- `centered-clip`: start from the coordinate-wise median and move towards each replica's mean
  gradient by at most `tau` (L2) per replica, `clip_iterations` times (Karimireddy, He and Jaggi,
  2021). `tau` defaults to the median distance of the replicas from the start, so that an honest
  swarm is barely clipped and a far outlier moves the result by at most `tau * weight`.

Before either, `norm_outliers` names the replicas whose gradient norm is more than
`norm_factor` times the median norm (a cheap first screen: a poisoner that scales its gradient
is caught at once and excluded from the commit, and the node logs who).

Everything is deterministic: replicas are taken in node-id order and every reduction runs in
float64, so every replica of the stage that aggregates the same contributions gets the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gwtf.train.commit import (
    AggregatedGradient,
    ContributionError,
    GradContribution,
    combine_contributions,
)

__all__ = ["AGGREGATIONS", "aggregate", "norm_outliers"]

AGGREGATIONS = ("mean", "trimmed-mean", "centered-clip")


def _means(ordered: Sequence[GradContribution], name: str) -> Tensor:
    """Replicas x flattened parameter: each replica's mean gradient, in float64."""
    return torch.stack(
        [(c.grad_sums[name].to(torch.float64) / c.count).reshape(-1) for c in ordered]
    )


def _norms(ordered: Sequence[GradContribution]) -> list[float]:
    norms = []
    for c in ordered:
        squares = sum(
            float((c.grad_sums[n].to(torch.float64) / c.count).pow(2).sum()) for n in c.grad_sums
        )
        norms.append(math.sqrt(squares))
    return norms


def norm_outliers(contributions: Sequence[GradContribution], factor: float = 10.0) -> list[str]:
    """Node ids whose mean gradient's norm is above `factor` x the median norm, or not finite.
    With fewer than 3 replicas there is no majority to compare with: only non-finite norms."""
    ordered = sorted((c for c in contributions if c.count), key=lambda c: c.node_id)
    norms = _norms(ordered)
    bad = [c.node_id for c, n in zip(ordered, norms, strict=True) if not math.isfinite(n)]
    finite = sorted(n for n in norms if math.isfinite(n))
    if len(finite) >= 3:
        median = finite[len(finite) // 2]
        bad += [c.node_id for c, n in zip(ordered, norms, strict=True)
                if math.isfinite(n) and n > factor * max(median, 1e-30)]  # fmt: skip
    return sorted(bad)


def _trimmed(values: Tensor, weights: Tensor, trim: float) -> Tensor:
    """Weighted coordinate-wise trimmed mean of `values` (replicas x coordinates)."""
    n = values.shape[0]
    cut = max(1, int(math.floor(trim * n))) if n >= 3 else 0
    if cut == 0:
        return (values * weights[:, None]).sum(0) / weights.sum()
    order = values.argsort(dim=0, stable=True)
    kept = order[cut : n - cut]
    taken = values.gather(0, kept)
    w = weights[kept]
    return (taken * w).sum(0) / w.sum(0)


def _centered_clip(
    values: Tensor, weights: Tensor, tau: float | None, iterations: int
) -> Tensor:
    center = values.median(dim=0).values if values.shape[0] >= 3 else values.mean(0)
    distances = (values - center).norm(dim=1)
    if tau is None:
        tau = float(distances.median()) or 1e-12
    for _ in range(iterations):
        delta = values - center
        norms = delta.norm(dim=1).clamp_min(1e-30)
        scale = (tau / norms).clamp(max=1.0)
        center = center + (delta * (scale * weights)[:, None]).sum(0) / weights.sum()
    return center


def aggregate(
    contributions: Sequence[GradContribution],
    rule: str = "mean",
    *,
    expected_ids: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    trim: float = 0.2,
    tau: float | None = None,
    clip_iterations: int = 3,
) -> AggregatedGradient:
    """The stage's gradient for one iteration by `rule` (module doc). The checks of
    `combine_contributions` (each microbatch counted once) hold for every rule."""
    if rule not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {rule!r}; choose one of {', '.join(AGGREGATIONS)}")
    exact = combine_contributions(contributions, expected_ids=expected_ids, dtype=dtype)
    if rule == "mean" or not exact.count:
        return exact
    ordered = sorted((c for c in contributions if c.count), key=lambda c: c.node_id)
    if len(ordered) < 2:
        return exact
    weights = torch.tensor([float(c.count) for c in ordered], dtype=torch.float64)
    grads: dict[str, Tensor] = {}
    if rule == "trimmed-mean":
        for name in exact.grads:
            shape = ordered[0].grad_sums[name].shape
            grads[name] = _trimmed(_means(ordered, name), weights, trim).reshape(shape).to(dtype)
    else:
        # Centered clipping works on the whole gradient vector (the clip is an L2 ball).
        names = sorted(exact.grads)
        flat = torch.cat([_means(ordered, n) for n in names], dim=1)
        center = _centered_clip(flat, weights, tau, clip_iterations)
        offset = 0
        for name in names:
            shape = ordered[0].grad_sums[name].shape
            size = math.prod(shape)
            grads[name] = center[offset : offset + size].reshape(shape).to(dtype)
            offset += size
    for name, g in grads.items():
        if not torch.isfinite(g).all():
            raise ContributionError(f"aggregated gradient of {name} is not finite")
    return AggregatedGradient(exact.stage, exact.iteration, exact.microbatch_ids, grads)
