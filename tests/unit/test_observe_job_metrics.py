"""The job metrics' exposition and the node's log records, without a node process."""

from __future__ import annotations

import io
import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gwtf.node.observe import (
    JOB_FAMILIES,
    SECONDS_BUCKETS,
    JobMetrics,
    JsonFormatter,
    NodeLog,
    NodeMetrics,
    job_event,
)


def exposition(metrics: JobMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """What a scrape of a node serving `metrics` parses to: sample name -> labels -> value."""
    node = NodeMetrics()
    node.add_source(metrics.collect)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(node)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_started_job_serves_every_family_at_zero() -> None:
    metrics = JobMetrics()
    metrics.start("j")
    samples = exposition(metrics)
    for name, family in JOB_FAMILIES.items():
        suffix = {"counter": "_total", "gauge": "", "histogram": "_count"}[family.kind]
        values = samples[name + suffix]
        labels = family.values or ("",)
        assert len(values) == len(labels), name
        assert all(v == 0 for v in values.values()), name


def test_counters_gauges_and_histograms_read_back() -> None:
    metrics = JobMetrics()
    metrics.count("gwtf_job_microbatches_sent", "j", "forward")
    metrics.count("gwtf_job_microbatches_sent", "j", "forward", by=2)
    metrics.count("gwtf_job_bytes_sent", "j", "gradient_sums", by=4096)
    metrics.set("gwtf_job_loss", "j", 3.5)
    metrics.set("gwtf_job_loss", "j", 3.25)
    for seconds in (0.003, 0.003, 0.2, 100.0):
        metrics.observe("gwtf_job_compute_seconds", "j", seconds, "backward")
    samples = exposition(metrics)
    fwd = (("direction", "forward"), ("job", "j"))
    assert samples["gwtf_job_microbatches_sent_total"] == {fwd: 3}
    assert samples["gwtf_job_bytes_sent_total"] == {(("job", "j"), ("kind", "gradient_sums")): 4096}
    assert samples["gwtf_job_loss"] == {(("job", "j"),): 3.25}
    series = (("job", "j"), ("kind", "backward"))
    assert samples["gwtf_job_compute_seconds_count"][series] == 4
    assert samples["gwtf_job_compute_seconds_sum"][series] == pytest.approx(100.206)
    buckets = {
        dict(labels)["le"]: value
        for labels, value in samples["gwtf_job_compute_seconds_bucket"].items()
    }
    # Cumulative: two at 5 ms, one more by 250 ms, the last one only in +Inf.
    assert buckets["0.0025"] == 0 and buckets["0.005"] == 2 and buckets["0.1"] == 2
    assert buckets["0.25"] == 3 and buckets[f"{SECONDS_BUCKETS[-1]:g}"] == 3
    assert buckets["+Inf"] == 4


def test_a_label_the_family_does_not_have_is_refused() -> None:
    metrics = JobMetrics()
    with pytest.raises(ValueError, match="direction 'sideways'"):
        metrics.count("gwtf_job_microbatches_sent", "j", "sideways")
    with pytest.raises(ValueError):
        metrics.count("gwtf_job_restarts", "j", "forward")
    with pytest.raises(KeyError):
        metrics.count("gwtf_job_no_such_family", "j")


def test_only_the_latest_jobs_keep_series() -> None:
    metrics = JobMetrics()
    jobs = [f"job-{i}" for i in range(JobMetrics.MAX_JOBS + 2)]
    for job in jobs:
        metrics.count("gwtf_job_restarts", job)
    kept = {dict(labels)["job"] for labels in exposition(metrics)["gwtf_job_restarts_total"]}
    assert kept == set(jobs[2:])


def test_a_job_event_carries_its_ids_into_a_json_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gwtf.test.observe")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    log = NodeLog(logger, {"node": "n1", "stage": 2})
    log.info("job %s it %d mb %d: rerouted", "j", 4, 7, extra=job_event("j", 4, 7))
    log.info("job %s iteration %d committed", "j", 4, extra=job_event("j", 4))
    log.warning("no job here")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "job j it 4 mb 7: rerouted"
    assert (first["node"], first["stage"], first["job"]) == ("n1", 2, "j")
    assert (first["iteration"], first["microbatch"]) == (4, 7)
    assert second["iteration"] == 4 and "microbatch" not in second
    assert third["node"] == "n1" and "iteration" not in third
