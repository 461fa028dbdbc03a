"""Arc parameters: the tail's formulas are the topology model's, and noise never churns arcs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.flow.topology import LinkSpec, NodeSpec, Topology
from gwtf.node.control.links import ArcParamsSpec, LinkEstimate, arc_params, changed, ring_params

positive = st.floats(min_value=1e-4, max_value=10.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    c_tail=positive,
    c_head=positive,
    rtt_ms=st.floats(min_value=0.0, max_value=500.0),
    bw=st.floats(min_value=1e-3, max_value=100.0),
    act=st.integers(min_value=1, max_value=2**28),
)
def test_arc_params_equal_the_topology_model(
    c_tail: float, c_head: float, rtt_ms: float, bw: float, act: int
) -> None:
    # The oracle in the tests builds a Topology from what the nodes announce: both must give
    # the same integers, or "the oracle of what they measured" would be another problem.
    topology = Topology.build(
        act,
        [NodeSpec.make("u", 0, c_tail, "A"), NodeSpec.make("v", 1, c_head, "B")],
        {frozenset(("A", "B")): LinkSpec(rtt_ms, bw)},
    )
    spec = topology.arc("u", "v")
    mine = arc_params(c_tail, c_head, rtt_ms, bw, act)
    assert (mine.cap, mine.cost) == (spec.cap_units, spec.cost_units)


def test_ring_arcs_take_the_smaller_node_capacity() -> None:
    assert ring_params(10.0, 4.0).cap == 4_000_000
    assert ring_params(2.5, 4.0).cap == 2_500_000


def test_estimates_are_windowed_min_rtt_and_median_bandwidth() -> None:
    est = LinkEstimate(rtt_window=3, bandwidth_window=3)
    assert est.rtt_s is None and est.bandwidth_gbps is None
    for rtt in (0.010, 0.005, 0.020):
        est.add_rtt(rtt)
    assert est.rtt_s == 0.005
    est.add_rtt(0.030)  # the 5 ms sample is still in the window of 3
    assert est.rtt_s == 0.005
    est.add_rtt(0.040)  # now it has left
    assert est.rtt_s == 0.020 and est.probes == 5
    # Probe pairs: 10^6 bytes took 8 ms more than the empty probe: 1 Gbit/s.
    assert est.add_transfer(10**6, 0.028, 0.020)
    assert est.add_transfer(10**6, 0.036, 0.020)  # 0.5 Gbit/s
    assert not est.add_transfer(10**6, 0.010, 0.020)  # the empty one stalled: no sample
    assert est.add_transfer(10**6, 0.0201, 0.020)  # a stall hidden in the pair: 80 Gbit/s
    assert est.samples == (3, 3)
    assert est.bandwidth_gbps == pytest.approx(1.0)  # the median shrugs it off


def test_hysteresis_ignores_noise_and_catches_real_changes() -> None:
    old = ArcParamsSpec(cap=1000, cost=100_000, rtt_ms=10.0, bandwidth_gbps=1.0)
    noisy = ArcParamsSpec(cap=1800, cost=110_000, rtt_ms=12.0, bandwidth_gbps=1.8)
    assert not changed(old, noisy, cost_rel=0.2, cap_rel=1.0)
    assert not changed(old, ArcParamsSpec(600, 90_000, 9.0, 0.6), cost_rel=0.2, cap_rel=1.0)
    slower = ArcParamsSpec(cap=1000, cost=130_000, rtt_ms=40.0, bandwidth_gbps=1.0)
    assert changed(old, slower, cost_rel=0.2, cap_rel=1.0)
    narrower = ArcParamsSpec(cap=400, cost=100_000, rtt_ms=10.0, bandwidth_gbps=0.4)
    assert changed(old, narrower, cost_rel=0.2, cap_rel=1.0)
    wider = ArcParamsSpec(cap=2500, cost=100_000, rtt_ms=10.0, bandwidth_gbps=2.5)
    assert changed(old, wider, cost_rel=0.2, cap_rel=1.0)
