"""The commit of a job's iterations, as its coordinator sees it (DESIGN.md 1), pure.

One member coordinates a job: the data holder with the smallest id among those that take part
(it owns data and injects microbatches, so it is where an iteration starts; issue 6 will let the
next one take over when it dies). Every iteration `k` goes:

1. the data holders of `k`, each with its share of the microbatch ids
   (`gwtf.train.assign_microbatches` over the holders, sorted), inject them;
2. each holder reports `done(k, ids)` when the gradient of every one of its microbatches is back
   (every stage has then run that microbatch's backward and accumulated it);
3. once every holder is done, the coordinator orders the commit of `k` over exactly the ids
   reported (`CommitOrder`), with the holders of `k + 1`;
4. every participant combines its stage's gradient sums with its stage peers, steps AdamW, and
   reports `committed(k)`: its stage's parameter checksum, and on the last stage the loss and the
   path of each microbatch it computed (on the final iteration, its parameter digests);
5. once every participant has reported, `k` is complete (`IterationOutcome`): the loss is the mean
   over the microbatches summed in id order (as `gwtf reference` computes it), and replicas whose
   checksums differ from their stage's are named.

Holders start `k + 1` right after their own commit of `k`, so `done(k + 1)` may arrive before
every `committed(k)`: the coordinator collects both at once and completes iterations in order.

Everything a peer reports is checked against what the coordinator expects (the sender takes
part, holds that stage, the iteration is the one in progress, the ids are its own, no microbatch
counted twice); a bad report raises `ReportError` and changes nothing. A report repeated by a
retry (its first reply was lost) is recognised and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CommitOrder",
    "CommittedReport",
    "IterationCoordinator",
    "IterationOutcome",
    "ReportError",
    "assign",
]


class ReportError(ValueError):
    """A report the coordinator cannot accept (one sentence)."""


def assign(microbatches: int, holders: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`gwtf.train.assign_microbatches`, without torch: ids dealt round-robin over the holders
    sorted by id (a test checks both agree)."""
    ordered = sorted(set(holders))
    if not ordered:
        raise ValueError("no data holder to assign microbatches to")
    return {h: tuple(range(j, microbatches, len(ordered))) for j, h in enumerate(ordered)}


@dataclass(frozen=True)
class CommitOrder:
    """Commit `iteration` over `microbatches`; `next_holders` inject the next one."""

    iteration: int
    microbatches: tuple[int, ...]
    final: bool
    next_holders: tuple[str, ...]


@dataclass(frozen=True)
class CommittedReport:
    """What one participant reports after its optimizer step."""

    sender: str
    iteration: int
    stage: int
    checksum: str
    losses: Mapping[int, float] = field(default_factory=dict)
    routes: Mapping[tuple[str, ...], int] = field(default_factory=dict)
    digests: Mapping[str, str] = field(default_factory=dict)


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


