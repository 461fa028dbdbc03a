"""`gwtf demo`: a local swarm on the emulated 10-region WAN trains a model while nodes die and join.

What it does, in order:

1. Starts `--nodes` node processes over `--stages` stages, spread round-robin over the 10 AWS
   regions of gwtf/data/geo10_aws.csv (each node's transport delays its messages as that WAN
   would) with compute times drawn from the measured GPU speeds, as `gwtf launch` does.
2. Submits the job (`--job`, default tiny-gpt, with `--iterations`) through the Python client.
3. While it trains, follows a churn plan: every `--churn-every` seconds a node that is not a
   data holder is SIGKILLed (a crash: no goodbye), and `--rejoin-after` seconds later a new node
   joins the stage that lost it. A kill waits until the last newcomer is in the swarm and an
   iteration has committed since the previous kill. Data holders are spared, so no microbatch
   is dropped and the swarm must end equal to the reference bit for bit (`--kill-holders`
   spares nobody; the reference then covers the microbatches that were actually trained).
4. Shows a live terminal view: members per stage, flows, the job's iterations, loss and
   throughput, and each crash, join and reconvergence as it happens.
5. At the end prints a summary (iterations, loss, throughput, crashes, rerouted and replayed
   work, dropped and lost microbatches, equality with `gwtf reference` trained in this process on
   the same microbatches), writes plots and the summary into `--out`, and stops every process it
   started, whatever happened.

`--quick` is a short run (6 nodes, 20 iterations, a crash due every 3 s: each waits for the
last newcomer and for an iteration to commit since the previous one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DemoPlan", "run_demo"]

EXIT_FAILED = 1
EXIT_USAGE = 2
RATE_WINDOW_S = 5.0


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    nodes: int
    stages: int
    iterations: int
    churn_every_s: float
    rejoin_after_s: float
    kill_holders: bool


def plan_from_args(args: argparse.Namespace) -> DemoPlan:
    if args.quick:
        # 20 iterations: a quiet machine trained 10 before the first kill's replacement (due
        # 4 s after it) had started, and the run showed a crash but no join.
        nodes, stages, iterations, every = 6, 3, 20, 3.0
    else:
        nodes, stages, iterations, every = 8, 3, 60, 8.0
    return DemoPlan(
        nodes=args.nodes or nodes,
        stages=args.stages or stages,
        iterations=args.iterations or iterations,
        churn_every_s=every if args.churn_every is None else args.churn_every,
        rejoin_after_s=args.rejoin_after,
        kill_holders=args.kill_holders,
    )


class _Timeline:
    """What happened when (seconds since the job started), for the plots and the summary."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        # t, alive, trained, flow value (nan while the routing has not converged)
        self.samples: list[tuple[float, int, int, float]] = []
        self.events: list[tuple[float, str, str]] = []  # t, kind, node

    def now(self) -> float:
        return time.monotonic() - self.start


