"""The topology model and its file format: formulas, arcs, validation, edits, round trips."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gwtf.flow.generate import data_path, random_layered
from gwtf.flow.topology import (
    CAP_SCALE,
    COST_SCALE,
    DEFAULT_INTRA,
    LinkSpec,
    NodeSpec,
    Topology,
    TopologyError,
    load_link_matrix,
    load_topology,
    parse_topology,
)

MB = 1_000_000  # activation bytes of the hand examples: round numbers


def three_nodes() -> dict[str, Any]:
    """a (stage 0, X) feeds b (stage 1, Y, over the X-Y link) and c (stage 1, X, intra)."""
    return {
        "activation_bytes": MB,
        "nodes": [
            {"id": "a", "stage": 0, "compute_s": 0.01, "location": "X"},
            {"id": "b", "stage": 1, "compute_s": 0.03, "location": "Y"},
            {"id": "c", "stage": 1, "compute_s": 0.05, "location": "X"},
        ],
        "links": [{"src": "X", "dst": "Y", "rtt_ms": 100, "bandwidth_gbps": 0.8}],
    }


# -- formulas ---------------------------------------------------------------------------------


def test_cost_and_capacity_formulas_on_a_hand_example() -> None:
    topo = parse_topology(three_nodes())
    assert topo.num_stages == 2
    assert [n.id for n in topo.nodes] == ["a", "b", "c"]
    assert topo.stage_nodes(0) == ("a",)
    assert topo.stage_nodes(1) == ("b", "c")
    assert topo.stage_nodes(2) == ()

    # node capacity = 1 / compute_s, floored to units
    assert topo.node("a").capacity == pytest.approx(100.0)
    assert topo.node("a").cap_units == 100_000_000
    assert topo.node("b").cap_units == 33_333_333
    assert topo.node("c").cap_units == 20_000_000

    assert [(arc.src, arc.dst) for arc in topo.arcs] == [("a", "b"), ("a", "c")]
    ab = topo.arc("a", "b")
    # capacity: 0.8e9 / 8 / 1e6 = 100 mb/s
    assert ab.capacity == pytest.approx(100.0)
    assert ab.cap_units == 100_000_000
    # cost: (0.01 + 0.03)/2 + 100/2000 + 1e6*8/0.8e9 = 0.02 + 0.05 + 0.01
    assert ab.cost == pytest.approx(0.08, abs=1e-15)
    assert ab.cost_units == 80_000_000

    ac = topo.arc("a", "c")  # same location: intra default, 1 ms and 10 Gbit/s
    assert ac.capacity == pytest.approx(1250.0)
    assert ac.cap_units == 1_250_000_000
    # (0.01 + 0.05)/2 + 1/2000 + 1e6*8/10e9 = 0.03 + 0.0005 + 0.0008
    assert ac.cost == pytest.approx(0.0313, abs=1e-15)
    assert ac.cost_units == 31_300_000

    assert topo.out_arcs("a") == (ab, ac)
    assert topo.in_arcs("b") == (ab,)
    assert topo.in_arcs("c") == (ac,)
    assert topo.out_arcs("b") == ()
    assert CAP_SCALE == 1_000_000 and COST_SCALE == 1_000_000_000


def test_explicit_capacity_and_floor_scaling() -> None:
    doc = three_nodes()
    doc["nodes"][1]["capacity"] = 2.9999999
    doc["nodes"][2]["capacity"] = 0
    topo = parse_topology(doc)
    assert topo.node("b").capacity == 2.9999999
    assert topo.node("b").cap_units == 2_999_999
    assert topo.node("c").cap_units == 0
    assert NodeSpec.make("n", 0, 0.5, "X").capacity == 2.0
    assert NodeSpec.make("n", 0, 0.5, "X", 1e-7).cap_units == 0


def test_links_are_symmetric() -> None:
    doc = three_nodes()
    doc["links"] = [{"src": "Y", "dst": "X", "rtt_ms": 100, "bandwidth_gbps": 0.8}]
    reversed_topo = parse_topology(doc)
    assert reversed_topo == parse_topology(three_nodes())
    assert reversed_topo.arc("a", "b").cost_units == 80_000_000
    assert reversed_topo.link_between("X", "Y") == reversed_topo.link_between("Y", "X")

    # the same pair twice with the same numbers is fine
    doc["links"].append({"src": "X", "dst": "Y", "rtt_ms": 100.0, "bandwidth_gbps": 0.8})
    assert parse_topology(doc) == reversed_topo

    # tuple keys in both directions work for build too
    nodes = reversed_topo.nodes
    link = LinkSpec(100, 0.8)
    built = Topology.build(MB, nodes, {("X", "Y"): link, ("Y", "X"): link})
    assert built == reversed_topo
    with pytest.raises(TopologyError, match="given twice"):
        Topology.build(MB, nodes, {("X", "Y"): link, ("Y", "X"): LinkSpec(100, 0.9)})


def test_same_location_arcs_use_intra_location() -> None:
    doc = {
        "activation_bytes": MB,
        "nodes": [
            {"id": "h", "stage": 0, "compute_s": 0.1, "location": "Lab"},
            {"id": "r", "stage": 1, "compute_s": 0.1, "location": "Lab"},
        ],
        "links": [],
    }
    topo = parse_topology(doc)
    assert topo.intra == DEFAULT_INTRA
    assert topo.link_between("Lab", "Lab") == LinkSpec(1.0, 10.0)
    assert topo.arc("h", "r").cost_units == round((0.1 + 1 / 2000 + 8e6 / 10e9) * 1e9)

    doc["intra_location"] = {"rtt_ms": 0.2, "bandwidth_gbps": 100}
    fast = parse_topology(doc)
    assert fast.arc("h", "r").capacity == pytest.approx(100e9 / 8 / MB)
    assert fast.arc("h", "r").cost == pytest.approx(0.1 + 0.0001 + 8e6 / 100e9)


def test_no_arc_between_unjoined_locations_or_non_consecutive_stages() -> None:
    doc = {
        "activation_bytes": MB,
        "nodes": [
            {"id": "h", "stage": 0, "compute_s": 0.1, "location": "A"},
            {"id": "x", "stage": 1, "compute_s": 0.1, "location": "B"},
            {"id": "y", "stage": 1, "compute_s": 0.1, "location": "C"},
            {"id": "z", "stage": 2, "compute_s": 0.1, "location": "A"},
        ],
        "links": [
            {"src": "A", "dst": "B", "rtt_ms": 10, "bandwidth_gbps": 1},
            {"src": "B", "dst": "C", "rtt_ms": 10, "bandwidth_gbps": 1},
        ],
    }
    topo = parse_topology(doc)
    assert [(a.src, a.dst) for a in topo.arcs] == [("h", "x"), ("x", "z")]
    assert not topo.has_arc("h", "y")
    assert not topo.has_arc("h", "z")
    assert topo.link_between("A", "C") is None
    with pytest.raises(KeyError):
        topo.arc("h", "y")
    with pytest.raises(KeyError):
        topo.node("nope")


def test_arc_count_of_a_large_topology_computed_by_hand() -> None:
    # 10 stages of 100 nodes: 40 at A, 30 at B, 30 at C; links A-B and B-C, none A-C.
    # Per pair of consecutive stages: A->A,B 40*70 + B->all 30*100 + C->B,C 30*60 = 7600.
    nodes = []
    for stage in range(10):
        for i in range(100):
            location = "A" if i < 40 else "B" if i < 70 else "C"
            nodes.append(NodeSpec.make(f"s{stage}n{i:03d}", stage, 0.1, location))
    links = {frozenset(("A", "B")): LinkSpec(50, 1.0), frozenset(("B", "C")): LinkSpec(20, 2.0)}
    topo = Topology.build(8 * 2**20, nodes, links)
    assert len(topo.nodes) == 1000
    assert len(topo.arcs) == 9 * 7600
    assert len(topo.out_arcs("s0n000")) == 70
    assert len(topo.out_arcs("s0n050")) == 100
    assert len(topo.in_arcs("s9n099")) == 60
    keys = [(topo.node(a.src).stage, a.src, a.dst) for a in topo.arcs]
    assert keys == sorted(keys)

    blocked = topo.without_arc("s0n000", "s1n000").without_arc("s3n050", "s4n099")
    assert len(blocked.arcs) == 9 * 7600 - 2


# -- validation -------------------------------------------------------------------------------


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _append(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc.setdefault(key, []).append(value)

    return mutate


NODE = {"id": "z", "stage": 1, "compute_s": 0.1, "location": "X"}

INVALID: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("missing activation_bytes", _delete(["activation_bytes"]), "missing 'activation_bytes'"),
    ("negative activation_bytes", _set(["activation_bytes"], -1), "'activation_bytes' must be"),
    ("zero activation_bytes", _set(["activation_bytes"], 0), "'activation_bytes' must be"),
    ("float activation_bytes", _set(["activation_bytes"], 1.5), "'activation_bytes' must be"),
    ("string activation_bytes", _set(["activation_bytes"], "8"), "'activation_bytes' must be"),
    ("bool activation_bytes", _set(["activation_bytes"], True), "'activation_bytes' must be"),
    ("missing nodes", _delete(["nodes"]), "missing 'nodes'"),
    ("nodes not a list", _set(["nodes"], {"a": 1}), "'nodes' must be a list"),
    ("empty nodes", _set(["nodes"], []), "'nodes' is empty"),
    ("node not an object", _set(["nodes", 0], "a"), "nodes[0] must be a JSON object"),
    ("missing id", _delete(["nodes", 1, "id"]), "nodes[1]: missing 'id'"),
    ("empty id", _set(["nodes", 1, "id"], ""), "'id' must be a non-empty string"),
    ("numeric id", _set(["nodes", 1, "id"], 7), "'id' must be a non-empty string"),
    ("missing stage", _delete(["nodes", 1, "stage"]), "node 'b': missing 'stage'"),
    ("negative stage", _set(["nodes", 1, "stage"], -1), "node 'b': 'stage' must be an integer"),
    ("float stage", _set(["nodes", 1, "stage"], 1.0), "node 'b': 'stage' must be an integer"),
    ("string stage", _set(["nodes", 1, "stage"], "1"), "node 'b': 'stage' must be an integer"),
    ("bool stage", _set(["nodes", 1, "stage"], True), "node 'b': 'stage' must be an integer"),
    ("missing compute_s", _delete(["nodes", 1, "compute_s"]), "node 'b': missing 'compute_s'"),
    ("zero compute_s", _set(["nodes", 1, "compute_s"], 0), "node 'b': 'compute_s' must be"),
    ("nan compute_s", _set(["nodes", 1, "compute_s"], math.nan), "'compute_s' must be"),
    ("inf compute_s", _set(["nodes", 1, "compute_s"], math.inf), "'compute_s' must be"),
    ("string compute_s", _set(["nodes", 1, "compute_s"], "fast"), "'compute_s' must be"),
    ("missing location", _delete(["nodes", 1, "location"]), "node 'b': missing 'location'"),
    ("numeric location", _set(["nodes", 1, "location"], 3), "'location' must be"),
    ("negative capacity", _set(["nodes", 1, "capacity"], -1), "node 'b': 'capacity' must be"),
    ("inf capacity", _set(["nodes", 1, "capacity"], math.inf), "node 'b': 'capacity' must be"),
    ("unknown node key", _set(["nodes", 1, "capcity"], 3), "node 'b': unknown key 'capcity'"),
    ("duplicate id", _set(["nodes", 2, "id"], "b"), "node 'b' is defined twice"),
    (
        "stage gap",
        _set(["nodes"], [{**NODE, "stage": 0}, {**NODE, "id": "y", "stage": 2}]),
        "stage 1 has no node",
    ),
    ("one stage", _set(["nodes"], [{**NODE, "stage": 0}]), "at least 2 stages"),
    ("unknown location", _set(["nodes", 1, "location"], "Atlantis"), "location 'Atlantis'"),
    ("links not a list", _set(["links"], {}), "'links' must be a list"),
    ("link not an object", _set(["links", 0], 3), "links[0] must be a JSON object"),
    ("link missing src", _delete(["links", 0, "src"]), "links[0]: missing 'src'"),
    ("link missing rtt", _delete(["links", 0, "rtt_ms"]), "link 'X'-'Y': missing 'rtt_ms'"),
    ("link missing bw", _delete(["links", 0, "bandwidth_gbps"]), "missing 'bandwidth_gbps'"),
    ("negative rtt", _set(["links", 0, "rtt_ms"], -5), "link 'X'-'Y': 'rtt_ms' must be"),
    ("nan rtt", _set(["links", 0, "rtt_ms"], math.nan), "'rtt_ms' must be"),
    ("zero bandwidth", _set(["links", 0, "bandwidth_gbps"], 0), "'bandwidth_gbps' must be"),
    ("negative bandwidth", _set(["links", 0, "bandwidth_gbps"], -1), "'bandwidth_gbps' must be"),
    ("self link", _set(["links", 0, "dst"], "X"), "joins a location to itself"),
    ("unknown link key", _set(["links", 0, "latency"], 3), "unknown key 'latency'"),
    (
        "conflicting duplicate link",
        _append("links", {"src": "Y", "dst": "X", "rtt_ms": 99, "bandwidth_gbps": 0.8}),
        "given twice with different numbers",
    ),
    ("unknown top key", _set(["nodez"], []), "unknown key 'nodez'"),
    ("intra not object", _set(["intra_location"], 1), "'intra_location' must be a JSON object"),
    (
        "intra zero bandwidth",
        _set(["intra_location"], {"rtt_ms": 1, "bandwidth_gbps": 0}),
        "'intra_location': 'bandwidth_gbps' must be",
    ),
    (
        "intra missing rtt",
        _set(["intra_location"], {"bandwidth_gbps": 1}),
        "'intra_location': missing 'rtt_ms'",
    ),
    (
        "blocked unknown node",
        _set(["blocked_arcs"], [{"src": "a", "dst": "q"}]),
        "unknown node 'q'",
    ),
    ("blocked missing dst", _set(["blocked_arcs"], [{"src": "a"}]), "missing 'dst'"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [(m, e) for _, m, e in INVALID], ids=[n for n, _, _ in INVALID]
)
def test_invalid_topologies_raise_one_line_errors(
    mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = copy.deepcopy(three_nodes())
    mutate(doc)
    with pytest.raises(TopologyError) as info:
        parse_topology(doc)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


def test_error_message_names_the_item_and_the_fix() -> None:
    doc = three_nodes()
    doc["nodes"][1]["id"] = "a1"
    doc["nodes"][1]["compute_s"] = -0.1
    with pytest.raises(TopologyError) as info:
        parse_topology(doc)
    assert str(info.value) == "node 'a1': 'compute_s' must be a positive number, got -0.1"


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(TopologyError, match="topology must be a JSON object"):
        parse_topology([1, 2])


def test_build_validates_programmatic_input() -> None:
    good = [NodeSpec.make("a", 0, 0.1, "X"), NodeSpec.make("b", 1, 0.1, "X")]
    with pytest.raises(TopologyError, match="'compute_s' must be a positive number"):
        Topology.build(MB, [*good, NodeSpec("c", 1, -1.0, "X", 1.0)], {})
    with pytest.raises(TopologyError, match="'bandwidth_gbps' must be a positive number"):
        Topology.build(MB, good, {("X", "Y"): LinkSpec(1, 0)})
    with pytest.raises(TopologyError, match="'intra_location': 'rtt_ms'"):
        Topology.build(MB, good, {}, LinkSpec(-1, 1))
    with pytest.raises(TopologyError, match="unknown node 'q'"):
        Topology.build(MB, good, {}, blocked=[("a", "q")])
    with pytest.raises(TypeError):
        Topology()


def test_load_topology_errors_are_one_line_with_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(TopologyError) as info:
        load_topology(missing)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)
    assert "cannot read" in str(info.value)

    bad = tmp_path / "bad.json"
    bad.write_text('{"activation_bytes": 1,\n "nodes": [}\n')
    with pytest.raises(TopologyError) as info:
        load_topology(bad)
    assert str(bad) in str(info.value) and "not valid JSON" in str(info.value)
    assert "line 2" in str(info.value) and "\n" not in str(info.value)

    invalid = tmp_path / "invalid.json"
    doc = three_nodes()
    doc["nodes"][0]["compute_s"] = 0
    invalid.write_text(json.dumps(doc))
    with pytest.raises(TopologyError) as info:
        load_topology(invalid)
    assert str(invalid) in str(info.value) and "'compute_s'" in str(info.value)

    good = tmp_path / "good.json"
    good.write_text(json.dumps(three_nodes()))
    assert load_topology(good) == parse_topology(three_nodes())
    assert load_topology(str(good)) == parse_topology(three_nodes())


# -- edits ------------------------------------------------------------------------------------


def test_node_edits() -> None:
    topo = parse_topology(three_nodes())
    joined = topo.with_node(NodeSpec.make("d", 1, 0.02, "Y"))
    assert joined.stage_nodes(1) == ("b", "c", "d")
    assert joined.has_arc("a", "d")
    assert joined.arc("a", "d").cost == pytest.approx(0.015 + 0.05 + 0.01)
    assert not topo.has_node("d")  # the original is unchanged

    left = joined.without_node("b")
    assert left.stage_nodes(1) == ("c", "d")
    assert not left.has_arc("a", "b")
    assert [(a.src, a.dst) for a in left.arcs] == [("a", "c"), ("a", "d")]

    replaced = topo.with_node(NodeSpec.make("b", 1, 0.03, "Y", capacity=7.0))
    assert replaced.node("b").cap_units == 7_000_000
    assert len(replaced.nodes) == 3

    # a node at a new stage extends the pipeline
    longer = topo.with_node(NodeSpec.make("t", 2, 0.1, "X"))
    assert longer.num_stages == 3
    assert [a.src for a in longer.in_arcs("t")] == ["b", "c"]

    with pytest.raises(TopologyError, match="would leave stage 0 with no node"):
        topo.without_node("a")
    with pytest.raises(TopologyError, match="'zz' is not in the topology"):
        topo.without_node("zz")
    with pytest.raises(TopologyError, match="stage 2 has no node"):
        topo.with_node(NodeSpec.make("q", 3, 0.1, "X"))


def test_arc_edits_block_and_unblock() -> None:
    topo = parse_topology(three_nodes())
    cut = topo.without_arc("a", "b")
    assert not cut.has_arc("a", "b") and cut.has_arc("a", "c")
    assert cut.blocked == frozenset({("a", "b")})
    assert cut.to_json()["blocked_arcs"] == [{"src": "a", "dst": "b"}]
    assert "blocked_arcs" not in topo.to_json()
    assert cut != topo

    restored = cut.with_arc("a", "b")
    assert restored == topo
    assert restored.arc("a", "b") == topo.arc("a", "b")

    with pytest.raises(TopologyError, match="not in the stage after"):
        topo.without_arc("b", "c")
    with pytest.raises(TopologyError, match="no node 'q'"):
        topo.without_arc("a", "q")

    unjoined = topo.without_link("X", "Y")
    assert not unjoined.has_arc("a", "b")
    with pytest.raises(TopologyError, match="are not joined"):
        unjoined.with_arc("a", "b")

    # removing a node forgets its blocked pairs
    assert cut.with_node(NodeSpec.make("d", 1, 0.1, "X")).without_node("b").blocked == frozenset()


def test_link_edits() -> None:
    topo = parse_topology(three_nodes())
    slower = topo.with_link("Y", "X", LinkSpec(200, 0.4))
    assert slower.link_between("X", "Y") == LinkSpec(200, 0.4)
    assert slower.arc("a", "b").capacity == pytest.approx(50.0)
    assert slower.arc("a", "b").cost == pytest.approx(0.02 + 0.1 + 0.02)
    assert slower.arc("a", "c") == topo.arc("a", "c")
    assert topo.arc("a", "b").cost_units == 80_000_000  # unchanged

    gone = topo.without_link("X", "Y")
    assert [(a.src, a.dst) for a in gone.arcs] == [("a", "c")]
    back = gone.with_link("X", "Y", LinkSpec(100, 0.8))
    assert back == topo

    with pytest.raises(TopologyError, match="'bandwidth_gbps' must be a positive number"):
        topo.with_link("X", "Y", LinkSpec(1, -2))
    with pytest.raises(TopologyError, match="joins a location to itself"):
        topo.with_link("X", "X", LinkSpec(1, 2))
    with pytest.raises(TopologyError, match="is not in the topology"):
        topo.without_link("X", "Z")


@pytest.mark.parametrize("seed", range(10))
def test_a_sequence_of_edits_matches_a_fresh_build(seed: int) -> None:
    # Edits copy the arcs they cannot have touched; a fresh build recomputes everything.
    rng = np.random.default_rng(seed)
    topo = random_layered(rng, 30, 4, n_locations=4)
    joined = 0
    for _ in range(25):
        kind = int(rng.integers(5))
        if kind == 0:
            removable = [n.id for n in topo.nodes if len(topo.stage_nodes(n.stage)) > 1]
            topo = topo.without_node(removable[int(rng.integers(len(removable)))])
        elif kind == 1:
            joined += 1
            stage = int(rng.integers(topo.num_stages))
            location = f"L{int(rng.integers(4))}"
            compute = float(rng.uniform(0.01, 0.2))
            topo = topo.with_node(NodeSpec.make(f"j{joined}", stage, compute, location))
        elif kind == 2 and topo.arcs:
            arc = topo.arcs[int(rng.integers(len(topo.arcs)))]
            topo = topo.without_arc(arc.src, arc.dst)
        elif kind == 3 and topo.blocked:
            src, dst = sorted(topo.blocked)[0]
            if topo.link_between(topo.node(src).location, topo.node(dst).location):
                topo = topo.with_arc(src, dst)
        else:
            a, b = (f"L{i}" for i in rng.choice(4, size=2, replace=False))
            rtt, bandwidth = float(rng.uniform(1, 100)), float(rng.uniform(0.1, 5))
            topo = topo.with_link(a, b, LinkSpec(rtt, bandwidth))
        fresh = Topology.build(
            topo.activation_bytes, topo.nodes, topo.links, topo.intra, topo.blocked
        )
        assert fresh.arcs == topo.arcs
        assert all(fresh.out_arcs(n.id) == topo.out_arcs(n.id) for n in topo.nodes)
        assert all(fresh.in_arcs(n.id) == topo.in_arcs(n.id) for n in topo.nodes)


# -- serialization ----------------------------------------------------------------------------


def test_to_json_round_trip_of_a_hand_example() -> None:
    doc = three_nodes()
    doc["nodes"][2]["capacity"] = 4.5
    doc["intra_location"] = {"rtt_ms": 2, "bandwidth_gbps": 25}
    doc["blocked_arcs"] = [{"src": "a", "dst": "c"}]
    topo = parse_topology(doc)
    out = topo.to_json()
    assert out == {
        "activation_bytes": MB,
        "nodes": [
            {"id": "a", "stage": 0, "compute_s": 0.01, "location": "X"},
            {"id": "b", "stage": 1, "compute_s": 0.03, "location": "Y"},
            {"id": "c", "stage": 1, "compute_s": 0.05, "location": "X", "capacity": 4.5},
        ],
        "links": [{"src": "X", "dst": "Y", "rtt_ms": 100.0, "bandwidth_gbps": 0.8}],
        "intra_location": {"rtt_ms": 2.0, "bandwidth_gbps": 25.0},
        "blocked_arcs": [{"src": "a", "dst": "c"}],
    }
    again = parse_topology(json.loads(json.dumps(out)))
    assert again == topo
    assert again.arcs == topo.arcs
    assert hash(again) == hash(topo)


@pytest.mark.parametrize("seed", range(5))
def test_to_json_round_trip_of_random_topologies(seed: int) -> None:
    topo = random_layered(np.random.default_rng(seed), 40, 5)
    cut = topo.without_arc(*next((a.src, a.dst) for a in topo.arcs))
    for t in (topo, cut):
        again = parse_topology(json.loads(json.dumps(t.to_json())))
        assert again == t
        assert again.arcs == t.arcs
        assert again.to_json() == t.to_json()


# -- link matrices ----------------------------------------------------------------------------


def test_load_link_matrix_reads_the_geo10_file() -> None:
    links = load_link_matrix(data_path("geo10_aws.csv"))
    assert len(links) == 45
    assert links[frozenset(("Oregon", "Tokyo"))] == LinkSpec(96.0, 0.523)
    assert links[frozenset(("Frankfurt", "Ireland"))] == LinkSpec(24.0, 1.08)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a,b,c\nX,Y,1,1\n", "the first line must be the header"),
        ("", "the first line must be the header"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,1\n", "line 2: expected 4"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,fast,1\n", "line 2: 'rtt_ms' must be a number"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,1,0\n", "line 2: 'bandwidth_gbps' must be"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,-1,1\n", "line 2: 'rtt_ms' must be"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,1,nan\n", "line 2: 'bandwidth_gbps' must be"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,X,1,1\n", "joins a location to itself"),
        ("src,dst,rtt_ms,bandwidth_gbps\n,Y,1,1\n", "line 2: 'src' must be"),
        ("src,dst,rtt_ms,bandwidth_gbps\nX,Y,1,1\n\nY,X,2,1\n", "line 4: link 'X'-'Y' is given"),
    ],
)
def test_load_link_matrix_bad_rows(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        load_link_matrix(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_load_link_matrix_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read link matrix"):
        load_link_matrix(tmp_path / "none.csv")


def test_load_link_matrix_accepts_both_directions_with_equal_numbers(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("src,dst,rtt_ms,bandwidth_gbps\nX,Y,3,1.5\nY,X,3,1.5\n")
    assert load_link_matrix(path) == {frozenset(("X", "Y")): LinkSpec(3.0, 1.5)}
