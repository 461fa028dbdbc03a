"""The topology model of one job and its file format (a contract shared by every solver).

A topology is a set of nodes, each holding one pipeline stage `0..S-1` at one location, plus the
links between locations. There is an arc from every node of stage `k` to every node of stage
`k+1` whose location is the same (the `intra_location` link applies) or joined by a link, unless
the pair is blocked (a link failure between those two nodes only).

Units and formulas (docs/design.md 2):

- node capacity, microbatches/s: `capacity` if given, else `1 / compute_s`;
- arc capacity, microbatches/s: `bandwidth_gbps * 1e9 / 8 / activation_bytes`;
- arc cost, seconds: `(c_i + c_j)/2 + rtt_ms/2000 + activation_bytes*8/(bandwidth_gbps*1e9)`,
  the average of the forward and backward cost over a symmetric link.

Every solver works on the same integers, so that the decentralized solver and the oracle agree
exactly: `cap_units = int(capacity * CAP_SCALE)` (floor, at least 0) and
`cost_units = round(cost * COST_SCALE)`.

File format (JSON)::

    {"activation_bytes": 8388608,
     "nodes": [{"id": "h0", "stage": 0, "compute_s": 0.02, "location": "Oregon"},
               {"id": "a1", "stage": 1, "compute_s": 0.11, "location": "Tokyo", "capacity": 5.0}],
     "links": [{"src": "Oregon", "dst": "Tokyo", "rtt_ms": 96, "bandwidth_gbps": 0.523}],
     "intra_location": {"rtt_ms": 1, "bandwidth_gbps": 10},
     "blocked_arcs": [{"src": "h0", "dst": "a1"}]}

`intra_location` and `blocked_arcs` are optional; links are symmetric.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "CAP_SCALE",
    "COST_SCALE",
    "DEFAULT_INTRA",
    "ArcSpec",
    "LinkKey",
    "LinkMap",
    "LinkSpec",
    "Members",
    "NodeSpec",
    "Topology",
    "TopologyError",
    "access_capacity",
    "cap_to_units",
    "cost_to_units",
    "load_link_matrix",
    "load_members",
    "load_topology",
    "parse_members",
    "parse_topology",
]

CAP_SCALE = 1_000_000
"""Flow units per microbatch/s."""

COST_SCALE = 1_000_000_000
"""Cost units per second (so one cost unit is a nanosecond)."""

StrPath = str | PathLike[str]

LinkKey = frozenset[str] | tuple[str, str]
# Mapping is invariant in its key type, so a dict keyed only by frozensets (or only by tuples)
# is not a Mapping[LinkKey, ...]: accept all three.
LinkMap = (
    Mapping[frozenset[str], "LinkSpec"]
    | Mapping[tuple[str, str], "LinkSpec"]
    | Mapping[LinkKey, "LinkSpec"]
)


class TopologyError(ValueError):
    """A topology (or a link matrix) is invalid; the message is one sentence saying what to fix."""


def cap_to_units(capacity: float) -> int:
    """Microbatches/s -> integer flow units, floored, never negative."""
    return max(0, int(capacity * CAP_SCALE))


def access_capacity(gbps: float, stage: int, stages: int, activation_bytes: float) -> float:
    """Microbatches/s a node's access link carries (`gbps`: its uplink, shared by everything
    it sends; inf: not said): a microbatch crosses it once per neighbouring stage, the
    activation down and the gradient (the same size) up. A node's capacity is the least of
    this and its compute (docs/design.md 2.1); the node and the simulator both use it."""
    sides = (stage > 0) + (stage < stages - 1)
    if not sides:
        return math.inf
    per_mb = sides * activation_bytes * 8 / 1e9
    return gbps / per_mb


def _bytes_at(activation_bytes: int, sizes: tuple[int, ...] | None, k: int) -> int:
    """The bytes boundary `k` sends: its plan's where one is given, else the activation's."""
    return activation_bytes if sizes is None or k >= len(sizes) else sizes[k]


def cost_to_units(cost: float) -> int:
    """Seconds -> integer cost units (nanoseconds), rounded."""
    return round(cost * COST_SCALE)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A symmetric link between two locations: round-trip time and bandwidth."""

    rtt_ms: float
    bandwidth_gbps: float


