"""Iteration commit: combine the replicas' gradient sums of one stage into one mean gradient.

Each replica of stage s accumulated, for the microbatches it finished, the sum of the gradients
of their per-microbatch mean losses. The stage's gradient for the iteration is

    aggregated = (sum over replicas of their gradient sums) / (number of microbatches finished)

which is the gradient of the mean loss over the finished microbatches, whatever their split over
the replicas. The sum runs over the replicas sorted by node id, in the sums' dtype (the job's
`grad_accum`), and the division too; only then is the result rounded to the parameters' dtype.
Every replica that combines the same contributions gets the same bits, steps AdamW the same way,
and stays identical to the others.

`combine_contributions` also checks docs/design.md 4 rule 6: no microbatch counted twice, and, given
the ids the iteration finished, every one of them counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "AggregatedGradient",
    "ContributionError",
    "GradContribution",
    "check_cover",
    "combine_contributions",
    "combine_summed",
    "mean_loss",
    "mean_of",
    "sum_in_order",
]


class ContributionError(ValueError):
    """The contributions do not cover the iteration's microbatches exactly once."""


@dataclass(frozen=True, eq=False)
class GradContribution:
    """One replica's gradient sums for one iteration (empty `grad_sums` when it finished none)."""

    node_id: str
    stage: int
    iteration: int
    microbatch_ids: tuple[int, ...]
    grad_sums: Mapping[str, Tensor] = field(repr=False)

    @property
    def count(self) -> int:
        return len(self.microbatch_ids)


@dataclass(frozen=True, eq=False)
class AggregatedGradient:
    """The stage's mean gradient for one iteration, in the parameters' dtype (empty if count 0)."""

    stage: int
    iteration: int
    microbatch_ids: tuple[int, ...]
    grads: Mapping[str, Tensor] = field(repr=False)

    @property
    def count(self) -> int:
        return len(self.microbatch_ids)


def _ids(ids: Iterable[int]) -> str:
    listed = sorted(ids)
    shown = ", ".join(str(i) for i in listed[:10])
    return f"[{shown}{', ...' if len(listed) > 10 else ''}]"


def check_cover(
    stage: int,
    iteration: int,
    parts: Sequence[tuple[str, tuple[int, ...]]],
    expected_ids: Iterable[int] | None = None,
) -> tuple[int, ...]:
    """Rule 6 on the replicas' (node id, microbatch ids): one contribution per node, no
    microbatch counted twice, and, given the ids the iteration finished, each of them counted.
    The ids combined, sorted."""
    node_ids = [node for node, _ in parts]
    if len(set(node_ids)) != len(node_ids):
        twice = next(n for n in node_ids if node_ids.count(n) > 1)
        raise ContributionError(f"node {twice} sent two contributions; keep one per node")
    owner: dict[int, str] = {}
    for node, ids in sorted(parts):
        if len(set(ids)) != len(ids):
            raise ContributionError(f"contribution of {node} lists a microbatch twice")
        for mb in ids:
            if mb in owner:
                raise ContributionError(
                    f"microbatch {mb} of iteration {iteration} was accumulated by both "
                    f"{owner[mb]} and {node}; it must be counted once"
                )
            owner[mb] = node
    if expected_ids is not None:
        expected = set(expected_ids)
        missing = expected - owner.keys()
        if missing:
            raise ContributionError(
                f"microbatches {_ids(missing)} of iteration {iteration} finished but no "
                f"replica of stage {stage} accumulated them; replay them before committing"
            )
        extra = owner.keys() - expected
        if extra:
            raise ContributionError(
                f"microbatches {_ids(extra)} were accumulated by stage {stage} but are not "
                f"finished in iteration {iteration}"
            )
    return tuple(sorted(owner))


def sum_in_order(parts: Sequence[Tensor]) -> Tensor:
    """The sum of `parts` (the replicas' sums, already in node-id order), left to right, in
    their dtype: the one addition every combine uses, whole tensors or slices of them.
    Elementwise, so a slice of the sum is bit for bit the sum of the slices."""
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total


def mean_of(total: Tensor, count: int, dtype: torch.dtype) -> Tensor:
    """The stage's mean gradient from the sum over its `count` microbatches: divided in the
    sums' dtype, then rounded to the parameters' `dtype`."""
    return (total / count).to(dtype)


def combine_contributions(
    contributions: Sequence[GradContribution],
    *,
    expected_ids: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> AggregatedGradient:
    """The weighted mean of the replicas' gradients, in a fixed order (by node id).

    `expected_ids`, when given, are the microbatch ids that finished in this iteration: each must
    be covered exactly once. `dtype` is the parameters' dtype.
    """
    if not contributions:
        raise ContributionError("no contribution to combine; every live replica must send one")
    ordered = sorted(contributions, key=lambda c: c.node_id)
    first = ordered[0]
    names: list[str] | None = None
    for contribution in ordered:
        if (contribution.stage, contribution.iteration) != (first.stage, first.iteration):
            raise ContributionError(
                f"contribution of {contribution.node_id} is for stage {contribution.stage} "
                f"iteration {contribution.iteration}, not stage {first.stage} iteration "
                f"{first.iteration}; combine one stage and iteration at a time"
            )
        if contribution.count and not contribution.grad_sums:
            raise ContributionError(
                f"contribution of {contribution.node_id} counts microbatches but has no gradient"
            )
        if contribution.count:
            these = sorted(contribution.grad_sums)
            if names is None:
                names = these
            elif these != names:
                raise ContributionError(
                    f"contribution of {contribution.node_id} has other parameters than the others"
                )
    ids = check_cover(
        first.stage, first.iteration, [(c.node_id, c.microbatch_ids) for c in ordered],
        expected_ids,
    )
    if not ids:
        return AggregatedGradient(first.stage, first.iteration, (), {})
    assert names is not None
    counted = [c for c in ordered if c.count]
    grads = {
        name: mean_of(sum_in_order([c.grad_sums[name] for c in counted]), len(ids), dtype)
        for name in names
    }
    return AggregatedGradient(first.stage, first.iteration, ids, grads)


def combine_summed(
    stage: int,
    iteration: int,
    parts: Sequence[tuple[str, tuple[int, ...]]],
    sums: Mapping[str, Tensor],
    *,
    expected_ids: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> AggregatedGradient:
    """`combine_contributions` where the replicas' sums were already added (`sum_in_order`,
    slice by slice, by the reduce-scatter of docs/design.md 3.7): `parts` are the replicas'
    (node id, microbatch ids), `sums` their total by parameter name (empty when none counted
    a microbatch). The same checks, the same division, the same bits."""
    if not parts:
        raise ContributionError("no contribution to combine; every live replica must send one")
    ids = check_cover(stage, iteration, parts, expected_ids)
    if not ids:
        return AggregatedGradient(stage, iteration, (), {})
    if not sums:
        raise ContributionError(f"stage {stage} counts microbatches but has no gradient")
    grads = {name: mean_of(sums[name], len(ids), dtype) for name in sorted(sums)}
    return AggregatedGradient(stage, iteration, ids, grads)


def mean_loss(losses: Mapping[int, float]) -> float:
    """The iteration's loss: the mean of the per-microbatch losses, summed in id order."""
    if not losses:
        return float("nan")
    return sum(losses[mb] for mb in sorted(losses)) / len(losses)
