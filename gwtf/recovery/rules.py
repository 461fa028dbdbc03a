"""The crash rules of docs/design.md 4 as pure functions: what to do when a node dies, and when an
iteration may commit.

A node X of stage s dies during an iteration. Its live neighbours (stage s-1 and s+1) each turn
their ledger into a `NeighbourReport` about X (`Ledger.report_about`); `plan_crash` merges the
evidence (the strongest wins) and decides, per microbatch X held:

===============  =================================  ==============================================
evidence at X    rule                               what happens
===============  =================================  ==============================================
SENT             1 `Rule.RESEND`                    the upstream node resends its kept activation
                                                    to a replacement X' chosen by the updated
                                                    flow; X' goes on as in an ordinary forward
FORWARD_DONE     2 `Rule.RECOMPUTE`                 upstream resends the activation marked
                                                    recompute: X' redoes stage s forward only and
                                                    waits; the downstream node sends (or resends)
                                                    its gradient to X'
BACKWARD_DONE    3 `Rule.REPLAY`                    upstream resends the activation, downstream
                                                    resends the gradient; X' redoes forward and
                                                    backward, accumulates, sends nothing on
SENT, s = 0      4 `Rule.DROP`                      a data holder took the microbatch's data with
                                                    it: recorded as dropped, never silently
BACKWARD_DONE,   3' `Rule.KEEP`                     bounded replay (docs/design.md 4.9): a live
covered                                             stage peer keeps a shipped sum covering it;
                                                    the peer adopts the sum, the neighbours
                                                    re-point their records to it, nothing is
                                                    computed again
===============  =================================  ==============================================

At stage 0 the "activation" of rules 2 and 3 is the token ids, which travel with the microbatch:
the downstream (stage 1) node sends them, with its gradient, to another data holder. A microbatch
that never left its dead data holder is the only one dropped, so no later stage ever holds a
contribution of a dropped microbatch, and the commit stays exact. (A finished microbatch whose
data holder dies is *not* dropped: its stage-0 contribution is replayed like any other.)

Choosing X' is the caller's business (the sender's updated routes), as is waiting when stage s
has no live node (rule 5: `Recovery` then waits until a node joins that stage), and resolving a
source that is itself dead (its own recovery makes a new source; the microbatch's path, carried
with it, names the stage to wait for). Rule 6 is `check_commit`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from gwtf.recovery.ledger import Evidence, MicrobatchId, Mode, NeighbourReport

__all__ = [
    "CommitCheck",
    "CrashPlan",
    "Recovery",
    "Rule",
    "check_commit",
    "merge_reports",
    "plan_crash",
]


class Rule(IntEnum):
    """The rule of docs/design.md 4 that applies to one microbatch at a dead node."""

    RESEND = 1
    RECOMPUTE = 2
    REPLAY = 3
    DROP = 4
    KEEP = 5

    @property
    def mode(self) -> Mode:
        """The mode the recovery's activation is sent with (`Ledger.activation_sent`)."""
        return {Rule.RECOMPUTE: Mode.RECOMPUTE, Rule.REPLAY: Mode.REPLAY,
                Rule.KEEP: Mode.REPLAY}.get(self, Mode.FORWARD)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What to do for one microbatch the dead node held at `stage`.

    `activation_from`: the live node that sends the input to the replacement (the upstream
    neighbour; for stage 0 the downstream one, which holds the token ids), or None if no live
    neighbour reported it (that neighbour is dead too: wait for its own recovery).
    `gradient_from`: the live downstream node that sends its gradient to the replacement (rules
    2 and 3 below the last stage), else None. For `Rule.KEEP` both name the neighbours whose
    records move to `keeper`, the live stage peer that adopts the dead node's shipped sum.
    """

    mb: MicrobatchId
    stage: int
    rule: Rule
    activation_from: str | None
    gradient_from: str | None
    keeper: str | None = None


@dataclass(frozen=True, slots=True)
class CrashPlan:
    """Everything to do after `dead` died: recoveries sorted by microbatch, and the dropped ids."""

    dead: str
    stage: int
    recoveries: tuple[Recovery, ...]
    dropped: frozenset[MicrobatchId]

    def count(self, rule: Rule) -> int:
        return sum(1 for r in self.recoveries if r.rule == rule)


def merge_reports(
    dead_stage: int, reports: Iterable[NeighbourReport]
) -> tuple[dict[MicrobatchId, Evidence], dict[MicrobatchId, str], dict[MicrobatchId, str]]:
    """Strongest evidence per microbatch, and which upstream / downstream neighbour reported it.

    Returns `(evidence, upstream, downstream)`; reports from nodes that are not at
    `dead_stage - 1` or `dead_stage + 1` are ignored.
    """
    evidence: dict[MicrobatchId, Evidence] = {}
    upstream: dict[MicrobatchId, str] = {}
    downstream: dict[MicrobatchId, str] = {}
    for report in sorted(reports, key=lambda r: r.node):
        if report.stage == dead_stage - 1:
            side = upstream
        elif report.stage == dead_stage + 1:
            side = downstream
        else:
            continue
        for mb, seen in report.evidence:
            evidence[mb] = max(seen, evidence.get(mb, seen))
            side.setdefault(mb, report.node)
    return evidence, upstream, downstream


def plan_crash(
    dead: str,
    dead_stage: int,
    num_stages: int,
    reports: Iterable[NeighbourReport],
    *,
    finished: Collection[MicrobatchId] = (),
    held_by_dead: Iterable[MicrobatchId] = (),
    covered: Collection[MicrobatchId] = (),
    keeper: str | None = None,
    dropped_before: Collection[MicrobatchId] = (),
) -> CrashPlan:
    """The recoveries for every microbatch of the current iteration that `dead` held.

    `reports`: one per live neighbour of `dead` (stages `dead_stage - 1` and `+ 1`).
    `finished`: the microbatches known to have finished (backward done at stage 0) in this
    iteration; for a dead data holder this is the evidence that its backward is done.
    `held_by_dead`: for a dead data holder, the microbatches it had started in this iteration
    (the iteration's plan knows them); those no neighbour reports never left it and are dropped.
    `covered`, `keeper`: the ids of the last sum `dead` shipped to `keeper`, a live stage peer
    (docs/design.md 4.9). Each becomes a `Rule.KEEP` instead of a replay. The sum is one tensor,
    taken whole or not at all: if a neighbour's evidence for one of its ids is weaker than
    BACKWARD_DONE (the dead node's input gradient may not have reached upstream, so the
    microbatch must pass through stage `dead_stage` again and would be accumulated twice), or
    if it covers a microbatch of `dropped_before` (dropped earlier in the iteration, while the
    dead node, not yet noticed, held its contribution), the sum is not used and every id follows
    rules 1-4.
    """
    if not 0 <= dead_stage < num_stages:
        raise ValueError(f"stage {dead_stage} is outside 0..{num_stages - 1}")
    evidence, upstream, downstream = merge_reports(dead_stage, reports)
    last = dead_stage == num_stages - 1
    if dead_stage == 0:
        done = set(finished)
        for mb in evidence:
            if mb in done:
                evidence[mb] = Evidence.BACKWARD_DONE
        for mb in held_by_dead:
            evidence.setdefault(mb, Evidence.SENT)
            if mb in done:
                evidence[mb] = Evidence.BACKWARD_DONE
    kept = frozenset(covered) if keeper is not None and keeper != dead else frozenset()
    if any(evidence.get(mb, Evidence.BACKWARD_DONE) != Evidence.BACKWARD_DONE for mb in kept):
        kept = frozenset()
    if not kept.isdisjoint(dropped_before):
        kept = frozenset()
    recoveries: list[Recovery] = []
    dropped: set[MicrobatchId] = set()
    for mb in sorted(evidence.keys() | kept):
        if mb in kept:
            source = downstream.get(mb) if dead_stage == 0 else upstream.get(mb)
            recoveries.append(Recovery(mb, dead_stage, Rule.KEEP, source,
                                       None if last else downstream.get(mb), keeper))
            continue
        seen = evidence[mb]
        if seen == Evidence.BACKWARD_DONE:
            rule = Rule.REPLAY
        elif seen == Evidence.FORWARD_DONE and not last:
            rule = Rule.RECOMPUTE
        elif dead_stage == 0:
            rule = Rule.DROP
        else:
            # At the last stage forward and backward are one step: no proof of a finished
            # backward means it must be done again in full, as a forward would be.
            rule = Rule.RESEND
        if rule == Rule.DROP:
            dropped.add(mb)
            continue
        if dead_stage == 0:
            source = downstream.get(mb)
        else:
            source = upstream.get(mb)
        gradient = downstream.get(mb) if rule != Rule.RESEND and not last else None
        recoveries.append(Recovery(mb, dead_stage, rule, source, gradient))
    return CrashPlan(dead, dead_stage, tuple(recoveries), frozenset(dropped))


@dataclass(frozen=True, slots=True)
class CommitCheck:
    """The verdict of rule 6. `ok` when every stage covers every finished microbatch once.

    `missing[s]`: finished microbatches with no contribution at stage s (a replay is pending).
    `duplicated[s]`: microbatches contributed more than once at stage s (a bug: never commit).
    `extra[s]`: contributions of microbatches that are not finished (dropped or still running).
    """

    ok: bool
    missing: Mapping[int, frozenset[MicrobatchId]]
    duplicated: Mapping[int, frozenset[MicrobatchId]]
    extra: Mapping[int, frozenset[MicrobatchId]]

    def reason(self) -> str:
        """One line saying why the commit must wait (or 'ok')."""
        if self.ok:
            return "ok"
        parts = []
        for name, table in (
            ("missing", self.missing),
            ("duplicated", self.duplicated),
            ("extra", self.extra),
        ):
            for stage, mbs in sorted(table.items()):
                if mbs:
                    parts.append(f"stage {stage}: {len(mbs)} {name} (e.g. {min(mbs)})")
        return "; ".join(parts)


def check_commit(
    num_stages: int,
    finished: Collection[MicrobatchId],
    contributions: Mapping[int, Iterable[Collection[MicrobatchId]]],
) -> CommitCheck:
    """Rule 6: may the aggregation commit?

    `finished`: the iteration's finished microbatches (dropped ones excluded).
    `contributions[s]`: for each live node of stage s, the microbatches it accumulated
    (`Ledger.contributions()`); the contributions of dead nodes died with them and are not given.
    """
    done = frozenset(finished)
    missing: dict[int, frozenset[MicrobatchId]] = {}
    duplicated: dict[int, frozenset[MicrobatchId]] = {}
    extra: dict[int, frozenset[MicrobatchId]] = {}
    ok = True
    for stage in range(num_stages):
        seen: set[MicrobatchId] = set()
        twice: set[MicrobatchId] = set()
        for node_set in contributions.get(stage, ()):
            for mb in node_set:
                if mb in seen:
                    twice.add(mb)
                seen.add(mb)
        missing[stage] = done - seen
        duplicated[stage] = frozenset(twice)
        extra[stage] = frozenset(seen - done)
        ok = ok and not missing[stage] and not twice and not extra[stage]
    return CommitCheck(ok, missing, duplicated, extra)
