"""The simulated network (docs/design.md 5, Network): the links between locations, each node's own
access link, and the queues of what is being sent.

Two models of bandwidth, which a scenario chooses (`[nodes] uplink_gbps` / `downlink_gbps`):

- **pair** (no access links given): every pair of nodes has the whole matrix link between their
  locations to itself, as between datacenter machines whose NICs are far faster than the WAN
  path. A node sending to three peers at once sends at three full link rates.
- **access** (access links given): a node's sends also share its uplink, and what it receives
  shares its downlink, as on a home connection. A send from a to b moves at
  `min(pair link, a's uplink, b's downlink)` and waits for what a already queued on its uplink
  and b on its downlink (first come, first served, which gives each node the same total rate as
  fair sharing would).

Latency is the pair link's one-way delay (RTT / 2) in both models.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gwtf.flow.topology import LinkSpec
from gwtf.job.exchange import Link, choose
from gwtf.sim.scenario import NodeInfo

__all__ = [
    "CommitTimeline", "Moves", "Network", "commit_timeline", "exchange_of", "fresh_moves",
    "leg_s", "order_s", "two_phase_commit_s", "whole_moves",
]


class Network:
    """Links of the scenario, changed by the trace's link rows, and the send queues."""

    def __init__(self, links: Mapping[frozenset[str], LinkSpec], intra: LinkSpec) -> None:
        self.links: dict[frozenset[str], LinkSpec] = dict(links)
        self.intra = intra
        self._pipe: dict[tuple[str, str], float] = {}
        self._up: dict[str, float] = {}
        self._down: dict[str, float] = {}

    def link(self, a: NodeInfo, b: NodeInfo) -> LinkSpec | None:
        """The location link between `a` and `b` (None: no route between their locations)."""
        if a.location == b.location:
            return self.intra
        return self.links.get(frozenset((a.location, b.location)))

    def gbps(self, a: NodeInfo, b: NodeInfo) -> float:
        """The rate of one send from `a` to `b` alone on their links, Gbit/s."""
        link = self.link(a, b) or self.intra
        return min(link.bandwidth_gbps, a.uplink_gbps, b.downlink_gbps)

    def one_way(self, a: NodeInfo, b: NodeInfo, nbytes: float) -> float:
        """Seconds for `nbytes` from `a` to `b` on idle links."""
        link = self.link(a, b) or self.intra
        return link.rtt_ms / 2000 + nbytes * 8 / (self.gbps(a, b) * 1e9)

    def idle_at(self, a: NodeInfo, b: NodeInfo) -> float:
        """When everything queued from `a` to `b`, on `a`'s uplink and on `b`'s downlink has
        gone: from then on a background send (a snapshot's next chunk) delays nothing queued
        before it."""
        free = self._pipe.get((a.id, b.id), 0.0)
        if math.isfinite(a.uplink_gbps):
            free = max(free, self._up.get(a.id, 0.0))
        if math.isfinite(b.downlink_gbps):
            free = max(free, self._down.get(b.id, 0.0))
        return free

    def transfer(self, now: float, a: NodeInfo, b: NodeInfo, nbytes: float) -> float:
        """Arrival time of `nbytes` sent at `now` from `a` to `b`, behind the pair's earlier
        sends and, where the nodes have access links, behind `a`'s uplink and `b`'s downlink
        queues."""
        link = self.link(a, b) or self.intra
        key = (a.id, b.id)
        start = max(now, self._pipe.get(key, 0.0))
        shared_up = math.isfinite(a.uplink_gbps)
        shared_down = math.isfinite(b.downlink_gbps)
        if shared_up:
            start = max(start, self._up.get(a.id, 0.0))
        if shared_down:
            start = max(start, self._down.get(b.id, 0.0))
        end = start + nbytes * 8 / (min(link.bandwidth_gbps, a.uplink_gbps,
                                        b.downlink_gbps) * 1e9)
        self._pipe[key] = end
        if shared_up:
            self._up[a.id] = end
        if shared_down:
            self._down[b.id] = end
        return end + link.rtt_ms / 2000


Moves = Mapping[tuple[str, str], float]
"""Bytes each (sender, receiver) of a stage sends in one leg of the commit exchange."""


def fresh_moves(stage: Sequence[NodeInfo], nbytes: float) -> tuple[Moves, Moves]:
    """The reduce-scatter and the all-gather of a first attempt, when every replica holds a sum
    of `nbytes`: in each, every replica sends a `1 / r` slice to every other one."""
    share = nbytes / len(stage) if stage else 0.0
    one = {(a.id, b.id): share for a in stage for b in stage if a.id != b.id}
    return one, dict(one)