DEFAULT_INTRA = LinkSpec(rtt_ms=1.0, bandwidth_gbps=10.0)
"""Two nodes at the same location: about 1 ms RTT and 10 Gbit/s (shared/data/README.md)."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: its id, stage, compute time per microbatch (s), location and capacity (mb/s)."""

    id: str
    stage: int
    compute_s: float
    location: str
    capacity: float

    @classmethod
    def make(
        cls,
        id: str,
        stage: int,
        compute_s: float,
        location: str,
        capacity: float | None = None,
    ) -> NodeSpec:
        """A node whose capacity defaults to `1 / compute_s` when not given."""
        if capacity is None:
            positive = _finite(compute_s)
            capacity = 1.0 / positive if positive is not None and positive > 0 else 0.0
        return cls(id, stage, compute_s, location, capacity)

    @property
    def cap_units(self) -> int:
        return cap_to_units(self.capacity)

    @property
    def default_capacity(self) -> bool:
        """True when the capacity is `1 / compute_s` (then the file format leaves it out)."""
        return self.compute_s > 0 and self.capacity == 1.0 / self.compute_s


@dataclass(frozen=True, slots=True)
class ArcSpec:
    """A directed arc between nodes of consecutive stages, with its capacity and cost."""

    src: str
    dst: str
    capacity: float
    cost: float
    cap_units: int
    cost_units: int


# ---------------------------------------------------------------------------------------------
# value checks shared by the parser and the programmatic constructor


