"""Topologies for tests and benchmarks, deterministic for a given numpy Generator.

- `random_layered`: synthetic, adversarial on purpose (missing links, very uneven nodes).
- `geo10`: realistic, from measured data shipped in gwtf/data (see gwtf/data/ATTRIBUTION.md):
  the 10 AWS regions of DT-FM's world-wide case and measured GPU training speeds.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from functools import cache
from itertools import combinations
from os import PathLike
from pathlib import Path

import numpy as np

from gwtf.flow.topology import (
    DEFAULT_INTRA,
    LinkSpec,
    Members,
    NodeSpec,
    Topology,
    TopologyError,
    load_link_matrix,
    parse_members,
)

__all__ = [
    "GEO10_FILE",
    "GPU_FILE",
    "data_path",
    "geo10",
    "geo10_links",
    "geo10_members",
    "geo10_regions",
    "gpu_speeds",
    "members_to_file",
    "random_layered",
    "topology_to_file",
]

GEO10_FILE = "geo10_aws.csv"
GPU_FILE = "gpu_train_throughput.csv"

_DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def data_path(name: str) -> Path:
    """The path of a data file shipped in gwtf/data (FileNotFoundError if there is none)."""
    path = _DATA_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no data file {name!r} in {_DATA_DIR}")
    return path


@cache
def _geo10_links() -> dict[frozenset[str], LinkSpec]:
    return load_link_matrix(data_path(GEO10_FILE))


def geo10_links() -> dict[frozenset[str], LinkSpec]:
    """The 45 measured links between the 10 regions of gwtf/data/geo10_aws.csv (a fresh copy)."""
    return dict(_geo10_links())


@cache
def geo10_regions() -> tuple[str, ...]:
    """The 10 regions of gwtf/data/geo10_aws.csv, in the order they first appear in it."""
    with open(data_path(GEO10_FILE), encoding="utf-8", newline="") as handle:
        regions: dict[str, None] = {}
        for row in csv.DictReader(handle):
            regions.setdefault(row["src"], None)
            regions.setdefault(row["dst"], None)
    return tuple(regions)


@cache
def gpu_speeds() -> tuple[tuple[str, float], ...]:
    """(gpu, training speed relative to a V100) for each row of gpu_train_throughput.csv."""
    speeds: list[tuple[str, float]] = []
    with open(data_path(GPU_FILE), encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            speed = float(row["relative_to_v100"])
            if not math.isfinite(speed) or speed <= 0:
                raise ValueError(f"{GPU_FILE}: GPU {row['gpu']!r} has speed {speed}")
            speeds.append((row["gpu"], speed))
    return tuple(speeds)


def _check_sizes(n_nodes: int, n_stages: int) -> None:
    if n_stages < 2:
        raise ValueError(f"n_stages must be at least 2, got {n_stages}")
    if n_nodes < n_stages:
        raise ValueError(f"n_nodes ({n_nodes}) must be at least n_stages ({n_stages})")


def _node_id(stage: int, index: int, width: int) -> str:
    # Zero-padded so that sorting ids as strings keeps their numeric order.
    return f"s{stage}n{index:0{width}d}"


def random_layered(
    rng: np.random.Generator,
    n_nodes: int,
    n_stages: int,
    *,
    missing_link_p: float = 0.2,
    n_locations: int = 5,
    activation_bytes: int = 8 * 2**20,
) -> Topology:
    """A random valid topology: heterogeneous nodes, links and missing links.

    Each stage gets at least one node, the others go to random stages. Locations L0..L{k-1} are
    joined pairwise by links of random RTT (uniform 1..300 ms) and bandwidth (log-uniform
    0.05..10 Gbit/s); each pair is missing with probability `missing_link_p` (every location keeps
    at least one link, so the file format accepts the result), so some nodes have few arcs or none.
    compute_s is log-uniform in 0.005..0.5 s; about a quarter of the nodes get an explicit
    capacity below 1 / compute_s (as if limited by memory or bandwidth).
    """
    _check_sizes(n_nodes, n_stages)
    if n_locations < 1:
        raise ValueError(f"n_locations must be at least 1, got {n_locations}")
    if not 0.0 <= missing_link_p <= 1.0:
        raise ValueError(f"missing_link_p must be in [0, 1], got {missing_link_p}")

    locations = [f"L{i}" for i in range(n_locations)]
    links: dict[frozenset[str], LinkSpec] = {}
    for a, b in combinations(locations, 2):
        rtt = round(float(rng.uniform(1.0, 300.0)), 1)
        bandwidth = round(float(math.exp(rng.uniform(math.log(0.05), math.log(10.0)))), 4)
        if rng.random() >= missing_link_p:
            links[frozenset((a, b))] = LinkSpec(rtt, bandwidth)
    linked = {loc for pair in links for loc in pair}
    for loc in locations:
        if n_locations > 1 and loc not in linked:
            other = locations[int(rng.integers(n_locations - 1))]
            other = other if other != loc else locations[-1]
            rtt = round(float(rng.uniform(1.0, 300.0)), 1)
            bandwidth = round(float(math.exp(rng.uniform(math.log(0.05), math.log(10.0)))), 4)
            links[frozenset((loc, other))] = LinkSpec(rtt, bandwidth)
            linked.update((loc, other))

    stages = list(range(n_stages)) + [
        int(s) for s in rng.integers(0, n_stages, size=n_nodes - n_stages)
    ]
    width = len(str(n_nodes))
    counts = [0] * n_stages
    nodes: list[NodeSpec] = []
    for stage in stages:
        compute_s = round(float(math.exp(rng.uniform(math.log(0.005), math.log(0.5)))), 6)
        location = locations[int(rng.integers(n_locations))]
        capacity = None
        if rng.random() < 0.25:
            capacity = round(float(rng.uniform(0.3, 1.0)) / compute_s, 3)
        nodes.append(
            NodeSpec.make(
                _node_id(stage, counts[stage], width), stage, compute_s, location, capacity
            )
        )
        counts[stage] += 1
    return Topology.build(activation_bytes, nodes, links, DEFAULT_INTRA)


def _geo10_nodes(
    rng: np.random.Generator, n_nodes: int, n_stages: int, base_compute_s: float
) -> list[NodeSpec]:
    _check_sizes(n_nodes, n_stages)
    if not math.isfinite(base_compute_s) or base_compute_s <= 0:
        raise ValueError(f"base_compute_s must be a positive number, got {base_compute_s}")
    regions = geo10_regions()
    gpus = gpu_speeds()
    per_stage, extra = divmod(n_nodes, n_stages)
    width = len(str(per_stage + 1))
    nodes: list[NodeSpec] = []
    for stage in range(n_stages):
        for index in range(per_stage + (1 if stage < extra else 0)):
            region = regions[int(rng.integers(len(regions)))]
            _, speed = gpus[int(rng.integers(len(gpus)))]
            nodes.append(
                NodeSpec.make(_node_id(stage, index, width), stage, base_compute_s / speed, region)
            )
    return nodes


def geo10(
    rng: np.random.Generator,
    n_nodes: int,
    n_stages: int,
    *,
    activation_bytes: int = 8 * 2**20,
    base_compute_s: float = 0.1,
) -> Topology:
    """A world-wide topology from measured data: 10 AWS regions and real GPU speeds.

    Nodes are spread uniformly at random over the 10 regions of gwtf/data/geo10_aws.csv, whose
    45 pairs are the links (two nodes in the same region: 1 ms RTT, 10 Gbit/s). Each node gets a
    GPU drawn uniformly from the rows of gwtf/data/gpu_train_throughput.csv, and
    compute_s = base_compute_s / relative_to_v100, where `base_compute_s` is the seconds one
    stage takes per microbatch (forward + backward) on a V100. Each stage gets
    n_nodes // n_stages nodes, the remainder going one each to the first stages.
    """
    nodes = _geo10_nodes(rng, n_nodes, n_stages, base_compute_s)
    return Topology.build(activation_bytes, nodes, geo10_links(), DEFAULT_INTRA)


def geo10_members(
    rng: np.random.Generator,
    n_nodes: int,
    n_stages: int,
    *,
    activation_bytes: int = 8 * 2**20,
    base_compute_s: float = 0.1,
) -> Members:
    """The Members of `geo10` with the same arguments (same draws, same nodes), without building
    the topology's arcs: the way to 10,000 nodes in 20 stages (4.75 million arcs)."""
    nodes = _geo10_nodes(rng, n_nodes, n_stages, base_compute_s)
    return parse_members(
        {
            "activation_bytes": activation_bytes,
            "nodes": [_node_entry(n) for n in nodes],
            "links": _link_entries(geo10_links()),
            "intra_location": {
                "rtt_ms": DEFAULT_INTRA.rtt_ms,
                "bandwidth_gbps": DEFAULT_INTRA.bandwidth_gbps,
            },
        }
    )


