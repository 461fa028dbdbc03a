"""The `gwtf` command: parses arguments, imports the package it needs lazily, and calls it.

Heavy imports (torch, grpc) happen inside each handler, so `gwtf --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from gwtf import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line that says where to look, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _route(args: argparse.Namespace) -> int:
    try:
        from gwtf.flow.route_cli import run_route
    except ModuleNotFoundError as missing:
        if missing.name not in ("gwtf.flow", "gwtf.flow.route_cli"):
            raise
        print(
            "gwtf route: not available in this installation (no gwtf.flow.route_cli)",
            file=sys.stderr,
        )
        return EXIT_USAGE

    return run_route(args)


def _reference(args: argparse.Namespace) -> int:
    try:
        from gwtf.train.reference_cli import run_reference
    except ModuleNotFoundError as missing:
        if missing.name not in ("gwtf.train", "gwtf.train.reference_cli", "torch"):
            raise
        print(
            f"gwtf reference: not available in this installation (no {missing.name})",
            file=sys.stderr,
        )
        return EXIT_USAGE

    return run_reference(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _simulate(args: argparse.Namespace) -> int:
    try:
        from gwtf.sim.cli import run_simulate
    except ModuleNotFoundError as missing:
        if missing.name not in ("gwtf.sim", "gwtf.sim.cli"):
            raise
        print("gwtf simulate: not available in this installation (no gwtf.sim)", file=sys.stderr)
        return EXIT_USAGE

    return run_simulate(args)


def _demo(args: argparse.Namespace) -> int:
    print(
        "gwtf demo: the demo is not available yet in this version; "
        "`gwtf route TOPOLOGY` is (see `gwtf route --help`)."
    )
    return 0


def _not_yet(command: str) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        print(f"gwtf {command}: not available yet in this version", file=sys.stderr)
        return EXIT_USAGE

    return handler


_NOT_YET = {
    "node": "run one gwtf node (one pipeline stage) as a gRPC server",
    "submit": "submit a training job to a running gwtf network",
    "status": "show the state of a running gwtf network and its jobs",
    "launch": "launch several gwtf nodes on this machine",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gwtf",
        description="Flow-based, churn-tolerant routing for decentralized pipeline training.",
    )
    parser.add_argument("--version", action="version", version=f"gwtf {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    route = commands.add_parser(
        "route",
        help="route microbatches through a topology with the decentralized min-cost max-flow",
        description="Route microbatches through the pipeline topology in TOPOLOGY.",
    )
    route.add_argument("topology", metavar="TOPOLOGY", help="the topology file to route on")
    route.add_argument(
        "--oracle", action="store_true", help="also solve centrally and compare with the oracle"
    )
    route.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed for all randomness (default: 0)"
    )
    route.add_argument("--json", action="store_true", help="print the result as JSON")
    route.set_defaults(handler=_route)

    reference = commands.add_parser(
        "reference",
        help="train a job in one process with no pipeline: the yardstick for the swarm",
        description="Train JOB in this process, with the swarm's seeds, microbatches and "
        "optimizer, and print the loss per iteration and the parameter checksum.",
    )
    reference.add_argument(
        "--job",
        required=True,
        metavar="JOB",
        help="a TOML job file, or a preset: tiny-gpt, tiny-llama",
    )
    reference.add_argument(
        "--iterations",
        type=_positive_int,
        metavar="N",
        help="train N iterations instead of the job's (a different job id)",
    )
    reference.add_argument(
        "--data",
        metavar="PATH",
        help="train on this text file (default: the job's data, else the Python stdlib sources)",
    )
    reference.add_argument(
        "--threads",
        type=_positive_int,
        metavar="N",
        help="torch CPU threads; use the swarm nodes' count to compare bit for bit "
        "(default: torch's)",
    )
    reference.add_argument("--json", action="store_true", help="print the result as JSON")
    reference.set_defaults(handler=_reference)


    simulate = commands.add_parser(
        "simulate",
        help="replay churn on a modelled swarm and compare routing policies",
        description="Run the scenario in SCENARIO (TOML) in the discrete-event simulator, once "
        "per policy, and print or write what each achieved.",
    )
    simulate.add_argument("scenario", metavar="SCENARIO", help="the scenario file (TOML)")
    simulate.add_argument(
        "--policy",
        metavar="P[,P...]",
        help="policies to run: gwtf, swarm, swarm-rebalance, dtfm, oracle "
        "(default: the scenario's list)",
    )
    simulate.add_argument(
        "--seed", type=int, default=None, metavar="N",
        help="seed for all randomness (default: the scenario's)",
    )
    simulate.add_argument(
        "--out", metavar="DIR",
        help="write summary.json, timeseries.csv, iterations.csv and PNG plots into DIR",
    )
    simulate.add_argument("--json", action="store_true", help="print the summary as JSON")
    simulate.set_defaults(handler=_simulate)

    for name, summary in _NOT_YET.items():
        sub = commands.add_parser(
            name, help=f"{summary} (not available yet)", description=f"{summary.capitalize()}."
        )
        sub.set_defaults(handler=_not_yet(name))

    demo = commands.add_parser(
        "demo", help="run the demo (not available yet)", description="Run the gwtf demo."
    )
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exit_:  # --help, --version and usage errors end here
            code = exit_.code
            return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
        handler: Handler = args.handler
        return handler(args)
    except KeyboardInterrupt:
        print("gwtf: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
