"""The reduce-scatter and all-gather of a stage's gradient sums (gwtf.node.worker.slices,
docs/design.md 3.7): the slices, the bits of a sliced combination, and what a rerun of the commit
reuses."""

from __future__ import annotations

import pytest
import torch

from gwtf.node.worker.slices import Delivered, SliceStore, basis, bounds, gaps
from gwtf.train import (
    ContributionError,
    GradContribution,
    check_cover,
    combine_contributions,
    combine_summed,
    sum_in_order,
)

SHAPES = {"a.weight": (7, 5), "b.bias": (3,), "c.weight": (2, 2, 2)}
NUMEL = 35 + 3 + 8


def layout(numel: int, members: int) -> list[tuple[int, int]]:
    return [bounds(numel, members, i) for i in range(members)]


@pytest.mark.parametrize(("numel", "members"), [(10, 3), (46, 4), (7, 1), (3, 5), (0, 2), (1, 1)])
def test_the_slices_cut_the_vector_into_contiguous_parts_in_member_order(
    numel: int, members: int
) -> None:
    cut = layout(numel, members)
    assert cut[0][0] == 0 and cut[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(cut, cut[1:], strict=False))
    sizes = [hi - lo for lo, hi in cut]
    assert max(sizes) - min(sizes) <= 1  # uneven sizes differ by one value at most
    if members > numel:
        assert sizes.count(0) == members - numel  # more members than values: some own nothing