def exchange_of(network: Network, stage: Sequence[NodeInfo], sum_bytes: float) -> str:
    """The exchange a stage's replicas choose (gwtf.job.exchange), from the pair links and
    their access links, as the node does from the link matrix."""
    infos = {n.id: n for n in stage}

    def link(a: str, b: str) -> Link | None:
        spec = network.link(infos[a], infos[b]) or network.intra
        return spec.rtt_ms / 2000, spec.bandwidth_gbps

    return choose(sum_bytes, sorted(infos), link,
                  {n.id: n.uplink_gbps for n in stage}, {n.id: n.downlink_gbps for n in stage})


def whole_moves(stage: Sequence[NodeInfo], nbytes: float) -> Moves:
    """The all-to-all exchange (gwtf.job.exchange `WHOLE`): every replica sends its whole sum
    of `nbytes` to every other one, in one leg."""
    return {(a.id, b.id): nbytes for a in stage for b in stage if a.id != b.id}


def leg_s(network: Network, stage: Sequence[NodeInfo], moves: Moves) -> float:
    """One leg of a stage's exchange: every replica sends its `moves` to the others at once; in
    parallel on pair links; under the access model one after the other through its shared
    uplink, and what it receives through its shared downlink. Headers travel whatever the bytes
    (a rerun declares what the receiver holds already), so the latency is paid anyway."""
    slowest = 0.0
    for a in stage:
        peers = [b for b in stage if b.id != a.id]
        if not peers:
            continue
        latency = max((network.link(a, b) or network.intra).rtt_ms / 2000 for b in peers)
        sends = [moves.get((a.id, b.id), 0.0) * 8 / (network.gbps(a, b) * 1e9) for b in peers]
        up = sum(sends) if math.isfinite(a.uplink_gbps) else max(sends)
        down = 0.0
        if math.isfinite(a.downlink_gbps):
            down = sum(moves.get((b.id, a.id), 0.0) for b in peers) * 8 / (a.downlink_gbps * 1e9)
        slowest = max(slowest, latency + max(up, down))
    return slowest


def two_phase_commit_s(
    network: Network,
    coordinator: NodeInfo,
    holders: Sequence[NodeInfo],
    stages: Sequence[Sequence[NodeInfo]],
    sum_bytes: Sequence[float],
    message_bytes: float,
    moves: Sequence[tuple[Moves, Moves]] | None = None,
    whole: Collection[int] = (),
) -> float:
    """Seconds from the last microbatch finishing at a holder to every holder injecting again,
    by the node's commit (docs/design.md 3.7): the holders' reports reach the `coordinator`;
    its commit order reaches every member; the replicas of each stage exchange their gradient
    sums (`sum_bytes[s]` each) by a reduce-scatter and an all-gather, two legs (`leg_s`); their
    `prepared` reports reach the coordinator; its step order reaches every member. Each leg as
    long as its slowest message, on idle links. `moves`: per stage, what the reduce-scatter and
    the all-gather send (a rerun's, `gwtf.sim.exchange`); by default a first attempt's.
    `whole`: the stages that exchange all to all instead (gwtf.job.exchange), one leg of
    `whole_moves`, sent whole again by every attempt.
    """
    members = [m for stage in stages for m in stage]
    sums = 0.0
    for s, stage in enumerate(stages):
        if s in whole:
            sums = max(sums, leg_s(network, stage, whole_moves(stage, sum_bytes[s])))
            continue
        scatter, gather = moves[s] if moves is not None else fresh_moves(stage, sum_bytes[s])
        sums = max(sums, leg_s(network, stage, scatter) + leg_s(network, stage, gather))
    before = order_s(network, coordinator, holders, members, message_bytes)
    return before + sums + order_s(network, coordinator, members, members, message_bytes)


def order_s(
    network: Network, coordinator: NodeInfo, senders: Sequence[NodeInfo],
    members: Sequence[NodeInfo], message_bytes: float,
) -> float:
    """Two legs of the commit: the `senders`' reports reach the `coordinator`, then its order
    reaches every member."""
    back = max((network.one_way(m, coordinator, message_bytes) for m in senders), default=0.0)
    out = max((network.one_way(coordinator, m, message_bytes) for m in members), default=0.0)
    return back + out


@dataclass(frozen=True)
class CommitTimeline:
    """When the node's two-phase commit reaches each member (docs/design.md 3.7, 4.3 rule 6),
    in seconds from the moment the iteration's last microbatch finished."""

    decided_s: float
    """The coordinator holds every member's `prepared` report and orders the step (a death
    before this voids the attempt)."""
    ordered_s: float
    """The last member has the commit order (the exchange cannot begin later than this)."""
    step_s: Mapping[str, float]
    """Per member, when the step order reaches it: it steps and starts the next iteration
    there, holders injecting and the others taking microbatches, each on its own."""


