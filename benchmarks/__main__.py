"""`python -m benchmarks [NAME ...] [--quick]`: run benchmarks and write benchmarks/RESULTS.md.

Every figure is a ratio against a baseline measured in the same run (the oracle, a reference
run), plus the absolute numbers it comes from. With no NAME, every benchmark runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = {
    "churn": "benchmarks.churn_real",
    "fidelity": "benchmarks.fidelity",
    "flow": "benchmarks.flow",
    "flow-relax": "benchmarks.flow_relax",
    "sim": "benchmarks.sim",
    "replay": "benchmarks.replay",
    "replaynode": "benchmarks.replay_node",
    "simspeed": "benchmarks.simspeed",
    "simbase": "benchmarks.simbase",
    "simtargets": "benchmarks.simtargets",
    "keepers": "benchmarks.keepers",
    "checkpoints": "benchmarks.client_checkpoints",
    "solvespeed": "benchmarks.solvespeed",
    "balance": "benchmarks.balance",
    "node": "benchmarks.node_control",
    "noderoute": "benchmarks.node_route",
    "gossip": "benchmarks.gossip_scale",
    "robust": "benchmarks.robust",
    "tensor": "benchmarks.tensor",
    "train": "benchmarks.train_cluster",
    "reconverge": "benchmarks.reconverge",
    "security": "benchmarks.security",
    "load": "benchmarks.load",
    "device": "benchmarks.device",
    "moves": "benchmarks.moves",
    "snapshots": "benchmarks.snapshots_node",
    "stragglers": "benchmarks.stragglers",
    "versus": "benchmarks.versus",
    "compression": "benchmarks.compression",
    "simcompress": "benchmarks.simcompress",
    "compress-real": "benchmarks.compress_real",
    "nat": "benchmarks.natswarm",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="small cases only (a smoke run)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    for name in args.names or list(BENCHMARKS):
        module = importlib.import_module(BENCHMARKS[name])
        print(module.run(quick=args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
