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
    "combine_contributions",
    "mean_loss",
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
    node_ids = [c.node_id for c in ordered]
    if len(set(node_ids)) != len(node_ids):
        twice = next(n for n in node_ids if node_ids.count(n) > 1)
        raise ContributionError(f"node {twice} sent two contributions; keep one per node")
    owner: dict[int, str] = {}
    names: list[str] | None = None
    for contribution in ordered:
        if (contribution.stage, contribution.iteration) != (first.stage, first.iteration):
            raise ContributionError(
                f"contribution of {contribution.node_id} is for stage {contribution.stage} "
                f"iteration {contribution.iteration}, not stage {first.stage} iteration "
                f"{first.iteration}; combine one stage and iteration at a time"
            )
        if len(set(contribution.microbatch_ids)) != contribution.count:
            raise ContributionError(
                f"contribution of {contribution.node_id} lists a microbatch twice"
            )
        if contribution.count and not contribution.grad_sums:
            raise ContributionError(
                f"contribution of {contribution.node_id} counts microbatches but has no gradient"
            )
        for mb in contribution.microbatch_ids:
            if mb in owner:
                raise ContributionError(
                    f"microbatch {mb} of iteration {first.iteration} was accumulated by both "
                    f"{owner[mb]} and {contribution.node_id}; it must be counted once"
                )
            owner[mb] = contribution.node_id
        if contribution.count:
            these = sorted(contribution.grad_sums)
            if names is None:
                names = these
            elif these != names:
                raise ContributionError(
                    f"contribution of {contribution.node_id} has other parameters than the others"
                )
    if expected_ids is not None:
        expected = set(expected_ids)
        missing = expected - owner.keys()
        if missing:
            raise ContributionError(
                f"microbatches {_ids(missing)} of iteration {first.iteration} finished but no "
                f"replica of stage {first.stage} accumulated them; replay them before committing"
            )
        extra = owner.keys() - expected
        if extra:
            raise ContributionError(
                f"microbatches {_ids(extra)} were accumulated by stage {first.stage} but are not "
                f"finished in iteration {first.iteration}"
            )
    ids = tuple(sorted(owner))
    if not ids:
        return AggregatedGradient(first.stage, first.iteration, (), {})
    assert names is not None
    grads: dict[str, Tensor] = {}
    for name in names:
        total: Tensor | None = None
        for contribution in ordered:
            if not contribution.count:
                continue
            part = contribution.grad_sums[name]
            total = part.clone() if total is None else total.add_(part)
        assert total is not None
        grads[name] = (total / len(ids)).to(dtype)
    return AggregatedGradient(first.stage, first.iteration, ids, grads)


def mean_loss(losses: Mapping[int, float]) -> float:
    """The iteration's loss: the mean of the per-microbatch losses, summed in id order."""
    if not losses:
        return float("nan")
    return sum(losses[mb] for mb in sorted(losses)) / len(losses)
