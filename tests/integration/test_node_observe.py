"""What an operator sees of real node processes: Prometheus metrics and JSON-line logs."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster import LocalSwarm, Proc, wait_for

from gwtf.client import GwtfClient
from gwtf.node.observe import JOB_FAMILIES
from gwtf.train import PRESETS

pytestmark = pytest.mark.integration

TIMEOUT_S = 60


def scrape(url: str) -> dict[str, float]:
    """Every sample of the exposition as {name{labels}: value}."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_metrics_and_json_logs_of_a_live_swarm(tmp_path: Path) -> None:
    with LocalSwarm(tmp_path) as swarm:
        # The relaxation, whose flow messages are among the metrics (local routing sends none).
        swarm.start([("m0", 0, 0.05), ("m1a", 1, 0.05), ("m1b", 1, 0.08)], 2,
                    "--routing", "relax")  # fmt: skip
        watched = swarm.join("w0", 0, 0.05, "--metrics-port", "0", "--log-json")
        line = watched.lines.get(timeout=TIMEOUT_S)
        match = re.search(r"metrics on (http://\S+)", line or "")
        assert match, line
        url = match.group(1)

        def routed() -> dict[str, float] | None:
            samples = scrape(url)
            flows = [v for k, v in samples.items()
                     if k.startswith("gwtf_arc_flow_microbatches_per_second{")]  # fmt: skip
            return samples if len(flows) == 2 and sum(flows) > 0 else None

        samples = wait_for(routed, TIMEOUT_S, "w0's arcs to carry flow", interval_s=0.5)
        assert samples['gwtf_node_info{location="-",node="w0",stage="0"}'] == 1
        assert samples["gwtf_capacity_microbatches_per_second"] == pytest.approx(20.0)
        assert samples['gwtf_members{state="alive"}'] == 4
        assert samples['gwtf_link_rtt_seconds{dst="m1a"}'] > 0
        assert samples["gwtf_flow_messages_sent_total"] > 0
        assert samples["gwtf_crashes_detected_total"] == 0

        swarm.kill("m1b")
        after = wait_for(lambda: (s := scrape(url))["gwtf_crashes_detected_total"] == 1 and s,
                         TIMEOUT_S, "w0 to count the crash", interval_s=0.5)  # fmt: skip
        assert after['gwtf_members{state="departed"}'] == 1
        assert not any('dst="m1b"' in k for k in after)

    records = [json.loads(x) for x in watched.log.read_text().splitlines() if x.strip()]
    assert records and all({"time", "level", "message"} <= set(r) for r in records)
    dead = [r for r in records if "m1b" in r["message"] and "declared dead" in r["message"]]
    assert dead and dead[0]["node"] == "w0" and dead[0]["stage"] == 0


def test_a_metrics_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    from cluster import REPO

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gwtf", "node", "--stage", "0", "--stages", "2",
             "--compute-s", "0.1", "--metrics-port", str(port)],
            cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot serve metrics" in lines[0], result.stderr


def metrics_url(proc: Proc) -> str:
    """The metrics address a node prints right after it is listening."""
    line = proc.lines.get(timeout=TIMEOUT_S)
    match = re.search(r"metrics on (http://\S+)", line or "")
    assert match, line
    return match.group(1)


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        value for key, value in samples.items()
        if key.partition("{")[0] == name and all(w in key for w in want)
    )  # fmt: skip


