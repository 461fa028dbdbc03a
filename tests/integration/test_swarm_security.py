"""A swarm that requires a token, or mutual TLS: real node processes on loopback. Members join
and route; a stranger node or client is refused in one line; nothing it sent is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO, LocalSwarm, wait_for

from tests.integration.pki import make_ca, make_member

pytestmark = pytest.mark.integration

TIMEOUT_S = 60
TOKEN = "5f2b7c0d9e8a4b1c3d6e7f8091a2b3c4"


def gwtf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gwtf", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)  # fmt: skip


def status(address: str, *flags: str) -> dict | None:
    result = gwtf("status", "--to", address, "--json", *flags)
    return json.loads(result.stdout) if result.returncode == 0 else None


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def converged(address: str, members: set[str], *flags: str) -> dict | None:
    view = status(address, *flags)
    if view is None or not view["converged"]:
        return None
    alive = {m["id"] for m in view["members"] if m["alive"]}
    return view if alive == members and view["flow_value"] > 0 else None


def test_a_token_swarm_admits_members_and_refuses_strangers(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("f" * 32 + "\n")
    flags = ("--token-file", str(token))
    with LocalSwarm(tmp_path, extra=flags) as swarm:
        swarm.start([("a0", 0, 0.05), ("a1", 1, 0.05), ("b1", 1, 0.08)], num_stages=2)
        address = swarm.procs["a0"].address
        view = wait_for(lambda: converged(address, {"a0", "a1", "b1"}, *flags), TIMEOUT_S,
                        "the token swarm to converge")  # fmt: skip
        assert len(view["arcs"]) == 2
        # A stranger node, without the token or with another one, cannot join.
        for extra in ((), ("--token-file", str(wrong))):
            joiner = gwtf("node", "--stage", "1", "--id", "intruder", "--bootstrap", address,
                          *extra)  # fmt: skip
            one_line(joiner, "refused this node", "token")
        # Clients too: one line, and the swarm never saw the intruder.
        one_line(gwtf("status", "--to", address), "refused the call", "missing token")
        one_line(gwtf("status", "--to", address, "--token-file", str(wrong)), "wrong token")
        view = status(address, *flags)
        assert view is not None
        assert {m["id"] for m in view["members"]} == {"a0", "a1", "b1"}


def test_a_mutual_tls_swarm(tmp_path: Path) -> None:
    ours, theirs = make_ca(tmp_path, "ours"), make_ca(tmp_path, "theirs")

    def tls(name: str, ca: tuple[Path, Path]) -> tuple[str, ...]:
        cert, key, ca_cert = make_member(tmp_path, name, ca)
        return ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca_cert))

    member = tls("member", ours)
    with LocalSwarm(tmp_path, extra=member) as swarm:
        swarm.start([("t0", 0, 0.05), ("t1", 1, 0.05)], num_stages=2)
        address = swarm.procs["t0"].address
        wait_for(lambda: converged(address, {"t0", "t1"}, *member), TIMEOUT_S,
                 "the TLS swarm to converge")  # fmt: skip
        assert status(address, *tls("operator", ours)) is not None
        # A certificate from another CA, or plain TCP: the handshake fails, nothing is served.
        assert status(address, *tls("stranger", theirs)) is None
        one_line(gwtf("status", "--to", address), "cannot reach")


def test_bad_credential_flags_are_one_line(tmp_path: Path) -> None:
    one_line(gwtf("node", "--stage", "0", "--stages", "2", "--token-file", str(tmp_path / "no")),
             "--token-file")  # fmt: skip
    one_line(gwtf("status", "--to", "127.0.0.1:1", "--tls-cert", "x.pem"), "needs all three")
