"""`python -m benchmarks nat`: a swarm with half its machines behind NAT against the same swarm
with every machine reachable, real processes on real network stacks (docs/design.md 3.11).

    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks nat           # 2 pairs
    flock /tmp/gwtf-heavy.lock .venv/bin/python -m benchmarks nat --quick   # 1 pair

Six `gwtf node` processes, two per stage of three, each in a network namespace of its own
(`gwtf.local.netns.Hosts`), every uplink shaped by `tc` tbf to 20 Mbit/s (a cable upload tier
of simulations/versus/nodes.csv) and declared (`--uplink-mbps`). In the NAT runs one machine of
each stage sits on a home LAN behind a router namespace that masquerades its connections and
lets none in (`behind_nat`): it finds that members cannot dial it and is reached through a
relay (`--relay auto`, the default). Compute is emulated (0.2 s a microbatch), tiny-gpt with
microbatches of 16 sequences (256 KiB float32 activations), `compression = "off"`, so that the
links bind. Runs alternate, each on a fresh swarm: microbatches per second over the iterations
after the first two, the flow's prediction without relays (the maximum flow of the nodes'
compute and declared uplinks) and the routing's own flow value (with each relayed member's
share of its relay's uplink, docs/design.md 3.11), who relayed whom and the bytes they carried.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.report import machine, write_section
from benchmarks.swarmrun import alternate, log, start_in_hosts, submit_when_formed
from gwtf.flow.compression import boundary_sizes, uplink_capacity
from gwtf.flow.placement import Swarm
from gwtf.flow.topology import DEFAULT_INTRA, NodeSpec
from gwtf.local.netns import Hosts, available

# (id, stage, uplink Mbit/s); the second of each stage sits behind the NAT in the NAT runs.
NODES = [("h0", 0, 20), ("h1", 0, 20), ("a0", 1, 20), ("a1", 1, 20), ("z0", 2, 20), ("z1", 2, 20)]
BEHIND_NAT = ("h1", "a1", "z1")
COMPUTE_S = 0.2
ITERATIONS = 7
MICROBATCHES = 24
MICROBATCH_SIZE = 16
PAIRS = 2
SKIP = 2


def predicted(activation_bytes: int) -> float:
    """The swarm's maximum flow (microbatches/s): each node the least of its compute and what
    its declared uplink carries."""
    sizes = boundary_sizes(activation_bytes, ("none", "none"))
    nodes = tuple(
        NodeSpec(node, stage, COMPUTE_S, "home",
                 min(1 / COMPUTE_S, uplink_capacity(mbps / 1000, stage, sizes)))
        for node, stage, mbps in NODES
    )  # fmt: skip
    return Swarm(3, activation_bytes, nodes, {}, DEFAULT_INTRA).max_flow()


def _relays(address: str) -> tuple[dict[str, str], dict[str, int], float]:
    """Who relays whom, the bytes each relay carried for each, and the routing's flow value
    (microbatches/s, from the members' records), as `address` sees them."""
    from gwtf.client import fetch_status, status_json

    view = status_json(fetch_status(address, timeout_s=10.0, swarm=True))
    relays = {m["id"]: m["relay"] for m in view["members"] if m["alive"] and m["relay"]}
    carried = {f"{n['id']}->{peer}": int(b) for n in view["nodes"]
               for peer, b in n.get("relayed_bytes", {}).items()}  # fmt: skip
    return relays, carried, float(view["flow_value"])


def one_run(nat: bool, log_dir: Path) -> dict[str, Any]:
    from gwtf.client import GwtfClient
    from gwtf.train import PRESETS
    from gwtf.train.costs import activation_bytes
    from gwtf.train.job import CompressionConfig

    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=ITERATIONS,
                              microbatches=MICROBATCHES, microbatch_size=MICROBATCH_SIZE,
                              compression=CompressionConfig(allow=()))  # fmt: skip
    names = [n for n, _, _ in NODES]
    behind = BEHIND_NAT if nat else ()
    with Hosts(names, {n: mbps for n, _, mbps in NODES}, tag="gwtfbn", prefix="10.81.0",
               behind_nat=behind) as hosts:  # fmt: skip
        addresses = start_in_hosts(hosts, NODES, COMPUTE_S, 3, activation_bytes(job), log_dir)
        start = time.monotonic()
        job_id = submit_when_formed(addresses["h0"], job)
        result = GwtfClient(addresses["h0"], timeout_s=60).wait(job_id, timeout_s=900)
        wall = time.monotonic() - start
        relays, carried, routed = _relays(addresses["h0"])
    if result.state != "completed":
        raise RuntimeError(f"the job {result.state}: {result.error}")
    rate = MICROBATCHES / statistics.mean(result.iteration_s[SKIP:])
    flow = predicted(activation_bytes(job))
    log(f"{'half behind NAT' if nat else 'all reachable'}: {rate:.2f} mb/s (flow {flow:.2f}, "
        f"routing's {routed:.2f}), relays {relays}, {wall:.0f} s")
    return {"nat": nat, "rate": rate, "flow": flow, "routed": routed, "relays": relays,
            "carried": carried, "wall_s": wall, "checksum": result.param_checksum}  # fmt: skip


def run(quick: bool = False, pairs: int = PAIRS) -> str:
    why = available()
    if why:
        return f"nat: skipped, {why}"
    runs = alternate("nat", 1 if quick else pairs, one_run)
    rows, ratios = [], []
    for pair in range(len(runs) // 2):
        open_, natted = runs[2 * pair], runs[2 * pair + 1]
        ratios.append(natted["rate"] / open_["rate"])
        same = "yes" if natted["checksum"] == open_["checksum"] else "NO"
        for r in (open_, natted):
            relayed = ", ".join(f"{k} by {v}" for k, v in sorted(r["relays"].items())) or "-"
            mib = sum(r["carried"].values()) / 2**20
            rows.append(
                f"| {pair} | {'half behind NAT' if r['nat'] else 'all reachable'} "
                f"| {r['rate']:.2f} | {r['flow']:.2f} | {r['routed']:.2f} "
                f"| {r['rate'] / r['routed']:.2f} "
                f"| {relayed} | {mib:.0f} | {same} | {r['wall_s']:.0f} |"
            )
    body = "\n".join([
        "## nat: half the swarm behind NAT, real processes and network stacks",
        "",
        f"`python -m benchmarks nat`, {time.strftime('%Y-%m-%d')}, {machine()}. Six nodes (two "
        "a stage), each in its own network namespace, uplinks shaped by tc tbf to 20 Mbit/s, "
        f"compute emulated at {COMPUTE_S} s a microbatch, tiny-gpt ({MICROBATCHES} microbatches "
        f"of 256 KiB float32 activations an iteration, {ITERATIONS} iterations, compression "
        f"off; the rate leaves out the first {SKIP}). NAT runs: one machine of each stage "
        "behind a masquerading router, reached through a relay it chose. *Flow without "
        "relays*: the maximum flow of the nodes' compute and declared uplinks; *routing's "
        "flow*: the flow value the swarm's routing holds after the job (its members' records, "
        "a relayed member's capacity bound by its share of its relay's uplink). *MiB "
        "relayed*: what the relays carried, both ways (their status). *Same model*: the two "
        "runs of a pair end with the same checksum.",
        "",
        "| pair | swarm | mb/s | flow without relays | routing's flow | measured / routing's "
        "| relayed | MiB relayed | same model | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Half behind NAT over all reachable: {', '.join(f'{x:.2f}' for x in ratios)} "
        f"(mean {statistics.mean(ratios):.2f}).",
    ])  # fmt: skip
    write_section("nat", body)
    return body


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
