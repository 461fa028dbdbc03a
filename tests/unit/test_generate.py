"""Generated topologies: deterministic, valid, and faithful to the shipped data."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from gwtf.flow.generate import (
    data_path,
    geo10,
    geo10_links,
    geo10_regions,
    gpu_speeds,
    random_layered,
    topology_to_file,
)
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, TopologyError, load_topology, parse_topology

REGIONS = {
    "Oregon",
    "Virginia",
    "Ohio",
    "Tokyo",
    "Seoul",
    "Singapore",
    "Sydney",
    "London",
    "Frankfurt",
    "Ireland",
}


def read_csv(name: str) -> list[dict[str, str]]:
    with open(data_path(name), newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_random_layered_is_deterministic_for_a_seed() -> None:
    def make(seed: int) -> dict[str, object]:
        return random_layered(np.random.default_rng(seed), 60, 6).to_json()

    assert make(3) == make(3)
    assert json.dumps(make(3)) == json.dumps(make(3))
    assert make(3) != make(4)


def test_geo10_is_deterministic_for_a_seed() -> None:
    def make(seed: int) -> dict[str, object]:
        return geo10(np.random.default_rng(seed), 50, 5).to_json()

    assert make(11) == make(11)
    assert make(11) != make(12)


@pytest.mark.parametrize("seed", range(30))
def test_random_layered_is_always_valid(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_stages = int(rng.integers(2, 8))
    n_nodes = n_stages + int(rng.integers(0, 40))
    missing = float(rng.uniform(0, 1))
    locations = int(rng.integers(1, 8))
    topo = random_layered(rng, n_nodes, n_stages, missing_link_p=missing, n_locations=locations)
    assert len(topo.nodes) == n_nodes
    assert topo.num_stages == n_stages
    assert all(topo.stage_nodes(k) for k in range(n_stages))
    # the file format accepts it as it is
    assert parse_topology(json.loads(json.dumps(topo.to_json()))) == topo


def test_random_layered_is_heterogeneous() -> None:
    topo = random_layered(np.random.default_rng(0), 200, 5, missing_link_p=0.3)
    compute = [n.compute_s for n in topo.nodes]
    assert 0.005 <= min(compute) and max(compute) <= 0.5
    assert max(compute) / min(compute) > 10
    explicit = [n for n in topo.nodes if not n.default_capacity]
    assert 0 < len(explicit) < len(topo.nodes)
    assert all(n.capacity < 1 / n.compute_s for n in explicit)
    all_pairs = 5 * 4 // 2
    assert 0 < len(topo.links) < all_pairs
    for spec in topo.links.values():
        assert 1 <= spec.rtt_ms <= 300
        assert 0.05 <= spec.bandwidth_gbps <= 10
    arcs_per_node = [len(topo.out_arcs(n.id)) for n in topo.nodes if n.stage < 4]
    assert min(arcs_per_node) < max(arcs_per_node)


def test_random_layered_edge_cases() -> None:
    tight = random_layered(np.random.default_rng(1), 3, 3)
    assert [len(tight.stage_nodes(k)) for k in range(3)] == [1, 1, 1]
    lonely = random_layered(np.random.default_rng(1), 10, 2, missing_link_p=1.0)
    assert all(any(loc in pair for pair in lonely.links) for loc in ("L0", "L1", "L4"))
    one_place = random_layered(np.random.default_rng(1), 10, 2, n_locations=1)
    assert len(one_place.links) == 0
    assert len(one_place.arcs) == len(one_place.stage_nodes(0)) * len(one_place.stage_nodes(1))
    with pytest.raises(ValueError, match="n_stages"):
        random_layered(np.random.default_rng(1), 10, 1)
    with pytest.raises(ValueError, match="n_nodes"):
        random_layered(np.random.default_rng(1), 2, 3)


def test_geo10_uses_the_ten_regions_and_the_measured_links() -> None:
    topo = geo10(np.random.default_rng(0), 200, 4)
    assert {n.location for n in topo.nodes} <= REGIONS
    assert set(geo10_regions()) == REGIONS
    rows = read_csv("geo10_aws.csv")
    assert len(rows) == 45
    assert len(topo.links) == 45
    for row in rows:
        expected = LinkSpec(float(row["rtt_ms"]), float(row["bandwidth_gbps"]))
        assert topo.link_between(row["src"], row["dst"]) == expected
        assert topo.link_between(row["dst"], row["src"]) == expected
    assert topo.intra == DEFAULT_INTRA
    assert geo10_links() == dict(topo.links)


def test_geo10_compute_times_come_from_measured_gpus() -> None:
    base = 0.25
    topo = geo10(np.random.default_rng(5), 300, 3, base_compute_s=base)
    speeds = {float(row["relative_to_v100"]) for row in read_csv("gpu_train_throughput.csv")}
    assert len(gpu_speeds()) == 18
    allowed = {base / s for s in speeds}
    assert all(n.compute_s in allowed for n in topo.nodes)
    assert len({n.compute_s for n in topo.nodes}) > 5
    assert all(n.default_capacity for n in topo.nodes)
    # a V100 node takes exactly base_compute_s
    assert base / 1.0 in allowed


def test_geo10_stage_sizes() -> None:
    topo = geo10(np.random.default_rng(0), 23, 4)
    assert [len(topo.stage_nodes(k)) for k in range(4)] == [6, 6, 6, 5]
    assert len(topo.nodes) == 23
    even = geo10(np.random.default_rng(0), 40, 8)
    assert [len(even.stage_nodes(k)) for k in range(8)] == [5] * 8


def test_topology_to_file_round_trip(tmp_path: Path) -> None:
    topo = random_layered(np.random.default_rng(2), 25, 4)
    topo = topo.without_arc(topo.arcs[0].src, topo.arcs[0].dst)
    path = tmp_path / "t.json"
    topology_to_file(topo, path)
    assert load_topology(path) == topo
    assert path.read_text().endswith("\n")
    with pytest.raises(TopologyError, match="cannot write"):
        topology_to_file(topo, tmp_path / "missing-dir" / "t.json")


def test_data_path() -> None:
    assert data_path("geo10_aws.csv").is_file()
    assert data_path("gpu_train_throughput.csv").is_file()
    assert (data_path("geo10_aws.csv").parent / "ATTRIBUTION.md").is_file()
    with pytest.raises(FileNotFoundError):
        data_path("nope.csv")
