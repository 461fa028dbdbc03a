"""The commit of a job's iterations and the bookkeeping of its recoveries, as its coordinator sees
them (docs/design.md 1 and 4), pure: no I/O, no clock.

One member coordinates a job: the live data holder with the smallest id among those that take
part (it owns data and injects microbatches, so it is where an iteration starts; when it dies the
next one takes over, see `gwtf.node.jobs.coordinator.coordinator`). Iteration `k` goes:

1. the data holders of `k`, each with its share of the microbatch ids (`assign`), inject them;
2. a holder reports `done(k, ids)` as microbatches finish (their gradient reached stage 0);
   a replacement holder reports the microbatches of a dead holder it recovered the same way;
3. when a participant dies, the coordinator plans its recovery with `gwtf.recovery.plan_crash`
   and records the result here (`recovering`): the dropped microbatches (rule 4) and the replays
   it must wait for (rule 3); a replacement reports each replay (`replayed`);
4. once every microbatch is finished or dropped and no replay is pending, the coordinator orders
   phase one of the commit (`commit_order`, a `CommitOrder` naming the live participants): each
   replica exchanges its gradient sums with its stage peers and reports `prepared` (the ids it
   accumulated, and on the last stage the losses and paths);
5. once every member of the attempt is prepared, `gwtf.recovery.check_commit` (rule 6) decides:
   every stage covers every finished microbatch exactly once, so `StepOrder`: every member steps
   AdamW with the sums it holds and reports `committed` (its stage checksum). A member that dies
   before the step voids the attempt (`member_down`): its sums die with it, they are replayed, and
   the commit runs again as a new attempt. A member that dies after the step order changes
   nothing: every other replica of its stage already holds its sums;
6. once every live member of the step has reported, `k` is complete (`IterationOutcome`).

Bad peers (a job with a robust aggregation, `gwtf.train.robust`). In phase one every member
screens the gradient sums it holds and names the stage peers out of bounds (`outliers`). A
replica named by a strict majority of its stage's members in the attempt is excluded (`prepared`
returns `Outliers` instead of a step order, and the attempt is void): the coordinator drops it
from the job as if it had died, so its work of the iteration is replayed by its honest peers and
the commit runs again without it. A poisoner alone cannot get an honest replica excluded: it is
one vote. After a step, a replica whose checksum differs from a strict majority of its stage is
`outvoted` in the iteration's outcome.

Split brain (`gwtf.job.quorum`). An attempt is ordered only while its members include a strict
majority of the iteration's *base* (the members of the last commit) that were not shown dead
(`gone`): a partition leaves at most one side able to commit, and the other waits.

When the rules cannot recover a microbatch (no live node holds its input: two neighbours died
at once), or a new coordinator takes over, the iteration starts again from scratch as a new
`round` (`restart`): every node forgets its work of the iteration; parameters only change at a
step, so nothing is counted twice, only compute is wasted.

Shares. An iteration ends when its slowest holder's microbatches are back, so the holders'
shares should be in the proportions of their flows: the flow may send twice as many microbatches
per second through one holder as through another, and equal shares would leave the faster path
idle at the end of every iteration. Any split trains the same model (a microbatch's data does not
depend on its holder, and the gradient sums are exact), so the coordinator weights the next
iteration's shares by the flows the holders reported with their `done`, once every holder of the
next iteration reported settled flows; until then the shares are equal, which is
`gwtf.train.assign_microbatches` exactly.

Holders start `k + 1` right after their own step of `k`, so `done(k + 1)` may arrive before every
`committed(k)`: iterations complete in order. Everything a peer reports is checked against what
is expected; a bad report raises `ReportError` and changes nothing. A report repeated by a retry
is recognised and ignored; one for another round or attempt is stale and ignored.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from gwtf.job.nexthop import SmoothRoundRobin
from gwtf.job.quorum import QuorumVerdict, commit_quorum
from gwtf.job.snapshots import Boundaries, SnapshotPolicy
from gwtf.recovery import (
    CrashPlan,
    NeighbourReport,
    Rule,
    best_cover,
    check_commit,
    plan_crash,
)

__all__ = [
    "INPUTS",
    "STALLED_ROUNDS",
    "CommitOrder",
    "Journal",
    "JournalEntry",
    "RecoveryOrders",
    "weights_of",
    "CommittedReport",
    "IterationCoordinator",
    "IterationOutcome",
    "Outliers",
    "PreparedReport",
    "ReportError",
    "StepOrder",
    "assign",
]


class ReportError(ValueError):
    """A report the coordinator cannot accept (one sentence)."""


def assign(
    microbatches: int, holders: Sequence[str], weights: Mapping[str, int] | None = None
) -> dict[str, tuple[int, ...]]:
    """Microbatch ids `0..microbatches-1` dealt over the holders by smooth weighted round-robin
    (`gwtf.job.nexthop`): each holder gets ids in the proportion of its weight, interleaved. Equal
    weights (or none) deal them round-robin over the holders sorted by id, which is
    `gwtf.train.assign_microbatches` (a test checks both agree). A holder with weight 0 gets
    none; if every weight is 0 they count as equal."""
    ordered = sorted(set(holders))
    if not ordered:
        raise ValueError("no data holder to assign microbatches to")
    if weights is None or not any(weights.get(h, 0) > 0 for h in ordered):
        weights = {h: 1 for h in ordered}
    dealt: dict[str, list[int]] = {h: [] for h in ordered}
    rr = SmoothRoundRobin()
    active = {h: weights.get(h, 0) for h in ordered}
    for mb in range(microbatches):
        holder = rr.pick(active)
        assert holder is not None
        dealt[holder].append(mb)
    return {h: tuple(ids) for h, ids in dealt.items()}


@dataclass(frozen=True)
class CommitOrder:
    """Phase one: the `members` exchange their sums for `iteration` over `microbatches`."""

    iteration: int
    microbatches: tuple[int, ...]
    final: bool
    next_holders: tuple[str, ...]
    round: int = 0
    attempt: int = 0
    members: Mapping[str, int] = field(default_factory=dict)


def weights_of(holders: Sequence[str], weights: Sequence[int]) -> dict[str, int] | None:
    """Weights by holder from the wire's parallel lists, None for equal shares."""
    if not weights:
        return None
    return dict(zip(holders, weights, strict=True))


