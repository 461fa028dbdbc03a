"""Activation compression at stage boundaries in the simulator (docs/design.md 2.15 and 5): what
each policy sends across each boundary, what that costs in compute, and how the flow structures
that take one activation size see a plan that differs between boundaries.

A scenario turns compression on with a `[compression]` table (`allow = ["int8"]`, the codecs
the job allows, as the job's own `[compression] allow`); without it every policy sends
activations and gradients uncompressed and every figure is what it was before compression
existed. With it, each policy runs on its own copy of the scenario (`for_policy`):

- `gwtf`, `gwtf-fixed` and `oracle` plan the job when it starts, as the node does at
  submission: `gwtf.flow.compression.swarm_plan` over the job's first members (their compute,
  their locations, and their access links where the scenario gives them), one codec per
  boundary. The plan is not revisited during the run, because the node does not revisit it:
  the plan is part of the job (`[compression] after`), so that a replacement node and the
  one-process reference round-trip the same boundaries with the same codec; a swarm that
  switched codecs in the middle of a job would train a different model than the one it
  started and could not be checked against the reference.
- `gwtf-uncompressed` is `gwtf` with every boundary `none` (the comparison the compression is
  measured by): on such a scenario it runs exactly as `gwtf` runs with compression off.
- `swarm`, `swarm-rebalance` and `swarm-routing` send 8-bit on every boundary, as SWARM ships
  (hivemind's blockwise 8-bit quantization of activations and gradients), wherever the links
  bind or not.
- `dtfm` sends uncompressed (DT-FM's schedule does not compress).

What is charged (`with_plan`):

- bytes: a boundary of codec `none` sends the scenario's activation (`tokens x hidden x
  activation_dtype_bytes`); a lossy codec sends its wire parts for `tokens x hidden` values
  (`gwtf.flow.compression.wire_bytes`: for int8 one byte a value and a 4-byte scale per 64
  values). For a 4-byte activation this is `gwtf.flow.compression.boundary_sizes`; for a
  2-byte one (fp16/bf16, most scenarios) int8 halves the bytes rather than quartering them,
  as SWARM's 8-bit halves its fp16 activations. Every send of an activation or gradient
  across boundary k, every arc capacity and cost across it and every access-link bound
  (`gwtf.flow.compression.uplink_capacity`) use that boundary's bytes.
- compute: a node next to a lossy boundary encodes what it sends across it and decodes what it
  receives, once each per microbatch (the activation one way, its gradient the other), on its
  CPU; `CODEC_S_PER_BYTE` seconds per float32 byte of the tensor (`tokens x hidden` values),
  added to the node's seconds per microbatch (`Scenario.compute_s`), and so to its capacity in
  the flow and to what its pace measures.

The flow topology (`Simulation.topology`: the oracle, the relaxation) and every node's
`LocalRoute` (`LocalRoute.set_boundary_bytes`, as the node's routing sets it while a job's plan
holds) price each boundary with its bytes. Placement (`gwtf.flow.placement.Swarm`) takes one
activation size for every boundary: a plan with one codec everywhere gives it that codec's
bytes, which is exact; a plan that mixes codecs gives it `RouteView`'s locations tagged with the
stage (`"loc@k"`) and a link between `a@k` and `b@k+1` for each boundary whose bandwidth is
scaled by `activation_bytes / bytes(k)`, so that every arc across boundary k has the capacity
and the transfer time of bytes(k) on the real link: the same flow problem, boundary by boundary.
(The node's own placement of a joiner, `gwtf.node.control.entry`, prices float32 activations
whatever the plan.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gwtf.flow.compression import (
    boundary_sizes,
    codec_info,
    stage_codec_seconds,
    swarm_plan,
    uplink_capacity,
)
from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network
from gwtf.flow.simplex import max_flow_value
from gwtf.flow.topology import CAP_SCALE, LinkSpec, NodeSpec, Topology, access_capacity
from gwtf.sim.scenario import NodeInfo, Scenario

__all__ = [
    "CODEC_S_PER_BYTE",
    "PLANNING",
    "SWARM_CODEC",
    "SWARMS",
    "UNCOMPRESSED",
    "RouteView",
    "access_bound",
    "codec_rate",
    "codec_seconds",
    "codec_side_seconds",
    "compute_bound_flow",
    "flow_topology",
    "for_policy",
    "job_plan",
    "plan_flow",
    "plan_sizes",
    "route_view",
    "with_plan",
]

_MIB = 2**20
CODEC_S_PER_BYTE: Mapping[str, tuple[tuple[float, float], ...]] = {
    "none": ((math.inf, 0.0),),
    "int8": ((16 * _MIB, 1.4e-9), (math.inf, 3.4e-9)),
    "int4": ((16 * _MIB, 2.0e-9), (math.inf, 4.1e-9)),
}
"""Seconds to encode and then decode one float32 byte of a tensor (`gwtf.train.codecs.encode`,
`decode`), by the tensor's float32 size: (up to this many bytes, seconds per byte). Measured on
the development machine's CPU (Intel Xeon, 2 cores shared with other work, load about 3;
2026-12-07): a float32 tensor of standard normal values, one torch thread, the best of 25
encode + decode of each; `python -m benchmarks simcompress` measures it again beside its
table. Best times, int8 / int4, ns per float32 byte: 4 MiB 1.31 / 1.75, 16 MiB 1.42 / 2.01,
64 MiB 3.42 / 3.30, 128 MiB 3.08 / 4.07 (past the caches each of the codec's elementwise passes
streams the tensor through memory). A tensor up to 16 MiB is charged the 16 MiB figure, a larger
one the slowest of the larger: int8 3.4 ns, int4 4.1 ns. So home_links' 2048 x 2048 activation
costs a node 24 ms (int8) per microbatch and lossy boundary it sits next to, small beside its
GPUs' ~0.1 s stage; but geo10_wan_bound's 8192 x 2560 one costs 0.29 s, far more than an H100's
39 ms stage: the plan (`job_plan`, `swarm_plan` with `codec_side_seconds`) weighs that compute
against what the links gain, and leaves such a boundary uncompressed. A machine with more
cores runs the codecs' elementwise passes on all of them, and a GPU faster still: `[compression]
codec_cost` scales this figure (0: free)."""


def codec_rate(name: str, tensor_bytes: float) -> float:
    """`CODEC_S_PER_BYTE` of codec `name` for a float32 tensor of `tensor_bytes`."""
    return next(rate for upto, rate in CODEC_S_PER_BYTE[codec_info(name).name]
                if tensor_bytes <= upto)


SWARM_CODEC = "int8"
"""What SWARM sends across every boundary (hivemind's blockwise 8-bit)."""
SWARMS = ("swarm", "swarm-rebalance", "swarm-routing")
"""The policies that compress every boundary with `SWARM_CODEC` when compression is on."""
PLANNING = ("gwtf", "gwtf-fixed", "oracle")
"""The policies that plan the job's codecs with `swarm_plan` when compression is on."""
UNCOMPRESSED = "gwtf-uncompressed"
"""gwtf with every boundary uncompressed, to compare against on the same scenario."""


def plan_sizes(sc: Scenario, plan: Sequence[str]) -> tuple[int, ...]:
    """Bytes each boundary sends per microbatch under `plan` (module doc: `none` is the
    scenario's activation, a lossy codec its wire parts for `tokens x hidden` values)."""
    return boundary_sizes(sc.activation_bytes, plan, values=_values(sc))


def _values(sc: Scenario) -> int:
    return sc.tokens_per_microbatch * sc.hidden_size


def codec_side_seconds(sc: Scenario, name: str) -> float:
    """Seconds a node spends per microbatch on one side of a boundary of codec `name`: encoding
    one way and decoding the other (`CODEC_S_PER_BYTE` times `Scenario.codec_cost`)."""
    tensor = 4 * _values(sc)
    return codec_rate(name, tensor) * tensor * sc.codec_cost


def codec_seconds(sc: Scenario, plan: Sequence[str]) -> tuple[float, ...]:
    """Per stage, the seconds a node spends per microbatch encoding and decoding at its lossy
    boundaries (`gwtf.flow.compression.stage_codec_seconds` of `codec_side_seconds`)."""
    return stage_codec_seconds(plan, lambda name: codec_side_seconds(sc, name))


def with_plan(sc: Scenario, plan: Sequence[str]) -> Scenario:
    """`sc` as a policy that sends by `plan` (one codec per boundary) runs it: bytes per
    boundary and codec compute per stage; a plan of `none` everywhere changes nothing but the
    plan reported."""
    plan = tuple(codec_info(name).name for name in plan)
    if len(plan) != sc.stages - 1:
        raise ValueError(f"a plan names {sc.stages - 1} boundaries, got {len(plan)}")
    if all(codec_info(name).lossless for name in plan):
        return replace(sc, codec_plan=plan, boundary_bytes=(), codec_s=())
    return replace(sc, codec_plan=plan, boundary_bytes=plan_sizes(sc, plan),
                   codec_s=codec_seconds(sc, plan))


def _members(sc: Scenario) -> list[tuple[NodeSpec, float]]:
    """The job's first members as the plan sees them: compute at normal speed, location, and
    the access link's rate where the scenario gives one (0: none, the pair model)."""
    out = []
    for node_id in sc.initial:
        info = sc.nodes[node_id]
        access = min(info.uplink_gbps, info.downlink_gbps)
        out.append((NodeSpec.make(info.id, info.stage, sc.compute_s(info), info.location),
                    access if math.isfinite(access) else 0.0))
    return out


def job_plan(sc: Scenario, allowed: Iterable[str] | None = None) -> tuple[str, ...]:
    """The codecs the job's first members plan at its start (`swarm_plan`, module doc)."""
    allow = sc.compression if allowed is None else tuple(allowed)
    return swarm_plan(sc.stages, sc.activation_bytes, _members(sc), sc.links, sc.intra, allow,
                      values=_values(sc), codec_seconds=lambda name: codec_side_seconds(sc, name))


def for_policy(sc: Scenario, policy: str) -> Scenario:
    """The scenario as `policy` runs it (module doc); `sc` itself when compression is off."""
    if not sc.compression:
        return sc
    if policy in PLANNING:
        return with_plan(sc, job_plan(sc))
    if policy in SWARMS:
        return with_plan(sc, (SWARM_CODEC,) * (sc.stages - 1))
    return with_plan(sc, ("none",) * (sc.stages - 1))


def access_bound(sc: Scenario, info: NodeInfo, stage: int) -> float:
    """Microbatches/s the access links of `info` carry at `stage` (inf in the pair model): the
    activation down and the gradient up each neighbouring boundary, at its bytes."""
    gbps = min(info.uplink_gbps, info.downlink_gbps)
    if sc.boundary_bytes:
        return uplink_capacity(gbps, stage, sc.boundary_bytes)
    return access_capacity(gbps, stage, sc.stages, sc.activation_bytes)


def flow_topology(sc: Scenario, nodes: Sequence[NodeSpec],
                  links: Mapping[frozenset[str], LinkSpec]) -> Topology:
    """The flow topology of `nodes`, each boundary at its bytes (TopologyError as build)."""
    topology = Topology.build(sc.activation_bytes, nodes, dict(links), sc.intra)
    return topology.with_boundary_bytes(sc.boundary_bytes) if sc.boundary_bytes else topology


def plan_flow(sc: Scenario, plan: Sequence[str]) -> float:
    """The first members' maximum flow, microbatches/s, under `plan` at the bytes the simulator
    charges (`plan_sizes`), each node's capacity as `swarm_plan` takes it: its compute, and
    what its access link carries where it has one (memory and the codecs' compute left out)."""
    sizes = plan_sizes(sc, plan)
    nodes = []
    for spec, access in _members(sc):
        if access > 0:
            spec = replace(spec, capacity=min(spec.capacity,
                                              uplink_capacity(access, spec.stage, sizes)))
        nodes.append(spec)
    if {n.stage for n in nodes} != set(range(sc.stages)):
        return 0.0
    topology = Topology.build(sc.activation_bytes, nodes, dict(sc.links), sc.intra)
    graph = build_oracle_network(topology.with_boundary_bytes(sizes))
    return max_flow_value(graph, SOURCE, SINK) / CAP_SCALE


def compute_bound_flow(sc: Scenario) -> float:
    """The first members' maximum flow, microbatches/s, if no link bound: the least stage
    compute (every node at `1 / compute_s`)."""
    per_stage = [0.0] * sc.stages
    for node_id in sc.initial:
        info = sc.nodes[node_id]
        per_stage[info.stage] += 1.0 / sc.compute_s(info)
    return min(per_stage)


@dataclass(frozen=True)
class RouteView:
    """What placement's `Swarm`, which takes one activation size for every boundary, is given
    for a plan (module doc)."""

    activation_bytes: int
    tagged: tuple[int, ...] = ()
    """Per boundary bytes when the plan mixes sizes (locations then carry the stage)."""

    def location(self, location: str, stage: int) -> str:
        return f"{location}@{stage}" if self.tagged else location

    def links(self, links: Mapping[frozenset[str], LinkSpec], intra: LinkSpec,
              locations: Iterable[str]) -> dict[frozenset[str], LinkSpec]:
        """`links` as the view's locations see them (`locations`: every location a node may
        have, whether a link names it or not)."""
        if not self.tagged:
            return dict(links)
        places = sorted({*locations, *(loc for pair in links for loc in pair)})
        out: dict[frozenset[str], LinkSpec] = {}
        for k, size in enumerate(self.tagged):
            scale = self.activation_bytes / size
            for a in places:
                for b in places:
                    link = intra if a == b else links.get(frozenset((a, b)))
                    if link is not None:
                        out[frozenset((f"{a}@{k}", f"{b}@{k + 1}"))] = LinkSpec(
                            link.rtt_ms, link.bandwidth_gbps * scale)
        return out


def route_view(sc: Scenario) -> RouteView:
    """The `RouteView` of the scenario's plan: its one size when every boundary has it."""
    sizes = sc.boundary_bytes
    if not sizes:
        return RouteView(sc.activation_bytes)
    if len(set(sizes)) == 1:
        return RouteView(sizes[0])
    return RouteView(sc.activation_bytes, sizes)
