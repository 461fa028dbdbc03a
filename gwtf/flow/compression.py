"""Where a job compresses what crosses a stage boundary: the codecs' sizes and the plan
(docs/design.md 2.15). Pure: the torch side of each codec is `gwtf.train.codecs`.

A codec maps a float32 tensor to fewer bytes (`wire_bytes`); the least lossy come first in
`CODECS`. A plan gives each boundary of the pipeline (between stages k and k+1) one codec, the
same for every arc across it and for every microbatch: what a microbatch's activation becomes
must not depend on which replica carried it, or a replacement node could not recompute a dead
node's work bit for bit, and the swarm could not equal the one-process reference.

The rule (`plan_boundaries`): let F* be the swarm's maximum flow with every boundary at the
strongest codec the job allows. Each boundary, in turn, takes the least lossy allowed codec that
keeps the maximum flow at least `(1 - slack) * F*`, the others as chosen so far (boundaries not
yet chosen stay at the strongest). So a boundary whose links do not bind gets `none`, one whose
links bind gets the weakest codec that lifts the cut off it, and the plan trains within `slack`
of the fastest the allowed codecs can give. Why this order rather than compressing the binding
boundary alone: when several boundaries bind equally (a swarm of similar home links), none of
them alone raises the flow, and a rule that tries one boundary at a time would compress none;
starting from all compressed and relaxing one at a time finds the ones that matter.
`slack` (5%) is the throughput a boundary's codec must buy to be used: less is within the
noise of the flow's own estimates, and a lossy codec costs accuracy and compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network
from gwtf.flow.simplex import max_flow_value
from gwtf.flow.topology import CAP_SCALE, LinkSpec, NodeSpec, Topology, TopologyError

__all__ = [
    "CODECS",
    "DEFAULT_ALLOWED",
    "PLAN_SLACK",
    "Codec",
    "boundary_sizes",
    "codec_info",
    "plan_boundaries",
    "swarm_plan",
    "uplink_capacity",
    "wire_bytes",
]


@dataclass(frozen=True)
class Codec:
    """One codec: its name and, for a quantizer, its levels on each side of zero, its block and
    how many values share a byte (`gwtf.train.codecs` says how each is computed)."""

    name: str
    levels: int = 0
    block: int = 0
    per_byte: int = 1

    @property
    def lossless(self) -> bool:
        return self.levels == 0


CODECS: Mapping[str, Codec] = {
    "none": Codec("none"),
    "int8": Codec("int8", levels=127, block=64, per_byte=1),
    "int4": Codec("int4", levels=7, block=64, per_byte=2),
}
"""Every codec, least lossy first: the order a plan tries them in."""

DEFAULT_ALLOWED = ("int8",)
"""What a job allows unless it says: 8-bit where a link binds, as SWARM sends everywhere."""

PLAN_SLACK = 0.05
"""The share of the best maximum flow a plan may give up to compress less (module docstring)."""

_SCALE_BYTES = 4


def codec_info(name: str) -> Codec:
    """The codec called `name`; ValueError naming the known ones otherwise."""
    found = CODECS.get(name)
    if found is None:
        raise ValueError(f"unknown codec {name!r}; the codecs are {', '.join(CODECS)}")
    return found


def wire_bytes(name: str, numel: int) -> int:
    """Bytes the parts of a float32 tensor of `numel` values take on the wire."""
    c = codec_info(name)
    if c.lossless:
        return 4 * numel
    blocks = -(-numel // c.block)
    return blocks * c.block // c.per_byte + blocks * _SCALE_BYTES


def boundary_sizes(activation_bytes: int, plan: Sequence[str]) -> tuple[int, ...]:
    """The bytes each boundary sends per microbatch under `plan` (one codec per boundary), for
    float32 activations of `activation_bytes`."""
    numel = activation_bytes // 4
    return tuple(wire_bytes(name, numel) for name in plan)


def plan_boundaries(
    boundaries: int,
    allowed: Iterable[str],
    flow: Callable[[tuple[str, ...]], float],
    *,
    slack: float = PLAN_SLACK,
) -> tuple[str, ...]:
    """One codec per boundary by the rule of the module docstring. `flow(plan)` is the swarm's
    maximum flow under a plan; `allowed` the lossy codecs the job allows (none: every boundary
    `none`). At most `1 + boundaries * len(allowed)` calls of `flow`."""
    ladder = ["none", *sorted({codec_info(a).name for a in allowed} - {"none"},
                               key=list(CODECS).index)]  # fmt: skip
    strongest = ladder[-1]
    plan = [strongest] * boundaries
    if strongest == "none" or boundaries == 0:
        return tuple(plan)
    best = flow(tuple(plan))
    if best <= 0:
        return tuple("none" for _ in plan)
    for b in range(boundaries):
        for name in ladder[:-1]:
            trial = (*plan[:b], name, *plan[b + 1:])
            if flow(trial) >= (1 - slack) * best:
                plan[b] = name
                break
    return tuple(plan)


def uplink_capacity(gbps: float, stage: int, sizes: Sequence[int]) -> float:
    """Microbatches/s an uplink of `gbps` carries for a node of `stage` when boundary k sends
    `sizes[k]` bytes: the activation down its outgoing boundary and the gradient up its incoming
    one (`gwtf.flow.topology.access_capacity` with a plan)."""
    per_mb = (sizes[stage - 1] if stage > 0 else 0) + (sizes[stage] if stage < len(sizes) else 0)
    return math.inf if per_mb == 0 or gbps <= 0 else gbps * 1e9 / 8 / per_mb


def swarm_plan(
    stages: int,
    activation_bytes: int,
    nodes: Iterable[tuple[NodeSpec, float]],
    links: Mapping[frozenset[str], LinkSpec],
    intra: LinkSpec,
    allowed: Iterable[str],
) -> tuple[str, ...]:
    """The plan (`plan_boundaries`) for a swarm of `nodes`, each with its declared uplink in
    Gbit/s (0: not said), joined by `links`: every node's capacity is the least of its compute
    (`1 / compute_s`, or its stated capacity where no uplink was said) and what its uplink
    carries under the plan tried. The node (at submission) and the simulator both call it."""
    members = list(nodes)
    allowed = tuple(allowed)

    def flow(plan: tuple[str, ...]) -> float:
        sizes = boundary_sizes(activation_bytes, plan)
        specs = []
        for node, uplink in members:
            capacity = node.capacity
            if uplink > 0 and node.compute_s > 0:
                capacity = min(1.0 / node.compute_s, uplink_capacity(uplink, node.stage, sizes))
            specs.append(replace(node, capacity=capacity))
        if {n.stage for n in specs} != set(range(stages)):
            return 0.0
        try:
            topology = Topology.build(activation_bytes, specs, links, intra)
        except TopologyError:
            return 0.0
        graph = build_oracle_network(topology.with_boundary_bytes(sizes))
        return max_flow_value(graph, SOURCE, SINK) / CAP_SCALE

    return plan_boundaries(max(0, stages - 1), allowed, flow)
