"""The `gwtf` command: parses arguments, imports the package it needs lazily, and calls it.

Heavy imports (torch, grpc) happen inside each handler, so `gwtf --help` stays fast.
"""

from __future__ import annotations

import argparse
import math
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
        from gwtf.train.reference.cli import run_reference
    except ModuleNotFoundError as missing:
        if missing.name not in ("gwtf.train", "gwtf.train.reference.cli", "torch"):
            raise
        print(
            f"gwtf reference: not available in this installation (no {missing.name})",
            file=sys.stderr,
        )
        return EXIT_USAGE

    return run_reference(args)


def _export(args: argparse.Namespace) -> int:
    try:
        from gwtf.train.checkpoints.export_cli import run_export
    except ModuleNotFoundError as missing:
        if missing.name not in ("gwtf.train", "gwtf.train.checkpoints.export_cli", "torch",
        "safetensors"):
            raise
        print(
            f"gwtf export: not available in this installation (no {missing.name})",
            file=sys.stderr,
        )
        return EXIT_USAGE

    return run_export(args)


def _add_export_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser(
        "export",
        help="write a trained model as a Hugging Face folder (transformers loads it)",
        description="Read CHECKPOINT_DIR (model.safetensors and job.toml, as gwtf submit "
        "--checkpoint-dir and gwtf reference --checkpoint-dir write them) and write OUT_DIR/"
        "config.json and OUT_DIR/model.safetensors in the layout of transformers' "
        "LlamaForCausalLM (llama) or GPT2LMHeadModel (gpt), head untied, float32.",
    )
    export.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                        help="a gwtf checkpoint folder")
    export.add_argument("--hf", required=True, metavar="OUT_DIR",
                        help="the Hugging Face folder to write (made if missing); refused if it "
                        "holds anything, as the checkpoint or the job's pretrained folder do")
    export.add_argument("--force", action="store_true",
                        help="write into OUT_DIR even if it is not empty, replacing its "
                        "config.json and model.safetensors")
    export.set_defaults(handler=_export)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {text}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {value}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of calls per second (0: no limit), got {text!r}"
        ) from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(
            f"expected a number of calls per second >= 0 (0: no limit), got {text}"
        )
    return value


def _stage(text: str) -> int | None:
    """A stage number, or None for "auto" (the node chooses, docs/design.md 2.11)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a stage number or auto, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a stage number >= 0, got {value}")
    return value


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def _host(text: str) -> str:
    """A host name or IP address, without a port."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not bare or not bare.isprintable() or any(c in bare for c in " /@") or len(bare) > 253:
        raise argparse.ArgumentTypeError(f"expected a host name or IP address, got {text!r}")
    if ":" in bare and bare.count(":") < 2:
        raise argparse.ArgumentTypeError(f"expected a host without a port, got {text!r}")
    return bare


def _node(args: argparse.Namespace) -> int:
    from gwtf.node.cli import run_node

    return run_node(args)


def _status(args: argparse.Namespace) -> int:
    from gwtf.client import run_status

    return run_status(args)


def _submit(args: argparse.Namespace) -> int:
    from gwtf.client import run_submit

    return run_submit(args)


def _cancel(args: argparse.Namespace) -> int:
    from gwtf.client import run_cancel

    return run_cancel(args)


def _launch(args: argparse.Namespace) -> int:
    from gwtf.local.launch import run_launch

    return run_launch(args)


def _add_security_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "security (a swarm that requires them refuses calls without them: UNAUTHENTICATED)"
    )
    group.add_argument("--token-file", metavar="FILE",
                       help="a file holding the swarm's shared token, sent and required on "
                       "every call (e.g. made by `openssl rand -hex 32 > FILE`)")
    group.add_argument("--tls-cert", metavar="PEM", help="this end's certificate (mutual TLS)")
    group.add_argument("--tls-key", metavar="PEM", help="this end's private key")
    group.add_argument("--tls-ca", metavar="PEM",
                       help="the CA that signs every member's certificate")