def test_job_metrics_and_event_logs_match_the_job_that_ran(tmp_path: Path) -> None:
    """A real job on four training nodes: every node's job families are served, and what they
    count adds up to what the job reports."""
    iterations = 3
    job = dataclasses.replace(PRESETS["tiny-gpt"], iterations=iterations)
    observed = ("--metrics-port", "0", "--log-json")
    with LocalSwarm(tmp_path, train=True, heartbeat_s=0.25, failure_timeout_s=5.0) as swarm:
        # h0, the smallest holder id, coordinates; it alone logs at debug level.
        first = swarm.spawn("h0", 0, 0.05, "--stages", "2", *observed, "--log-level", "debug")
        swarm.wait_listening(first)
        swarm.bootstrap = first.address
        rest = [swarm.spawn(i, s, 0.05, *observed) for i, s in (("h1", 0), ("z0", 1), ("z1", 1))]
        swarm.wait_listening(*rest)
        procs = [first, *rest]
        urls = {p.id: metrics_url(p) for p in procs}
        everyone = set(urls)

        def formed() -> bool:
            for proc in procs:
                view = swarm.status(proc.id, swarm=False)
                if view is None or {m["id"] for m in view["members"] if m["alive"]} != everyone:
                    return False
            return True

        wait_for(formed, TIMEOUT_S, "every node to know every member")
        client = GwtfClient(first.address)
        job_id = client.submit(job)
        result = client.wait(job_id, timeout_s=120)
        assert result.state == "completed", result.error
        trained = result.microbatches_trained
        assert trained == iterations * job.microbatches and result.dropped_microbatches == 0
        scraped = {node: scrape(url) for node, url in urls.items()}

    holders, lasts = ["h0", "h1"], ["z0", "z1"]

    def over(nodes: list[str], name: str, **labels: str) -> float:
        return sum(total(scraped[n], name, job=job_id, **labels) for n in nodes)

    for node, samples in scraped.items():
        served = {key.partition("{")[0] for key in samples if f'job="{job_id}"' in key}
        for name, family in JOB_FAMILIES.items():
            suffix = {"counter": "_total", "gauge": "", "histogram": "_count"}[family.kind]
            assert name + suffix in served, (node, name)
        assert total(samples, "gwtf_job_iterations_committed_total") == iterations, node
        assert total(samples, "gwtf_job_iteration") == iterations, node
        assert total(samples, "gwtf_job_microbatches_trained_total") == trained, node
        assert total(samples, "gwtf_job_dropped_microbatches_total") == 0, node
        assert total(samples, "gwtf_job_loss") == pytest.approx(result.loss[-1]), node
        assert total(samples, "gwtf_job_commit_seconds_count", phase="step") == iterations, node
        assert total(samples, "gwtf_job_commit_seconds_sum", phase="prepare") > 0, node
        assert total(samples, "gwtf_job_queue_depth") == 0, node
        for quiet in ("gwtf_job_reroutes_total", "gwtf_job_replays_total",
                      "gwtf_job_restarts_total", "gwtf_job_participants_down_total"):
            assert total(samples, quiet) == 0, (node, quiet)
    # Every microbatch left a holder once, reached the last stage once and came back once.
    assert over(holders, "gwtf_job_microbatches_sent_total", direction="forward") == trained
    assert over(lasts, "gwtf_job_microbatches_received_total", direction="forward") == trained
    assert over(lasts, "gwtf_job_microbatches_sent_total", direction="backward") == trained
    assert over(holders, "gwtf_job_microbatches_received_total", direction="backward") == trained
    # Each stage did each microbatch's work once, and it took time.
    assert over(holders, "gwtf_job_compute_seconds_count", kind="forward") == trained
    assert over(holders, "gwtf_job_compute_seconds_count", kind="backward") == trained
    assert over(lasts, "gwtf_job_compute_seconds_count", kind="loss") == trained
    assert over(holders, "gwtf_job_compute_seconds_sum", kind="forward") > 0
    assert over(lasts, "gwtf_job_compute_seconds_sum", kind="loss") > 0
    # What one side sent, the other took: activations, gradients, and the replicas' sums.
    for kind, senders, takers in (("forward", holders, lasts), ("backward", lasts, holders)):
        sent = over(senders, "gwtf_job_bytes_sent_total", kind=kind)
        assert sent > 0 and sent == over(takers, "gwtf_job_bytes_received_total", kind=kind)
    sums = over(holders + lasts, "gwtf_job_bytes_sent_total", kind="gradient_sums")
    assert sums > 0
    assert sums == over(holders + lasts, "gwtf_job_bytes_received_total", kind="gradient_sums")

    def records(node: str) -> list[dict[str, Any]]:
        lines = swarm.procs[node].log.read_text().splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    coordinator = records("h0")
    done = [r for r in coordinator if "forward done" in r["message"]]
    assert len(done) == total(scraped["h0"], "gwtf_job_compute_seconds_count", kind="forward")
    assert all(
        r["level"] == "debug" and r["job"] == job_id and r["node"] == "h0" and r["stage"] == 0
        and isinstance(r["iteration"], int) and isinstance(r["microbatch"], int) for r in done
    )
    assert {r["iteration"] for r in done} == set(range(iterations))
    committed = [r for r in coordinator if " committed: " in r["message"]]
    assert [r["iteration"] for r in committed] == list(range(iterations))
    # At the default level a job with no crash logs nothing per microbatch.
    assert not [r for r in records("h1") if "microbatch" in r and r["level"] in ("debug", "info")]


