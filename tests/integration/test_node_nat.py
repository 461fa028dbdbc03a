"""Volunteers behind a NAT join without opening a port (docs/design.md 3.11), on real network
stacks: two public hosts hold stage 0; the only nodes of stage 1 sit on a home LAN behind a
router namespace that masquerades their connections out and lets none in
(`gwtf.local.netns.Hosts(behind_nat=...)`). They find out by themselves that members cannot dial
them (`--relay auto`, the default), attach to a public member and are reached through it; the
swarm trains a job equal to the reference through the SIGKILL of their relay (they attach to the
other public host, nothing is lost), and the death of a NATed node is detected as any other.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from cluster import LocalSwarm, wait_for

from gwtf.client import GwtfClient
from gwtf.local.netns import Hosts, available
from gwtf.train import PRESETS, train_reference


def _why_not() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root"
    return available()


pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]

WAIT_S = 240.0


def _members(swarm: LocalSwarm, asked: str) -> dict[str, dict[str, object]]:
    view = swarm.status(asked, swarm=False)
    return {} if view is None else {m["id"]: m for m in view["members"]}


def test_nodes_behind_nat_are_relayed_train_and_survive_their_relay(
    tmp_path: Path, one_thread: None
) -> None:
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=8, microbatches=8)
    with Hosts(["p0", "p1", "h0", "h1"], tag="gwtfnat", prefix="10.79.0",
               behind_nat=["h0", "h1"]) as hosts, \
            LocalSwarm(tmp_path, failure_timeout_s=3.0, train=True, hosts=hosts,
                       extra=("--emulate-compute",)) as swarm:  # fmt: skip
        # Compute padded to 0.15 s a microbatch: the job lasts long enough to kill in it.
        swarm.start([("p0", 0, 0.15), ("p1", 0, 0.15), ("h0", 1, 0.15), ("h1", 1, 0.15)],
                    num_stages=2)  # fmt: skip
        swarm.wait_formed()

        def relays() -> dict[str, str] | None:
            view = _members(swarm, "p1")
            found = {h: str(view[h]["relay"]) for h in ("h0", "h1") if h in view}
            return found if len(found) == 2 and all(found.values()) else None

        # They joined through p0, asked it to dial back, were told they cannot be (their calls
        # come from the NAT's address), and are reached through a public member: at its port.
        found = wait_for(relays, 30, "the NATed nodes relayed")
        for h in ("h0", "h1"):
            relay = found[h]
            assert relay in ("p0", "p1")
            address = str(_members(swarm, "p1")[h]["address"])
            assert address.startswith(hosts.address(relay) + ":"), (h, address)
            log = swarm.procs[h].log.read_text()
            assert f"its calls come from {hosts.nat_address}" in log, h
        assert not _members(swarm, "p1")["p1"]["relay"]  # public hosts are dialled directly
        client = GwtfClient(swarm.procs["p1"].address)
        job_id = client.submit(job)
        # Their relay dies in the middle of the job: they attach to p1 and the job goes on.
        wait_for(lambda: any("iteration 2/" in p.log.read_text() for p in swarm.live()), 120,
                 "iteration 2 committed")  # fmt: skip
        assert "completed" not in swarm.procs["p0"].log.read_text()
        swarm.kill("p0")
        wait_for(lambda: relays() == {"h0": "p1", "h1": "p1"}, 30, "the NATed nodes relayed again")
        result = client.wait(job_id, timeout_s=WAIT_S)
        assert result.state == "completed", result.error
        ref = train_reference(job)
        assert result.loss == ref.loss and result.param_checksum == ref.param_checksum
        assert result.checksum_mismatches == 0
        # A NATed node dies: the others see it dead, as any member.
        swarm.kill("h1")
        wait_for(lambda: _members(swarm, "p1").get("h1", {}).get("alive") is False, 30,
                 "h1 declared dead")  # fmt: skip
        for proc in swarm.procs.values():
            assert "Traceback" not in proc.log.read_text(), proc.id
