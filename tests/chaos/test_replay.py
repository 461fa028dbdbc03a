"""The journal of a real chaos run, replayed through the pure job core, decides the same
(docs/design.md 4.10).

A swarm of 5 real node processes in 3 stages (holders h0 and h1, a0 and a1 at stage 1, z0 at
stage 2) trains one short job with every coordinator's journal on (`GWTF_JOB_RECORD`). Two
nodes SIGKILL themselves mid-job (`--fault`, a real SIGKILL of the real process): a1 in a
backward of iteration 1, so that its microbatches are resent, recomputed or replayed; h1 in a
forward of iteration 0, so that what never left it is dropped. (h1 dies first: once a1 is gone,
stage 1 carries less than h0 alone sends, the flows give h1 no share, and a fault of h1 set for
a later iteration may never fire.) The journal the coordinator wrote is then fed to a fresh
`IterationCoordinator` (`gwtf.job.journal.replay`): every decision (who resends, recomputes or
replays what, what is dropped, each commit attempt, step, restart and completed iteration) must
be the one the node took, and the journal must hold the recoveries, so that the comparison is
not of two empty lists. Every participant's ledger journal, replayed through a fresh `Ledger`,
must answer the same, and every neighbour report the coordinator planned from must be one its
sender's ledger gave.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cluster import LocalSwarm, wait_for

from gwtf.client import GwtfClient
from gwtf.job.journal import canonical, decisions, from_record, replay
from gwtf.node.jobs.journals import RECORD_ENV
from gwtf.recovery import Rule
from gwtf.train import PRESETS

pytestmark = pytest.mark.chaos

NODES = [("h0", 0, 0.04), ("a0", 1, 0.05), ("z0", 2, 0.04)]


def read(path: Path) -> list[dict[str, Any]]:
    """A journal's entries; a last line without its newline was cut by the SIGKILL."""
    lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines]


def routed(swarm: LocalSwarm, node: str, stage: int) -> bool:
    view = swarm.status(node)
    return view is not None and view["converged"] and any(
        arc["flow"] > 0 and (arc["src"] if stage == 0 else arc["dst"]) == node
        for arc in view["arcs"]
    )


def test_the_journal_of_a_chaos_run_replays_to_the_same_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    began = time.monotonic()
    journals = tmp_path / "journals"
    journals.mkdir()
    monkeypatch.setenv(RECORD_ENV, str(journals))
    with LocalSwarm(tmp_path, heartbeat_s=0.25, failure_timeout_s=3.0, train=True) as swarm:
        swarm.start(NODES, 3, "--activation-bytes", "131072")
        a1 = swarm.join("a1", 1, 0.05, "--fault", "crash-in:backward:iteration=1")
        h1 = swarm.join("h1", 0, 0.04, "--fault", "crash-in:forward:iteration=0")
        swarm.wait_formed()
        wait_for(lambda: routed(swarm, "a1", 1) and routed(swarm, "h1", 0), 60,
                 "the flows to route microbatches through a1 and h1")
        job = dataclasses.replace(PRESETS["tiny-gpt"], name="chaos-journal", iterations=3)
        client = GwtfClient(swarm.procs["z0"].address)
        result = client.wait(client.submit(job), timeout_s=90)
        for victim in (a1, h1):
            wait_for(lambda v=victim: v.popen.poll() is not None, 30, f"{victim.id} to die")
            assert victim.popen.returncode == -9, (victim.id, victim.popen.returncode)
    assert result.state == "completed", result.error
    assert result.crashes == 2 and result.lost_microbatches == 0
    (path,) = sorted(journals.glob("h0-*-coordinator-*.jsonl"))  # h0 coordinated throughout
    records = read(path)
    recorded = decisions(records)
    assert replay(records) == recorded

    # Every participant's ledger, replayed, answers the same; and each report the coordinator
    # planned from is an answer of the reporting node's ledger.
    answered: dict[str, set[str]] = {}
    for ledger in sorted(journals.glob("*-ledger-*.jsonl")):
        entries = read(ledger)
        assert replay(entries) == decisions(entries), ledger.name
        answered.setdefault(entries[0]["kwargs"]["node"], set()).update(
            canonical(from_record(e).result) for e in entries if e["call"] == "report_about")
    assert set(answered) == {n for n, _, _ in NODES} | {"a1", "h1"}
    reports = [report for r in records if r["call"] == "plan_recovery"
               for report in from_record(r).args[2]]
    assert reports and all(canonical(rep) in answered[rep.node] for rep in reports)

    orders = [from_record(r).result for r in records if r["call"] == "plan_recovery"]
    rules = {r.rule for o in orders for r in o.plan.recoveries}
    dropped = sum(len(o.plan.dropped) for o in orders)
    # The microbatch in a1's backward had finished its forward there: rule 2 recomputes it.
    assert Rule.RECOMPUTE in rules, rules
    assert dropped >= result.dropped_microbatches > 0  # a restart would undo drops
    steps = [d for d in recorded if d.call == "prepared" and '"StepOrder"' in d.result]
    assert len(steps) == job.iterations
    print(f"journal: {len(records)} entries, rules {sorted(r.name for r in rules)}, {dropped} "
          f"dropped; the test took {time.monotonic() - began:.1f} s")
