"""SWARM's chooser (gwtf.job.swarmroute): its throughput estimates, its choices, its bans."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gwtf.job.swarmroute import PerformanceEMA, SwarmBalancer


def test_the_estimate_of_a_steady_peer_is_its_rate_from_the_first_sample() -> None:
    ema = PerformanceEMA(alpha=0.1)
    for k in range(20):
        rate = ema.update(1.0, started=k * 0.5, now=(k + 1) * 0.5)
        assert rate == pytest.approx(2.0)  # the bias correction: no ramp from zero


def test_concurrent_calls_measure_throughput_not_latency() -> None:
    ema = PerformanceEMA(alpha=0.5)
    # Four calls started together, answered one every 0.25 s (a peer that takes 0.25 s each,
    # queued): each counts from the previous answer, so the estimate is 4/s, not 1/latency.
    for k in range(1, 5):
        rate = ema.update(1.0, started=0.0, now=0.25 * k)
    assert rate == pytest.approx(4.0)


def test_the_estimate_follows_a_peer_that_slows_down() -> None:
    ema = PerformanceEMA(alpha=0.1)
    now = 0.0
    for _ in range(30):
        ema.update(1.0, now, now + 0.1)
        now += 0.1
    for _ in range(60):
        ema.update(1.0, now, now + 0.4)
        now += 0.4
    assert ema.samples_per_second == pytest.approx(2.5, rel=0.01)


def _trained(rates: dict[str, float], seed: int = 0) -> SwarmBalancer:
    bal = SwarmBalancer(random.Random(seed))
    for peer in sorted(rates):
        bal.add(peer, 0.0)
        for k in range(10):
            bal.measured(peer, k / rates[peer], (k + 1) / rates[peer])
    return bal


def test_a_peer_gets_work_in_proportion_to_its_measured_throughput() -> None:
    bal = _trained({"fast": 8.0, "slow": 2.0})
    picks = Counter(bal.choose() for _ in range(1000))
    assert picks["fast"] / picks["slow"] == pytest.approx(4.0, rel=0.02)


def test_a_new_peer_starts_at_the_least_load_and_is_tried_soon() -> None:
    bal = _trained({"a": 4.0, "b": 4.0})
    for _ in range(50):
        bal.choose()
    bal.add("c", 10.0)
    assert "c" in {bal.choose(), bal.choose(), bal.choose()}
    assert bal.ema["c"].num_updates == 0
    assert bal.expected_s("c") == bal.initial_s


def test_a_banned_peer_is_left_out_until_its_ban_ends_then_comes_back_as_new() -> None:
    bal = _trained({"a": 4.0, "b": 4.0})
    bal.ban("a", until=30.0)
    assert {bal.choose() for _ in range(20)} == {"b"}
    bal.add("a", 29.0)  # a refresh before the ban ends does not bring it back
    assert "a" not in bal.runtime
    bal.add("a", 30.0)
    assert "a" in bal.runtime and bal.ema["a"].num_updates == 0  # its estimate was forgotten
    assert "a" not in bal.banned


def test_a_ban_without_an_end_lasts_until_lifted() -> None:
    bal = _trained({"a": 4.0})
    bal.ban("a")
    bal.add("a", 1e12)
    assert bal.choose() is None
    bal.unban("a")
    bal.add("a", 0.0)
    assert bal.choose() == "a"


def test_a_forgotten_peer_can_come_back_at_once_and_excluded_peers_are_skipped() -> None:
    bal = _trained({"a": 4.0, "b": 4.0})
    bal.forget("a")
    assert bal.choose(exclude={"b"}) is None
    bal.add("a", 0.0)
    assert {bal.choose(exclude={"b"}) for _ in range(5)} == {"a"}


def test_the_same_seed_and_measurements_give_the_same_choices() -> None:
    rates = {"a": 3.0, "b": 5.0, "c": 4.0}
    one, two = _trained(rates, 7), _trained(rates, 7)
    assert [one.choose() for _ in range(100)] == [two.choose() for _ in range(100)]