def _node_entry(node: NodeSpec) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": node.id,
        "stage": node.stage,
        "compute_s": node.compute_s,
        "location": node.location,
    }
    if not node.default_capacity:
        entry["capacity"] = node.capacity
    return entry


def _link_entries(links: Mapping[frozenset[str], LinkSpec]) -> list[dict[str, object]]:
    return [
        {"src": a, "dst": b, "rtt_ms": link.rtt_ms, "bandwidth_gbps": link.bandwidth_gbps}
        for (a, b), link in sorted((tuple(sorted(k)), v) for k, v in links.items())
    ]


def members_to_file(members: Members, path: str | PathLike[str]) -> None:
    """Write `members` in the topology file format (what topology_to_file writes)."""
    document: dict[str, object] = {
        "activation_bytes": members.activation_bytes,
        "nodes": [_node_entry(n) for n in members.nodes],
        "links": _link_entries(members.links),
        "intra_location": {
            "rtt_ms": members.intra.rtt_ms,
            "bandwidth_gbps": members.intra.bandwidth_gbps,
        },
    }
    if members.blocked:
        document["blocked_arcs"] = [{"src": s, "dst": d} for s, d in sorted(members.blocked)]
    _write(document, path)


def topology_to_file(topology: Topology, path: str | PathLike[str]) -> None:
    """Write `topology` in the file format (JSON, indented, deterministic)."""
    _write(topology.to_json(), path)


def _write(document: object, path: str | PathLike[str]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
    except OSError as err:
        raise TopologyError(f"cannot write topology file {str(path)!r}: {err.strerror}") from None