@dataclass(frozen=True)
class PreparedReport:
    """A member of a commit attempt holds its stage peers' sums (phase one done)."""

    sender: str
    iteration: int
    round: int
    attempt: int
    stage: int
    contributed: frozenset[int]
    losses: Mapping[int, float] = field(default_factory=dict)
    routes: Mapping[tuple[str, ...], int] = field(default_factory=dict)
    compute_s: float = 0.0
    replayed_s: float = 0.0
    outliers: frozenset[str] = frozenset()
    """Stage peers whose gradient sums this member's screen found out of bounds."""


@dataclass(frozen=True)
class Outliers:
    """Replicas a strict majority of their stage named out of bounds: the attempt is void and
    they are to be excluded. `nodes`: node -> (stage, votes, members of its stage)."""

    iteration: int
    nodes: Mapping[str, tuple[int, int, int]]


@dataclass(frozen=True)
class StepOrder:
    """Phase two: the members of `attempt` step; `participants` go on with the next iteration."""

    iteration: int
    round: int
    attempt: int
    final: bool
    next_holders: tuple[str, ...]
    participants: Mapping[str, int]
    loss: float
    trained: int
    dropped: tuple[int, ...]
    next_weights: tuple[int, ...] = ()
    """The next holders' weights in their order (empty: equal shares)."""
    next_round: int = 0
    """The round the next iteration starts at (above every round used before a rollback)."""
    mover: str = ""
    """A node that steps this iteration at `mover_from` and moves to `move_to` (`moving`):
    not among `participants`, it takes no part in the next iteration and enters the job again
    at its new stage as a joiner. Empty: no move."""
    mover_from: int = -1
    move_to: int = -1
    periodic: bool = False
    """The boundary after this iteration is declared a periodic snapshot (`Boundaries.step`)."""
    floor: int | None = None
    """The newest periodic boundary whose snapshot landed at every stage: every node keeps its
    own state of it and of the latest (`own_kept`). None: no boundaries are declared."""

    def weights(self) -> dict[str, int] | None:
        return weights_of(self.next_holders, self.next_weights)


@dataclass(frozen=True)
class CommittedReport:
    """What one participant reports after its optimizer step."""

    sender: str
    iteration: int
    stage: int
    checksum: str
    digests: Mapping[str, str] = field(default_factory=dict)
    snapshots_landed: tuple[int, ...] = ()
    """Its stage's snapshot sender: the periodic boundaries whose snapshot it landed at every
    keeper (docs/design.md 4.6)."""
    snapshot_lacking: int | None = None
    """Its stage's snapshot sender: the latest boundary, which it holds no state of and whose
    snapshot it has not landed."""


@dataclass(frozen=True)
class IterationOutcome:
    """A completed iteration."""

    iteration: int
    loss: float
    microbatches: int
    final: bool
    mismatched: tuple[str, ...]
    """Participants whose checksum differs from their stage's majority (every replica of a
    stage whose checksums differ with no majority)."""
    routes: Mapping[tuple[str, ...], int]
    digests: Mapping[str, str]
    """Final iteration: the parameter digests of one replica per stage, the whole model."""
    dropped: tuple[int, ...] = ()
    compute_s: float = 0.0
    replayed_s: float = 0.0
    outvoted: tuple[str, ...] = ()
    """Of `mismatched`, those whose stage had a strict majority of one checksum."""


