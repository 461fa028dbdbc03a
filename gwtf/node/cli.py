"""`gwtf node`: run one node until SIGTERM or Ctrl-C, then leave the swarm gracefully.

Output: one line on stdout once the node is in its swarm,
`gwtf node ID listening on HOST:PORT (stage K of S, swarm SWARM)` (K: the stage it was given, or
the one it chose with `--stage auto`, docs/design.md 2.11); logs on stderr, one line per
event. Errors a user can cause end in one line on stderr and a non-zero exit: 2 for wrong input
(flags, matrix file, a stage outside the swarm), 1 when the world is not as expected (port in
use, bootstrap unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from gwtf.flow.topology import LinkSpec, TopologyError, load_link_matrix

if TYPE_CHECKING:
    from gwtf.node.config import NodeConfig
    from gwtf.node.node import Node, NodeSettings

__all__ = ["load_matrix", "run_node"]

EXIT_USAGE = 2
def quiet_grpc_core() -> None:
    """gRPC's C core logs errors (a failed bind, a refused connection) on stderr by itself;
    the node says what matters in one line of its own instead."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def load_matrix(
    path: str | None, location: str | None
) -> tuple[Mapping[frozenset[str], LinkSpec] | None, str]:
    """The emulated WAN's matrix and this node's location; TopologyError (one line) if wrong."""
    if path is None and location is None:
        return None, ""
    if path is None:
        raise TopologyError("--location needs --link-matrix FILE (the matrix it refers to)")
    links = load_link_matrix(path)
    names = sorted({name for pair in links for name in pair})
    if location is None:
        raise TopologyError(
            f"--link-matrix needs --location NAME, one of: {', '.join(names) or '(none)'}"
        )
    if location not in names:
        raise TopologyError(
            f"location {location!r} is not in the link matrix {path!r}; "
            f"choose one of: {', '.join(names)}"
        )
    return links, location


class ConfigError(ValueError):
    """A node config file that cannot be used (one sentence)."""


