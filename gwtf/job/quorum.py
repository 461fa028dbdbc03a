"""The split-brain rule of a job's commits (docs/design.md 4.5), pure.

A partition of the network looks, from each side, exactly like the death of every node on the
other side: heartbeats stop and calls time out. Without a rule each side would get a coordinator
(the next data holder takes over, 4.5) and, if it has a node of every stage, commit its own
update of the same iteration: the replicas of a stage would diverge, and after the heal nothing
could tell which side's model is the job's.

The rule: **a commit needs a strict majority of its base**, where

- the *base* of iteration `k` is the set of members of the last commit (those that stepped
  `k - 1`, or the participants the job started or resumed with): they, and only they, hold the
  state iteration `k` starts from;
- a base member that the coordinator has *shown gone* does not vote: a call to its address was
  refused outright (nothing listens there, so its process is dead) or another incarnation of it
  answers (it restarted, losing the old one's state). A member that only went silent may be
  alive on the far side of a partition, and counts against the quorum until it is heard again.

Two sides of a partition are disjoint and every member each side shows gone is really dead, so
the base members alive at that time are voters on both sides, and two disjoint sets cannot each
hold a strict majority of them: at most one side commits. The other side *pauses*: it commits
nothing, says why in the job's progress, and goes on only once it holds a quorum again (the
heal), when its stale replicas are brought back from the side that went on.

What the rule costs: a job whose majority of nodes fails at once in a way that looks like silence
(a machine or its network lost, rather than its process killed, which its host refuses calls for)
pauses until they answer or a joiner restores the stage; a SIGKILL or a preemption that leaves
the host up is shown gone within a call and costs nothing. Its limits: when every voter of a
commit dies after it (both sides' in turn), the survivors may commit that iteration again; the
earlier commit died with all its holders. And it assumes two sides: a node that reaches both
sides of a partition that is not transitive could prepare for two coordinators at once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["QuorumVerdict", "commit_quorum"]


@dataclass(frozen=True)
class QuorumVerdict:
    """Whether `present` may commit over `base`, and why not (one sentence) when it may not."""

    ok: bool
    voters: int
    """Base members that were not shown gone."""
    present: int
    """Of the voters, those that take part in the commit."""
    silent: tuple[str, ...] = ()
    """Voters absent from the commit (alive elsewhere, or dead without proof), sorted."""

    def reason(self) -> str:
        if self.ok:
            return ""
        shown = ", ".join(self.silent[:4]) + (" ..." if len(self.silent) > 4 else "")
        return (
            f"only {self.present} of the {self.voters} members of the last commit that are not "
            f"known dead take part, not a majority: {shown} went silent and may go on without "
            "this side (a network partition), so this side commits nothing until they answer"
        )


def commit_quorum(
    base: Collection[str], present: Collection[str], gone: Collection[str] = ()
) -> QuorumVerdict:
    """May the live members `present` commit an iteration whose base is `base` (module
    docstring), given the base members `gone` shown dead? Members of `present` outside the base
    (joiners of the iteration) take part but do not vote. With no voter left (every base member
    shown dead), nobody else can commit either, and the verdict is yes."""
    voters = set(base) - set(gone)
    here = voters & set(present)
    ok = not voters or 2 * len(here) > len(voters)
    return QuorumVerdict(ok, len(voters), len(here), tuple(sorted(voters - here)))
