"""The node's commit exchange across the attempts of an iteration, in the simulator
(docs/design.md 3.7): what the reduce-scatter and all-gather of earlier attempts delivered, so
that a rerun after a death is charged only what the node would move again.

The node (gwtf.node.worker.slices) keeps, per iteration and round, a partial slice by its sender,
the sender's microbatch ids and its range, and a reduced slice by its owner, range and basis (the
members and their ids it sums); a sender moves only the gaps of what its receiver holds. This
ledger keeps the same keys over simulated sends: each attempt's sends are scheduled with their
arrival times (`leg_s`'s model: one after the other through a shared uplink), and at the next
attempt those that arrived by then count as held. That includes the sends of an attempt a death
voided: in the node the live replicas go on with the attempt's sends until the next order
comes, and the stages without a dead member finish theirs. A dead member's pieces are held
under its id, which no later attempt names; a replay changes its replayer's ids, and every
reduced slice that summed the dead member has a basis no later attempt has.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gwtf.job.slicing import Range, bounds, gaps, size
from gwtf.sim.network import Moves, Network, leg_s
from gwtf.sim.scenario import NodeInfo

__all__ = ["ExchangeLedger"]

Ids = frozenset[int]
Basis = frozenset[tuple[str, Ids]]


@dataclass(frozen=True)
class _Send:
    at: float
    sender: str
    receiver: str
    want: Range
    ids: Ids | None = None
    """A partial slice: the sender's microbatch ids (None: a reduced slice)."""
    basis: Basis | None = None


class ExchangeLedger:
    """What the stages' exchanges delivered in the iteration's earlier commit attempts."""

    def __init__(self) -> None:
        self._iteration: tuple[int, float] | None = None
        self._partial: dict[tuple[str, Ids, str], list[Range]] = {}
        self._reduced: set[tuple[str, Range, Basis, str]] = set()
        self._pending: list[_Send] = []

    def moves(
        self,
        now: float,
        iteration: tuple[int, float],
        network: Network,
        stages: Sequence[Sequence[NodeInfo]],
        ids: Mapping[str, Ids],
        numel: Sequence[int],
        value_bytes: float,
        before_s: float,
        whole: Collection[int] = (),
    ) -> list[tuple[Moves, Moves]]:
        """Per stage, the bytes the attempt that starts `now` (of `iteration`: its index and
        start, a restarted round is another) moves in its reduce-scatter and
        its all-gather (which begin `before_s` later, after the reports and the order); the
        attempt's sends are recorded for the next one. The stages in `whole` exchange all to
        all (gwtf.job.exchange), which keeps nothing across attempts: nothing for them here."""
        if iteration != self._iteration:
            self._iteration = iteration
            self._partial, self._reduced = {}, set()
            self._pending = []
        for send in self._pending:
            if send.at > now:
                continue
            if send.ids is not None:
                self._partial.setdefault((send.sender, send.ids, send.receiver), []).append(
                    send.want)
            elif send.basis is not None:
                self._reduced.add((send.sender, send.want, send.basis, send.receiver))
        self._pending = []
        out: list[tuple[Moves, Moves]] = []
        for s, stage in enumerate(stages):
            if s in whole:
                out.append(({}, {}))
                continue
            order = sorted(stage, key=lambda n: n.id)
            ranges = {n.id: bounds(numel[s], len(order), i) for i, n in enumerate(order)}
            basis: Basis = frozenset((n.id, ids.get(n.id, frozenset())) for n in order)
            counted = any(these for _, these in basis)
            scatter: dict[tuple[str, str], float] = {}
            gather: dict[tuple[str, str], float] = {}
            for a in order:
                mine = ids.get(a.id, frozenset())
                for b in order:
                    if b.id == a.id:
                        continue
                    held = self._partial.get((a.id, mine, b.id), [])
                    want = ranges[b.id]
                    scatter[(a.id, b.id)] = size(gaps(want, held)) * value_bytes if mine else 0.0
                    own = ranges[a.id]
                    done = not counted or (a.id, own, basis, b.id) in self._reduced
                    gather[(a.id, b.id)] = 0.0 if done else size([own]) * value_bytes
            start = now + before_s
            self._schedule(network, order, scatter, start, ranges, ids, None)
            self._schedule(network, order, gather, start + leg_s(network, order, scatter),
                           ranges, ids, basis)
            out.append((scatter, gather))
        return out

    def _schedule(
        self, network: Network, order: Sequence[NodeInfo], moves: Moves, start: float,
        ranges: Mapping[str, Range], ids: Mapping[str, Ids], basis: Basis | None,
    ) -> None:
        """Arrival times of one leg's sends: each sender sends to its peers in node-id order,
        one after the other through a shared uplink, all at once on pair links."""
        for a in order:
            at = start
            for b in order:
                if b.id == a.id:
                    continue
                latency = (network.link(a, b) or network.intra).rtt_ms / 2000
                seconds = moves.get((a.id, b.id), 0.0) * 8 / (network.gbps(a, b) * 1e9)
                at = at + seconds if math.isfinite(a.uplink_gbps) else start + seconds
                if basis is None:
                    send = _Send(at + latency, a.id, b.id, ranges[b.id],
                                 ids=ids.get(a.id, frozenset()))
                else:
                    send = _Send(at + latency, a.id, b.id, ranges[a.id], basis=basis)
                self._pending.append(send)
