"""Routing by local solves on gossiped records: dissemination, cold start, crash and repair.

Each node's record (id, stage, location, compute_s, capacity, and its blocked arcs) is small and
changes only on a join, a leave, a death or a re-measured link. Nodes spread records by push
gossip: a node that learns records it did not have forwards just those to `fanout` peers drawn
at random, batched per round; besides, every `pull_every` rounds each node asks one random peer
for what it lacks (anti-entropy: a digest out, the missing records back, two messages), which
closes the gaps push gossip leaves with probability about `exp(-fanout)` per node. Messages are
delivered 1 to `max_delay` rounds after they are sent, as on the MessageBus of bus.py, so rounds
are counted in the same unit as `gwtf route --method relax`.

A node whose view is complete solves the whole problem itself (`localsolve.solve_members`,
deterministic) and routes by its own out-arcs: convergence is the round at which the last node's
view is complete, and the whole routing cost is the dissemination (docs/design.md 2.12).

A crash: the dead node's neighbours (the nodes with flow to or from it) detect it within one
message delay and put out a death record, which spreads like any other. Its upstream senders
repair at once: they re-split what they sent it over their other next-stage peers by residual
capacity (`repair`). Every node changes to the new solution together, SWITCH_AFTER rounds after
the first detection (or when it learns of the death, if later). `crash_curve` measures the flow
that actually arrives, round by round.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gwtf.flow.localsolve import HUB_SLACK, Solved, link_terms, solve_members
from gwtf.flow.topology import Members

__all__ = [
    "FANOUT",
    "PULL_EVERY",
    "SWITCH_AFTER",
    "CrashCurve",
    "Dissemination",
    "crash_curve",
    "delivered",
    "disseminate",
    "repair",
    "without_node",
]

FANOUT = 3
"""Peers each push goes to: enough for the push phase to reach all but ~5% of the nodes, which
anti-entropy then completes; more would buy little time for proportionally more messages."""

PULL_EVERY = 2
"""Rounds between a node's anti-entropy pulls."""


@dataclass(frozen=True)
class Dissemination:
    """How records spread: messages sent, and the round each node's view became complete."""

    messages: int
    rounds: int
    complete_at: tuple[int, ...]
    mean_delay: float = 2.0
    """Rounds one message takes on average ((1 + max_delay) / 2)."""

    @property
    def delays(self) -> float:
        """The rounds in message delays (one delay: a one-way latency on a WAN)."""
        return self.rounds / self.mean_delay


def disseminate(
    n_nodes: int,
    known: Iterable[int],
    rng: random.Random,
    *,
    start: Mapping[int, int] | None = None,
    fanout: int = FANOUT,
    pull_every: int = PULL_EVERY,
    max_delay: int = 3,
    max_rounds: int = 10_000,
) -> Dissemination:
    """Spread records among `n_nodes` nodes until every view holds every record.

    `known[i]` is the bit set of records node `i` holds at round 0; `start[i]`, when given, the
    round at which node `i` comes to hold them (a detector learning of a death), 0 otherwise.
    """
    views = list(known)
    full = 0
    for bits in views:
        full |= bits
    pending: dict[int, list[tuple[int, int]]] = defaultdict(list)  # round -> (receiver, bits)
    fresh = [0] * n_nodes
    later: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, bits in enumerate(views):
        at = (start or {}).get(i, 0)
        if at > 0:
            later[at].append((i, bits))
            views[i] = 0
        else:
            fresh[i] = bits
    complete_at = [0 if v == full else -1 for v in views]
    missing = sum(1 for c in complete_at if c < 0)
    messages = 0
    now = 0
    others = max(1, n_nodes - 1)

    def send(sender: int, receiver: int, bits: int) -> None:
        nonlocal messages
        messages += 1
        pending[now + 1 + int(rng.random() * max_delay)].append((receiver, bits))

    def peer(of: int) -> int:
        j = int(rng.random() * others)
        return j + 1 if j >= of else j

    while missing > 0 and n_nodes > 1:
        for i, bits in later.pop(now, ()):
            new = bits & ~views[i]
            views[i] |= new
            fresh[i] |= new
        for receiver, bits in pending.pop(now, ()):
            new = bits & ~views[receiver]
            if new:
                views[receiver] |= new
                fresh[receiver] |= new
        for i in range(n_nodes):
            if complete_at[i] < 0 and views[i] == full:
                complete_at[i] = now
                missing -= 1
            if fresh[i]:
                for _ in range(fanout):
                    send(i, peer(i), fresh[i])
                fresh[i] = 0
            if pull_every and (now + i) % pull_every == 0:
                # A digest out, and back the peer's view less the asker's (the peer's view as
                # of the digest's sending: it can only have grown by the time it answers).
                j = peer(i)
                messages += 1
                delay = 1 + int(rng.random() * max_delay)
                if views[j] & ~views[i]:
                    send_at = now + delay
                    messages += 1
                    pending[send_at + 1 + int(rng.random() * max_delay)].append((i, views[j]))
        if missing <= 0:
            break
        now += 1
        if now > max_rounds:
            raise RuntimeError(f"records did not reach every node within {max_rounds} rounds")
    return Dissemination(messages, now, tuple(complete_at), (1 + max_delay) / 2)


