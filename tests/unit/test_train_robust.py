"""Robust aggregation: with honest replicas it stays close to the exact mean; with a poisoning
replica the mean goes anywhere and the robust rules do not; outliers by norm are named."""

from __future__ import annotations

import math

import pytest
import torch

from gwtf.train.commit import ContributionError, GradContribution
from gwtf.train.robust import aggregate, norm_outliers

SHAPES = {"w": (16, 8), "b": (8,)}


def honest(node: str, mbs: tuple[int, ...], seed: int, spread: float = 0.1) -> GradContribution:
    """A replica whose per-microbatch gradients are the true gradient plus noise."""
    true = torch.Generator().manual_seed(0)
    noise = torch.Generator().manual_seed(seed)
    sums = {}
    for name, shape in SHAPES.items():
        base = torch.randn(shape, generator=true, dtype=torch.float64)
        sums[name] = sum(base + spread * torch.randn(shape, generator=noise, dtype=torch.float64)
                         for _ in mbs)  # fmt: skip
    return GradContribution(node, 1, 3, mbs, sums)


def poisoned(node: str, mbs: tuple[int, ...], scale: float) -> GradContribution:
    g = torch.Generator().manual_seed(99)
    sums = {n: scale * torch.randn(s, generator=g, dtype=torch.float64) for n, s in SHAPES.items()}
    return GradContribution(node, 1, 3, mbs, sums)


def truth() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in SHAPES.items()}


def error(grads: dict[str, torch.Tensor]) -> float:
    """L2 distance from the true gradient, relative to its norm."""
    t = truth()
    num = sum(float((grads[n].double() - t[n]).pow(2).sum()) for n in t)
    den = sum(float(t[n].pow(2).sum()) for n in t)
    return math.sqrt(num / den)


def swarm() -> list[GradContribution]:
    return [honest("a", (0, 1, 2), 1), honest("b", (3, 4), 2), honest("c", (5, 6, 7), 3),
            honest("d", (8,), 4)]  # fmt: skip


@pytest.mark.parametrize("rule", ["trimmed-mean", "centered-clip"])
def test_honest_replicas_stay_near_the_mean(rule: str) -> None:
    exact = aggregate(swarm(), "mean", dtype=torch.float64)
    robust = aggregate(swarm(), rule, dtype=torch.float64)
    assert robust.microbatch_ids == exact.microbatch_ids == tuple(range(9))
    assert error(exact.grads) < 0.1 and error(robust.grads) < 0.1


@pytest.mark.parametrize("rule", ["trimmed-mean", "centered-clip"])
def test_a_poisoner_moves_the_mean_but_not_the_robust_rules(rule: str) -> None:
    contributions = [*swarm(), poisoned("e", (9, 10), 1e4)]
    assert error(aggregate(contributions, "mean", dtype=torch.float64).grads) > 100
    assert error(aggregate(contributions, rule, dtype=torch.float64).grads) < 0.3


def test_the_result_does_not_depend_on_the_order_received() -> None:
    contributions = [*swarm(), poisoned("e", (9,), 50.0)]
    for rule in ("trimmed-mean", "centered-clip"):
        one = aggregate(contributions, rule)
        other = aggregate(list(reversed(contributions)), rule)
        assert all(torch.equal(one.grads[n], other.grads[n]) for n in SHAPES)


def test_norm_outliers_name_scaled_and_non_finite_replicas() -> None:
    nan = poisoned("f", (11,), 1.0)
    nan.grad_sums["w"][0, 0] = float("nan")
    assert norm_outliers(swarm()) == []
    assert norm_outliers([*swarm(), poisoned("e", (9,), 1e3), nan]) == ["e", "f"]
    # Two replicas: no majority to judge a scale by, only the non-finite one.
    assert norm_outliers([honest("a", (0,), 1), poisoned("e", (1,), 1e3), nan]) == ["f"]


def test_the_commit_checks_hold_for_every_rule() -> None:
    twice = [honest("a", (0, 1), 1), honest("b", (1, 2), 2), honest("c", (3,), 3)]
    for rule in ("mean", "trimmed-mean", "centered-clip"):
        with pytest.raises(ContributionError, match="microbatch 1"):
            aggregate(twice, rule)
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        aggregate(swarm(), "median")


def scaled(c: GradContribution, factor: float) -> GradContribution:
    return GradContribution(c.node_id, c.stage, c.iteration, c.microbatch_ids,
                            {n: factor * t for n, t in c.grad_sums.items()})


@pytest.mark.parametrize("rule", ["trimmed-mean", "centered-clip"])
def test_honest_replicas_screen_alike_and_the_poisoners_own_view_differs(rule: str) -> None:
    """What the nodes of a stage hold at a commit: each its own sums and what its peers sent.
    The poisoner `x` sends its peers its sums scaled by 1e4 and keeps the true ones."""
    a, b, x = honest("a", (0, 1), 1), honest("b", (2, 3), 2), honest("x", (4, 5), 3)
    at_a = [a, b, scaled(x, 1e4)]
    at_b = [b, scaled(x, 1e4), a]
    at_x = [x, a, b]
    # The screen: both honest replicas name x (a majority of three), x names nobody.
    assert norm_outliers(at_a) == norm_outliers(at_b) == ["x"]
    assert norm_outliers(at_x) == []
    # Every honest replica steps with the same bits; the poisoner with others, so its checksum
    # disagrees with the majority of its stage even when the screen lets it through.
    mine, theirs, its = (aggregate(view, rule) for view in (at_a, at_b, at_x))
    assert all(torch.equal(mine.grads[n], theirs.grads[n]) for n in SHAPES)
    assert not all(torch.equal(mine.grads[n], its.grads[n]) for n in SHAPES)
    # Once it is excluded and its microbatches replayed at a and b, two honest replicas are left:
    # the trimmed mean cuts nothing of two, and is then their weighted mean.
    if rule == "trimmed-mean":
        pair = aggregate([a, b], rule, dtype=torch.float64)
        exact = aggregate([a, b], "mean", dtype=torch.float64)
        assert all(torch.allclose(pair.grads[n], exact.grads[n], rtol=1e-12, atol=0)
                   for n in SHAPES)
