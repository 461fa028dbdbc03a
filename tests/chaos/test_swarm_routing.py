"""SWARM's routing in real node processes (`gwtf node --routing swarm`, docs/design.md 2.14).

A swarm created with `--routing swarm` has every sender choose its next hops by its own
throughput estimates (gwtf.job.swarmroute) and recovers with gwtf's rules. A stage-1 node armed
to SIGKILL itself in a forward joins; SWARM's chooser tries a newcomer soon (it starts at the
least load), so its fault fires without waiting for any flow. The job still ends equal to the
one-process reference bit for bit, every hop was chosen by SWARM's chooser, and every stage-1
node got work.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from cluster import LocalSwarm
from test_recovery import assert_equals_reference, died, job_for, train

pytestmark = pytest.mark.chaos

NODES = [("h0", 0, 0.05), ("a0", 1, 0.04), ("a1", 1, 0.08), ("z0", 2, 0.05)]
_HOPS = re.compile(r"\); next hops (.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    logs = tmp_path_factory.mktemp("swarm-routing")
    # Compute emulated (padded by sleep to --compute-s): the nodes mostly wait, as a GPU's host
    # does, rather than take a core from the chaos test beside this one. Unpadded, they made
    # test_stragglers' shares leave their bands when the two ran together (-n 2).
    with LocalSwarm(logs, heartbeat_s=0.25, failure_timeout_s=3.0, train=True,
                    extra=("--emulate-compute",)) as s:
        s.start(NODES, 3, "--activation-bytes", "131072", "--routing", "swarm")
        s.wait_formed()
        yield s


def test_swarm_routing_trains_through_a_sigkill_equal_to_the_reference(
    swarm: LocalSwarm,
) -> None:
    victim = swarm.join("a2", 1, 0.05, "--fault", "crash-in:forward:iteration=1")
    swarm.wait_formed()
    view = swarm.status("h0")
    assert view is not None and all(n["routing"] == "swarm" for n in view["nodes"])
    job = job_for("swarm-routing", iterations=3)
    result = train(swarm, job)
    died(victim)
    assert_equals_reference(result, job)
    assert result.crashes == 1 and result.rerouted_microbatches >= 1
    # Each sender logs where its next hops came from when its part of the job ends.
    for node_id in ("h0", "a0", "a1"):
        hops = _HOPS.findall(swarm.procs[node_id].log.read_text())
        assert hops, node_id
        assert all(re.fullmatch(r"\d+ from swarm", h) for h in hops), (node_id, hops)
    worked = {p.id for p in swarm.live() if p.stage == 1
              and re.search(r"stage 1: [1-9]\d* forwards", p.log.read_text())}
    assert worked == {"a0", "a1"}, worked
