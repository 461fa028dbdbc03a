"""The slices of a stage's commit exchange (docs/design.md 3.7), pure, so that the node
(gwtf.node.worker.slices) and the simulator (gwtf.sim.exchange) cut the same way.

The `r` members of a stage in a commit attempt, sorted by node id, cut the flat vector of `n`
gradient values into `r` contiguous slices, slice `i` = `[i n // r, (i + 1) n // r)`, owned by the
i-th member: sizes differ by one value at most, and with `r > n` some slices are empty. A rerun
of the commit moves only what a receiver does not hold yet (`gaps`).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Range", "bounds", "gaps", "size"]

Range = tuple[int, int]


def bounds(numel: int, members: int, index: int) -> Range:
    """Slice `index` of `members` over a vector of `numel` values: `[lo, hi)`."""
    if members < 1 or not 0 <= index < members:
        raise ValueError(f"slice {index} of {members} does not exist")
    return index * numel // members, (index + 1) * numel // members


def gaps(want: Range, have: Iterable[Range]) -> list[Range]:
    """The parts of `want` that no range of `have` covers, in order."""
    lo, hi = want
    out: list[Range] = []
    at = lo
    for start, end in sorted(have):
        if end <= at or start >= hi:
            continue
        if start > at:
            out.append((at, min(start, hi)))
        at = max(at, end)
        if at >= hi:
            break
    if at < hi:
        out.append((at, hi))
    return out


def size(ranges: Iterable[Range]) -> int:
    """The values the ranges hold (they do not overlap)."""
    return sum(hi - lo for lo, hi in ranges)