def _add_node_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = commands.add_parser(
        "node",
        help="run one gwtf node (one pipeline stage) as a gRPC server",
        description="Run one gwtf node: create a swarm (no --bootstrap; give --stages) or join "
        "one, measure its links, route with its neighbours, until SIGTERM or Ctrl-C, then "
        "leave gracefully. Prints 'gwtf node ID listening on HOST:PORT ...' once in the swarm.",
    )
    node.add_argument("--config", metavar="FILE",
                      help="a TOML file of settings, named as these flags are (stage = 1, "
                      "bootstrap = [\"HOST:PORT\"], log-json = true, ...): the flags given "
                      "here as well win over it")
    node.add_argument("--stage", type=_stage, default="auto", metavar="K|auto",
                      help="the pipeline stage this node holds (0 = a data holder); default "
                      "auto: the stage where this node adds the most flow to the swarm (the "
                      "bottleneck the minimum cut names; the first node of a swarm takes 0)")
    node.add_argument("--no-moves", action="store_true",
                      help="keep the stage this node took with --stage auto: by default the "
                      "job coordinator may move it to the stage the minimum cut names when "
                      "the flow gains by it (a node given --stage K never moves)")
    node.add_argument("--port", type=_port, default=0, metavar="P",
                      help="port to listen on (default 0: a free one, printed)")
    node.add_argument("--host", default="127.0.0.1", metavar="HOST",
                      help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    node.add_argument("--advertise", type=_host, metavar="HOST",
                      help="the address peers reach this node at, when it is not --host (a "
                      "public IP or DNS name; default: --host, or the machine's host name "
                      "when --host is 0.0.0.0)")
    node.add_argument("--bootstrap", type=_address, nargs="+", action="extend", metavar="HOST:PORT",
                      help="members to join through (none: create a new swarm)")
    node.add_argument("--id", metavar="NAME", help="node id, unique in the swarm "
                      "(default: HOST:PORT)")
    node.add_argument("--location", metavar="NAME",
                      help="this node's location in --link-matrix (emulated WAN)")
    node.add_argument("--uplink-mbps", type=_positive_float, metavar="MBIT",
                      help="this machine's upload bandwidth in Mbit/s: it bounds the node's "
                      "capacity (every microbatch crosses it), its stage's snapshots go out "
                      "from the replica with the fastest, and with --link-matrix the data "
                      "plane's sends queue on it (default: not said, no bound, ranked last)")
    node.add_argument("--relay", choices=("auto", "always", "never"), default="auto",
                      help="reach this node through a member when members cannot dial it (behind "
                      "NAT): auto asks a member to dial back at the advertised address and "
                      "relays only if it cannot; always relays; never does not (default auto)")
    node.add_argument("--relay-peers", type=_count, default=8, metavar="N",
                      help="relay for at most N members that cannot be dialled (default 8; 0: "
                      "for none)")
    node.add_argument("--relay-mbps", type=_non_negative, default=0.0, metavar="MBIT",
                      help="what this node carries for each relayed member, Mbit/s each way "
                      "(default 0: no limit)")
    node.add_argument("--link-matrix", metavar="FILE",
                      help="CSV src,dst,rtt_ms,bandwidth_gbps: delay every outgoing message as "
                      "that link would (e.g. gwtf/data/geo10_aws.csv)")
    node.add_argument("--wan-schedule", metavar="FILE",
                      help="partitions of the emulated WAN: a TOML file of [[partition]] tables "
                      "(groups = two lists of locations, at = Unix start time, duration_s), "
                      "re-read whenever it changes; every message between the groups is dropped "
                      "while one holds")
    node.add_argument("--compute-s", type=_positive_float, metavar="S",
                      help="seconds per microbatch of this node's stage (default: measured by a "
                      "short warm-up of --job's stage, which loads torch)")
    node.add_argument("--job", default="tiny-gpt", metavar="JOB",
                      help="the model whose stage the warm-up measures (default: tiny-gpt)")
    node.add_argument("--heartbeat-s", type=_positive_float, default=0.5, metavar="S",
                      help="gossip/heartbeat period (default 0.5)")
    node.add_argument("--failure-timeout-s", type=_positive_float, default=5.0, metavar="S",
                      help="a member silent this long is declared dead (default 5)")
    node.add_argument("--rpc-timeout-s", type=_positive_float, default=3.0, metavar="S",
                      help="deadline of control calls (default 3)")
    node.add_argument("--bootstrap-wait-s", type=_seconds, default=60.0, metavar="S",
                      help="with --bootstrap: call bootstrap nodes that do not answer yet again "
                      "for up to S seconds before giving up (default 60; 0: once)")
    node.add_argument("--probe-s", type=_positive_float, default=1.0, metavar="S",
                      help="latency probe period per owned arc (default 1)")
    node.add_argument("--route-quiet-s", type=_positive_float, default=1.0, metavar="S",
                      help="local routing: solve once the member view has been unchanged "
                      "for S seconds (default 1)")
    node.add_argument("--routing-links", choices=("matrix", "measured"), default="matrix",
                      help="local routing: a link no member has measured is the --link-matrix "
                      "one (matrix, the default) or the intra-location link (measured: the "
                      "matrix only emulates the WAN, routing learns it by probing)")
    node.add_argument("--report-bandwidth", action="store_true",
                      help="local routing: gossip measured bandwidth too, not only RTT and "
                      "failed links (off: loopback bandwidth probes on a loaded machine wander)")
    node.add_argument("--explore-peers", type=_count, default=2, metavar="K",
                      help="local routing: next-stage members without flow from here probed "
                      "anyway, K at a time, so unused links get measured (default 2)")
    node.add_argument("--explore-s", type=_positive_float, default=30.0, metavar="S",
                      help="local routing: how long each explored set is probed before the "
                      "next (default 30)")
    swarm = node.add_argument_group("a new swarm (first node only; joiners get the swarm's)")
    swarm.add_argument("--stages", type=_positive_int, metavar="S",
                       help="number of pipeline stages")
    swarm.add_argument("--activation-bytes", type=_positive_int, default=8 * 2**20, metavar="N",
                       help="bytes of one activation (default 8 MiB)")
    swarm.add_argument("--max-arc-cost-s", type=_positive_float, default=2.0, metavar="S",
                       help="largest arc cost the routing is sized for (default 2)")
    swarm.add_argument("--min-arc-cost-s", type=_positive_float, default=0.01, metavar="S",
                       help="smallest arc cost; sets the cost accuracy (default 0.01)")
    swarm.add_argument("--routing", choices=("local", "relax", "swarm"), default="local",
                       help="how the swarm routes: every node solves the flow on its "
                       "membership view (local, the default), the decentralized "
                       "relaxation (relax), or as SWARM does, each sender by its own "
                       "throughput estimates of the next stage (swarm: a baseline)")
    swarm.add_argument("--quiet-s", type=_positive_float, metavar="S",
                       help="end scaling phases per node after S quiet seconds instead of "
                       "swarm-wide (uncoordinated; several times the messages)")
    node.add_argument("--memory-slots", type=_positive_int, default=8, metavar="N",
                      help="microbatches whose forward state this node keeps at once in a "
                      "training job; more wait upstream (default 8)")
    node.add_argument("--no-train", action="store_true",
                      help="route only: do not load torch (the node starts in a fraction of "
                      "the time) and refuse training jobs")
    _add_device_flags(node)
    node.add_argument("--threads", type=_positive_int, metavar="N",
                      help="torch CPU threads (default: 1 on a GPU, else the free cores up to "
                      "8; replicas and the reference give the same bits at the same count)")
    node.add_argument("--emulate-compute", action="store_true",
                      help="pad each microbatch's stage work to --compute-s with sleep, as the "
                      "emulated WAN pads messages (a local swarm then runs at its stated speeds)")
    node.add_argument("--pace", choices=("auto", "live", "declared"), default="auto",
                      help="live: the compute time this node announces follows what it "
                      "measures on every microbatch, so the flows move off a node that slows "
                      "down; declared: it stays --compute-s (or the warm-up's); auto "
                      "(default): live unless --compute-s is declared without "
                      "--emulate-compute")
    node.add_argument("--fault", metavar="SPEC",
                      help="chaos tests: SIGKILL this node at one point of a job, "
                      "crash-in:POINT[:iteration=K][:microbatch=M], POINT one of forward, "
                      "backward, after-backward, aggregation, state-transfer; make it a "
                      "bad peer, poison:gradients|weights[:scale=S][:from=K]; or a straggler, "
                      "slow:compute:factor=F[:from=K][:until=K2] or "
                      "slow:link:factor=F[:peer=ID][:from=K][:until=K2] (default: the "
                      "GWTF_FAULT environment variable, else none)")
    node.add_argument("--seed", type=int, metavar="N", help="seed of the gossip order "
                      "(default: from the id)")
    node.add_argument("--log-level", default="info",
                      choices=("debug", "info", "warning", "error"), help="(default info)")
    node.add_argument("--log-json", action="store_true",
                      help="log JSON lines (time, level, node, stage, message, ids) on stderr")
    node.add_argument("--metrics-port", type=_port, metavar="P",
                      help="serve Prometheus metrics on http://HOST:P/metrics (0: a free port, "
                      "printed)")
    node.add_argument("--rate-limit", type=_rate, default=1000.0, metavar="N",
                      help="calls per second each peer (host and node id) may make, in bursts "
                      "of up to two seconds' worth; beyond it a call is refused with "
                      "RESOURCE_EXHAUSTED (default 1000; 0: no limit)")
    _add_security_flags(node)
    node.set_defaults(handler=_node)


def _add_status_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser(
        "status",
        help="show the state of a running gwtf network and its jobs",
        description="Ask one node for the swarm as it sees it: members, flows, flow value.",
    )
    status.add_argument("--to", type=_address, required=True, metavar="HOST:PORT",
                        help="the node to ask")
    status.add_argument("--json", action="store_true", help="print the result as JSON")
    status.add_argument("--local", action="store_true",
                        help="that node's own arcs only (do not ask every member)")
    status.add_argument("--timeout", type=_positive_float, default=10.0, metavar="S",
                        help="deadline (default 10)")
    status.add_argument("--watch", action="store_true",
                        help="a live view, refreshed until Ctrl-C: members per stage, flows, "
                        "and each death, join and reconvergence as it happens")
    status.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                        help="refresh period of --watch (default 1)")
    _add_security_flags(status)
    status.set_defaults(handler=_status)