@dataclass
class _Commit:
    order: CommitOrder
    reports: dict[str, CommittedReport] = field(default_factory=dict)


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
    ) -> None:
        if iterations < 1 or microbatches < 1:
            raise ValueError("a job needs at least one iteration and one microbatch")
        self.iterations = iterations
        self.microbatches = microbatches
        self.participants = dict(participants)
        self.num_stages = num_stages
        for stage in range(num_stages):
            if stage not in self.participants.values():
                raise ValueError(f"stage {stage} has no participant")
        self.injecting = 0
        """The iteration whose `done` reports are being collected."""
        self._holders = tuple(sorted(holders))
        self._check_holders(self._holders)
        self._done: dict[str, tuple[int, ...]] = {}
        self._commits: dict[int, _Commit] = {}
        self.completed = 0
        """Iterations completed, in order (the outcomes returned so far)."""

    def _check_holders(self, holders: Sequence[str]) -> None:
        if not holders:
            raise ValueError("an iteration needs at least one data holder")
        for holder in holders:
            if self.participants.get(holder) != 0:
                raise ValueError(f"{holder} is not a data holder taking part in the job")

    @property
    def holders(self) -> tuple[str, ...]:
        """The data holders of the iteration being injected."""
        return self._holders

    def assignment(self) -> dict[str, tuple[int, ...]]:
        return assign(self.microbatches, self._holders)

    def committing(self) -> list[int]:
        """Iterations ordered to commit and not complete yet."""
        return sorted(self._commits)

    def done(self, holder: str, iteration: int, ids: Sequence[int]) -> CommitOrder | None:
        """A holder's microbatches of `iteration` are all back; the commit order once every
        holder of the iteration is done."""
        if iteration < self.injecting:
            return None  # a retried report of an iteration already ordered to commit
        if iteration != self.injecting or self.injecting >= self.iterations:
            raise ReportError(
                f"{holder} reports iteration {iteration} done, but iteration "
                f"{self.injecting} is the one in progress"
            )
        mine = self.assignment().get(holder)
        if mine is None:
            raise ReportError(f"{holder} is not a data holder of iteration {iteration}")
        if tuple(sorted(ids)) != mine:
            raise ReportError(
                f"{holder} reports microbatches {sorted(ids)[:8]} of iteration {iteration}, "
                f"but its share is {list(mine[:8])}"
            )
        self._done[holder] = mine
        if len(self._done) < len(self._holders):
            return None
        ids_done = tuple(sorted(mb for share in self._done.values() for mb in share))
        final = iteration == self.iterations - 1
        order = CommitOrder(iteration, ids_done, final, () if final else self._holders)
        self._commits[iteration] = _Commit(order)
        self._done = {}
        self.injecting += 1
        return order

    def committed(self, report: CommittedReport) -> list[IterationOutcome]:
        """A participant's report; the iterations it completes, in order (usually none or one)."""
        commit = self._commits.get(report.iteration)
        if commit is None and report.iteration < self.completed:
            return []  # a retried report of an iteration already complete
        if commit is None:
            raise ReportError(
                f"{report.sender} reports a commit of iteration {report.iteration}, which is "
                "not being committed"
            )
        stage = self.participants.get(report.sender)
        if stage is None:
            raise ReportError(f"{report.sender} does not take part in the job")
        if stage != report.stage:
            raise ReportError(f"{report.sender} holds stage {stage}, not {report.stage}")
        if report.sender in commit.reports:
            if commit.reports[report.sender] == report:
                return []  # a retried report
            raise ReportError(
                f"{report.sender} already reported another commit of iteration "
                f"{report.iteration}"
            )
        last = stage == self.num_stages - 1
        if not last and (report.losses or report.routes):
            raise ReportError(f"{report.sender} is not on the last stage but reports losses")
        expected = set(commit.order.microbatches)
        if not set(report.losses) <= expected:
            raise ReportError(
                f"{report.sender} reports losses of microbatches not in iteration "
                f"{report.iteration}'s commit"
            )
        if sum(report.routes.values()) != len(report.losses):
            raise ReportError(f"{report.sender} reports routes that do not match its losses")
        for other in commit.reports.values():
            twice = set(other.losses) & set(report.losses)
            if twice:
                raise ReportError(
                    f"microbatch {min(twice)} of iteration {report.iteration} was reported "
                    f"by both {other.sender} and {report.sender}"
                )
        if set(commit.reports) | {report.sender} == set(self.participants):
            losses = {mb for r in (*commit.reports.values(), report) for mb in r.losses}
            missing = sorted(expected - losses)
            if missing:
                raise ReportError(
                    f"no last-stage node reported the loss of microbatches {missing[:8]} of "
                    f"iteration {report.iteration}"
                )
        commit.reports[report.sender] = report
        return self._complete()

    def _complete(self) -> list[IterationOutcome]:
        outcomes = []
        while self.completed in self._commits:
            commit = self._commits[self.completed]
            if set(commit.reports) != set(self.participants):
                break
            outcomes.append(self._outcome(commit))
            del self._commits[self.completed]
            self.completed += 1
        return outcomes

    def _outcome(self, commit: _Commit) -> IterationOutcome:
        order = commit.order
        losses: dict[int, float] = {}
        routes: dict[tuple[str, ...], int] = {}
        for report in commit.reports.values():
            losses.update(report.losses)
            for path, count in report.routes.items():
                routes[path] = routes.get(path, 0) + count
        loss = (
            sum(losses[mb] for mb in sorted(losses)) / len(losses) if losses else float("nan")
        )
        mismatched: list[str] = []
        digests: dict[str, str] = {}
        for stage in range(self.num_stages):
            reports = sorted(
                (r for r in commit.reports.values() if r.stage == stage), key=lambda r: r.sender
            )
            counts: dict[str, int] = {}
            for r in reports:
                counts[r.checksum] = counts.get(r.checksum, 0) + 1
            common = max(sorted(counts), key=lambda c: counts[c])
            if 2 * counts[common] > len(reports):
                mismatched.extend(r.sender for r in reports if r.checksum != common)
            else:  # no majority: which replica is right cannot be told
                mismatched.extend(r.sender for r in reports if len(counts) > 1)
            if order.final:
                agreeing = next(r for r in reports if r.checksum == common)
                digests.update(agreeing.digests)
        return IterationOutcome(
            iteration=order.iteration,
            loss=loss,
            microbatches=len(order.microbatches),
            final=order.final,
            mismatched=tuple(sorted(mismatched)),
            routes=routes,
            digests=digests,
        )
