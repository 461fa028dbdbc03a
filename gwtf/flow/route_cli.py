"""`gwtf route TOPOLOGY.json [--method local|relax] [--oracle] [--seed N] [--json]`.

`local` (the default, docs/design.md 2.12) simulates the gossip of every node's record until
every view is complete and solves once, as each node would, on the compact records: it never
builds the topology's arcs, which is what lets it load 10,000 nodes. `relax` and `--oracle` work
on the full Topology.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from gwtf.flow.solution import FlowResult
from gwtf.flow.topology import TopologyError, load_members, load_topology

__all__ = ["run_route"]


def _local(path: str, seed: int) -> FlowResult:
    from gwtf.flow.gossip import disseminate
    from gwtf.flow.localsolve import evaluate, solve_members

    members = load_members(path)
    n = len(members.nodes)
    spread = disseminate(n, [1 << i for i in range(n)], random.Random(seed))
    solved = solve_members(members)
    return evaluate(members, solved.flows, spread.messages, spread.rounds)


def run_route(args: argparse.Namespace) -> int:
    method = getattr(args, "method", "local")
    try:
        if args.oracle:
            from gwtf.flow.oracle import solve_oracle

            result = solve_oracle(load_topology(args.topology))
        elif method == "local":
            result = _local(args.topology, args.seed)
        else:
            from gwtf.flow.relax.bus import NotConverged, solve_decentralized

            topology = load_topology(args.topology)
            try:
                result, _ = solve_decentralized(topology, seed=args.seed)
            except NotConverged as exc:
                print(f"gwtf route: the decentralized solver did not converge ({exc}); "
                      "try --oracle", file=sys.stderr)
                return 1
    except TopologyError as exc:
        print(f"gwtf route: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    print(f"flow value     {result.flow_value:.6f} microbatches/s")
    print(f"total cost     {result.total_cost:.6f}")
    print(f"max path cost  {result.max_path_cost:.6f} s")
    # Both methods deliver a message 1 to 3 rounds after it is sent: 2 rounds on average.
    print(f"messages       {result.messages}   rounds {result.rounds}   "
          f"message delays {result.rounds / 2:g}")
    for arc in result.to_json()["arcs"]:
        print(f"  {arc['src']:>12} -> {arc['dst']:<12} {arc['flow']:.6f}")
    return 0
