"""A joiner's catch-up in the simulator (docs/design.md 3.8, gwtf.job.catchup): a joiner whose
state download outlasts an iteration fetches the steps it missed and enters; without them it
fetches the whole state again and again and never enters.

The swarm of `tests.unit.test_sim_shipping` on home links: an iteration takes about 30 s, a
stage's state (4 bytes a parameter here) is 1.2 GB, 48 s at a 200 Mbit/s uplink; one step's
gradient is 300 MB, 12 s."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gwtf.sim.policies import simulation
from gwtf.sim.simulator import SimResult
from tests.unit.test_sim_shipping import scenario

LINKS = "uplink_gbps = [0.2]\ndownlink_gbps = [1.0]\n"


def run(tmp_path: Path, rows: str, catch_up_steps: int) -> SimResult:
    sc = scenario(tmp_path, rows, duration=400, nodes=LINKS)
    sc = replace(sc, catch_up_steps=catch_up_steps, state_bytes_per_param=4.0)
    return simulation(sc, "gwtf-fixed").run()


def test_a_slow_joiner_catches_up_with_the_steps_and_enters(tmp_path: Path) -> None:
    rows = "30,join,s1x,1,Ohio\n"
    on = run(tmp_path, rows, 4)
    off = run(tmp_path, rows, 0)
    for result in (on, off):
        assert result.lost_microbatches == 0
        assert result.audit["conserved_iterations"] >= result.iterations_completed >= 10
    # Without the steps, every download ends a step behind: the joiner never enters.
    assert off.catch_ups == 0 and off.refetches >= 5
    assert off.series[-1][3] == 6
    # With them it enters after a catch-up or two, and trains with the others.
    assert 1 <= on.catch_ups <= 3 and on.refetches == 0
    assert on.series[-1][3] == 7


def test_a_joiner_further_behind_than_the_kept_steps_fetches_the_state_again(
    tmp_path: Path,
) -> None:
    # A download that misses two steps, where one is kept, is fetched again; once one misses
    # only one the joiner catches up and enters.
    one = run(tmp_path, "30,join,s1x,1,Ohio\n", 1)
    assert one.refetches >= 1 and one.catch_ups >= 1 and one.series[-1][3] == 7