def with_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`gwtf node`'s arguments with the settings of its `--config FILE` (TOML) put before them,
    as the flags they name: the command line, later, wins. The file holds flag names (with - or
    _) and values: a string or number for a flag's value, true for a switch, a list for a flag
    that takes several (bootstrap); a [node] table may hold them instead of the top level."""
    import tomllib

    path = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    if path is None:
        return argv
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as err:
        raise ConfigError(f"cannot read the config file {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"the config file {path} is not valid TOML: {err}") from None
    if isinstance(table.get("node"), dict):
        table = table["node"]
    flags = {
        option[2:]: action
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--config")
    }
    tokens: list[str] = []
    for key, value in table.items():
        name = key.replace("_", "-")
        action = flags.get(name)
        if action is None:
            raise ConfigError(f"{path}: {key!r} is not a setting of gwtf node (the settings are "
                              "its flags, e.g. stage, port, bootstrap, metrics-port)")
        flag = f"--{name}"
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} is a switch: true or false, not {value!r}")
            tokens += [flag] if value else []
        elif isinstance(value, list) and action.nargs in ("+", "*"):
            tokens += [flag, *map(str, value)]
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            tokens += [flag, str(value)]
        else:
            raise ConfigError(f"{path}: {key} takes one value, not {value!r}")
    return tokens + argv


def run_node(args: argparse.Namespace) -> int:
    from gwtf.local.launch import die_with_launcher

    die_with_launcher()
    quiet_grpc_core()

    from gwtf.node.config import NodeConfig
    from gwtf.node.control.peers import read_schedule
    from gwtf.node.faults import FAULT_ENV, FaultError, parse_fault
    from gwtf.node.node import NodeSettings
    from gwtf.node.observe import configure_logging
    from gwtf.node.rpc.codec import InvalidMessage, check_name
    from gwtf.node.rpc.ratelimit import RateLimit
    from gwtf.node.rpc.relay import RelayLimits
    from gwtf.node.rpc.security import SecurityError, credentials_from_args
    from gwtf.node.rpc.wan import ScheduleError

    if args.stages is None and not args.bootstrap:
        # Before the node binds anything: without a stage, `gwtf node` alone is the likeliest
        # way to get here, and its answer is a usage error like any other.
        print("gwtf node: error: the first node of a swarm needs --stages S (or give "
              "--bootstrap HOST:PORT to join a running swarm)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.id is not None:
            check_name("--id", args.id)
        links, location = load_matrix(args.link_matrix, args.location)
        if args.wan_schedule is not None:
            if links is None:
                raise TopologyError("--wan-schedule needs --link-matrix FILE and --location "
                                    "(it partitions the emulated WAN)")
            read_schedule(args.wan_schedule, {n for pair in links for n in pair})
        spec = args.fault if args.fault is not None else os.environ.get(FAULT_ENV, "")
        fault = parse_fault(spec) if spec else None
        credentials = credentials_from_args(args)
    except (TopologyError, InvalidMessage, FaultError, SecurityError, ScheduleError) as err:
        print(f"gwtf node: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = NodeConfig(
            heartbeat_s=args.heartbeat_s,
            failure_timeout_s=args.failure_timeout_s,
            rpc_timeout_s=args.rpc_timeout_s,
            bootstrap_wait_s=args.bootstrap_wait_s,
            probe_s=args.probe_s,
            route_quiet_s=args.route_quiet_s,
            explore_peers=args.explore_peers,
            explore_s=args.explore_s,
            report_bandwidth=args.report_bandwidth,
        )
    except ValueError as err:
        print(f"gwtf node: {err}", file=sys.stderr)
        return EXIT_USAGE
    settings = NodeSettings(
        stage=args.stage,
        host=args.host,
        advertise=args.advertise,
        port=args.port,
        node_id=args.id,
        bootstrap=tuple(args.bootstrap or ()),
        location=location,
        links=links,
        routing_links=args.routing_links,
        wan_schedule=args.wan_schedule,
        compute_s=args.compute_s,
        job=args.job,
        num_stages=args.stages,
        activation_bytes=args.activation_bytes,
        max_arc_cost_s=args.max_arc_cost_s,
        min_arc_cost_s=args.min_arc_cost_s,
        quiet_s=args.quiet_s,
        routing=args.routing,
        seed=args.seed,
        credentials=credentials,
        metrics_port=args.metrics_port,
        memory_slots=args.memory_slots,
        device=args.device,
        precision=args.precision,
        threads=args.threads,
        emulate_compute=args.emulate_compute,
        pace=args.pace,
        train=not args.no_train,
        fault=fault,
        rate_limit=RateLimit(args.rate_limit),
        moves=not args.no_moves,
        uplink_gbps=(args.uplink_mbps or 0.0) / 1000,
        relay=args.relay,
        relay_limits=RelayLimits(args.relay_peers, args.relay_mbps),
    )
    configure_logging(args.log_level, json_lines=args.log_json)
    return run_loop(_serve(settings, config))


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run `main` on uvloop where it is installed (Linux, macOS), else on plain asyncio
    (Windows has no uvloop): the node works the same on either, uvloop only serves it faster."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _serve(settings: NodeSettings, config: NodeConfig) -> int:
    from gwtf.node.node import Node, NodeError

    node = Node(settings, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # Windows' event loops: a plain handler that wakes the loop
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    try:
        await node.start()
        entering = asyncio.ensure_future(node.enter_swarm())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((entering, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not entering.done():
            entering.cancel()
            await asyncio.gather(entering, return_exceptions=True)
            await node.close()
            return 0
        stopped.cancel()
        entering.result()
    except NodeError as err:
        print(f"gwtf node: {err}", file=sys.stderr)
        await node.close()
        return err.exit_code
    print(
        f"gwtf node {node.node_id} listening on {node.address} "
        f"(stage {node.own_stage()} of {node.swarm.num_stages}, swarm {node.swarm.swarm_id})",
        flush=True,
    )
    if node.metrics.port is not None:
        print(f"gwtf node {node.node_id} metrics on http://{settings.host}:{node.metrics.port}"
              "/metrics", flush=True)  # fmt: skip
    while True:
        stopped = asyncio.ensure_future(stop.wait())
        moving = asyncio.ensure_future(node.relocating.wait())
        await asyncio.wait((stopped, moving), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        moving.cancel()
        if stop.is_set():
            break
        moved = await _move(node, config)
        if moved is None:
            return 1
        node = moved
    node.log.info("stopping: leaving the swarm")
    await node.leave()
    await node.close()
    return 0


async def _move(node: Node, config: NodeConfig) -> Node | None:
    """The job coordinator moved `node` to another stage (docs/design.md 2.11): it leaves the
    swarm gracefully and a new incarnation under the same id and port joins it at the new stage
    (and enters the running job there, as a joiner does). None, with the reason on stderr, if
    the new incarnation cannot join."""
    from gwtf.node.node import Node, NodeError

    assert node.relocation is not None
    stage, note = node.relocation
    settings = node.next_settings()
    node.log.info("leaving the swarm to enter it again at stage %d", stage)
    await node.leave()
    await node.close()
    moved = Node(settings, config)
    try:
        await moved.start()
        await moved.enter_swarm()
    except NodeError as err:
        print(f"gwtf node: the move to stage {stage} failed: {err}", file=sys.stderr)
        await moved.close()
        return None
    moved.log.info("%s", note)
    print(f"gwtf node {moved.node_id} moved to stage {moved.own_stage()} of "
          f"{moved.swarm.num_stages} ({note})", flush=True)
    return moved
