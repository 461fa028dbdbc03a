"""Crash recovery rules of docs/design.md 4, as pure sans-I/O logic.

Used by the simulator and by the real node: no time, no I/O, no randomness;
every output is sorted, so equal inputs give equal outputs.

- `Ledger`: what one node sent, received and accumulated in the current iteration.
- `plan_crash`: from the surviving neighbours' reports about a dead node, what to resend,
  recompute, replay or drop (`CrashPlan` of `Recovery`, each with its `Rule`).
- `check_commit`: may the iteration's aggregation commit (every finished microbatch covered
  exactly once at every stage)? (`CommitCheck`)
- `ship_due`, `pick_keeper`, `best_cover`: bounded replay (docs/design.md 4.9), partial gradient
  sums shipped to a stage peer so that a death replays at most `replay_bound` microbatches.

How a node drives it (what `gwtf.sim.simulator` does with simulated messages):

1. Keep one `Ledger(node_id, stage)`; call `reset(k)` when iteration k-1 commits.
2. Record every data-plane step: `activation_sent(mb, receiver, mode)` when sending an
   activation down (mode = the recovery's `Rule.mode` for a recovery send),
   `activation_received(mb, sender)`, `gradient_sent(mb, receiver)`,
   `gradient_received(mb, sender)`, `accumulated(mb)`. A node told by a recovery that its
   gradient now goes elsewhere calls `gradient_target(mb, target, mode)` (a stage-1 node that
   starts a recovery at a data holder does the same: it sends the token ids). A replacement
   that recomputes or replays a stage records `activation_sent(mb, downstream)` for the
   downstream node named in the microbatch's path: it now keeps that node's input.
3. When the failure detector declares X (stage s) dead, each live neighbour of X (stages s-1
   and s+1) sends `report_about(X)` (a frozen, serialisable `NeighbourReport`) to X's
   upstream neighbours, which run `plan_crash(X, s, S, reports, finished=..., held_by_dead=...)`
   (`finished`/`held_by_dead` from the iteration's progress, for a dead data holder) and carry
   out the recoveries whose `activation_from` is themselves: pick the replacement from the
   updated routes, send the activation with `rule.mode`, and tell `gradient_from` the new
   target. A stage with no live node (rule 5) keeps its recoveries until a node joins it.
4. With bounded replay: after `accumulated(mb)`, if `ship_due(ledger, bound)`, send the running
   sum to `pick_keeper(...)` and record `shipped(ledger.contributions(), keeper)`; the keeper
   records `kept(sender, ids)`. At a death, `best_cover` over the stage peers' `held_for(dead)`
   gives `plan_crash` its `covered`/`keeper`; for each `Rule.KEEP` the keeper calls
   `adopt(dead)` once and the neighbours `contribution_moved(mb, stage, keeper)`; senders whose
   keeper died call `keeper_lost()`.
5. Before the all-reduce: `check_commit(S, finished, {stage: [each live node's
   contributions()]})`; commit only when `.ok`, else `.reason()` says what is pending.
"""

from gwtf.recovery.ledger import Evidence, Hops, Ledger, MicrobatchId, Mode, NeighbourReport
from gwtf.recovery.rules import (
    CommitCheck,
    CrashPlan,
    Recovery,
    Rule,
    check_commit,
    merge_reports,
    plan_crash,
)
from gwtf.recovery.shipments import (
    DEFAULT_REPLAY_BOUND,
    RECHECK,
    REPLAY_AUTO,
    HazardEstimate,
    ShipCost,
    best_cover,
    pick_keeper,
    recheck_at,
    replay_bound,
    ship_due,
    ship_interval,
)

__all__ = [
    "DEFAULT_REPLAY_BOUND",
    "RECHECK",
    "REPLAY_AUTO",
    "CommitCheck",
    "HazardEstimate",
    "Hops",
    "CrashPlan",
    "Evidence",
    "Ledger",
    "MicrobatchId",
    "Mode",
    "NeighbourReport",
    "Recovery",
    "Rule",
    "ShipCost",
    "best_cover",
    "check_commit",
    "merge_reports",
    "pick_keeper",
    "recheck_at",
    "replay_bound",
    "plan_crash",
    "ship_due",
    "ship_interval",
]
