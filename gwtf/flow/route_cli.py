"""`gwtf route TOPOLOGY.json [--oracle] [--seed N] [--json]`: route a static topology."""

from __future__ import annotations

import argparse
import json
import sys

from gwtf.flow.topology import TopologyError, load_topology

__all__ = ["run_route"]


def run_route(args: argparse.Namespace) -> int:
    try:
        topology = load_topology(args.topology)
    except TopologyError as exc:
        print(f"gwtf route: {exc}", file=sys.stderr)
        return 2
    if args.oracle:
        from gwtf.flow.oracle import solve_oracle

        result = solve_oracle(topology)
    else:
        from gwtf.flow.bus import NotConverged, solve_decentralized

        try:
            result, _ = solve_decentralized(topology, seed=args.seed)
        except NotConverged as exc:
            print(f"gwtf route: the decentralized solver did not converge ({exc}); "
                  "try --oracle", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    print(f"flow value     {result.flow_value:.6f} microbatches/s")
    print(f"total cost     {result.total_cost:.6f}")
    print(f"max path cost  {result.max_path_cost:.6f} s")
    print(f"messages       {result.messages}   rounds {result.rounds}")
    for arc in result.to_json()["arcs"]:
        print(f"  {arc['src']:>12} -> {arc['dst']:<12} {arc['flow']:.6f}")
    return 0
