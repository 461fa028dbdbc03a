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

The flow a plan is weighed by (`swarm_plan`) charges both sides of a codec: the bytes it sends
(each access link and each arc across the boundary carries `boundary_sizes`) and the compute it
costs (a node next to a lossy boundary encodes what it sends across it and decodes what it
receives, once per microbatch each way: `stage_codec_seconds` added to its seconds per
microbatch). Where a codec's compute costs a node more than its link gains, the flow falls and
the rule keeps the boundary uncompressed: on a fast GPU with a large activation the codec can
take longer than the stage.
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
    "stage_codec_seconds",
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


def boundary_sizes(activation_bytes: int, plan: Sequence[str], *,
                   values: int | None = None) -> tuple[int, ...]:
    """The bytes each boundary sends per microbatch under `plan` (one codec per boundary), for
    activations of `activation_bytes` holding `values` values (None: float32, as the node
    trains, `activation_bytes / 4`; for fp16 or bf16 activations int8 halves the bytes rather
    than quartering them)."""
    numel = activation_bytes // 4 if values is None else values
    return tuple(activation_bytes if codec_info(name).lossless else wire_bytes(name, numel)
                 for name in plan)


def stage_codec_seconds(plan: Sequence[str], seconds: Callable[[str], float]) -> tuple[float, ...]:
    """Per stage, the seconds a node spends per microbatch on the codecs of `plan`: each lossy
    boundary costs both its sides `seconds(codec)` (encoding what the side sends across it and
    decoding what it receives: the activation one way, its gradient the other)."""
    sides = [0.0] * (len(plan) + 1)
    for k, name in enumerate(plan):
        if not codec_info(name).lossless:
            cost = seconds(name)
            sides[k] += cost
            sides[k + 1] += cost
    return tuple(sides)


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
    *,
    values: int | None = None,
    codec_seconds: Callable[[str], float] | None = None,
) -> tuple[str, ...]:
    """The plan (`plan_boundaries`) for a swarm of `nodes`, each with its declared uplink in
    Gbit/s (0: not said), joined by `links`: every node's capacity is the least of its compute
    (`1 / compute_s`, or its stated capacity where no uplink was said) slowed by the codecs it
    runs under the plan tried (`codec_seconds(codec)`: seconds per microbatch and side of a
    lossy boundary; None: free), and what its uplink carries under that plan. Activations hold
    `values` values (`boundary_sizes`). The node (at submission) and the simulator both
    call it."""
    members = list(nodes)
    allowed = tuple(allowed)

    def flow(plan: tuple[str, ...]) -> float:
        sizes = boundary_sizes(activation_bytes, plan, values=values)
        extra = (stage_codec_seconds(plan, codec_seconds) if codec_seconds is not None
                 else (0.0,) * stages)  # fmt: skip
        specs = []
        for node, uplink in members:
            compute = node.capacity
            if uplink > 0 and node.compute_s > 0:
                compute = 1.0 / node.compute_s
            if compute > 0 and 0 <= node.stage < stages and extra[node.stage] > 0:
                compute = 1.0 / (1.0 / compute + extra[node.stage])
            capacity = (min(compute, uplink_capacity(uplink, node.stage, sizes)) if uplink > 0
                        else compute)  # fmt: skip
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