def commit_timeline(
    network: Network,
    coordinator: NodeInfo,
    reported: Mapping[str, tuple[NodeInfo, float]],
    stages: Sequence[Sequence[NodeInfo]],
    sum_bytes: Sequence[float],
    message_bytes: float,
    moves: Sequence[tuple[Moves, Moves]] | None = None,
    whole: Collection[int] = (),
) -> CommitTimeline:
    """The node's commit message by message, as `two_phase_commit_s` charges it in legs, but
    each message timed from when its sender had what it sends, as the node sends it: a holder
    (or a replayer) reports each microbatch when it finishes (`reported`: per reporter, its
    last report's time, at most 0, relative to now), so only the last report is on the way;
    each member gets the commit order on its own link from the coordinator and starts its
    exchange then; a replica has its stage's sums when the last of its peers' sends arrives
    (per pair, the sender's start plus the pair's latency plus the sender's sends, `leg_s`'s
    terms); the owners of a reduce-scatter send their reduced slice once they hold every
    partial for it; each member reports `prepared` when it holds the sum; the step order
    leaves the coordinator when the last report arrives and reaches each member on its own
    link. The slowest path of this is at most `two_phase_commit_s` (same moves, same links),
    which charges every leg at its slowest message."""
    members = [m for stage in stages for m in stage]

    def msg(a: NodeInfo, b: NodeInfo) -> float:
        return 0.0 if a.id == b.id else network.one_way(a, b, message_bytes)  # a local call

    got = max((t + msg(node, coordinator) for node, t in reported.values()), default=0.0)
    got = max(got, 0.0)
    ordered = {m.id: got + msg(coordinator, m) for m in members}
    held: dict[str, float] = {}
    for s, stage in enumerate(stages):
        start = {m.id: ordered[m.id] for m in stage}
        if s in whole:
            legs: list[Moves] = [whole_moves(stage, sum_bytes[s])]
        else:
            legs = list(moves[s] if moves is not None else fresh_moves(stage, sum_bytes[s]))
        uplinks: dict[str, float] = {}
        for leg in legs:
            start = _leg_arrivals(network, stage, leg, start, uplinks)
        held.update(start)
    decided = max((held[m.id] + msg(m, coordinator) for m in members), default=got)
    return CommitTimeline(
        decided_s=decided,
        ordered_s=max(ordered.values(), default=got),
        step_s={m.id: decided + msg(coordinator, m) for m in members},
    )


def _leg_arrivals(
    network: Network, stage: Sequence[NodeInfo], moves: Moves, start: Mapping[str, float],
    uplinks: dict[str, float],
) -> dict[str, float]:
    """When each replica of `stage` holds what one leg of the exchange sends it, every replica
    `a` sending its `moves` from `start[a]` on: per pair, `a`'s start, the pair's latency and
    `a`'s sends (through a shared uplink one after the other, on pair links the one to this
    receiver), or what the receiver takes in through its shared downlink, whichever is longer
    (the terms of `leg_s`). A shared uplink is one queue for every leg: a replica that holds
    what the last leg sent it before its own sends of that leg are out (a slow uplink among
    fast ones) starts this leg's sends behind them (`uplinks`: when each replica's uplink is
    free, updated; measured in real processes, section `versus` of benchmarks/RESULTS.md)."""
    out: dict[str, float] = {}
    begin: dict[str, float] = {}
    sent: dict[str, list[float]] = {}
    for a in stage:
        peers = [c for c in stage if c.id != a.id]
        sent[a.id] = [moves.get((a.id, c.id), 0.0) * 8 / (network.gbps(a, c) * 1e9)
                      for c in peers]
        begin[a.id] = start[a.id]
        if math.isfinite(a.uplink_gbps):
            begin[a.id] = max(start[a.id], uplinks.get(a.id, start[a.id]))
    for b in stage:
        at = start[b.id]
        for a in stage:
            if a.id == b.id:
                continue
            up = (sum(sent[a.id]) if math.isfinite(a.uplink_gbps)
                  else moves.get((a.id, b.id), 0.0) * 8 / (network.gbps(a, b) * 1e9))
            down = 0.0
            if math.isfinite(b.downlink_gbps):
                down = sum(moves.get((c.id, b.id), 0.0) for c in stage
                           if c.id != b.id) * 8 / (b.downlink_gbps * 1e9)
            latency = (network.link(a, b) or network.intra).rtt_ms / 2000
            at = max(at, begin[a.id] + latency + max(up, down))
        out[b.id] = at
    for a in stage:
        if math.isfinite(a.uplink_gbps):
            uplinks[a.id] = begin[a.id] + sum(sent[a.id])
    return out