@dataclass(frozen=True)
class RecoveryOrders:
    """What the coordinator orders after a death (`IterationCoordinator.plan_recovery`).

    `plan`: the recoveries and drops not planned before in this round (a sweep plans the same
    death again and orders only what is new). `sources[i]`: the node that sends the input of
    `plan.recoveries[i]` (the upstream neighbour that keeps its activation; for stage 0 a live
    data holder, which rebuilds the token ids from its own data; for a `Rule.KEEP`, the keeper
    of the dead node's running sum). `restart`: when not empty, the
    round cannot recover (a microbatch's input died with the dead node, or no data holder is
    left): the reason to start it again; `sources` then stops at the recovery that failed."""

    plan: CrashPlan
    sources: tuple[str, ...]
    restart: str = ""


def _orders(plan: CrashPlan, holders: Sequence[str], turn: int) -> tuple[RecoveryOrders, int]:
    """The sources of `plan`'s recoveries (`RecoveryOrders`), and the holders' next turn: a
    dead holder's microbatches go round the live `holders` from `turn` on."""
    sources: list[str] = []
    for recovery in plan.recoveries:
        if recovery.rule == Rule.KEEP:
            assert recovery.keeper is not None
            sources.append(recovery.keeper)
            continue
        if recovery.activation_from is None:
            return RecoveryOrders(plan, tuple(sources), f"microbatch {recovery.mb} of "
                                  f"{plan.dead} has no live node holding its input"), turn
        if plan.stage != 0:
            sources.append(recovery.activation_from)
            continue
        if not holders:
            return RecoveryOrders(plan, tuple(sources), "no live data holder can recover a "
                                  "dead holder's microbatch"), turn
        sources.append(holders[turn % len(holders)])
        turn += 1
    return RecoveryOrders(plan, tuple(sources)), turn


@dataclass(frozen=True)
class JournalEntry:
    """One input the driver fed the coordinator and what it decided (`result`, or the
    `error` it raised). `call` is one of `INPUTS`; "start" is the coordinator's construction
    (its arguments in `kwargs`)."""

    call: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    result: Any = None
    error: str = ""


Journal = Callable[[JournalEntry], None]

INPUTS = (
    "done", "replayed", "recovering", "plan_recovery", "commit_order", "prepared", "stepped",
    "committed", "member_down", "completions", "admit", "restart", "rollback", "shown_gone",
    "moving",
)
"""The methods through which everything the coordinator decides comes in: a journal of their
calls and results, fed to a fresh coordinator, decides the same (`gwtf.job.journal`)."""

STALLED_ROUNDS = 5
"""Rounds in a row that the coordinator's watchdog may start for one iteration, each after the
iteration made no progress for its `recovery_stall_s`, before the job fails: an iteration that
five fresh starts with every live participant could not commit waits on something no restart
mends (a participant that never hears the coordinator), and failing with the nodes it waits on
beats hanging without a word (docs/design.md 4.4)."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _input(
    method: Callable[Concatenate[IterationCoordinator, _P], _R],
) -> Callable[Concatenate[IterationCoordinator, _P], _R]:
    """An input of the coordinator: with a journal attached, its call (an iterator argument
    made a tuple first, so that it is read once) and its result, or its error, are entered.
    A call from inside another input is part of that one, and is not entered apart."""
    name = method.__name__
    assert name in INPUTS, name

    @functools.wraps(method)
    def call(self: IterationCoordinator, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._fed = True
        if self.journal is None or self._journaling:
            return method(self, *args, **kwargs)
        args = tuple(tuple(a) if isinstance(a, Iterator) else a  # type: ignore[assignment]
                     for a in args)
        self._journaling = True
        try:
            result = method(self, *args, **kwargs)
        except ValueError as err:
            self.journal(JournalEntry(name, tuple(args), dict(kwargs), None, str(err)))
            raise
        finally:
            self._journaling = False
        self.journal(JournalEntry(name, tuple(args), dict(kwargs), result))
        return result

    return call


@dataclass
class _Stepping:
    order: StepOrder
    waiting: set[str]
    routes: Mapping[tuple[str, ...], int]
    compute_s: float
    replayed_s: float
    reports: dict[str, CommittedReport] = field(default_factory=dict)


def _outliers(members: Mapping[str, int], reports: Sequence[PreparedReport], num_stages: int
              ) -> dict[str, tuple[int, int, int]]:
    """Members named out of bounds by a strict majority of their stage's members."""
    out: dict[str, tuple[int, int, int]] = {}
    for stage in range(num_stages):
        voters = [r for r in reports if r.stage == stage]
        votes: dict[str, int] = {}
        for r in voters:
            for node in r.outliers:
                if members.get(node) == stage:
                    votes[node] = votes.get(node, 0) + 1
        for node in sorted(votes):
            if 2 * votes[node] > len(voters):
                out[node] = (stage, votes[node], len(voters))
    return out


