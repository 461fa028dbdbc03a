"""Crash recovery rules of DESIGN.md section 4, as pure sans-I/O logic.

Used by the simulator now and by the real node later (issue 6): no time, no I/O, no randomness.

- `Ledger`: what one node sent, received and accumulated in the current iteration.
- `plan_crash`: from the surviving neighbours' reports about a dead node, what to resend,
  recompute, replay or drop.
- `check_commit`: may the iteration's aggregation commit (every finished microbatch covered
  exactly once at every stage)?
"""

from gwtf.recovery.ledger import Evidence, Ledger, MicrobatchId, Mode, NeighbourReport
from gwtf.recovery.rules import (
    CommitCheck,
    CrashPlan,
    Recovery,
    Rule,
    check_commit,
    merge_reports,
    plan_crash,
)

__all__ = [
    "CommitCheck",
    "CrashPlan",
    "Evidence",
    "Ledger",
    "MicrobatchId",
    "Mode",
    "NeighbourReport",
    "Recovery",
    "Rule",
    "check_commit",
    "merge_reports",
    "plan_crash",
]