def run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from gwtf.client import ClientError, GwtfClient, StatusError, fetch_status, status_json
    from gwtf.flow.generate import data_path
    from gwtf.live import SwarmWatch
    from gwtf.local.launch import _Cluster, _locations, _node_argv, plan_nodes
    from gwtf.train.job import JobError, resolve_job

    plan = plan_from_args(args)
    try:
        job = resolve_job(args.job)
    except JobError as err:
        print(f"gwtf demo: {err}", file=sys.stderr)
        return EXIT_USAGE
    job = dataclasses.replace(job, iterations=plan.iterations)
    if plan.nodes < 2 * plan.stages:
        print(f"gwtf demo: {plan.nodes} nodes cannot give each of {plan.stages} stages two "
              "(one may die); give --nodes >= 2 x --stages", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    out = Path(args.out or f"gwtf-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    matrix = str(data_path("geo10_aws.csv"))
    locations = _locations(matrix)
    plans = plan_nodes(plan.nodes, plan.stages, locations=locations,
                       base_compute_s=args.compute_s, seed=args.seed)  # fmt: skip
    node_args = argparse.Namespace(
        host="127.0.0.1", heartbeat_s=0.5, failure_timeout_s=args.failure_timeout_s,
        link_matrix=matrix, memory_slots=4, emulate_compute=False, no_train=False,
        token_file=None, tls_cert=None, tls_key=None, tls_ca=None,
        # The demo ends by comparing the swarm with the reference bit for bit: the CPU at fp32.
        device="cpu", precision="fp32",
    )  # fmt: skip
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = _Cluster(out / "logs")
    (out / "logs").mkdir(exist_ok=True)
    try:
        first = _node_argv(plans[0], node_args, 0) + ["--stages", str(plan.stages)]
        first += ["--activation-bytes", str(_activation_bytes(job))]
        cluster.start(plans[0], first)
        say(f"starting {plan.nodes} nodes over {plan.stages} stages on the emulated geo10 WAN "
            f"(logs in {out / 'logs'})")  # fmt: skip
        bootstrap = cluster.wait_addresses({0}, time.monotonic() + 120)[0]
        rest = {cluster.start(p, _node_argv(p, node_args, 0) + ["--bootstrap", bootstrap])
                for p in plans[1:]}  # fmt: skip
        addresses = {0: bootstrap, **cluster.wait_addresses(rest, time.monotonic() + 120)}
        ids = {p.id for p in plans}
        _wait(lambda: _members_known(fetch_status, bootstrap, ids), 120, stop,
              "every node to know every member")  # fmt: skip
        say(f"swarm formed; submitting {job.name or 'the job'} ({plan.iterations} iterations of "
            f"{job.microbatches} microbatches)")  # fmt: skip
        client = GwtfClient(bootstrap)
        job_id = client.submit(job)
        timeline = _Timeline()
        watch = SwarmWatch()
        result = _follow(client, job_id, cluster, plans, addresses, node_args, plan, timeline,
                         watch, stop, fetch_status, status_json, StatusError,
                         live=not args.no_live)  # fmt: skip
        model = _download(job_id, result, cluster, addresses, out) if result is not None else ""
    except (ClientError, RuntimeError, TimeoutError) as err:
        print(f"gwtf demo: {err} (logs in {out / 'logs'})", file=sys.stderr)
        return EXIT_FAILED
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if result is None:
        print("gwtf demo: interrupted; every node stopped", file=sys.stderr)
        return 130
    summary = _summarize(job, result, timeline)
    summary["model"] = model
    _plots(out, summary, timeline)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_format_summary(summary, out), flush=True)
    if args.json:
        print(json.dumps(summary), flush=True)
    ok = result.state == "completed" and summary["lost_microbatches"] == 0
    return 0 if ok and summary["equal_to_reference"] else EXIT_FAILED


def say(message: str) -> None:
    print(f"gwtf demo: {message}", file=sys.stderr, flush=True)


def _activation_bytes(job: Any) -> int:
    from gwtf.train import activation_bytes

    return int(activation_bytes(job))


def _members_known(fetch: Callable[..., Any], address: str, ids: set[str]) -> bool:
    from gwtf.client import StatusError, status_json

    try:
        view = status_json(fetch(address, timeout_s=5.0))
    except StatusError:
        return False
    known = {n["id"] for n in view["nodes"]}
    alive = {m["id"] for m in view["members"] if m["alive"]}
    return ids <= alive and ids <= known


def _wait(check: Callable[[], bool], timeout_s: float, stop: threading.Event, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if stop.wait(0.5):
            raise RuntimeError("interrupted")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


def _download(
    job_id: str, result: Any, cluster: Any, addresses: dict[int, str], out: Path
) -> str:
    """The trained model into `out` (model.safetensors, job.toml) through a node still alive;
    its path, or "" when the job did not complete or no node could send it."""
    from gwtf.client import ClientError, GwtfClient

    if result.state != "completed":
        return ""
    live = [addresses[i] for i, (_, proc) in enumerate(cluster.procs)
            if i in addresses and proc.poll() is None]  # fmt: skip
    for address in live:
        try:
            return str(GwtfClient(address).download(job_id, out))
        except ClientError as err:
            print(f"gwtf demo: the model could not be fetched through {address}: {err}",
                  file=sys.stderr)  # fmt: skip
    return ""


def _follow(
    client: Any,
    job_id: str,
    cluster: Any,
    plans: list[Any],
    addresses: dict[int, str],
    node_args: argparse.Namespace,
    plan: DemoPlan,
    timeline: _Timeline,
    watch: Any,
    stop: threading.Event,
    fetch_status: Callable[..., Any],
    status_json: Callable[[Any], dict[str, Any]],
    status_error: type[Exception],
    *,
    live: bool,
) -> Any:
    """Follow the job to its end, carrying out the churn plan; the final JobResult (None if
    interrupted)."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.panel import Panel

    from gwtf.client import ClientError
    from gwtf.local.launch import _node_argv
    from gwtf.local.plan import NodePlan

    rng = random.Random(7)
    index = {p.id: i for i, p in enumerate(plans)}
    next_kill = plan.churn_every_s if plan.churn_every_s > 0 else float("inf")
    rejoins: list[tuple[float, NodePlan]] = []
    joined = 0
    killed_at = 0  # iterations committed at the last kill
    progress = client.progress(job_id)

    def live_addresses() -> list[str]:
        return [addresses[i] for i, (_, proc) in enumerate(cluster.procs)
                if i in addresses and proc.poll() is None]  # fmt: skip

    def victims() -> list[NodePlan]:
        alive = [(p, proc) for p, proc in cluster.procs if proc.poll() is None]
        per_stage: dict[int, int] = {}
        for p, _ in alive:
            per_stage[p.stage] = per_stage.get(p.stage, 0) + 1
        return [p for p, _ in alive
                if (plan.kill_holders or p.stage > 0) and per_stage[p.stage] >= 2
                and p.id != progress.coordinator]  # fmt: skip

    def panel() -> Any:
        loss = f"{progress.loss[-1]:.4f}" if progress.loss else "-"
        text = (
            f"job {job_id}: {progress.state}, iteration {progress.iterations_completed}/"
            f"{progress.iterations}, loss {loss}, {progress.throughput_mb_s:.2f} microbatches/s"
        )
        return Group(Panel(text, title="training"), watch.render())

    console = Console(stderr=False)
    screen = Live(panel(), console=console, auto_refresh=False, transient=False)
    if live:
        screen.start()
    try:
        while not progress.over:
            if stop.wait(1.0):
                return None
            t = timeline.now()
            # The churn plan: a kill is due every `churn_every_s`, but waits until the last
            # newcomer is in the swarm and an iteration has committed since the last kill (a
            # swarm that never gets through an iteration shows nothing).
            settled = not rejoins and all(i in addresses for i in index.values()
                                          if cluster.procs[i][1].poll() is None)  # fmt: skip
            if t >= next_kill and settled and progress.iterations_completed > killed_at:
                choices = victims()
                if choices:
                    victim = rng.choice(choices)
                    i = index[victim.id]
                    cluster.signal(i, signal.SIGKILL)
                    addresses.pop(i, None)
                    timeline.events.append((t, "crash", victim.id))
                    watch.events.append(f"{t:7.1f} s  SIGKILL {victim.id} (stage {victim.stage})")
                    joined += 1
                    newcomer = NodePlan(f"{victim.id}j{joined}", victim.stage, victim.location,
                                        victim.compute_s)  # fmt: skip
                    rejoins.append((t + plan.rejoin_after_s, newcomer))
                    killed_at = progress.iterations_completed
                next_kill = t + plan.churn_every_s
            for due, newcomer in list(rejoins):
                if t >= due:
                    rejoins.remove((due, newcomer))
                    argv = _node_argv(newcomer, node_args, 0) + [
                        "--bootstrap", *live_addresses()[:3]]  # fmt: skip
                    index[newcomer.id] = cluster.start(newcomer, argv)
                    timeline.events.append((t, "join", newcomer.id))
                    watch.events.append(f"{t:7.1f} s  started {newcomer.id} (stage "
                                        f"{newcomer.stage})")  # fmt: skip
            found, _ = cluster.poll_addresses()
            addresses.update(found)
            # What the swarm and the job look like now.
            for address in live_addresses():
                try:
                    view = status_json(fetch_status(address, timeout_s=5.0))
                except status_error as err:
                    watch.failed(str(err))
                    continue
                watch.update(view)
                alive = sum(1 for m in view["members"] if m["alive"])
                flow = view["flow_value"] if view["converged"] else math.nan
                timeline.samples.append((t, alive, progress.microbatches_trained, flow))
                try:
                    progress = type(client)(address).progress(job_id)
                except ClientError as err:  # the asked node may die the next moment
                    watch.failed(str(err))
                break
            if live:
                screen.update(panel(), refresh=True)
            else:
                print(f"  {t:6.1f} s  iteration {progress.iterations_completed}/"
                      f"{progress.iterations}", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        if live:
            screen.stop()
    return progress


def _summarize(job: Any, result: Any, timeline: _Timeline) -> dict[str, Any]:
    import torch

    from gwtf.train import train_reference

    say("training the reference in this process (same seed, same microbatches) ...")
    # The nodes compute with one torch thread; float reductions split by thread count, so the
    # reference must too for the bits to compare.
    torch.set_num_threads(1)
    dropped = {k: set(ids) for k, ids in result.dropped}
    reference = train_reference(
        job,
        iterations=result.iterations_completed,
        microbatch_ids=lambda k: [m for m in range(job.microbatches)
                                  if m not in dropped.get(k, set())],  # fmt: skip
    )
    equal = reference.param_checksum == result.param_checksum
    crashes = [e for e in timeline.events if e[1] == "crash"]
    joins = [e for e in timeline.events if e[1] == "join"]
    summary = {
        "job_id": result.job_id,
        "state": result.state,
        "error": result.error,
        "iterations_completed": result.iterations_completed,
        "loss": list(result.loss),
        "reference_loss": list(reference.loss),
        "throughput_mb_s": result.throughput_mb_s,
        "crashes": len(crashes),
        "joins": len(joins),
        "crashes_seen_by_the_job": result.crashes,
        "rerouted_microbatches": result.rerouted_microbatches,
        "replayed_microbatches": result.replayed_microbatches,
        "replayed_work_s": result.replayed_s,
        "dropped_microbatches": result.dropped_microbatches,
        "lost_microbatches": result.lost_microbatches,
        "param_checksum": result.param_checksum,
        "reference_checksum": reference.param_checksum,
        "equal_to_reference": equal,
        "elapsed_s": result.elapsed_s,
    }
    return summary


def _plots(out: Path, summary: dict[str, Any], timeline: _Timeline) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (loss_ax, thr_ax, alive_ax) = plt.subplots(3, 1, figsize=(8, 9))
    loss_ax.plot(range(1, len(summary["loss"]) + 1), summary["loss"], "o-", label="swarm")
    loss_ax.plot(range(1, len(summary["reference_loss"]) + 1), summary["reference_loss"], "x--",
                 label="reference (one process)")  # fmt: skip
    loss_ax.set_xlabel("iteration")
    loss_ax.set_ylabel("loss")
    loss_ax.legend()
    loss_ax.set_title("loss per iteration")
    if timeline.samples:
        t = [s[0] for s in timeline.samples]
        trained = [s[2] for s in timeline.samples]
        # Microbatches count as trained when their iteration commits, in steps of a whole
        # iteration: a rate over a window of RATE_WINDOW_S seconds reads better than per sample.
        rate, first = [], 0
        for i in range(len(t)):
            while t[i] - t[first] > RATE_WINDOW_S:
                first += 1
            span = t[i] - t[first]
            rate.append((trained[i] - trained[first]) / span if span > 0 else 0.0)
        thr_ax.plot(t, rate, label=f"trained (microbatches/s over {RATE_WINDOW_S:g} s)")
        # Only while every node's flows have converged: in between, the flows of a scaling
        # phase are not a feasible routing yet and their sum means nothing.
        flows = [s[3] for s in timeline.samples]
        if any(math.isfinite(f) for f in flows):
            thr_ax.plot(t, flows, "o", markersize=3, label="flow value of the converged routing")
            thr_ax.set_ylim(bottom=0)
        else:
            # On the emulated WAN the flows take tens of seconds to settle after a crash
            # (RESULTS.md, section node): with a kill every few seconds the swarm trains on
            # flows in progress.
            thr_ax.set_ylim(0, 1.4 * max(max(rate), 1.0))  # room for the note
            thr_ax.text(0.99, 0.97, "the routing did not converge between kills; the job\n"
                        "followed the flows as they were", transform=thr_ax.transAxes,
                        ha="right", va="top", fontsize="small")  # fmt: skip
        thr_ax.set_ylabel("microbatches/s")
        thr_ax.legend(fontsize="small")
        alive_ax.step(t, [s[1] for s in timeline.samples], where="post")
        alive_ax.set_ylabel("live nodes")
        alive_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (thr_ax, alive_ax):
        for at, kind, _ in timeline.events:
            ax.axvline(at, color="red" if kind == "crash" else "green", alpha=0.4)
        ax.set_xlabel("seconds since the job started (red: crash, green: join)")
    thr_ax.set_title("throughput")
    alive_ax.set_title("live nodes")
    fig.tight_layout()
    fig.savefig(out / "demo.png", dpi=100)
    plt.close(fig)


def _format_summary(summary: dict[str, Any], out: Path) -> str:
    loss = summary["loss"]
    lines = [
        "",
        f"gwtf demo: {summary['state']} ({summary['error']})" if summary["error"]
        else f"gwtf demo: {summary['state']}",
        f"  iterations            {summary['iterations_completed']}",
        f"  loss                  {loss[0]:.4f} -> {loss[-1]:.4f}" if loss else "  loss -",
        f"  throughput            {summary['throughput_mb_s']:.2f} microbatches/s",
        f"  crashes / joins       {summary['crashes']} / {summary['joins']}",
        f"  rerouted microbatches {summary['rerouted_microbatches']}",
        f"  replayed stage work   {summary['replayed_work_s']:.2f} s",
        f"  dropped / lost        {summary['dropped_microbatches']} / "
        f"{summary['lost_microbatches']}",
        f"  equal to reference    {'yes' if summary['equal_to_reference'] else 'NO'} "
        f"(checksum {summary['param_checksum'][:16]})",
        f"  plots and summary     {out / 'demo.png'}, {out / 'summary.json'}",
        f"  trained model         {summary['model'] or 'not written'}",
    ]
    return "\n".join(lines)