def without_node(members: Members, node_id: str) -> Members:
    """`members` after `node_id` died (with its blocked pairs)."""
    return replace(
        members,
        nodes=tuple(n for n in members.nodes if n.id != node_id),
        blocked=frozenset(p for p in members.blocked if node_id not in p),
    )


Plan = Mapping[str, Mapping[str, int]]  # node -> next-stage peer -> units


def _plan(flows: Mapping[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    plan: dict[str, dict[str, int]] = defaultdict(dict)
    for (s, d), x in flows.items():
        if x > 0:
            plan[s][d] = x
    return plan


def delivered(members: Members, plans: Mapping[str, Plan], mode: Mapping[str, str]) -> float:
    """Units per second that reach the last stage when each live node routes by its own plan
    (`plans[mode[node]]`, `plans["old"]` for a node not in `mode`), splitting what it gets in the
    proportions of that plan, as weighted round-robin does (docs/design.md 2.8): data holders
    send their planned rate, a node passes on at most its capacity, an arc carries at most its
    capacity, and what goes to a dead node or over capacity is lost."""
    node = {n.id: n for n in members.nodes}
    last = max(n.stage for n in members.nodes)
    received: dict[str, float] = defaultdict(float)
    total = 0.0
    for n in members.nodes:  # (stage, id) order: a node's inputs are all in when it is reached
        plan = plans[mode.get(n.id, "old")].get(n.id, {})
        if n.stage == 0:
            rate = float(min(n.cap_units, sum(plan.values())))
        else:
            rate = min(received[n.id], float(n.cap_units))
        if n.stage == last:
            total += rate
            continue
        weight = sum(plan.values())
        if weight <= 0 or rate <= 0:
            continue
        for peer, x in plan.items():
            head = node.get(peer)
            if head is None:
                continue
            terms = link_terms(members, n.location, head.location, n.stage)
            cap = terms.cap_units if terms is not None else 0
            received[peer] += min(rate * x / weight, float(cap))
    return total


SWITCH_AFTER = 40
"""Rounds after a death's first detection at which every node that knows of it changes to the
new solution at once (a later learner changes when it learns). Switching node by node mixes two
routings that do not fit together: at 1,000 nodes the delivered flow dips to 0.84 of the optimum
while the death spreads (about 20 rounds), below the repaired old routing (section `flow` of
benchmarks/RESULTS.md). 40 is twice the rounds a death takes to reach 1,000 nodes."""


def repair(
    members: Members, plan: Mapping[str, Mapping[str, int]], node_id: str, dead: str
) -> dict[str, int]:
    """`node_id`'s out-rates after its next hop `dead` died: what it sent there is re-split over
    its other next-stage peers in proportion to their residual capacity in the old solution
    (node capacity less planned throughput, within the pair's own capacity). Local: it needs
    only the old solution, which every node holds."""
    mine = dict(plan.get(node_id, {}))
    lost = mine.pop(dead, 0)
    if lost <= 0:
        return mine
    node = {n.id: n for n in members.nodes}
    me = node[node_id]
    through: dict[str, int] = defaultdict(int)
    for peers in plan.values():
        for peer, x in peers.items():
            through[peer] += x
    room: dict[str, int] = {}
    for n in members.nodes:
        if n.stage != me.stage + 1 or n.id == dead or (node_id, n.id) in members.blocked:
            continue
        terms = link_terms(members, me.location, n.location, me.stage)
        if terms is None:
            continue
        free = min(n.cap_units - through[n.id], terms.cap_units - mine.get(n.id, 0))
        if free > 0:
            room[n.id] = free
    total = sum(room.values())
    if total <= 0:
        return mine
    for peer, free in sorted(room.items()):
        mine[peer] = mine.get(peer, 0) + min(free, lost * free // total)
    return mine


@dataclass(frozen=True)
class CrashCurve:
    """After a crash: the new optimum, and per round the delivered flow over it."""

    victim: str
    old_value: int
    new_value: int
    ratios: tuple[float, ...]  # ratios[t]: delivered / new optimum at round t (crash at 0)
    messages: int
    rounds: int  # until every live node knows of the death
    switch_at: int


def crash_curve(
    members: Members,
    victim: str,
    old: Solved,
    seed: int = 0,
    *,
    horizon: int = 200,
    max_delay: int = 3,
    switch_after: int = SWITCH_AFTER,
    hub_slack: float | None = HUB_SLACK,
) -> CrashCurve:
    """The flow after `victim` dies, round by round, while its death spreads (module doc): the
    upstream neighbours repair at once on detection (`repair`), every node changes to the new
    solution `switch_after` rounds after the first detection or when it learns, if later."""
    rng = random.Random(seed)
    after = without_node(members, victim)
    new = solve_members(after, hub_slack=hub_slack)
    new_value = _value(after, new.flows)
    ids = [n.id for n in after.nodes]
    old_plan = _plan(old.flows)
    upstream = {s for s, d in old.flows if d == victim}
    neighbours = upstream | {d for s, d in old.flows if s == victim}
    start = {}
    known = []
    for i, node_id in enumerate(ids):
        if node_id in neighbours:
            known.append(1)
            start[i] = 1 + int(rng.random() * max_delay)  # the first failed send, one delay
        else:
            known.append(0)
    if not neighbours:  # nobody routed through it: nothing to learn, nothing lost
        known[0] = 1
    spread = disseminate(len(ids), known, rng, start=start, max_delay=max_delay)
    switch_at = min(start.values(), default=0) + switch_after
    repaired = {**old_plan, **{u: repair(members, old_plan, u, victim) for u in upstream}}
    plans = {"old": old_plan, "repaired": repaired, "new": _plan(new.flows)}
    ratios = []
    for t in range(horizon + 1):
        mode = {}
        for i, node_id in enumerate(ids):
            learned = spread.complete_at[i]
            if learned < 0 or learned > t:
                mode[node_id] = "old"
            else:
                mode[node_id] = "new" if t >= switch_at else "repaired"
        ratios.append(delivered(after, plans, mode) / max(1, new_value))
    return CrashCurve(
        victim,
        _value(members, old.flows),
        new_value,
        tuple(ratios),
        spread.messages,
        spread.rounds,
        switch_at,
    )


def _value(members: Members, flows: Mapping[tuple[str, str], int]) -> int:
    last = max(n.stage for n in members.nodes)
    stage = {n.id: n.stage for n in members.nodes}
    return sum(x for (_, d), x in flows.items() if stage.get(d) == last)
