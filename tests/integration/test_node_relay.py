"""Relays on loopback (docs/design.md 3.11): a node told to be relayed (`--relay always`, as a
node behind NAT finds itself) is reached through a member for everything, trains a job equal to
the reference, and attaches to another member when its relay is SIGKILLed; a relay refuses a
stranger and attachments over its limit, and goes on. tests/integration/test_node_nat.py runs the
same behind a real NAT, where the node finds out by itself."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import grpc
import pytest
from cluster import REPO, LocalSwarm, wait_for

from gwtf.client import GwtfClient, format_status
from gwtf.node.rpc.transport import ChannelPool
from gwtf.train import PRESETS, train_reference
from gwtf.v1 import node_pb2
from tests.integration.pki import make_ca, make_member

pytestmark = pytest.mark.integration

WAIT_S = 180.0


def status(address: str, *flags: str) -> dict[str, Any] | None:
    """`gwtf status --json` at `address` with `flags`, None if it is refused."""
    done = subprocess.run([sys.executable, "-m", "gwtf", "status", "--to", address, "--json",
                           *flags], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    return json.loads(done.stdout) if done.returncode == 0 else None


def _members(swarm: LocalSwarm, asked: str) -> dict[str, dict[str, object]]:
    view = swarm.status(asked, swarm=False)
    return {} if view is None else {m["id"]: m for m in view["members"]}


def _relayed_by(swarm: LocalSwarm, asked: str, node: str) -> str:
    member = _members(swarm, asked).get(node)
    return str(member["relay"]) if member and member["alive"] else ""


def test_a_relayed_node_trains_equal_to_the_reference_and_survives_its_relay(
    tmp_path, one_thread: None
) -> None:
    import dataclasses

    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=4, microbatches=4)
    # Compute padded to 0.05 s a microbatch (as a GPU's host waits): the nodes leave the other
    # core to the test beside this one, whose paces a busy swarm here would move.
    with LocalSwarm(tmp_path, failure_timeout_s=3.0, train=True,
                    extra=("--emulate-compute",)) as swarm:  # fmt: skip
        swarm.start([("a0", 0, 0.05), ("a1", 0, 0.05)], num_stages=2)
        swarm.join("z0", 1, 0.05, "--relay", "always")
        swarm.wait_formed()
        relay = wait_for(lambda: _relayed_by(swarm, "a0", "z0"), 20, "z0's relay")
        assert relay in ("a0", "a1")
        # Peers dial a port of the relay's, which carries z0's calls and counts their bytes.
        assert _members(swarm, "a1")["z0"]["address"] != _members(swarm, relay)[relay]["address"]

        def carried() -> int:
            view = swarm.status(relay, swarm=False)
            return int(view["nodes"][0]["relayed_bytes"].get("z0", 0)) if view else 0

        wait_for(carried, 20, "bytes relayed for z0")
        view = swarm.status(relay)
        assert view is not None and f"{relay} for z0" in format_status(view)
        client = GwtfClient(swarm.procs["a0" if relay == "a1" else "a1"].address)
        result = client.wait(client.submit(job), timeout_s=WAIT_S)
        assert result.state == "completed", result.error
        ref = train_reference(job)
        assert result.loss == ref.loss and result.param_checksum == ref.param_checksum
        # The relay dies: z0 attaches to the other member and is reached there.
        swarm.kill(relay)
        other = "a1" if relay == "a0" else "a0"
        wait_for(lambda: _relayed_by(swarm, other, "z0") == other, 30, "z0 relayed by " + other)
        wait_for(lambda: not _members(swarm, other)[relay]["alive"], 30, f"{relay} declared dead")
        assert swarm.procs["z0"].alive and _members(swarm, other)["z0"]["alive"]
        again = GwtfClient(swarm.procs[other].address)
        second = dataclasses.replace(job, seed=job.seed + 1, iterations=2)
        done = again.wait(again.submit(second), timeout_s=WAIT_S)
        assert done.state == "completed", done.error
        assert done.param_checksum == train_reference(second).param_checksum


def test_a_relay_refuses_strangers_and_more_than_its_limit(tmp_path) -> None:
    import asyncio

    with LocalSwarm(tmp_path) as swarm:
        swarm.start([("a0", 0, 0.01)], num_stages=2)
        swarm.join("b0", 1, 0.01, "--relay-peers", "0")
        swarm.wait_formed()

        async def attach(address: str, node_id: str, epoch: int) -> grpc.StatusCode:
            pool = ChannelPool("test", "", None)
            try:
                call = pool.stubs(address).relay.Attach(
                    node_pb2.AttachRequest(node_id=node_id, epoch=epoch), timeout=5)
                async for _ in call:
                    return grpc.StatusCode.OK
                return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as err:
                assert "\n" not in (err.details() or "")
                return err.code()
            finally:
                await pool.close_all()

        a0, b0 = swarm.procs["a0"].address, swarm.procs["b0"].address
        assert asyncio.run(attach(a0, "nobody", 1)) == grpc.StatusCode.FAILED_PRECONDITION
        epoch = int(_members(swarm, "b0")["a0"]["epoch"])  # type: ignore[call-overload]
        assert asyncio.run(attach(b0, "a0", epoch)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Both go on serving.
        swarm.wait_formed()
        assert all(p.alive for p in swarm.procs.values())


def test_a_relayed_node_in_a_tls_and_token_swarm(tmp_path) -> None:
    """TLS and the token are end to end: the relay carries the two ends' own TLS connection, so
    a member reaches the relayed node with the swarm's certificates and token through the relay,
    and a client without them is refused as it would be at the node itself."""
    ours = make_ca(tmp_path, "ours")
    token = tmp_path / "token"
    token.write_text("5f2b7c0d9e8a4b1c3d6e7f8091a2b3c4\n")

    def tls(name: str) -> tuple[str, ...]:
        cert, key, ca_cert = make_member(tmp_path, name, ours)
        return ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca_cert),
                "--token-file", str(token))  # fmt: skip

    member = tls("member")
    with LocalSwarm(tmp_path, extra=member) as swarm:
        swarm.start([("t0", 0, 0.05)], num_stages=2)
        swarm.join("t1", 1, 0.05, "--relay", "always")
        wait_for(lambda: (status(swarm.procs["t0"].address, *member) or {}).get("converged"),
                 60, "the TLS swarm to converge")  # fmt: skip
        def relayed_at() -> str:
            view = status(swarm.procs["t0"].address, *member) or {"members": []}
            t1 = {m["id"]: m for m in view["members"]}.get("t1", {})
            return str(t1["address"]) if t1.get("relay") == "t0" else ""

        relayed = wait_for(relayed_at, 30, "t1 relayed")
        # Through the relay, with the swarm's credentials: t1 itself answers.
        view = status(str(relayed), *member)
        assert view is not None and view["node"] == "t1"
        # Without the token, or without TLS: refused, the relay carrying nothing it could use.
        no_token = tuple(a for a in member if a not in ("--token-file", str(token)))
        assert status(str(relayed), *no_token) is None
        assert status(str(relayed)) is None