def test_a_crash_shows_in_the_job_metrics_and_event_logs(tmp_path: Path) -> None:
    """A last-stage node dies in a forward: the holder's reroutes are the job's, every survivor
    counts the crash, and the reroute's log line names its iteration and microbatch."""
    job = dataclasses.replace(PRESETS["tiny-gpt"], name="observe-crash", iterations=3)
    observed = ("--metrics-port", "0", "--log-json")
    with LocalSwarm(tmp_path, train=True, heartbeat_s=0.25, failure_timeout_s=3.0) as swarm:
        # The holder is faster than one last-stage node (0.02 s against 0.05 s a microbatch), so
        # the max flow needs both of them: the victim is routed microbatches whether the flows
        # have settled or not (a holder no faster than one of them may send it nothing).
        first = swarm.spawn("h0", 0, 0.02, "--stages", "2", *observed)
        swarm.wait_listening(first)
        swarm.bootstrap = first.address
        relay = swarm.spawn("z0", 1, 0.05, *observed)
        victim = swarm.spawn("z1", 1, 0.05, "--fault", "crash-in:forward:iteration=1")
        swarm.wait_listening(relay, victim)
        urls = {p.id: metrics_url(p) for p in (first, relay)}

        def formed() -> bool:
            for node in ("h0", "z0", "z1"):
                view = swarm.status(node, swarm=False)
                if view is None or sum(m["alive"] for m in view["members"]) != 3:
                    return False
            return True

        wait_for(formed, TIMEOUT_S, "every node to know every member")
        client = GwtfClient(first.address)
        result = client.wait(client.submit(job), timeout_s=120)
        assert victim.popen.poll() == -9
        scraped = {node: scrape(url) for node, url in urls.items()}
    assert result.state == "completed", result.error
    assert result.crashes == 1 and result.rerouted_microbatches >= 1 and result.restarts == 0
    job_id = result.job_id
    h0, z0 = scraped["h0"], scraped["z0"]
    # The only holder resent every microbatch the coordinator planned to recover (rule 1).
    assert total(h0, "gwtf_job_reroutes_total", job=job_id, rule="resend") == (
        result.rerouted_microbatches
    )
    assert total(h0, "gwtf_job_reroutes_total", job=job_id) == result.rerouted_microbatches
    for samples in (h0, z0):
        assert total(samples, "gwtf_job_participants_down_total", job=job_id, how="crashed") == 1
        assert total(samples, "gwtf_job_iterations_committed_total", job=job_id) == 3
        assert total(samples, "gwtf_crashes_detected_total") >= 1

    def records(node: str) -> list[dict[str, Any]]:
        lines = swarm.procs[node].log.read_text().splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    holder = records("h0")
    rerouted = [r for r in holder if "rerouted from dead z1" in r["message"]]
    assert len(rerouted) == result.rerouted_microbatches
    assert all(r["level"] == "info" and r["job"] == job_id and r["iteration"] == 1
               and isinstance(r["microbatch"], int) for r in rerouted)  # fmt: skip
    recovery = [r for r in holder if "recovery of z1" in r["message"]]
    assert recovery and recovery[0]["iteration"] == 1 and "microbatch" not in recovery[0]
    # The coordinator hears of it in iteration 1 (which waits for the dead node's work); z0
    # may hear a heartbeat later, after iteration 1 committed.
    for node, iterations in (("h0", {1}), ("z0", {1, 2})):
        down = [r for r in records(node) if "participant z1 (stage 1) crashed" in r["message"]]
        assert len(down) == 1 and down[0]["job"] == job_id, (node, down)
        assert down[0]["iteration"] in iterations, (node, down)