class IterationCoordinator:
    """The coordinator's bookkeeping for one job."""

    def __init__(
        self,
        *,
        iterations: int,
        microbatches: int,
        participants: Mapping[str, int],
        num_stages: int,
        holders: Sequence[str],
        weights: Mapping[str, int] | None = None,
        iteration: int = 0,
        round_: int = 0,
        base: Iterable[str] | None = None,
        snapshot_every: int = 0,
        snapshot_start: int = 0,
        declared: Sequence[int] = (),
        floor: int | None = None,
    ) -> None:
        """`base`: the members of the last commit before `iteration` (default: `participants`,
        those the job starts with). `snapshot_every` (0: none): the step orders declare the
        periodic boundaries after `snapshot_start`, the job's first iteration, as they land
        (`Boundaries`); `declared`: those declared before, `floor`: the last step order's."""
        if iterations < 1 or microbatches < 1:
            raise ValueError("a job needs at least one iteration and one microbatch")
        self.iterations = iterations
        self.microbatches = microbatches
        self.participants = dict(participants)
        self.num_stages = num_stages
        self.injecting = iteration
        """The iteration in progress (injected, recovered, committed in two phases)."""
        self.round = round_
        self._holders = tuple(sorted(holders))
        self._check_holders(self._holders)
        self._weights: dict[str, int] | None = dict(weights) if weights else None
        self._flows: dict[str, int | None] = {}
        """The flow units each holder reported last (None: its flows were not settled)."""
        self.finished: set[int] = set()
        self.dropped: set[int] = set()
        self.replays: set[tuple[int, int]] = set()
        self.unplanned: dict[str, tuple[int, int]] = {}
        """Participants that died in (iteration, round) and whose recovery is not planned yet
        (`plan_recovery`): no commit is ordered in that round until it is, since a commit
        ordered before the replays are known would be prepared on sums without them."""
        """(microbatch, stage) replays (rule 3) ordered and not reported done yet."""
        self.attempt = 0
        self._members: dict[str, int] = {}
        """The members of the commit attempt in phase one (empty: no attempt under way)."""
        self._prepared: dict[str, PreparedReport] = {}
        self._stepping: dict[int, _Stepping] = {}
        self.completed = iteration
        """Iterations completed, in order (the outcomes returned so far)."""
        self.round_floor = round_
        self.stalled = 0
        """Rounds of the iteration in progress the watchdog started (`restart(stalled=True)`)."""
        """Every iteration starts at this round: after a rollback, above every round used
        before it, so that no message from before the rollback passes for a current one."""
        self.base: frozenset[str] = frozenset(participants if base is None else base)
        """The members of the last commit: the voters of the next one's quorum."""
        self.gone: set[str] = set()
        """Nodes shown dead (their address refuses calls): they no longer vote."""
        self.planned: dict[str, set[int]] = {}
        """Per dead node, the microbatches of this round already recovered or dropped."""
        self._holder_turn = 0
        """Dead holders' microbatches go round the live holders (`plan_recovery`)."""
        self.journal: Journal | None = None
        self._journaling = False
        self._fed = False
        self.boundaries: Boundaries | None = None
        if snapshot_every > 0:
            policy = SnapshotPolicy(snapshot_every, 0, snapshot_start, tuple(declared))
            self.boundaries = (Boundaries(policy, num_stages) if floor is None
                               else Boundaries.after(policy, num_stages, floor))
        self._start: dict[str, Any] = {
            "iterations": iterations, "microbatches": microbatches,
            "participants": dict(participants), "num_stages": num_stages,
            "holders": tuple(holders), "weights": dict(weights) if weights else None,
            "iteration": iteration, "round_": round_,
            "base": tuple(sorted(self.base)), "snapshot_every": snapshot_every,
            "snapshot_start": snapshot_start, "declared": tuple(declared), "floor": floor,
        }

    def attach(self, journal: Journal) -> None:
        """Enter every input from now on in `journal`, after a "start" entry with this
        coordinator's construction. Only before its first input: a journal that misses one
        cannot be replayed."""
        if self.journal is not None or self._fed:
            raise ValueError("a journal is attached before the coordinator's first input")
        self.journal = journal
        journal(JournalEntry("start", (), dict(self._start)))

    def _check_holders(self, holders: Sequence[str]) -> None:
        if not holders:
            raise ValueError("an iteration needs at least one data holder")
        for holder in holders:
            if self.participants.get(holder) != 0:
                raise ValueError(f"{holder} is not a data holder taking part in the job")

    # ------------------------------------------------------------------ views

    @property
    def holders(self) -> tuple[str, ...]:
        """The data holders of the iteration being injected."""
        return self._holders

    def assignment(self) -> dict[str, tuple[int, ...]]:
        """Each holder's share of the iteration being injected."""
        return assign(self.microbatches, self._holders, self._weights)

    def committing(self) -> list[int]:
        """Iterations ordered to step and not complete yet."""
        return sorted(self._stepping)

    @property
    def in_commit(self) -> bool:
        """Phase one of a commit attempt is under way."""
        return bool(self._members)

    def live_holders(self) -> tuple[str, ...]:
        return tuple(sorted(p for p, s in self.participants.items() if s == 0))

    def empty_stages(self) -> list[int]:
        present = set(self.participants.values())
        return [s for s in range(self.num_stages) if s not in present]

    def unfinished(self) -> set[int]:
        """Microbatches of the iteration neither finished nor dropped."""
        return set(range(self.microbatches)) - self.finished - self.dropped

    def held_by(self, holder: str) -> tuple[int, ...]:
        """A holder's share of the iteration that has not finished (for a dead holder's plan)."""
        return tuple(m for m in self.assignment().get(holder, ()) if m not in self.finished)

    # ------------------------------------------------------------------ reports

    def _current(self, iteration: int, round_: int) -> bool:
        """Is a report about the iteration and round in progress? (Older: stale, ignored.)"""
        if iteration == self.injecting and round_ == self.round:
            return True
        if iteration < self.injecting or (iteration == self.injecting and round_ < self.round):
            return False
        raise ReportError(
            f"a report about iteration {iteration} round {round_} came while iteration "
            f"{self.injecting} round {self.round} is in progress"
        )

    @property
    def weights(self) -> dict[str, int] | None:
        """The shares' weights of the iteration being injected (None: equal)."""
        return dict(self._weights) if self._weights else None

    def next_weights(self, holders: Sequence[str]) -> tuple[int, ...]:
        """Weights for `holders` from their latest flows; () unless every one reported
        settled flows and some flow is positive."""
        flows = [self._flows.get(h) for h in holders]
        if not holders or any(f is None for f in flows) or not any(flows):
            return ()
        return tuple(f or 0 for f in flows)

    @_input
    def done(self, holder: str, iteration: int, round_: int, ids: Iterable[int],
             flow: int | None = None) -> None:
        """Microbatches of `iteration` finished at data holder `holder`; `flow`: the flow
        units out of it (None while its flows are not settled)."""
        if self.participants.get(holder) != 0:
            raise ReportError(f"{holder} is not a live data holder of the job")
        if flow is not None and flow < 0:
            raise ReportError(f"{holder} reports a negative flow")
        self._flows[holder] = flow
        if not self._current(iteration, round_):
            return
        ids = set(ids)
        bad = [m for m in ids if not 0 <= m < self.microbatches or m in self.dropped]
        if bad:
            raise ReportError(
                f"{holder} reports microbatch {min(bad)} of iteration {iteration} done, which is "
                "outside the job or dropped"
            )
        self.finished |= ids

    @_input
    def replayed(self, sender: str, iteration: int, round_: int, mb: int, stage: int) -> None:
        if self.participants.get(sender) != stage:
            raise ReportError(f"{sender} is not a live stage-{stage} participant")
        if self._current(iteration, round_):
            self.replays.discard((mb, stage))

    @_input
    def recovering(self, plan: CrashPlan) -> None:
        """A dead node's recovery was planned: record its drops and the replays to wait for (a
        `Rule.KEEP` too, until its keeper reports the sum adopted with `replayed`)."""
        self.unplanned.pop(plan.dead, None)
        self.dropped |= set(plan.dropped)
        for recovery in plan.recoveries:
            if recovery.rule in (Rule.REPLAY, Rule.KEEP):
                self.replays.add((recovery.mb, recovery.stage))

    @_input
    def plan_recovery(self, dead: str, stage: int, reports: Sequence[NeighbourReport],
                      kept: Mapping[str, frozenset[int]] | None = None) -> RecoveryOrders:
        """`dead` (of `stage`) died in the round in progress and its live neighbours reported
        `reports`: the rules decide (`gwtf.recovery.plan_crash`; a dead holder's unfinished
        share is what it held; `kept`: what each live stage peer keeps of its running sum, the
        largest taken whole as `Rule.KEEP` where the rules allow, docs/design.md 4.9), what was
        planned for it before in this round is left alone, and the new drops, replays and keeps
        are recorded (`recovering`). See `RecoveryOrders`."""
        self.unplanned.pop(dead, None)
        held = self.held_by(dead) if stage == 0 else ()
        planned = self.planned.setdefault(dead, set())
        keeper, covered = best_cover(dead, {p: ids for p, ids in (kept or {}).items()
                                            if self.participants.get(p) == stage})
        if not covered.isdisjoint(planned):
            keeper, covered = None, frozenset()  # a sum is one tensor: all of it, or none
        crash = plan_crash(dead, stage, self.num_stages, reports, finished=self.finished,
                           held_by_dead=held, covered=covered, keeper=keeper,
                           dropped_before=self.dropped)
        recoveries = tuple(r for r in crash.recoveries if r.mb not in planned)
        dropped = frozenset(m for m in crash.dropped
                            if m not in planned and m not in self.finished)
        fresh = CrashPlan(dead, stage, recoveries, dropped)
        if not recoveries and not dropped:
            return RecoveryOrders(fresh, ())
        planned.update(r.mb for r in recoveries)
        planned.update(dropped)
        self.recovering(fresh)
        holders = [h for h in self.live_holders() if h != dead]
        orders, self._holder_turn = _orders(fresh, holders, self._holder_turn)
        return orders

    def quorum(self) -> QuorumVerdict:
        """May the live participants commit the iteration in progress (`gwtf.job.quorum`)?"""
        return commit_quorum(self.base, self.participants, self.gone)

    @_input
    def shown_gone(self, node: str) -> None:
        """`node` is shown dead (a call to it was refused, or it holds nothing of the job): it
        no longer counts against the quorum."""
        self.gone.add(node)

    @_input
    def commit_order(self) -> CommitOrder | None:
        """Phase one of a new attempt, once the iteration may commit; None while it may not
        (work outstanding, an empty stage, or no quorum)."""
        if self.in_commit or self.injecting >= self.iterations or self.unfinished():
            return None
        if self.replays or self.empty_stages() or not self.quorum().ok:
            return None
        if self.awaiting_plan():
            return None
        self.attempt += 1
        self._members = dict(self.participants)
        self._prepared = {}
        final = self.injecting == self.iterations - 1
        return CommitOrder(
            self.injecting, tuple(sorted(self.finished)), final,
            () if final else self.live_holders(), self.round, self.attempt, dict(self._members),
        )

    @_input
    def prepared(self, report: PreparedReport) -> StepOrder | Outliers | str | None:
        """A member is prepared. The step order once all are and rule 6 holds; the replicas to
        exclude when all are and a majority of a stage named some (the attempt is void); a
        reason (str) when all are but rule 6 does not hold (void too); else None."""
        if not self._current(report.iteration, report.round) or report.attempt != self.attempt:
            return None
        stage = self._members.get(report.sender)
        if stage is None:
            return None  # not a member of this attempt (or it was voided)
        if stage != report.stage:
            raise ReportError(f"{report.sender} holds stage {stage}, not {report.stage}")
        last = stage == self.num_stages - 1
        if not last and (report.losses or report.routes):
            raise ReportError(f"{report.sender} is not on the last stage but reports losses")
        if set(report.losses) - self.finished:
            raise ReportError(f"{report.sender} reports losses of microbatches not finished")
        if sum(report.routes.values()) != len(report.losses):
            raise ReportError(f"{report.sender} reports routes that do not match its losses")
        self._prepared[report.sender] = report
        if set(self._prepared) != set(self._members):
            return None
        reports = list(self._prepared.values())
        outliers = _outliers(self._members, reports, self.num_stages)
        if outliers:
            self._members = {}
            self._prepared = {}
            return Outliers(self.injecting, outliers)
        contributions = {
            s: [r.contributed for r in reports if r.stage == s] for s in range(self.num_stages)
        }
        verdict = check_commit(self.num_stages, self.finished, contributions)
        losses: dict[int, float] = {}
        twice: set[int] = set()
        for r in reports:
            twice |= set(r.losses) & set(losses)
            losses.update(r.losses)
        reason = ""
        if not verdict.ok:
            reason = verdict.reason()
        elif twice:
            reason = f"the loss of microbatch {min(twice)} came from two last-stage nodes"
        elif set(losses) != self.finished:
            reason = f"no loss for microbatch {min(self.finished - set(losses))}"
        if reason:
            self._members = {}
            self._prepared = {}
            return reason
        routes: dict[tuple[str, ...], int] = {}
        for r in reports:
            for path, count in r.routes.items():
                routes[path] = routes.get(path, 0) + count
        loss = sum(losses[m] for m in sorted(losses)) / len(losses) if losses else float("nan")
        final = self.injecting == self.iterations - 1
        next_holders = () if final else self.live_holders()
        periodic, floor = (False, None) if self.boundaries is None or final else \
            self.boundaries.step(self.injecting, self.participants.values())
        order = StepOrder(
            iteration=self.injecting,
            round=self.round,
            attempt=self.attempt,
            final=final,
            next_holders=next_holders,
            participants=dict(self.participants),
            loss=loss,
            trained=len(self.finished),
            dropped=tuple(sorted(self.dropped)),
            next_weights=self.next_weights(next_holders),
            next_round=self.round_floor,
            periodic=periodic,
            floor=floor,
        )
        self._stepping[self.injecting] = _Stepping(
            order, set(self._members), routes,
            sum(r.compute_s for r in reports), sum(r.replayed_s for r in reports),
        )
        self.base = frozenset(self._members)
        self._next_iteration(order.next_holders, order.weights())
        return order

    def _next_iteration(self, holders: Sequence[str], weights: Mapping[str, int] | None
                        ) -> None:
        self.planned = {}
        self.stalled = 0
        self.injecting += 1
        self.round = self.round_floor
        self.attempt = 0
        self.finished = set()
        self.dropped = set()
        self.replays = set()
        self._members = {}
        self._prepared = {}
        if holders:
            self._holders = tuple(sorted(holders))
            self._weights = dict(weights) if weights else None

    @_input
    def stepped(self, order: StepOrder, members: Iterable[str]) -> None:
        """A step ordered by an earlier coordinator (a new one takes over after it): wait for
        the committed reports of `members`."""
        self._stepping[order.iteration] = _Stepping(order, set(members), {}, 0.0, 0.0)
        if order.iteration >= self.injecting:
            self.base = frozenset(members)
            self._next_iteration(order.next_holders, order.weights())

    @_input
    def committed(self, report: CommittedReport) -> list[IterationOutcome]:
        """A participant's report; the iterations it completes, in order (usually none or one)."""
        stepping = self._stepping.get(report.iteration)
        if stepping is None:
            if report.iteration < self.injecting:
                return []  # a retry of a completed one, or one stepped by a dead coordinator
            raise ReportError(
                f"{report.sender} reports a commit of iteration {report.iteration}, which is "
                "not being committed"
            )
        order = stepping.order
        stage = order.participants.get(report.sender)
        if stage is None and report.sender == order.mover:
            stage = order.mover_from  # it stepped at its old stage before it moves
        if stage is None:
            raise ReportError(f"{report.sender} does not take part in the job")
        if stage != report.stage:
            raise ReportError(f"{report.sender} holds stage {stage}, not {report.stage}")
        if report.sender in stepping.reports:
            if stepping.reports[report.sender] == report:
                return []
            raise ReportError(
                f"{report.sender} already reported another commit of iteration "
                f"{report.iteration}"
            )
        stepping.reports[report.sender] = report
        stepping.waiting.discard(report.sender)
        if self.boundaries is not None:
            self.boundaries.report(stage, report.snapshots_landed, report.snapshot_lacking)
        return self._complete()

    @_input
    def moving(self, node: str, stage: int) -> StepOrder:
        """The step just ordered (`prepared` returned it) also moves `node` to `stage`
        (docs/design.md 2.11): it steps the iteration with the other members, then takes no
        part in the next one (it is out of the participants, the holders and the quorum's base,
        as a node that left at the step) and enters the job again at `stage` as a joiner. The
        step order to send instead. ReportError when no such move can be made now: no step was
        just ordered, `node` does not take part, its stage would be left empty, `stage` is its
        own or outside the job, or it is the last data holder."""
        last = self._stepping.get(self.injecting - 1)
        if last is None or last.order.mover or self.finished or self.dropped or self.in_commit:
            raise ReportError("a move is named only with the step just ordered")
        if not 0 <= stage < self.num_stages:
            raise ReportError(f"stage {stage} is outside the job's 0..{self.num_stages - 1}")
        old = self.participants.get(node)
        if old is None:
            raise ReportError(f"{node} does not take part in the job")
        if old == stage:
            raise ReportError(f"{node} holds stage {stage} already")
        if sum(1 for s in self.participants.values() if s == old) < 2:
            raise ReportError(f"{node} is the last node of stage {old}")
        order = last.order
        if order.final:
            raise ReportError("no move at the last iteration's step")
        del self.participants[node]
        self.base = self.base - {node}
        holders = tuple(h for h in order.next_holders if h != node)
        weights = order.weights()
        if node in order.next_holders:
            kept = {h: w for h, w in (weights or {}).items() if h != node}
            weights = kept if any(kept.values()) else None
            self._holders = holders
            self._weights = dict(weights) if weights else None
        moved = dataclasses.replace(
            order, participants=dict(self.participants), next_holders=holders,
            next_weights=tuple(weights[h] for h in holders) if weights else (),
            mover=node, mover_from=old, move_to=stage,
        )
        last.order = moved
        return moved

    # ------------------------------------------------------------------ membership

    @_input
    def member_down(self, node: str) -> bool:
        """A participant died or left. True when it voided the commit attempt under way. No
        commit is ordered in this round before its recovery is planned (`unplanned`)."""
        if self.participants.pop(node, None) is not None:
            self.unplanned[node] = (self.injecting, self.round)
        voided = node in self._members
        if voided:
            self._members = {}
            self._prepared = {}
        for stepping in self._stepping.values():
            stepping.waiting.discard(node)
        # A dead holder's share stays assigned: its microbatches are recovered or dropped.
        return voided

    @_input
    def completions(self) -> list[IterationOutcome]:
        """Iterations a death completed (the last reports it waited for will never come)."""
        return self._complete()

    @_input
    def admit(self, node: str, stage: int) -> None:
        """A joiner takes part from now on (it holds its stage's state of this iteration)."""
        if not 0 <= stage < self.num_stages:
            raise ReportError(f"stage {stage} is outside the job's 0..{self.num_stages - 1}")
        self.participants[node] = stage

    def awaiting_plan(self) -> list[str]:
        """The dead of the round in progress whose recovery is not planned yet (a node that
        entered again since is its own, not a dead node's)."""
        now = (self.injecting, self.round)
        return sorted(n for n, at in self.unplanned.items()
                      if at == now and n not in self.participants)

    def waiting_on(self) -> str:
        """What the iteration in progress waits for, in a few words (for a stalled one)."""
        if self.in_commit:
            late = sorted(set(self._members) - set(self._prepared))
            return f"the prepared reports of {', '.join(late)} in commit attempt {self.attempt}"
        shares = self.assignment()
        late = sorted(h for h, ids in shares.items() if set(ids) & self.unfinished())
        if late:
            return f"the microbatches injected by {', '.join(late)}"
        if self.replays:
            return f"{len(self.replays)} replays"
        if self.awaiting_plan():
            return f"the recovery plan of {', '.join(self.awaiting_plan())}"
        return "a commit that no rule blocks"

    @_input
    def restart(self, reason: str = "", *, stalled: bool = False
                ) -> tuple[int, int, tuple[str, ...], tuple[int, ...]]:
        """Start the iteration again from scratch with the live participants: (iteration, new
        round, its holders, their weights). ValueError when no data holder is left, or when
        `stalled` (the watchdog's restart of an iteration that made no progress) and the
        watchdog already started `STALLED_ROUNDS` rounds of it: the reason names what it
        waited on."""
        holders = self.live_holders()
        if not holders:
            raise ValueError("no data holder is left to start the iteration again")
        if stalled:
            self.stalled += 1
            if self.stalled >= STALLED_ROUNDS:
                raise ValueError(
                    f"iteration {self.injecting} stalled in {STALLED_ROUNDS} rounds in a row "
                    f"(each started again after no progress); round {self.round} still waited "
                    f"on {self.waiting_on()}"
                )
        weights = self.next_weights(holders)
        self._weights = weights_of(holders, weights)
        self.round += 1
        self.planned = {}
        self.attempt = 0
        self.finished = set()
        self.dropped = set()
        self.replays = set()
        self._members = {}
        self._prepared = {}
        self._holders = holders
        return self.injecting, self.round, holders, weights

    @_input
    def rollback(self, iteration: int) -> tuple[int, tuple[str, ...], tuple[int, ...]]:
        """Go back to `iteration`, older than the one in progress (a stage lost every replica
        and its snapshot is of `iteration`: docs/design.md 4.6): what stepped since is undone
        and is done again, from a round above every round used so far. Returns (the new
        round, the holders, their weights); ValueError when no data holder is left."""
        if iteration > self.injecting:
            raise ValueError(f"cannot roll back to iteration {iteration}, which is ahead of "
                             f"{self.injecting}")
        holders = self.live_holders()
        if not holders:
            raise ValueError("no data holder is left to start the iteration again")
        top = max([self.round, self.round_floor, *(s.order.round for s in
                                                   self._stepping.values())])
        self.round_floor = top + 1
        self.injecting = iteration
        self.stalled = 0
        self.completed = iteration
        self._stepping = {}
        if self.boundaries is not None:
            self.boundaries.undo(iteration)
        # Every participant restores its own state of `iteration`, or refuses and fails the job.
        self.base = frozenset(self.participants)
        self.round = top  # restart() moves it on to the floor
        _, round_, holders, weights = self.restart()
        return round_, holders, weights

    # ------------------------------------------------------------------ completion

    def _complete(self) -> list[IterationOutcome]:
        outcomes = []
        while self.completed in self._stepping:
            stepping = self._stepping[self.completed]
            if stepping.waiting:
                break
            outcomes.append(self._outcome(stepping))
            del self._stepping[self.completed]
            self.completed += 1
        return outcomes

    def _outcome(self, stepping: _Stepping) -> IterationOutcome:
        order = stepping.order
        mismatched: list[str] = []
        outvoted: list[str] = []
        digests: dict[str, str] = {}
        for stage in range(self.num_stages):
            reports = sorted(
                (r for r in stepping.reports.values() if r.stage == stage), key=lambda r: r.sender
            )
            if not reports:
                continue
            counts: dict[str, int] = {}
            for r in reports:
                counts[r.checksum] = counts.get(r.checksum, 0) + 1
            common = max(sorted(counts), key=lambda c: counts[c])
            if 2 * counts[common] > len(reports):
                mismatched.extend(r.sender for r in reports if r.checksum != common)
                outvoted.extend(r.sender for r in reports if r.checksum != common)
            else:  # no majority: which replica is right cannot be told
                mismatched.extend(r.sender for r in reports if len(counts) > 1)
            if order.final:
                agreeing = next(r for r in reports if r.checksum == common)
                digests.update(agreeing.digests)
        return IterationOutcome(
            iteration=order.iteration,
            loss=order.loss,
            microbatches=order.trained,
            final=order.final,
            mismatched=tuple(sorted(mismatched)),
            routes=stepping.routes,
            digests=digests,
            dropped=order.dropped,
            compute_s=stepping.compute_s,
            replayed_s=stepping.replayed_s,
            outvoted=tuple(sorted(outvoted)),
        )
