"""The emulated WAN: one-way latency + size / bandwidth, a queue per peer, calibration."""

from __future__ import annotations

import pytest

from gwtf.flow.topology import LinkSpec
from gwtf.node.wan import CALIBRATION_MIN, WanEmulator

LINKS = {frozenset(("Oregon", "Tokyo")): LinkSpec(rtt_ms=96.0, bandwidth_gbps=0.5)}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delay_is_half_the_rtt_plus_serialisation() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048)
    # 1 MB at 0.5 Gbit/s: 16 ms on the wire.
    assert wan.delay("t2", "Tokyo", 1_000_000) == pytest.approx(0.048 + 0.016)


def test_same_location_is_the_intra_link_and_unknown_is_free() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    assert wan.delay("o", "Oregon", 0) == pytest.approx(0.0005)  # 1 ms RTT
    assert wan.delay("x", "Mars", 10**6) == 0.0  # not in the matrix: no link to emulate
    assert wan.delay("c", "", 10**6) == 0.0  # a client with no location (gwtf status)
    assert wan.link_to("Mars") is None and wan.knows("Tokyo") and not wan.knows("Mars")


def test_messages_to_one_peer_queue_behind_each_other() -> None:
    clock = Clock()
    wan = WanEmulator("Oregon", LINKS, clock)
    first = wan.delay("t", "Tokyo", 1_000_000)  # 16 ms on the wire
    second = wan.delay("t", "Tokyo", 0)  # waits for the first to be serialised
    assert second == pytest.approx(0.016 + 0.048)
    other = wan.delay("u", "Tokyo", 0)  # another peer: its own link
    assert other == pytest.approx(0.048)
    clock.now += 1.0  # the queue has drained
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048)
    assert first == pytest.approx(0.064)


def test_calibration_subtracts_the_local_stack_once_measured_enough() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    for _ in range(CALIBRATION_MIN - 1):
        wan.calibrate(0.004)
    assert wan.stack_rtt_s == 0.0  # too few samples: start-up ones overstate it
    wan.calibrate(0.002)
    assert wan.stack_rtt_s == 0.002
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048 - 0.001)
