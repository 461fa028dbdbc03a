"""Local routing by measured links on real processes (docs/design.md 2.12, 3.5): the nodes are
told nothing of the WAN they run on, measure it, put what they measured in their records, and
route away from the slow link."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from cluster import LocalSwarm, wait_for

pytestmark = pytest.mark.integration

SETTLE_S = 90.0
SLOW_RTT_MS = 400.0

# Two sites, A and C, 400 ms apart; each stage-0 node has a stage-1 node at its own site. With
# every link taken alike (what routing knows before it measures) the solve's order of ties
# sends nearly all of each stage-0 node's flow across the slow link; measured, across none
# but the balance's 2% headroom.
NODES = [
    ("s0a", 0, 0.05, "A"),
    ("s0c", 0, 0.05, "C"),
    ("s1a", 1, 0.03, "A"),
    ("s1c", 1, 0.03, "C"),
    ("s2", 2, 0.02, "A"),
]
CROSS = {"s0a": "s1c", "s0c": "s1a"}
"""Each stage-0 node's next hop across the slow link."""

_SOLVED = re.compile(r"routes: solved .* next hops (\{.*\})$")


def _hops(log: str) -> list[dict[str, int]]:
    """The next hops of every solve that routed somewhere, in order."""
    return [ast.literal_eval(m.group(1)) for m in map(_SOLVED.search, log.splitlines()) if m]


def _cross_share(view: dict[str, Any], node: str) -> float | None:
    flows = {a["dst"]: a["flow_units"] for a in view["arcs"] if a["src"] == node}
    total = sum(flows.values())
    return flows.get(CROSS[node], 0) / total if total else None


def test_nodes_route_away_from_a_slow_link_they_measured(tmp_path: Path) -> None:
    matrix = tmp_path / "wan.csv"
    matrix.write_text(f"src,dst,rtt_ms,bandwidth_gbps\nA,C,{SLOW_RTT_MS},10\n")
    wan = ("--link-matrix", str(matrix), "--routing-links", "measured")
    with LocalSwarm(tmp_path, heartbeat_s=0.5, failure_timeout_s=5.0) as swarm:
        first, *rest = NODES
        proc = swarm.spawn(first[0], first[1], first[2], "--stages", "3",
                           "--location", first[3], *wan)  # fmt: skip
        swarm.wait_listening(proc)
        swarm.bootstrap = proc.address
        swarm.wait_listening(*(swarm.spawn(i, s, c, "--location", loc, *wan)
                               for i, s, c, loc in rest))  # fmt: skip

        def away() -> dict[str, Any] | None:
            view = swarm.status()
            if view is None or {n["id"] for n in view["nodes"]} != {n[0] for n in NODES}:
                return None
            shares = [_cross_share(view, node) for node in CROSS]
            if any(s is None or s > 0.05 for s in shares):
                return None
            return view

        view = wait_for(away, SETTLE_S, "the stage-0 nodes to route away from the slow link")
        # The records say why: a report of the A-C link near the emulated RTT.
        reports = [(m["id"], r) for m in view["members"] if m["alive"] for r in m["links"]]
        assert reports, view["members"]
        for member, r in reports:
            assert r["site"] in ("A", "C"), (member, r)
            assert 0.7 * SLOW_RTT_MS <= r["rtt_ms"] <= 1.5 * SLOW_RTT_MS, (member, r)
        for node, cross in CROSS.items():
            hops = _hops(swarm.procs[node].log.read_text())
            # Before the measurement reached it, the node routed nearly all across the link.
            assert any(h.get(cross, 0) > 0.9 * sum(h.values()) for h in hops), (node, hops)
            assert hops[-1].get(cross, 0) <= 0.05 * sum(hops[-1].values()), (node, hops)
