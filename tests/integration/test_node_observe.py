"""What an operator sees of real node processes: Prometheus metrics and JSON-line logs."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from cluster import LocalSwarm, wait_for

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
        swarm.start([("m0", 0, 0.05), ("m1a", 1, 0.05), ("m1b", 1, 0.08)], num_stages=2)
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
