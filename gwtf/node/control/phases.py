"""Ending the scaling phases of the flow algorithm swarm-wide (termination detection, pure).

`FlowNode.tighten()` must be called on every node once the current phase's work is done
everywhere: no node has surplus and no flow message is in flight. The coordinator (the live
member with the smallest id) runs *waves*: one `Flow.Phase` call to every live member, which
carries the current command (round, number of phases ended) and returns the member's report.

A member reports itself *quiet* when its state machine is idle, nothing is queued for any peer,
no `Exchange` call is in flight (a unary call returns only after the receiver has merged it, so a
message is in flight exactly while its sender's call is), and no arc is being measured; and an
*activity* counter of everything it did (receives, sends, topology edits, commands).

Rule (the four-counter method of Mattern, 1987, with activity counters): the phase is over when
two consecutive waves, the second started after the first completed, got the same members, all
quiet in both, each with the same activity in both, and all seeing the same membership. Proof:
let t be the end of the first wave; every member reported before t and again after it with
nothing done in between, so at t every member was quiet and no message was in flight, and a
swarm in that state stays in it until the topology changes or a command arrives.

A wrong decision (a member the coordinator does not know yet, two coordinators for a moment
after a crash) can only end a phase early, which the algorithm tolerates: it is what the
uncoordinated `quiet_s` mode does all the time, at several times the messages. Commands are
idempotent (`tightens` is a target count, rounds only grow), so duplicates change nothing.

Any member that wants a rescale (`FlowNode.wants_rescale`) starts a new round at once, unless
it is behind a round that has just started (that round's command rescales it). So does
a change of topology in the middle of the scaling (after its first phase): `wants_rescale` only
watches the final epsilon, but a change that moves the minimum cut needs prices to move by about
`M`, which takes `M / eps` relabels at the current epsilon, eight times more with every phase
ended; restarting the scaling from the current flows and prices costs a few phases instead (a
crash at phase 3 of 6 took over a minute to settle in an 8-node local swarm, a restart seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Command", "Decision", "PhaseDetector", "PhaseReportData"]


@dataclass(frozen=True, slots=True)
class PhaseReportData:
    id: str
    epoch: int
    round: int
    tightens: int
    final: bool
    quiet: bool
    activity: int
    wants_rescale: bool
    view: int
    edits: int = 0


@dataclass(frozen=True, slots=True)
class Command:
    round: int = 0
    tightens: int = 0
    scaling: bool = True


@dataclass(frozen=True, slots=True)
class Decision:
    """What the coordinator does after a wave: send `command` in the next wave; `again` says
    whether that wave should run at once (a command changed) or wait for a nudge or timer;
    `done` when every member is final and quiet (no more waves needed)."""

    command: Command
    again: bool
    done: bool
    reason: str


class PhaseDetector:
    """The coordinator's memory between waves."""

    def __init__(self, num_stages: int, *, coordinated: bool = True) -> None:
        self.num_stages = num_stages
        self.coordinated = coordinated
        """False in `quiet_s` mode: members tighten on their own; only rescales are decided."""
        self.command = Command()
        self._previous: Mapping[str, PhaseReportData] | None = None
        self._edits: dict[str, tuple[int, int]] = {}  # id -> (epoch, edits) at the last wave
        self.waves = 0

    def adopt(self, round_: int, tightens: int) -> None:
        """Start from this node's own state (a new coordinator)."""
        if (round_, tightens) > (self.command.round, self.command.tightens):
            self.command = Command(round_, tightens, self.command.scaling)

    def observe(
        self, reports: Mapping[str, PhaseReportData], stages: Mapping[str, int]
    ) -> Decision:
        """One complete wave: a report from every member in `stages` (id -> stage)."""
        self.waves += 1
        previous, self._previous = self._previous, dict(reports)
        cmd = self.command
        # Catch up with the furthest member (a former coordinator may have been ahead).
        top = max(((r.round, r.tightens) for r in reports.values()), default=(0, 0))
        if top > (cmd.round, cmd.tightens):
            cmd = Command(top[0], top[1], cmd.scaling)
        scaling = not all(r.final for r in reports.values())
        edited = any(
            self._edits.get(i, (r.epoch, r.edits)) != (r.epoch, r.edits)
            for i, r in reports.items()
        )
        self._edits = {i: (r.epoch, r.edits) for i, r in reports.items()}
        askers = [r for r in reports.values() if r.wants_rescale]
        behind = all(r.round < cmd.round for r in askers)
        if askers and behind and cmd.scaling and cmd.tightens == 0:
            # They ask from the final epsilon of an earlier round, and the round just started
            # rescales them anyway: another round would only restart it (two tails that
            # re-measured their arcs a moment apart made two rounds of one).
            self.command = cmd
            return Decision(cmd, True, False, "rescale under way")
        if askers:
            self.command = Command(cmd.round + 1, 0, True)
            self._previous = None
            return Decision(self.command, True, False, "rescale asked")
        if edited and scaling and cmd.tightens > 0:
            self.command = Command(cmd.round + 1, 0, True)
            self._previous = None
            return Decision(self.command, True, False, "topology changed while scaling")
        quiet = all(r.quiet for r in reports.values())
        told = self.command.scaling  # what the members were told in this wave
        self.command = cmd = Command(cmd.round, cmd.tightens, scaling)
        if not scaling:
            # One more wave tells the members that the scaling is over (they stop nudging, and
            # re-measured arcs may then be updated).
            return Decision(cmd, told, quiet and not told, "final everywhere")
        if not self.coordinated:
            return Decision(cmd, False, False, "members tighten on their own")
        if not quiet:
            return Decision(cmd, False, False, "busy")
        if set(stages.values()) != set(range(self.num_stages)):
            return Decision(cmd, False, False, "a stage has no member")
        if len({r.view for r in reports.values()}) != 1:
            return Decision(cmd, False, False, "members see different swarms")
        if previous is None or set(previous) != set(reports):
            return Decision(cmd, True, False, "first quiet wave")
        for node_id, report in reports.items():
            before = previous[node_id]
            same = (before.epoch, before.activity) == (report.epoch, report.activity)
            if not (same and before.quiet):
                return Decision(cmd, True, False, "activity between waves")
        self.command = Command(cmd.round, cmd.tightens + 1, True)
        self._previous = None
        return Decision(self.command, True, False, "phase over")

    def forget(self) -> None:
        """The last wave is no evidence any more (it was incomplete, or the members changed)."""
        self._previous = None
