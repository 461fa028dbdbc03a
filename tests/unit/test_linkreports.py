"""Measured links in members' records (docs/design.md 2.12): the grid, the median per site
pair, the rule for what is worth reporting, the wire checks, the table's merge by revision,
and a solve that routes away from a reported slow link or a blocked arc."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gwtf.flow.linkreports import (
    BANDWIDTH_LEVELS,
    MAX_REPORTS,
    RTT_LEVELS,
    LinkReport,
    LinkReportError,
    SiteLinks,
    SiteRecord,
    blocked_arcs,
    check_record,
    level,
    material,
    report,
    site_links,
    site_of,
    solve_sites,
    unlevel,
)
from gwtf.flow.localroute import LocalRoute
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, NodeSpec
from gwtf.node.control.membership import MemberInfo, Membership
from gwtf.node.rpc.codec import InvalidMessage, member_from_pb, member_to_pb

ACT = 8 * 2**20


# ------------------------------------------------------------------ the grid


def test_levels_are_a_log_grid_with_steps_of_a_fourth_octave() -> None:
    assert level(1.0, RTT_LEVELS) == 0 and level(2.0, RTT_LEVELS) == 4
    assert unlevel(level(400.0, RTT_LEVELS)) == pytest.approx(430.5, abs=0.1)
    for value in (0.3, 1.0, 7.7, 67.0, 290.0):
        back = unlevel(level(value, RTT_LEVELS))
        assert abs(math.log2(back / value)) <= 1 / 8 + 1e-12  # within half a step
    # Noise inside a step changes nothing (at a step's edge it moves one level, 19%: less than
    # the cost hysteresis that decides whether a report changes at all).
    assert level(88.0, RTT_LEVELS) == level(90.5, RTT_LEVELS) == level(93.0, RTT_LEVELS) == 26
    # Off the range: clamped, not an error; not a positive number: an error.
    assert level(1e9, RTT_LEVELS) == RTT_LEVELS[1]
    assert level(1e-9, BANDWIDTH_LEVELS) == BANDWIDTH_LEVELS[0]
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(LinkReportError, match="positive and finite"):
            level(bad, RTT_LEVELS)


def test_a_node_without_a_location_is_its_own_site() -> None:
    assert site_of("h:1", "Tokyo") == "Tokyo"
    assert site_of("h:1", "") == "@h:1"


def test_unlocated_nodes_share_one_site_until_a_report_involves_them() -> None:
    members = [("x", "", (report("@y", 300.0, None),)), ("y", "", ()), ("z", "", ()),
               ("w", "", ()), ("t", "Tokyo", ())]  # fmt: skip
    assert solve_sites(members, "one-site") == {
        "x": "@x", "y": "@y", "z": "one-site", "w": "one-site", "t": "Tokyo"
    }
    assert set(solve_sites([(i, "", ()) for i in "xyz"], "one-site").values()) == {"one-site"}


# ------------------------------------------------------------------ aggregation


def _records(reports: dict[str, list[LinkReport]], site: dict[str, str]) -> list[SiteRecord]:
    return [SiteRecord(n, site[n], tuple(reports.get(n, ()))) for n in sorted(site)]


def test_the_median_of_the_reports_from_either_end_rates_a_site_pair() -> None:
    site = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "c1": "C"}
    reports = {
        "a1": [report("B", 100.0, None)],
        "a2": [report("B", 110.0, 2.0)],
        "a3": [report("B", 5000.0, None)],  # one overloaded reporter is outvoted
        "b1": [report("A", 90.0, None)],
    }
    base = {frozenset(("A", "B")): LinkSpec(50.0, 10.0), frozenset(("A", "C")): LinkSpec(20, 1)}
    links = site_links(_records(reports, site), base, None)
    ab = links[frozenset(("A", "B"))]
    # RTT levels 27 (100, 110 -> 26.6, 27.1), 39, 26 (90): the lower median of 26, 27, 27, 39.
    assert ab.rtt_ms == unlevel(27)
    assert ab.bandwidth_gbps == unlevel(4)  # the one bandwidth report
    assert links[frozenset(("A", "C"))] == LinkSpec(20, 1)  # no one measured: the matrix
    assert frozenset(("B", "C")) not in links  # the matrix does not join them: no link
    assert links.key() == ((("A", "B"), ab),)


def test_without_a_matrix_every_site_pair_is_joined_by_the_intra_link() -> None:
    site = {"x": "@x", "y": "@y", "z": "@z"}
    links = site_links(_records({"x": [report("@y", 300.0, None)]}, site), {}, DEFAULT_INTRA)
    assert links[frozenset(("@x", "@y"))] == LinkSpec(unlevel(33), DEFAULT_INTRA.bandwidth_gbps)
    assert links.get(frozenset(("@x", "@z"))) == DEFAULT_INTRA
    assert links.get(frozenset(("@x",))) is None  # inside one site: the solver's intra link


def test_reports_on_sites_without_records_and_blocks_of_the_dead_are_ignored() -> None:
    recs = [
        SiteRecord("x", "@x", (report("@gone", 300.0, None),), ("y", "gone")),
        SiteRecord("y", "@y"),
    ]
    assert site_links(recs, {}, DEFAULT_INTRA).key() == ()
    assert blocked_arcs(recs) == frozenset({("x", "y")})
    check_record("x", "@x", recs[0].reports, recs[0].blocked)  # well formed, only stale


def test_the_links_depend_only_on_the_records_not_their_order() -> None:
    rng = random.Random(7)
    sites = ["A", "B", "C", "D"]
    recs = []
    for i in range(40):
        here = sites[i % 4]
        there = [s for s in sites if s != here]
        recs.append(SiteRecord(f"n{i}", here, tuple(sorted(
            report(s, rng.uniform(5, 500), rng.choice([None, rng.uniform(0.1, 10)]))
            for s in rng.sample(there, 2)
        ))))  # fmt: skip
    want = site_links(recs, {}, DEFAULT_INTRA).key()
    for _ in range(10):
        rng.shuffle(recs)
        assert site_links(recs, {}, DEFAULT_INTRA).key() == want


# ------------------------------------------------------------------ what is reported


def test_only_a_material_difference_is_worth_a_report() -> None:
    node = (0.05, 20.0)
    kw = {"tail": node, "head": node, "activation_bytes": ACT, "cost_rel": 0.5, "cap_rel": 1.0}
    base = LinkSpec(1.0, 10.0)
    assert not material(base, LinkSpec(3.0, 10.0), **kw)  # ms on a 57 ms arc
    assert material(base, LinkSpec(100.0, 10.0), **kw)
    # 2 Gbit/s: the transfer term grows from 6.7 to 33.6 ms, +47% of the arc's cost: not yet.
    assert not material(base, LinkSpec(1.0, 2.0), **kw)
    assert material(base, LinkSpec(1.0, 1.0), **kw)
    # A capacity that cannot bind does not count: 10 vs 100 Gbit/s are both far above 20 mb/s.
    small = {**kw, "activation_bytes": 1000}
    assert not material(base, LinkSpec(1.0, 100.0), **small)
    # ...one that can, does: 0.0001 Gbit/s carries 12.5 mb/s of 1 kB activations.
    assert material(base, LinkSpec(1.0, 0.0001), **small)


# ------------------------------------------------------------------ from peers


def _member(**kw: object) -> MemberInfo:
    info = MemberInfo("n1", "h:1", 0, "A", 0.1, 10.0, 1)
    return MemberInfo(**{**{f: getattr(info, f) for f in info.__slots__}, **kw})  # type: ignore[arg-type]


def test_records_cross_the_wire_unchanged() -> None:
    info = _member(
        links=(LinkReport("B", 27, None), LinkReport("C", None, -3)), blocked=("n7",), revision=4,
        uplink_gbps=0.04,
    )
    assert member_from_pb(member_to_pb(info), 1) == info


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"links": (LinkReport("A", 3, None),)}, "its own site 'A'"),
        ({"links": (LinkReport("B", 3, None), LinkReport("B", 4, None))}, "site 'B' twice"),
        ({"links": (LinkReport("B", 999, None),)}, "RTT level 999"),
        ({"links": (LinkReport("B", 3, -99),)}, "bandwidth level -99"),
        ({"links": (LinkReport("B", None, None),)}, "nothing about 'B'"),
        ({"links": (LinkReport("", 3, None),)}, "link site is empty"),
        ({"blocked": ("n1",)}, "blocks an arc to itself"),
        ({"blocked": ("n2", "n2")}, "the same head twice"),
        ({"links": tuple(LinkReport(f"s{i}", 1) for i in range(MAX_REPORTS + 1))}, "at most"),
        ({"uplink_gbps": -1.0}, "uplink -1.0"),
        ({"uplink_gbps": float("nan")}, "uplink nan"),
    ],
)
def test_a_bad_record_from_a_peer_is_refused_with_its_reason(
    kw: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        member_from_pb(member_to_pb(_member(**kw)), 1)


def test_a_new_revision_replaces_the_links_and_spreads_and_an_old_one_does_not() -> None:
    now = [0.0]
    mine = Membership(
        _member(id="me", address="h:me"),
        lambda: now[0],
        failure_timeout_s=4.0,
        ping_interval_s=0.5,
        tombstone_s=60.0,
        rng=np.random.default_rng(0),
    )
    mine.merge([_member()])
    before = mine.view_hash()
    new = _member(links=(LinkReport("B", 27),), revision=1, heartbeat=3)
    events = mine.merge([new])
    assert [(e.kind, e.member.id) for e in events] == [("links", "n1")]
    assert mine.get("n1") == new and mine.spreading
    assert mine.view_hash() != before  # anti-entropy repairs a missed revision
    assert mine.merge([_member(revision=0, heartbeat=9)]) == []  # older links: heartbeat only
    assert mine.get("n1").links == new.links and mine.get("n1").heartbeat == 9  # type: ignore[union-attr]
    assert mine.set_links((LinkReport("B", 5),), ()) and mine.me.revision == 1
    assert not mine.set_links((LinkReport("B", 5),), ())  # unchanged: no new revision


# ------------------------------------------------------------------ the solve


def _route(me: str, nodes: list[NodeSpec], links: SiteLinks, blocked: frozenset) -> LocalRoute:  # type: ignore[type-arg]
    r = LocalRoute(me, 3, ACT, {}, DEFAULT_INTRA, quiet_s=0.0, clock=lambda: 0.0, balance=None)
    r.set_view(nodes, links, blocked)
    assert r.solve()
    return r


NODES = [
    NodeSpec.make("s0", 0, 0.05, "@s0"),
    NodeSpec.make("s1a", 1, 0.03, "@s1a"),
    NodeSpec.make("s1b", 1, 0.02, "@s1b"),
    NodeSpec.make("s2", 2, 0.02, "@s2"),
]


def test_a_reported_slow_link_and_a_blocked_arc_move_the_flow() -> None:
    plain = SiteLinks({}, {}, DEFAULT_INTRA)
    # Told nothing, the faster s1b takes everything.
    assert _route("s0", NODES, plain, frozenset()).routes() == {"s1b": 20_000_000}
    recs = [SiteRecord("s0", "@s0", (report("@s1b", 400.0, None),))] + [
        SiteRecord(n.id, n.location) for n in NODES[1:]
    ]
    slow = _route("s0", NODES, site_links(recs, {}, DEFAULT_INTRA), frozenset())
    assert slow.routes() == {"s1a": 20_000_000}
    # A blocked arc carries nothing and is not an out-arc; the view's key changes with it.
    blocked = _route("s0", NODES, plain, frozenset({("s0", "s1b")}))
    assert blocked.routes() == {"s1a": 20_000_000}
    assert [a.peer for a in blocked.out_arcs()] == ["s1a"]
    assert blocked.set_view(NODES, plain, frozenset())
    assert not blocked.set_view(NODES, plain, frozenset())