def _finite(value: object) -> float | None:
    """`value` as a finite float, or None when it is not a finite number (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_positive(where: str, key: str, value: object) -> float:
    number = _finite(value)
    if number is None or number <= 0:
        raise TopologyError(f"{where}: '{key}' must be a positive number, got {_show(value)}")
    return number


def _check_nonneg(where: str, key: str, value: object) -> float:
    number = _finite(value)
    if number is None or number < 0:
        raise TopologyError(f"{where}: '{key}' must be a number >= 0, got {_show(value)}")
    return number


def _check_name(where: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TopologyError(f"{where}: '{key}' must be a non-empty string, got {_show(value)}")
    return value


def _check_node(node: NodeSpec) -> None:
    where = f"node {node.id!r}" if isinstance(node.id, str) and node.id else "node"
    _check_name(where, "id", node.id)
    if not isinstance(node.stage, int) or isinstance(node.stage, bool) or node.stage < 0:
        raise TopologyError(f"{where}: 'stage' must be an integer >= 0, got {_show(node.stage)}")
    _check_positive(where, "compute_s", node.compute_s)
    _check_name(where, "location", node.location)
    _check_nonneg(where, "capacity", node.capacity)


def _link_name(a: str, b: str) -> str:
    return f"link {a!r}-{b!r}"


def _check_link(where: str, link: LinkSpec) -> None:
    _check_nonneg(where, "rtt_ms", link.rtt_ms)
    _check_positive(where, "bandwidth_gbps", link.bandwidth_gbps)


def _link_key(where: str, key: object) -> frozenset[str]:
    """A links-mapping key (frozenset or (a, b) tuple) -> frozenset of two location names."""
    if isinstance(key, frozenset | tuple | list):
        names = list(key)
    else:
        raise TopologyError(f"{where}: key {_show(key)} must be a pair of location names")
    if isinstance(key, frozenset) and len(names) == 1:
        names = names * 2
    if len(names) != 2 or not all(isinstance(n, str) and n for n in names):
        raise TopologyError(f"{where}: key {_show(key)} must be a pair of location names")
    if names[0] == names[1]:
        raise TopologyError(
            f"{_link_name(names[0], names[1])} joins a location to itself; remove it and set "
            "'intra_location' for same-location links"
        )
    return frozenset(names)


def _pair(key: frozenset[str]) -> tuple[str, str]:
    a, b = sorted(key)
    return a, b


def _validated(
    activation_bytes: int,
    nodes: list[NodeSpec],
    links: Mapping[frozenset[str], LinkSpec],
    intra: LinkSpec,
    blocked: Iterable[tuple[str, str]],
    *,
    check_locations: bool,
) -> tuple[tuple[NodeSpec, ...], list[list[str]], frozenset[tuple[str, str]]]:
    """The checks every topology passes (with or without its arcs built): nodes sorted by
    (stage, id), the ids of each stage, and the blocked pairs; TopologyError naming what to fix."""
    if (
        not isinstance(activation_bytes, int)
        or isinstance(activation_bytes, bool)
        or activation_bytes <= 0
    ):
        raise TopologyError(
            "topology: 'activation_bytes' must be a positive integer, "
            f"got {_show(activation_bytes)}"
        )
    if not isinstance(intra, LinkSpec):
        raise TopologyError(
            f"topology: 'intra_location' must be a LinkSpec, got {_show(intra)}"
        )
    _check_link("topology: 'intra_location'", intra)

    index: dict[str, NodeSpec] = {}
    for node in nodes:
        if not isinstance(node, NodeSpec):
            raise TopologyError(f"topology: nodes must be NodeSpec, got {_show(node)}")
        _check_node(node)
        if node.id in index:
            raise TopologyError(f"node {node.id!r} is defined twice; node ids must be unique")
        index[node.id] = node
    ordered = tuple(sorted(index.values(), key=lambda n: (n.stage, n.id)))
    if not ordered:
        raise TopologyError("topology: 'nodes' is empty; give at least one node per stage")
    num_stages = ordered[-1].stage + 1
    if num_stages < 2:
        raise TopologyError(
            f"topology: needs at least 2 stages, got {num_stages}; "
            "add nodes with stage 1 (the stages are 0..S-1)"
        )
    stage_lists: list[list[str]] = [[] for _ in range(num_stages)]
    for node in ordered:
        stage_lists[node.stage].append(node.id)
    for k, members in enumerate(stage_lists):
        if not members:
            raise TopologyError(
                f"topology: stage {k} has no node; stages must be numbered 0..{num_stages - 1} "
                "with at least one node each"
            )

    if check_locations:
        linked = {loc for pair in links for loc in pair}
        count: dict[str, int] = defaultdict(int)
        for node in ordered:
            count[node.location] += 1
        for node in ordered:
            if node.location not in linked and count[node.location] < 2:
                raise TopologyError(
                    f"node {node.id!r}: location {node.location!r} is unknown; add a link "
                    "from it in 'links' or fix the location name"
                )

    blocked_set: set[tuple[str, str]] = set()
    for item in blocked:
        if (
            not isinstance(item, tuple)
            or len(item) != 2
            or not all(isinstance(x, str) for x in item)
        ):
            raise TopologyError(f"blocked arc {_show(item)} must be a (src, dst) pair of ids")
        src, dst = item
        for end in (src, dst):
            if end not in index:
                raise TopologyError(
                    f"blocked arc {src!r}->{dst!r}: unknown node {end!r}; "
                    "name existing nodes only"
                )
        blocked_set.add((src, dst))
    return ordered, stage_lists, frozenset(blocked_set)


# ---------------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True, slots=True)
class _Reuse:
    """What an edit leaves alone: arcs of the previous topology not touching these may be kept."""

    arcs: Mapping[tuple[str, str], ArcSpec]
    changed_nodes: frozenset[str]
    changed_pairs: frozenset[frozenset[str]]


class Topology:
    """An immutable (by convention) topology: nodes, links, and the arcs they imply.

    Build one with `Topology.build`, `parse_topology` or `load_topology`; the `with_*` and
    `without_*` methods return a new Topology. Nodes are ordered by (stage, id) and arcs by
    (source stage, source, destination) everywhere.
    """

    __slots__ = (
        "_activation_bytes",
        "_boundary_bytes",
        "_intra",
        "_nodes",
        "_node_index",
        "_stages",
        "_links",
        "_blocked",
        "_arcs",
        "_arc_index",
        "_out",
        "_in",
    )

    _activation_bytes: int
    _boundary_bytes: tuple[int, ...] | None
    _intra: LinkSpec
    _nodes: tuple[NodeSpec, ...]
    _node_index: dict[str, NodeSpec]
    _stages: tuple[tuple[str, ...], ...]
    _links: dict[frozenset[str], LinkSpec]
    _blocked: frozenset[tuple[str, str]]
    _arcs: tuple[ArcSpec, ...]
    _arc_index: dict[tuple[str, str], ArcSpec]
    _out: dict[str, tuple[ArcSpec, ...]]
    _in: dict[str, tuple[ArcSpec, ...]]

    def __init__(self) -> None:
        raise TypeError("use Topology.build, parse_topology or load_topology")

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        activation_bytes: int,
        nodes: Iterable[NodeSpec],
        links: LinkMap,
        intra: LinkSpec = DEFAULT_INTRA,
        blocked: Iterable[tuple[str, str]] = (),
    ) -> Topology:
        """Validate and build a topology; raises TopologyError naming what to fix.

        `links` may key a pair by a frozenset or by a tuple; a pair given twice (as (a, b) and
        (b, a)) with different numbers is an error. `blocked` lists (src, dst) node pairs with no
        arc even though their locations are joined.
        """
        link_map: dict[frozenset[str], LinkSpec] = {}
        items: Iterable[tuple[object, object]] = links.items()
        for key, link in items:
            pair = _link_key("links", key)
            name = _link_name(*_pair(pair))
            if not isinstance(link, LinkSpec):
                raise TopologyError(f"{name}: must be a LinkSpec, got {_show(link)}")
            _check_link(name, link)
            old = link_map.get(pair)
            if old is not None and old != link:
                raise TopologyError(_duplicate_link_message(pair, old, link))
            link_map[pair] = link
        return cls._make(
            activation_bytes, list(nodes), link_map, intra, blocked, check_locations=True
        )

    @classmethod
    def _make(
        cls,
        activation_bytes: int,
        nodes: list[NodeSpec],
        links: dict[frozenset[str], LinkSpec],
        intra: LinkSpec,
        blocked: Iterable[tuple[str, str]],
        *,
        check_locations: bool,
        reuse: _Reuse | None = None,
        boundary_bytes: tuple[int, ...] | None = None,
    ) -> Topology:
        ordered, stage_lists, blocked_set = _validated(
            activation_bytes, nodes, links, intra, blocked, check_locations=check_locations
        )

        self = object.__new__(cls)
        self._activation_bytes = activation_bytes
        self._boundary_bytes = boundary_bytes
        self._intra = intra
        self._nodes = ordered
        self._node_index = {n.id: n for n in ordered}
        self._stages = tuple(tuple(s) for s in stage_lists)
        self._links = dict(sorted(links.items(), key=lambda kv: _pair(kv[0])))
        self._blocked = blocked_set
        self._build_arcs(reuse)
        return self

    def _build_arcs(self, previous: _Reuse | None) -> None:
        # Per location pair (and bytes), the link terms of the cost and the capacity, computed
        # once: arcs are |stage k| x |stage k+1|, links only |locations|^2. The last item says
        # whether arcs over this pair may be copied from the previous topology (an edit that
        # left it alone).
        per_pair: dict[tuple[str, str, int], tuple[float, float, float, int, bool] | None] = {}

        def link_terms(a: str, b: str, act: int) -> tuple[float, float, float, int, bool] | None:
            key = (a, b, act)
            if key not in per_pair:
                link = self.link_between(a, b)
                if link is None:
                    per_pair[key] = None
                else:
                    bw = link.bandwidth_gbps
                    capacity = bw * 1e9 / 8 / act
                    per_pair[key] = (
                        link.rtt_ms / 2000,
                        act * 8 / (bw * 1e9),
                        capacity,
                        cap_to_units(capacity),
                        previous is not None and frozenset((a, b)) not in previous.changed_pairs,
                    )
            return per_pair[key]

        old_arcs = previous.arcs if previous is not None else {}
        changed = previous.changed_nodes if previous is not None else frozenset()
        arcs: list[ArcSpec] = []
        out: dict[str, list[ArcSpec]] = {n.id: [] for n in self._nodes}
        into: dict[str, list[ArcSpec]] = {n.id: [] for n in self._nodes}
        blocked = self._blocked
        for k in range(len(self._stages) - 1):
            act = self.boundary_bytes(k)
            heads = [self._node_index[d] for d in self._stages[k + 1]]
            for src_id in self._stages[k]:
                src = self._node_index[src_id]
                c_i = src.compute_s
                src_same = src_id not in changed
                for dst in heads:
                    terms = link_terms(src.location, dst.location, act)
                    if terms is None or (blocked and (src_id, dst.id) in blocked):
                        continue
                    half_rtt, transfer, capacity, cap_units, reusable = terms
                    arc = None
                    if reusable and src_same and dst.id not in changed:
                        arc = old_arcs.get((src_id, dst.id))
                    if arc is None:
                        cost = (c_i + dst.compute_s) / 2 + half_rtt + transfer
                        arc = ArcSpec(
                            src_id, dst.id, capacity, cost, cap_units, cost_to_units(cost)
                        )
                    arcs.append(arc)
                    out[src_id].append(arc)
                    into[dst.id].append(arc)
        self._arcs = tuple(arcs)
        self._arc_index = {(a.src, a.dst): a for a in arcs}
        self._out = {k: tuple(v) for k, v in out.items()}
        self._in = {k: tuple(v) for k, v in into.items()}

    # -- queries ---------------------------------------------------------------------------

    @property
    def activation_bytes(self) -> int:
        return self._activation_bytes

    def boundary_bytes(self, k: int) -> int:
        """Bytes one microbatch sends across the boundary between stages k and k+1 (each way):
        the activation's, or its codec's where the topology was given per-boundary bytes."""
        return _bytes_at(self._activation_bytes, self._boundary_bytes, k)

    def with_boundary_bytes(self, sizes: Iterable[int] | None) -> Topology:
        """This topology with the bytes of each boundary given (a compression plan: docs/design.md
        2.15); None: every boundary sends `activation_bytes`."""
        fixed = None if sizes is None else tuple(int(b) for b in sizes)
        if fixed is not None and any(b <= 0 for b in fixed):
            raise TopologyError(f"boundary bytes must be positive integers, got {fixed}")
        return Topology._make(
            self._activation_bytes, list(self._nodes), dict(self._links), self._intra,
            self._blocked, check_locations=False, boundary_bytes=fixed,
        )  # fmt: skip

    @property
    def intra(self) -> LinkSpec:
        return self._intra

    @property
    def num_stages(self) -> int:
        return len(self._stages)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._nodes

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self._nodes)

    @property
    def links(self) -> Mapping[frozenset[str], LinkSpec]:
        """The links between distinct locations, keyed by unordered pair (read-only)."""
        return MappingProxyType(self._links)

    @property
    def blocked(self) -> frozenset[tuple[str, str]]:
        """(src, dst) node pairs that have no arc even though their locations are joined."""
        return self._blocked

    @property
    def arcs(self) -> tuple[ArcSpec, ...]:
        return self._arcs

    def has_node(self, node_id: str) -> bool:
        return node_id in self._node_index

    def node(self, node_id: str) -> NodeSpec:
        """The node with this id; KeyError if there is none."""
        try:
            return self._node_index[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the topology") from None

    def stage_nodes(self, stage: int) -> tuple[str, ...]:
        """Ids of the nodes of `stage`, sorted; empty outside 0..S-1."""
        if 0 <= stage < len(self._stages):
            return self._stages[stage]
        return ()

    def has_arc(self, src: str, dst: str) -> bool:
        return (src, dst) in self._arc_index

    def arc(self, src: str, dst: str) -> ArcSpec:
        """The arc src->dst; KeyError if there is none."""
        try:
            return self._arc_index[(src, dst)]
        except KeyError:
            raise KeyError(f"no arc {src!r}->{dst!r} in the topology") from None

    def out_arcs(self, node_id: str) -> tuple[ArcSpec, ...]:
        """Arcs leaving `node_id` (to stage + 1), sorted by destination; KeyError if unknown."""
        try:
            return self._out[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the topology") from None

    def in_arcs(self, node_id: str) -> tuple[ArcSpec, ...]:
        """Arcs entering `node_id` (from stage - 1), sorted by source; KeyError if unknown."""
        try:
            return self._in[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the topology") from None

    def link_between(self, loc_a: str, loc_b: str) -> LinkSpec | None:
        """The link joining two locations (`intra` when they are the same), or None."""
        if loc_a == loc_b:
            return self._intra
        return self._links.get(frozenset((loc_a, loc_b)))

    # -- edits (each returns a new Topology) ------------------------------------------------
    #
    # Edits re-check everything except the "unknown location" rule, which exists to catch typos
    # in files: churn can legitimately leave a node alone at a location with no link.

    def _edit(
        self,
        *,
        nodes: list[NodeSpec] | None = None,
        links: dict[frozenset[str], LinkSpec] | None = None,
        blocked: Iterable[tuple[str, str]] | None = None,
        changed_nodes: frozenset[str] = frozenset(),
        changed_pairs: frozenset[frozenset[str]] = frozenset(),
    ) -> Topology:
        # Arcs the edit cannot have touched are copied, not recomputed: with ~90,000 arcs a
        # rebuild from scratch would cost a churn simulation a third of a second per event.
        return Topology._make(
            self._activation_bytes,
            list(self._nodes) if nodes is None else nodes,
            dict(self._links) if links is None else links,
            self._intra,
            self._blocked if blocked is None else blocked,
            check_locations=False,
            reuse=_Reuse(self._arc_index, changed_nodes, changed_pairs),
            boundary_bytes=self._boundary_bytes,
        )

    def without_node(self, node_id: str) -> Topology:
        """This topology without the node (a leave or a crash), and without its blocked pairs."""
        if node_id not in self._node_index:
            raise TopologyError(f"node {node_id!r} is not in the topology; nothing to remove")
        nodes = [n for n in self._nodes if n.id != node_id]
        blocked = [p for p in self._blocked if node_id not in p]
        if not any(n.stage == self._node_index[node_id].stage for n in nodes):
            stage = self._node_index[node_id].stage
            raise TopologyError(
                f"removing node {node_id!r} would leave stage {stage} with no node; "
                "a topology needs at least one node per stage"
            )
        return self._edit(nodes=nodes, blocked=blocked)

    def with_node(self, node: NodeSpec) -> Topology:
        """This topology plus `node` (a join); a node with the same id is replaced."""
        nodes = [n for n in self._nodes if n.id != node.id]
        nodes.append(node)
        return self._edit(nodes=nodes, changed_nodes=frozenset((node.id,)))

    def with_capacities(self, capacities: Mapping[str, float]) -> Topology:
        """This topology with the named nodes' capacities replaced; arcs do not depend on them
        (their cost on compute times and links, their capacity on links), so they are kept."""
        nodes = [
            replace(n, capacity=capacities[n.id]) if n.id in capacities else n
            for n in self._nodes
        ]
        return self._edit(nodes=nodes)

    def _check_pair(self, src: str, dst: str) -> None:
        for end in (src, dst):
            if end not in self._node_index:
                raise TopologyError(f"arc {src!r}->{dst!r}: no node {end!r} in the topology")
        if self._node_index[dst].stage != self._node_index[src].stage + 1:
            raise TopologyError(
                f"arc {src!r}->{dst!r}: {dst!r} is not in the stage after {src!r}'s; "
                "arcs only join consecutive stages"
            )

    def without_arc(self, src: str, dst: str) -> Topology:
        """This topology with the pair src->dst blocked (a failed link between two nodes)."""
        self._check_pair(src, dst)
        return self._edit(blocked=self._blocked | {(src, dst)})

    def with_arc(self, src: str, dst: str) -> Topology:
        """This topology with src->dst unblocked; an error if their locations are not joined."""
        self._check_pair(src, dst)
        a, b = self._node_index[src].location, self._node_index[dst].location
        if self.link_between(a, b) is None:
            raise TopologyError(
                f"arc {src!r}->{dst!r}: locations {a!r} and {b!r} are not joined; "
                "add a link with with_link first"
            )
        return self._edit(blocked=self._blocked - {(src, dst)})

    def with_link(self, loc_a: str, loc_b: str, link: LinkSpec) -> Topology:
        """This topology with the link between two locations added or changed."""
        pair = _link_key("with_link", (loc_a, loc_b))
        name = _link_name(*_pair(pair))
        if not isinstance(link, LinkSpec):
            raise TopologyError(f"{name}: must be a LinkSpec, got {_show(link)}")
        _check_link(name, link)
        links = dict(self._links)
        links[pair] = link
        return self._edit(links=links, changed_pairs=frozenset((pair,)))

    def without_link(self, loc_a: str, loc_b: str) -> Topology:
        """This topology with the link between two distinct locations removed."""
        pair = _link_key("without_link", (loc_a, loc_b))
        if pair not in self._links:
            raise TopologyError(f"{_link_name(*_pair(pair))} is not in the topology")
        links = {k: v for k, v in self._links.items() if k != pair}
        return self._edit(links=links, changed_pairs=frozenset((pair,)))

    # -- serialization ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """This topology in the file format (`capacity` only where it is not 1 / compute_s)."""
        nodes: list[dict[str, Any]] = []
        for n in self._nodes:
            entry: dict[str, Any] = {
                "id": n.id,
                "stage": n.stage,
                "compute_s": n.compute_s,
                "location": n.location,
            }
            if not n.default_capacity:
                entry["capacity"] = n.capacity
            nodes.append(entry)
        links = [
            {"src": a, "dst": b, "rtt_ms": link.rtt_ms, "bandwidth_gbps": link.bandwidth_gbps}
            for (a, b), link in sorted((_pair(k), v) for k, v in self._links.items())
        ]
        result: dict[str, Any] = {
            "activation_bytes": self._activation_bytes,
            "nodes": nodes,
            "links": links,
            "intra_location": {
                "rtt_ms": self._intra.rtt_ms,
                "bandwidth_gbps": self._intra.bandwidth_gbps,
            },
        }
        if self._blocked:
            result["blocked_arcs"] = [{"src": s, "dst": d} for s, d in sorted(self._blocked)]
        return result

    # -- value semantics -------------------------------------------------------------------

    def _key(self) -> tuple[object, ...]:
        return (
            self._activation_bytes,
            self._boundary_bytes,
            self._intra,
            self._nodes,
            frozenset(self._links.items()),
            self._blocked,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Topology(stages={self.num_stages}, nodes={len(self._nodes)}, "
            f"arcs={len(self._arcs)}, links={len(self._links)})"
        )


def _duplicate_link_message(pair: frozenset[str], old: LinkSpec, new: LinkSpec) -> str:
    return (
        f"{_link_name(*_pair(pair))} is given twice with different numbers "
        f"(rtt_ms {old.rtt_ms:g} vs {new.rtt_ms:g}, bandwidth_gbps {old.bandwidth_gbps:g} vs "
        f"{new.bandwidth_gbps:g}); keep one"
    )


# ---------------------------------------------------------------------------------------------
# the file format

_TOP_KEYS = ("activation_bytes", "nodes", "links", "intra_location", "blocked_arcs")
_NODE_KEYS = ("id", "stage", "compute_s", "location", "capacity")
_LINK_KEYS = ("src", "dst", "rtt_ms", "bandwidth_gbps")
_INTRA_KEYS = ("rtt_ms", "bandwidth_gbps")
_BLOCKED_KEYS = ("src", "dst")


def _object(where: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TopologyError(f"{where} must be a JSON object, got {_show(value)}")
    return value


def _list(where: str, key: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TopologyError(f"{where}: '{key}' must be a list, got {_show(value)}")
    return value


def _check_keys(where: str, obj: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            raise TopologyError(
                f"{where}: unknown key {key!r}; the allowed keys are {', '.join(allowed)}"
            )


def _require(where: str, obj: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in obj:
        raise TopologyError(f"{where}: missing '{key}'; give {what}")
    return obj[key]


def _parse_node(i: int, raw: object) -> NodeSpec:
    obj = _object(f"nodes[{i}]", raw)
    where = f"nodes[{i}]"
    node_id = _check_name(where, "id", _require(where, obj, "id", "a unique string id"))
    where = f"node {node_id!r}"
    _check_keys(where, obj, _NODE_KEYS)
    stage = _require(where, obj, "stage", "its pipeline stage, an integer >= 0")
    if not isinstance(stage, int) or isinstance(stage, bool) or stage < 0:
        raise TopologyError(f"{where}: 'stage' must be an integer >= 0, got {_show(stage)}")
    compute_s = _check_positive(
        where,
        "compute_s",
        _require(where, obj, "compute_s", "its seconds of compute per microbatch"),
    )
    location = _check_name(
        where, "location", _require(where, obj, "location", "the name of its location")
    )
    capacity = _check_nonneg(where, "capacity", obj["capacity"]) if "capacity" in obj else None
    return NodeSpec.make(node_id, stage, compute_s, location, capacity)


def _parse_link_fields(where: str, obj: Mapping[str, Any]) -> LinkSpec:
    rtt = _check_nonneg(
        where, "rtt_ms", _require(where, obj, "rtt_ms", "the round-trip time in ms")
    )
    bw = _check_positive(
        where,
        "bandwidth_gbps",
        _require(where, obj, "bandwidth_gbps", "the bandwidth in Gbit/s"),
    )
    return LinkSpec(rtt, bw)


def _parse_link(i: int, raw: object) -> tuple[frozenset[str], LinkSpec]:
    where = f"links[{i}]"
    obj = _object(where, raw)
    src = _check_name(where, "src", _require(where, obj, "src", "a location name"))
    dst = _check_name(where, "dst", _require(where, obj, "dst", "a location name"))
    where = f"link {src!r}-{dst!r}"
    _check_keys(where, obj, _LINK_KEYS)
    pair = _link_key(where, (src, dst))
    return pair, _parse_link_fields(where, obj)


_Document = tuple[int, list[NodeSpec], dict[frozenset[str], LinkSpec], LinkSpec,
                  list[tuple[str, str]]]


def _parse_document(obj: object) -> _Document:
    top = _object("topology", obj)
    _check_keys("topology", top, _TOP_KEYS)
    activation_bytes = _require(
        "topology", top, "activation_bytes", "the bytes of one activation, a positive integer"
    )
    raw_nodes = _list(
        "topology",
        "nodes",
        _require("topology", top, "nodes", "the list of nodes"),
    )
    raw_links = _list("topology", "links", top.get("links", []))
    nodes = [_parse_node(i, raw) for i, raw in enumerate(raw_nodes)]

    links: dict[frozenset[str], LinkSpec] = {}
    for i, raw in enumerate(raw_links):
        pair, link = _parse_link(i, raw)
        old = links.get(pair)
        if old is not None and old != link:
            raise TopologyError(_duplicate_link_message(pair, old, link))
        links[pair] = link

    intra = DEFAULT_INTRA
    if "intra_location" in top:
        where = "topology: 'intra_location'"
        intra_obj = _object(where, top["intra_location"])
        _check_keys(where, intra_obj, _INTRA_KEYS)
        intra = _parse_link_fields(where, intra_obj)

    blocked: list[tuple[str, str]] = []
    for i, raw in enumerate(_list("topology", "blocked_arcs", top.get("blocked_arcs", []))):
        where = f"blocked_arcs[{i}]"
        item = _object(where, raw)
        _check_keys(where, item, _BLOCKED_KEYS)
        src = _check_name(where, "src", _require(where, item, "src", "a node id"))
        dst = _check_name(where, "dst", _require(where, item, "dst", "a node id"))
        blocked.append((src, dst))

    return activation_bytes, nodes, links, intra, blocked


def parse_topology(obj: object) -> Topology:
    """A Topology from a decoded JSON document in the file format; TopologyError if invalid."""
    activation_bytes, nodes, links, intra, blocked = _parse_document(obj)
    return Topology._make(activation_bytes, nodes, links, intra, blocked, check_locations=True)


@dataclass(frozen=True)
class Members:
    """What a topology is made of, checked like a Topology but without its arcs.

    A Topology lists every arc, |stage k| x |stage k+1| of them: 4.75 million ArcSpecs (seconds
    and over a gigabyte) for 10,000 nodes in 20 stages. A solver that only needs the nodes and
    the links (gwtf/flow/localsolve.py) reads this instead. Nodes are sorted by (stage, id).
    """

    activation_bytes: int
    nodes: tuple[NodeSpec, ...]
    links: Mapping[frozenset[str], LinkSpec]
    intra: LinkSpec
    blocked: frozenset[tuple[str, str]]
    boundary_bytes: tuple[int, ...] | None = None
    """Bytes per boundary (a compression plan, docs/design.md 2.15); None: activation_bytes."""

    def bytes_at(self, stage: int) -> int:
        """Bytes an arc from `stage` to the next sends per microbatch (as Topology's)."""
        return _bytes_at(self.activation_bytes, self.boundary_bytes, stage)

    @classmethod
    def of(cls, topology: Topology) -> Members:
        return cls(
            topology.activation_bytes,
            topology.nodes,
            MappingProxyType(dict(topology.links)),
            topology.intra,
            topology.blocked,
            topology._boundary_bytes,
        )


def parse_members(obj: object) -> Members:
    """The Members of a decoded JSON document in the file format; TopologyError if invalid."""
    activation_bytes, nodes, links, intra, blocked = _parse_document(obj)
    ordered, _, blocked_set = _validated(
        activation_bytes, nodes, links, intra, blocked, check_locations=True
    )
    return Members(activation_bytes, ordered, MappingProxyType(links), intra, blocked_set)


def load_members(path: StrPath) -> Members:
    """Read and validate a topology file without building its arcs (see Members)."""
    document = _read_document(path)
    try:
        return parse_members(document)
    except TopologyError as err:
        raise TopologyError(f"topology file {str(path)!r}: {err}") from None


def _read_document(path: StrPath) -> object:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TopologyError(f"cannot read topology file {str(path)!r}: {reason}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise TopologyError(
            f"topology file {str(path)!r} is not valid JSON: {err.msg} at line {err.lineno} "
            f"column {err.colno}"
        ) from None
    return document


def load_topology(path: StrPath) -> Topology:
    """Read and validate a topology file; every problem is a one-line TopologyError."""
    document = _read_document(path)
    try:
        return parse_topology(document)
    except TopologyError as err:
        raise TopologyError(f"topology file {str(path)!r}: {err}") from None


_MATRIX_HEADER = ["src", "dst", "rtt_ms", "bandwidth_gbps"]


def load_link_matrix(path: StrPath) -> dict[frozenset[str], LinkSpec]:
    """Read a CSV link matrix with header `src,dst,rtt_ms,bandwidth_gbps` (one row per pair).

    Links are symmetric: a pair may appear in either direction, twice only with equal numbers.
    """
    name = str(path)
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise TopologyError(f"cannot read link matrix {name!r}: {reason}") from None
    if not rows or [c.strip() for c in rows[0]] != _MATRIX_HEADER:
        raise TopologyError(
            f"link matrix {name!r}: the first line must be the header '{','.join(_MATRIX_HEADER)}'"
        )
    links: dict[frozenset[str], LinkSpec] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        where = f"link matrix {name!r} line {lineno}"
        if len(row) != 4:
            raise TopologyError(f"{where}: expected 4 comma-separated fields, got {len(row)}")
        src, dst, rtt_text, bw_text = (c.strip() for c in row)
        numbers: list[float] = []
        for key, text in (("rtt_ms", rtt_text), ("bandwidth_gbps", bw_text)):
            try:
                numbers.append(float(text))
            except ValueError:
                raise TopologyError(f"{where}: '{key}' must be a number, got {text!r}") from None
        _check_name(where, "src", src)
        _check_name(where, "dst", dst)
        if src == dst:
            raise TopologyError(
                f"{where}: {_link_name(src, dst)} joins a location to itself; remove the row "
                "(same-location links are not part of a link matrix)"
            )
        pair = _link_key(where, (src, dst))
        link = LinkSpec(
            _check_nonneg(where, "rtt_ms", numbers[0]),
            _check_positive(where, "bandwidth_gbps", numbers[1]),
        )
        old = links.get(pair)
        if old is not None and old != link:
            raise TopologyError(f"{where}: {_duplicate_link_message(pair, old, link)}")
        links[pair] = link
    return links
