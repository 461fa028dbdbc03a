"""Which exchange a stage's commit uses (`gwtf.job.exchange`, docs/design.md 3.7): the rule the
node and the simulator share."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf.flow.topology import LinkSpec
from gwtf.job.exchange import SLICES, WHOLE, Link, choose, exchange_s
from gwtf.sim.network import Network, exchange_of, fresh_moves, leg_s, whole_moves
from gwtf.sim.scenario import NodeInfo


def everywhere(one_way_s: float, gbps: float):  # type: ignore[no-untyped-def]
    def link(a: str, b: str) -> Link:
        return one_way_s, gbps
    return link


def unknown(a: str, b: str) -> Link | None:
    return None


@given(st.floats(0, 1e12), st.booleans())
def test_one_replica_moves_nothing_either_way(nbytes: float, known: bool) -> None:
    assert choose(nbytes, ["n0"], everywhere(0.05, 0.02) if known else unknown) == WHOLE
    assert exchange_s(SLICES, nbytes, ["n0"], unknown) == exchange_s(WHOLE, nbytes, ["n0"],
                                                                      unknown) == 0.0


@given(st.floats(1.0, 1e10), st.floats(0.001, 0.2), st.floats(0.01, 100.0))
def test_two_replicas_go_all_to_all_exactly_when_latency_bound(
    nbytes: float, one_way_s: float, gbps: float
) -> None:
    # The same bytes as a reduce-scatter and all-gather, one leg fewer; but a rerun resends
    # whole sums where slices send headers, so only while the bytes take no longer than the leg.
    link = everywhere(one_way_s, gbps)
    whole = exchange_s(WHOLE, nbytes, ["a", "b"], link)
    slices = exchange_s(SLICES, nbytes, ["a", "b"], link)
    assert whole < slices
    bound = nbytes * 8 / (gbps * 1e9) <= one_way_s
    assert choose(nbytes, ["a", "b"], link) == (WHOLE if bound else SLICES)
    assert choose(nbytes, ["a", "b"], unknown) == SLICES


def test_a_robust_aggregation_always_goes_all_to_all() -> None:
    members = [f"n{i}" for i in range(6)]
    assert choose(600e6, members, everywhere(0.02, 0.02)) == SLICES
    assert choose(600e6, members, everywhere(0.02, 0.02), robust=True) == WHOLE
    assert choose(600e6, members, unknown, robust=True) == WHOLE


def test_a_small_sum_on_inter_region_links_goes_all_to_all() -> None:
    # fidelity: 400 KB sums between Virginia, Oregon and Frankfurt (34-72 ms one way,
    # 0.4-1.0 Gbit/s): one 72-ms leg beats two.
    regions = {"v": 0, "o": 1, "f": 2}
    one_way = {frozenset((0, 1)): (0.034, 1.0), frozenset((0, 2)): (0.045, 0.6),
               frozenset((1, 2)): (0.072, 0.4)}

    def link(a: str, b: str) -> Link:
        return one_way[frozenset((regions[a], regions[b]))]

    assert choose(400e3, ["v", "o", "f"], link) == WHOLE
    assert exchange_s(WHOLE, 400e3, ["v", "o", "f"], link) == pytest.approx(
        0.072 + 400e3 * 8 / 0.4e9)


def test_a_large_sum_through_home_uplinks_goes_by_slices() -> None:
    # home_links: 6 replicas, 600 MB each, 20 Mbit/s shared uplinks: 1,000 s of uplink all to
    # all (five whole sums), 400 s by slices (two legs of five sixths of a sum).
    members = [f"n{i}" for i in range(6)]
    link = everywhere(0.02, 1.0)
    uplink = {m: 0.02 for m in members}
    whole = exchange_s(WHOLE, 600e6, members, link, uplink)
    slices = exchange_s(SLICES, 600e6, members, link, uplink)
    assert whole == pytest.approx(0.02 + 5 * 600e6 * 8 / 20e6)
    assert slices == pytest.approx(2 * (0.02 + 5 * 100e6 * 8 / 20e6))
    assert choose(600e6, members, link, uplink) == SLICES
    # Two of them as well: the first attempt would gain a leg, every rerun lose minutes.
    assert choose(600e6, members[:2], link, uplink) == SLICES


def test_the_cross_over_is_where_the_bytes_take_as_long_as_the_latency() -> None:
    # Pair links, r = 4, 50 ms one way, 1 Gbit/s: all to all costs L + S / B, slices
    # 2 (L + S / (4 B)), equal at S = 12.5 MB; but past S / B = L (6.25 MB) a rerun of the all
    # to all, which resends every sum, would cost more than one by slices, which sends headers.
    members = ["a", "b", "c", "d"]
    link = everywhere(0.05, 1.0)
    assert exchange_s(WHOLE, 12.4e6, members, link) < exchange_s(SLICES, 12.4e6, members, link)
    assert choose(6.2e6, members, link) == WHOLE
    assert choose(6.3e6, members, link) == SLICES
    # Through 0.1 Gbit/s uplinks the three sends of a whole sum queue: 3 S / U <= L.
    uplink = {m: 0.1 for m in members}
    assert choose(0.2e6, members, link, uplink) == WHOLE
    assert choose(0.21e6, members, link, uplink) == SLICES


def test_an_unknown_link_with_three_replicas_goes_by_slices() -> None:
    # Without the link matrix nothing says latency dominates; slices never move more bytes.
    assert choose(1.0, ["a", "b", "c"], unknown) == SLICES
    known = everywhere(0.05, 1.0)

    def partly(a: str, b: str) -> Link | None:
        return None if {a, b} == {"a", "c"} else known(a, b)

    assert choose(1.0, ["a", "b", "c"], partly) == SLICES
    assert choose(1.0, ["a", "b", "c"], known) == WHOLE


def test_every_member_order_chooses_alike() -> None:
    lat = {"a": 0.01, "b": 0.03, "c": 0.07, "d": 0.02}

    def link(x: str, y: str) -> Link:
        return lat[x] + lat[y], 0.5 if "c" in (x, y) else 2.0

    for nbytes in (1e5, 5e6, 2e7, 1e9):
        seen = {choose(nbytes, list(order), link) for order in itertools.permutations(lat)}
        assert len(seen) == 1


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="a sum of -1"):
        choose(-1, ["a", "b", "c"], unknown)
    with pytest.raises(ValueError, match="no exchange 'ring'"):
        exchange_s("ring", 1.0, ["a", "b"], everywhere(0.01, 1.0))


def node(node_id: str, location: str, up: float = math.inf, down: float = math.inf) -> NodeInfo:
    return NodeInfo(node_id, 0, location, "gpu", 1.0, uplink_gbps=up, downlink_gbps=down)


@pytest.mark.parametrize("access", [False, True])
def test_the_rule_estimates_what_the_simulator_charges(access: bool) -> None:
    # A first attempt's legs as the simulator charges them (`leg_s`) are the rule's estimates,
    # on pair links and through access links.
    links = {frozenset(("A", "B")): LinkSpec(68.0, 1.0), frozenset(("A", "C")): LinkSpec(90.0, 0.6),
             frozenset(("B", "C")): LinkSpec(144.0, 0.4)}
    net = Network(links, LinkSpec(1.0, 10.0))
    up, down = (0.1, 0.3) if access else (math.inf, math.inf)
    stage = [node("x", "A", up, down), node("y", "B", up, down), node("z", "C", up, down),
             node("w", "A", up, down)]
    infos = {n.id: n for n in stage}

    def link(a: str, b: str) -> Link:
        spec = net.link(infos[a], infos[b]) or net.intra
        return spec.rtt_ms / 2000, spec.bandwidth_gbps

    ids = [n.id for n in stage]
    ups = {n.id: n.uplink_gbps for n in stage}
    downs = {n.id: n.downlink_gbps for n in stage}
    for nbytes in (4e5, 4e7):
        scatter, gather = fresh_moves(stage, nbytes)
        assert exchange_s(SLICES, nbytes, ids, link, ups, downs) == pytest.approx(
            leg_s(net, stage, scatter) + leg_s(net, stage, gather))
        assert exchange_s(WHOLE, nbytes, ids, link, ups, downs) == pytest.approx(
            leg_s(net, stage, whole_moves(stage, nbytes)))
        assert exchange_of(net, stage, nbytes) == choose(nbytes, ids, link, ups, downs)