def test_uneven_and_single_member_slices() -> None:
    assert layout(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert layout(7, 1) == [(0, 7)]
    assert layout(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match="does not exist"):
        bounds(10, 3, 3)


def test_gaps_are_what_the_held_ranges_leave_out() -> None:
    assert gaps((0, 10), []) == [(0, 10)]
    assert gaps((0, 10), [(0, 10)]) == []
    assert gaps((2, 10), [(0, 4), (6, 8)]) == [(4, 6), (8, 10)]
    assert gaps((5, 5), []) == []
    assert gaps((3, 9), [(9, 12), (0, 3)]) == [(3, 9)]


def contributions(members: int, empty: tuple[int, ...] = ()) -> list[GradContribution]:
    """Sums whose additions round (values of very different magnitudes), in float64."""
    gen = torch.Generator().manual_seed(members)
    out = []
    for m in range(members):
        ids = () if m in empty else tuple(range(3 * m, 3 * m + 3))
        sums = {
            name: torch.randn(shape, generator=gen, dtype=torch.float64)
            * 10.0 ** float(torch.randint(-8, 9, (), generator=gen))
            for name, shape in SHAPES.items()
        } if ids else {}
        out.append(GradContribution(f"n{m:02d}", 1, 4, ids, sums))
    return out


def flat(c: GradContribution) -> torch.Tensor:
    return torch.cat([c.grad_sums[n].reshape(-1) for n in sorted(SHAPES)])


def unflat(vector: torch.Tensor) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name in sorted(SHAPES):
        size = torch.Size(SHAPES[name]).numel()
        out[name] = vector[at : at + size].view(SHAPES[name])
        at += size
    return out


@pytest.mark.parametrize(("members", "empty"), [(3, ()), (4, (2,)), (1, ()), (5, (0, 3)),
                                                 (50, (7,))])
def test_a_sliced_combination_is_the_whole_combination_bit_for_bit(
    members: int, empty: tuple[int, ...]
) -> None:
    held = contributions(members, empty)
    counted = [c for c in sorted(held, key=lambda c: c.node_id) if c.count]
    # Each owner adds its slice of every counted contribution in node-id order.
    reduced = [
        sum_in_order([flat(c)[lo:hi] for c in counted]) for lo, hi in layout(NUMEL, members)
    ]
    whole = torch.cat(reduced)
    assert whole.numel() == NUMEL
    # The additions do round: another order gives other bits, so the test can tell.
    assert not torch.equal(whole, sum_in_order([flat(c) for c in reversed(counted)])) or (
        len(counted) < 3)
    assert torch.equal(whole, sum_in_order([flat(c) for c in counted]))
    parts = [(c.node_id, c.microbatch_ids) for c in held]
    expected = sorted(mb for c in held for mb in c.microbatch_ids)
    sliced = combine_summed(1, 4, parts, unflat(whole), expected_ids=expected)
    reference = combine_contributions(held, expected_ids=expected)
    assert sliced.microbatch_ids == reference.microbatch_ids
    assert sorted(sliced.grads) == sorted(reference.grads)
    for name in reference.grads:
        assert sliced.grads[name].dtype == torch.float32
        assert torch.equal(sliced.grads[name], reference.grads[name]), name


def test_a_sliced_combination_checks_the_cover_as_the_whole_one_does() -> None:
    held = contributions(3)
    parts = [(c.node_id, c.microbatch_ids) for c in held]
    total = unflat(sum_in_order([flat(c) for c in held]))
    with pytest.raises(ContributionError, match="no replica of stage 1 accumulated them"):
        combine_summed(1, 4, parts, total, expected_ids=range(10))
    with pytest.raises(ContributionError, match="not finished"):
        combine_summed(1, 4, parts, total, expected_ids=range(8))
    with pytest.raises(ContributionError, match="counted once"):
        combine_summed(1, 4, [*parts, ("n09", (0,))], total)
    with pytest.raises(ContributionError, match="two contributions"):
        combine_summed(1, 4, [*parts, parts[0]], total)
    with pytest.raises(ContributionError, match="no contribution"):
        combine_summed(1, 4, [], {})
    # Nobody counted anything: an empty gradient, no step.
    nothing = combine_summed(1, 4, [("n00", ()), ("n01", ())], {}, expected_ids=())
    assert nothing.microbatch_ids == () and dict(nothing.grads) == {}
    assert check_cover(1, 4, parts) == tuple(range(9))


def test_a_receiver_reuses_a_senders_pieces_across_attempts_while_its_ids_stay() -> None:
    key = (4, 0)
    values = torch.arange(12, dtype=torch.float64)
    store, sent = SliceStore(), Delivered()
    # Attempt 1, three members: this node owns [4, 8) and gets it whole from n0.
    want = bounds(12, 3, 1)
    assert sent.missing(key, "me", "p0,1", want) == [(4, 8)]
    assert store.add_partial(key, 1, "n0", (0, 1), 4, values[4:8], want)
    sent.add(key, "me", "p0,1", want)
    # Attempt 2, a member died: two slices, this node now owns [6, 12). The sender moves only
    # what it has not delivered, and the receiver holds the whole slice.
    want = bounds(12, 2, 1)
    assert sent.missing(key, "me", "p0,1", want) == [(8, 12)]
    assert not store.add_partial(key, 2, "n0", (0, 1), 6, values[6:6], want)  # a header alone
    assert store.add_partial(key, 2, "n0", (0, 1), 8, values[8:12], want)
    views = store.pieces(key, "n0", (0, 1), want)
    assert views is not None and torch.equal(torch.cat(views), values[6:12])
    assert store.declared(key, 2) == {"n0": (0, 1)}
    # A replay reached the sender: other ids, so what was held of it no longer counts.
    assert not store.add_partial(key, 3, "n0", (0, 1, 5), 6, values[6:7], want)
    assert store.pieces(key, "n0", (0, 1), want) is None
    assert store.pieces(key, "n0", (0, 1, 5), want) is None
    assert sent.missing(key, "me", "p0,1,5", want) == [want]
    # A receiver that lost everything (a rollback) says so; the sender forgets its record.
    store.forget_all()
    assert not store.add_partial(key, 4, "n0", (0, 1), 12, values[12:12], want)
    sent.lost(key, "me", "p0,1")
    assert sent.missing(key, "me", "p0,1", want) == [want]
    # A stepped iteration is forgotten.
    sent.add(key, "me", "p0,1", want)
    sent.forget(5)
    assert sent.missing(key, "me", "p0,1", want) == [want]


def test_a_reduced_slice_is_found_only_under_the_basis_it_sums() -> None:
    store = SliceStore()
    key = (2, 1)
    first = basis([("b", (1, 2)), ("a", (0,))])
    assert first == basis([("a", [0]), ("b", [2, 1])])  # order-free
    store.add_reduced(key, "a", (0, 5), first, torch.ones(5, dtype=torch.float64))
    assert store.reduced(key, "a", (0, 5), first) is not None
    # The same members, another split of the microbatches: another basis, nothing reused.
    other = basis([("b", (2,)), ("a", (0, 1))])
    assert other != first and store.reduced(key, "a", (0, 5), other) is None
    assert store.reduced(key, "a", (0, 6), first) is None
    store.forget(3)
    assert store.reduced(key, "a", (0, 5), first) is None
