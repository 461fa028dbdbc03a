"""The reduce-scatter and all-gather of a stage's gradient sums (docs/design.md 3.7): the slices,
what a replica holds of its peers' sums, and what it already delivered to them. Pure: no I/O.

The `r` members of a stage in a commit attempt, sorted by node id, cut the flat vector of `n`
values (`gwtf.node.dataplane.gradsync.flatten`) into `r` contiguous slices
(`gwtf.job.slicing.bounds`: slice `i` = `[i n // r, (i + 1) n // r)`, owned by the i-th member;
uneven sizes differ by one value, and with `r > n` some slices are empty, whose owner still hears
every member's microbatches). Each
member sends slice `j` of its sums to owner `j` (*partial*), owner `j` adds the slices it holds
in node-id order with `gwtf.train.sum_in_order` (elementwise, so its result is bit for bit that
slice of the whole sum) and sends the result to every other member (*reduced*); the reduced
slices, concatenated, are the stage's whole sum. Out per member: `2 (r - 1) / r` of the vector,
where sending the whole vector to every peer was `r - 1` of it.

**Across attempts** (a member died and the coordinator orders another attempt). What a receiver
holds is kept per (iteration, round), not per attempt, and keyed by what makes it valid: a
partial piece by its sender, the sender's microbatch ids and the range it covers; a reduced
slice by its owner, its range and its `basis`, a digest of every (member, microbatch ids) it
sums. A sender whose contribution did not change (same ids: no replay reached it) sends an
owner only the part of the owner's new slice it has not delivered before (`Delivered`, from the
acks), and an owner whose reduced slice did not change (same basis, same range: another stage's
death) sends nothing but a header. Each stream declares what the receiver must then hold, and
the ack says whether it does (`complete`): a receiver that lost pieces (it rolled back, or it is
a new process under an old id) gets them whole again, so a wrong record costs bytes, never bits.

The dead member's own sums are never reused: its microbatches are replayed at a live peer by
rule 3 (docs/design.md 4.3), or the stage peer that keeps its last shipped running sum adopts
that (4.9); either changes that peer's contribution (new ids, so its pieces are sent again), and
the reduced slices that summed the dead member's sums have another basis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from gwtf.job.slicing import Range, bounds, gaps

__all__ = [
    "Delivered",
    "SliceStore",
    "Summed",
    "basis",
    "bounds",
    "gaps",
]

Key = tuple[int, int]
"""(iteration, round): what is held stays valid across the attempts of one round."""


def basis(parts: Iterable[tuple[str, Sequence[int]]]) -> str:
    """A digest of the (member, microbatch ids) a reduced slice sums, order-free."""
    text = ";".join(f"{node}:{','.join(map(str, sorted(ids)))}" for node, ids in sorted(
        (node, tuple(ids)) for node, ids in parts))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, eq=False)
class Summed:
    """Phase one's result by reduce-scatter and all-gather: the members' (node id, microbatch
    ids) and the stage's whole sum by parameter name (empty when none counted a microbatch)."""

    parts: tuple[tuple[str, tuple[int, ...]], ...]
    sums: Mapping[str, Tensor] = field(repr=False)


class Delivered:
    """A sender's record of what its peers acknowledged, per (iteration, round): ranges by
    (peer, what), `what` naming the sums they are of (its microbatch ids, or a reduced
    slice's basis)."""

    def __init__(self) -> None:
        self._sent: dict[Key, dict[tuple[str, str], list[Range]]] = {}

    def missing(self, key: Key, peer: str, what: str, want: Range) -> list[Range]:
        """The parts of `want` that `peer` has not acknowledged (all of it if empty)."""
        return gaps(want, self._sent.get(key, {}).get((peer, what), []))

    def add(self, key: Key, peer: str, what: str, done: Range) -> None:
        if done[1] > done[0]:
            self._sent.setdefault(key, {}).setdefault((peer, what), []).append(done)

    def lost(self, key: Key, peer: str, what: str) -> None:
        """`peer` said it does not hold what the record says: forget the record."""
        self._sent.get(key, {}).pop((peer, what), None)

    def forget(self, before: int) -> None:
        self._sent = {k: v for k, v in self._sent.items() if k[0] >= before}

    def forget_all(self) -> None:
        self._sent = {}


class SliceStore:
    """What a replica holds of its stage peers' sums for the reduce-scatter and all-gather."""

    def __init__(self) -> None:
        self._pieces: dict[Key, dict[str, tuple[tuple[int, ...], list[tuple[int, int, Tensor]]]]]
        self._pieces = {}
        """Per key and sender: its microbatch ids and the pieces of its sums held (lo, hi,
        values); a sender's pieces of other ids (before a replay reached it) are dropped."""
        self._declared: dict[tuple[int, int, int], dict[str, tuple[int, ...]]] = {}
        """(iteration, round, attempt) -> sender -> the microbatch ids it contributes there."""
        self._reduced: dict[Key, dict[tuple[str, int, int, str], Tensor]] = {}
        """Per key: (owner, lo, hi, basis) -> the reduced slice."""

    def add_partial(
        self, key: Key, attempt: int, sender: str, ids: tuple[int, ...], offset: int,
        values: Tensor, want: Range,
    ) -> bool:
        """A piece of `sender`'s sums at `offset`, declaring its ids for `attempt`; True when
        the pieces held of those sums now cover `want` (the receiver's slice)."""
        self._declared.setdefault((*key, attempt), {})[sender] = ids
        held = self._pieces.setdefault(key, {})
        old = held.get(sender)
        if old is None or old[0] != ids:
            old = (ids, [])
            held[sender] = old
        pieces = old[1]
        end = offset + values.numel()
        if end > offset:
            pieces[:] = [p for p in pieces if not (offset <= p[0] and p[1] <= end)]
            pieces.append((offset, end, values))
        return not ids or not gaps(want, ((lo, hi) for lo, hi, _ in pieces))

    def declared(self, key: Key, attempt: int) -> Mapping[str, tuple[int, ...]]:
        """The senders' microbatch ids for `attempt`, as their streams declared them."""
        return self._declared.get((*key, attempt), {})

    def pieces(
        self, key: Key, sender: str, ids: tuple[int, ...], want: Range
    ) -> list[Tensor] | None:
        """`sender`'s sums over `want` as views of the pieces held, in order (empty for an
        empty `want`), or None if its pieces of those ids do not cover it."""
        held = self._pieces.get(key, {}).get(sender)
        if held is None or held[0] != ids:
            return None
        lo, hi = want
        views: list[Tensor] = []
        at = lo
        for start, end, values in sorted(held[1], key=lambda p: (p[0], -p[1])):
            if at >= hi or start > at:
                break
            if end <= at:
                continue
            stop = min(end, hi)
            views.append(values[at - start : stop - start])
            at = stop
        return views if at >= hi else None

    def add_reduced(self, key: Key, owner: str, want: Range, digest: str, values: Tensor) -> None:
        self._reduced.setdefault(key, {})[(owner, *want, digest)] = values

    def reduced(self, key: Key, owner: str, want: Range, digest: str) -> Tensor | None:
        return self._reduced.get(key, {}).get((owner, *want, digest))

    def forget(self, before: int) -> None:
        """Drop what belongs to iterations before `before` (stepped, or started over)."""
        self._pieces = {k: v for k, v in self._pieces.items() if k[0] >= before}
        self._declared = {k: v for k, v in self._declared.items() if k[0] >= before}
        self._reduced = {k: v for k, v in self._reduced.items() if k[0] >= before}

    def forget_all(self) -> None:
        self._pieces, self._declared, self._reduced = {}, {}, {}