def _add_submit_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = commands.add_parser(
        "submit",
        help="submit a training job to a running gwtf network",
        description="Submit JOB to the swarm of the node at --to: every member builds its stage "
        "and the swarm trains the job, routing microbatches along its flows. Prints the job id; "
        "--wait follows the job (a progress bar and the loss of every iteration on stderr) to "
        "the end.",
    )
    submit.add_argument("--to", type=_address, required=True, metavar="HOST:PORT",
                        help="any node of the swarm")
    what = submit.add_mutually_exclusive_group(required=True)
    what.add_argument("--job", metavar="JOB",
                      help="a TOML job file, or a preset: tiny-gpt, tiny-llama")
    what.add_argument("--resume", metavar="DIR",
                      help="resume the job checkpointed in DIR (by --checkpoint-every) at its "
                      "iteration, on this swarm, whatever its number of stages; it ends equal to "
                      "an uninterrupted run")
    submit.add_argument("--iterations", type=_positive_int, metavar="N",
                        help="train N iterations instead of the job's (a different job id)")
    submit.add_argument("--aggregation", metavar="RULE",
                        help="how a stage's replicas combine gradients instead of the job's: "
                        "mean, trimmed-mean or centered-clip (the last two also exclude bad "
                        "peers; a different job id)")
    submit.add_argument("--wait", action="store_true",
                        help="follow the job until it completes or fails")
    submit.add_argument("--checkpoint-dir", metavar="DIR",
                        help="with --wait: write the trained model there at the end, as "
                        "DIR/model.safetensors (the names gwtf reference --checkpoint-dir "
                        "writes) and DIR/job.toml")
    submit.add_argument("--checkpoint-every", type=_positive_int, metavar="K",
                        help="also write the latest weights and optimizer state to "
                        "--checkpoint-dir every K iterations while the job trains (a folder "
                        "--resume can continue from); if the job then fails because a stage "
                        "lost every replica and every snapshot of it, it is resumed from there "
                        "once every stage has a live node again")
    submit.add_argument("--resume-within", type=_positive_float, default=600.0, metavar="S",
                        help="with --checkpoint-every: how long to wait for every stage to have "
                        "a live node before resuming such a job (default 600)")
    submit.add_argument("--json", action="store_true",
                        help="print job_id, iterations_completed, loss, param_checksum, "
                        "throughput_mb_s, dropped_microbatches as JSON (at the end with --wait)")
    submit.add_argument("--timeout", type=_positive_float, default=10.0, metavar="S",
                        help="deadline of each status call (default 10)")
    _add_security_flags(submit)
    submit.set_defaults(handler=_submit)

    cancel = commands.add_parser(
        "cancel",
        help="stop a running training job",
        description="Stop JOB_ID on every node of the swarm of the node at --to: the job fails "
        "with the reason given. A job that ended already is left as it is. Prints the job's "
        "state after the call.",
    )
    cancel.add_argument("job_id", metavar="JOB_ID", help="the id gwtf submit printed")
    cancel.add_argument("--to", type=_address, required=True, metavar="HOST:PORT",
                        help="any node of the swarm")
    cancel.add_argument("--reason", default="", metavar="TEXT",
                        help="why (shown as the job's error everywhere)")
    cancel.add_argument("--timeout", type=_positive_float, default=10.0, metavar="S",
                        help="deadline of the call (default 10)")
    _add_security_flags(cancel)
    cancel.set_defaults(handler=_cancel)


