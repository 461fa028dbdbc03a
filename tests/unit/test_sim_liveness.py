"""Liveness under random churn (docs/design.md 4.8): whatever dies, in whatever order (mass
kills, whole stages killed then joined, kills during a commit), every policy keeps committing
once every stage has a live node again, and the exact policies stay exact: every committed
iteration passed the commit check (each finished microbatch's gradient in every stage's sums
exactly once), nothing is lost, and every injected microbatch is either counted or dropped.

Each of these properties failed on main before the fixes that came with this test: a finished
microbatch whose every holder died while the only joining data holder was still loading was
never pumped again (gwtf and the oracle committed nothing, ever); SWARM waited for good for a
gradient that died with a lost last-stage peer; DT-FM's all-reduce waited for good for a
non-member that died during it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.sim.scenario import POLICIES
from tests.unit.test_sim_run import run, scenario, trace_with

STAGES = 3
SETTLE_S = 300.0
"""How long the swarm runs after the last churn event, every stage held."""

EXACT = ("gwtf", "gwtf-fixed", "oracle")


@dataclass(frozen=True)
class Churn:
    rows: tuple[str, ...]
    last_s: float


@st.composite
def churn(draw: st.DrawFn) -> Churn:
    """Kills (crash or graceful leave) of random subsets or of whole stages, at random gaps (0
    included: simultaneous), with joins that refill every emptied stage after 0-20 s, plus
    random extra joins. Starts from `trace_with`'s two nodes per stage."""
    stage = {f"s{k}{c}": k for k in range(STAGES) for c in "ab"}
    alive = set(stage)
    joined_at = dict.fromkeys(stage, 0.0)
    rows: list[tuple[float, str]] = []
    t = draw(st.sampled_from([0.3, 1.0, 2.0, 5.0]))
    fresh = 0
    for _ in range(draw(st.integers(1, 10))):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.7, 3.0, 10.0, 23.0, 40.0]))
        present = sorted(n for n in alive if joined_at[n] <= t)
        kind = draw(st.sampled_from(["some", "some", "stage", "none"]))
        if kind == "some" and present:
            victims = draw(st.lists(st.sampled_from(present), min_size=1, max_size=4,
                                    unique=True))
        elif kind == "stage":
            k = draw(st.integers(0, STAGES - 1))
            victims = [n for n in present if stage[n] == k]
        else:
            victims = []
        for node in victims:
            how = draw(st.sampled_from(["crash", "crash", "leave"]))
            rows.append((t, f"{how},{node}"))
            alive.discard(node)
        for k in range(STAGES):
            if any(stage[n] == k for n in alive) and not draw(st.booleans()):
                continue
            fresh += 1
            node = f"j{fresh}"
            at = t + draw(st.sampled_from([0.0, 4.0, 20.0]))
            stage[node], joined_at[node] = k, at
            alive.add(node)
            where = draw(st.sampled_from(["Oregon", "Ohio"]))
            rows.append((at, f"join,{node},{k},{where}"))
    rows.sort(key=lambda row: row[0])
    return Churn(tuple(f"{at:.1f},{what}" for at, what in rows), max(at for at, _ in rows))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=churn())
def test_random_churn_never_stalls_and_stays_exact(tmp_path: Path, case: Churn) -> None:
    sc = scenario(tmp_path, duration=case.last_s + SETTLE_S,
                  trace=trace_with("\n".join(case.rows) + "\n"))
    for policy in POLICIES:
        result = run(sc, policy)
        # Every stage is held from `last_s` on (joins refill emptied stages), and an iteration
        # of this swarm takes under 40 s (under 70 s with a joiner's download): at least two
        # commits must follow, or the policy stalled.
        after = [t for t in result.commit_times if t > case.last_s]
        assert len(after) >= 2, (policy, case.rows, result.commit_times[-3:])
        if policy in EXACT:
            assert result.audit["conserved_iterations"] == result.iterations_completed, policy
            assert result.audit["commit_checks"] >= result.iterations_completed, policy
            assert result.lost_microbatches == 0, policy
            assert result.committed_microbatches + result.dropped_microbatches == (
                result.iterations_completed * sc.microbatches_per_iteration
            ), policy