def _add_device_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where stages run: auto (a CUDA GPU, else MPS, else the CPU), cpu, "
                        "cuda, cuda:N or mps (default auto)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"),
                        help="fp32 (the reference's bits on a CPU), or bf16 / fp16 matmuls under "
                        "autocast, weights and optimizer in fp32 (default fp32)")


def _add_launch_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    launch = commands.add_parser(
        "launch",
        help="launch several gwtf nodes on this machine",
        description="Start a local swarm of N node processes spread over S stages (and over "
        "the locations of --link-matrix), print their addresses, and stop them all on Ctrl-C "
        "or SIGTERM.",
    )
    launch.add_argument("--nodes", type=_positive_int, required=True, metavar="N")
    launch.add_argument("--stages", type=_positive_int, required=True, metavar="S")
    launch.add_argument("--base-port", type=_port, default=0, metavar="P",
                        help="ports P, P+1, ... (default 0: free ports)")
    launch.add_argument("--host", default="127.0.0.1", metavar="HOST")
    launch.add_argument("--link-matrix", metavar="FILE",
                        help="emulate this WAN: nodes go round-robin over its locations")
    launch.add_argument("--compute-s", type=_positive_float, default=0.1, metavar="S",
                        help="seconds per microbatch on a V100; each node draws a GPU from "
                        "gwtf/data/gpu_train_throughput.csv and divides by its speed (default 0.1)")
    launch.add_argument("--heartbeat-s", type=_positive_float, default=0.5, metavar="S")
    launch.add_argument("--failure-timeout-s", type=_positive_float, default=5.0, metavar="S")
    launch.add_argument("--memory-slots", type=_positive_int, default=8, metavar="N",
                        help="each node's memory slots for training jobs (default 8)")
    launch.add_argument("--emulate-compute", action="store_true",
                        help="nodes pad their stage work to their compute time (see gwtf node)")
    launch.add_argument("--activation-bytes", type=_positive_int, metavar="N",
                        help="bytes of one activation, for the flows (default: the node's, "
                        "8 MiB; tiny-gpt's is 131072)")
    launch.add_argument("--no-train", action="store_true",
                        help="nodes route only: they do not load torch and refuse jobs")
    _add_device_flags(launch)
    launch.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed of the GPU draw (default 0)")
    launch.add_argument("--log-dir", metavar="DIR",
                        help="write each node's log there (default: a new temporary folder)")
    launch.add_argument("--json", action="store_true",
                        help="print the nodes as one JSON line once the swarm is formed (and "
                        "with --churn, one JSON line per event)")
    launch.add_argument("--metrics-port", type=_port, metavar="P",
                        help="each node serves Prometheus metrics, node i on port P+i (0: free "
                        "ports); the URLs are listed with the nodes")
    launch.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        help="the nodes' log level (default: theirs, info)")
    launch.add_argument("--log-json", action="store_true",
                        help="the nodes log JSON lines into their log files")
    launch.add_argument("--churn", metavar="TRACE",
                        help="replay this churn trace on the swarm: SIGKILL on crash, SIGTERM on "
                        "leave, a new node process on join (CSV time_s,event,node[,stage]"
                        "[,location] or Bamboo time_ms,add|remove,node)")
    launch.add_argument("--churn-format", choices=("csv", "bamboo"),
                        help="the trace's format (default: from its header)")
    launch.add_argument("--time-scale", type=_positive_float, default=1.0, metavar="F",
                        help="wall seconds per trace second (default 1; 0.01 replays 100x "
                        "faster)")
    _add_security_flags(launch)
    launch.set_defaults(handler=_launch)


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
    from gwtf.local.demo import run_demo

    return run_demo(args)


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
        "--oracle", action="store_true",
        help="solve centrally with the networkx oracle instead (the reference)",
    )
    route.add_argument(
        "--method", choices=("local", "relax"), default="local",
        help="local (default): nodes gossip compact records and each solves the whole flow "
             "itself; relax: the asynchronous epsilon-relaxation between neighbours "
             "(docs/design.md 2.3, 2.12)",
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
    reference.add_argument("--checkpoint-dir", metavar="DIR",
                           help="write the trained model there: DIR/model.safetensors (the "
                           "names a swarm's checkpoint has) and DIR/job.toml")
    reference.set_defaults(handler=_reference)
    _add_export_parser(commands)

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
        help="policies to run: gwtf, gwtf-fixed, gwtf-uncompressed, swarm, swarm-rebalance, "
        "swarm-routing, dtfm, oracle (default: the scenario's list)",
    )
    simulate.add_argument(
        "--seed", type=int, default=None, metavar="N",
        help="seed for all randomness (default: the scenario's)",
    )
    simulate.add_argument(
        "--replay-bound", type=int, default=None, metavar="N",
        help="ship partial gradient sums to a stage peer every N microbatches, 0 for never "
        "(default: the scenario's [training] replay_bound)",
    )
    simulate.add_argument(
        "--out", metavar="DIR",
        help="write summary.json, timeseries.csv, iterations.csv and PNG plots into DIR",
    )
    simulate.add_argument("--json", action="store_true", help="print the summary as JSON")
    simulate.set_defaults(handler=_simulate)

    _add_node_parser(commands)
    _add_submit_parser(commands)
    _add_status_parser(commands)
    _add_launch_parser(commands)

    demo = commands.add_parser(
        "demo",
        help="a local swarm on the emulated 10-region WAN trains a model while nodes die",
        description="Start a local swarm on the emulated geo10 WAN, train a model on it while "
        "nodes are killed and new ones join, show it live, then print a summary (and whether "
        "the result equals the one-process reference) and write plots. Under 5 minutes on 2 "
        "cores; --quick: under a minute. Leaves no process behind.",
    )
    demo.add_argument("--quick", action="store_true",
                      help="a short run (6 nodes, 20 iterations, a crash every 3 s)")
    demo.add_argument("--nodes", type=_positive_int, metavar="N", help="nodes (default 8)")
    demo.add_argument("--stages", type=_positive_int, metavar="S", help="stages (default 3)")
    demo.add_argument("--iterations", type=_positive_int, metavar="K",
                      help="iterations to train (default 60)")
    demo.add_argument("--job", default="tiny-gpt", metavar="JOB",
                      help="preset or TOML job file (default tiny-gpt)")
    demo.add_argument("--churn-every", type=float, metavar="S",
                      help="kill a node every S seconds (default 8; --quick 3; 0: never)")
    demo.add_argument("--rejoin-after", type=_positive_float, default=4.0, metavar="S",
                      help="a new node joins the stage S seconds after each kill (default 4)")
    demo.add_argument("--kill-holders", action="store_true",
                      help="data holders may be killed too (their microbatches are dropped)")
    demo.add_argument("--compute-s", type=_positive_float, default=0.05, metavar="S",
                      help="seconds per microbatch on a V100 for the routing (default 0.05)")
    demo.add_argument("--failure-timeout-s", type=_positive_float, default=3.0, metavar="S",
                      help="a silent node is declared dead after S seconds (default 3)")
    demo.add_argument("--seed", type=int, default=0, metavar="N", help="seed (default 0)")
    demo.add_argument("--out", metavar="DIR",
                      help="folder for the plots and the summary (default gwtf-demo-TIME)")
    demo.add_argument("--no-live", action="store_true",
                      help="print progress lines instead of the live view")
    demo.add_argument("--json", action="store_true", help="also print the summary as JSON")
    demo.set_defaults(handler=_demo)
    return parser


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        argv = sys.argv[1:] if argv is None else list(argv)
        if argv[:1] == ["node"]:
            from gwtf.node.cli import ConfigError, with_config

            try:
                argv = ["node", *with_config(argv[1:], _subcommand(parser, "node"))]
            except ConfigError as err:
                print(f"gwtf node: {err}", file=sys.stderr)
                return EXIT_USAGE
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
