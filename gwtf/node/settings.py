"""Who a node is and where it goes: the `gwtf node` flags (docs/design.md 3.1).

Apart from the node (gwtf.node.node) so that the parts that build a node from them (entering a
swarm, gwtf.node.control.entry; the channels to peers, gwtf.node.control.peers) name them without
naming the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gwtf.flow.topology import LinkSpec
from gwtf.node.config import (
    DEFAULT_ACTIVATION_BYTES,
    DEFAULT_MAX_ARC_COST_S,
    DEFAULT_MIN_ARC_COST_S,
)
from gwtf.node.faults import Fault
from gwtf.node.rpc.ratelimit import RateLimit
from gwtf.node.rpc.relay import RelayLimits
from gwtf.node.rpc.security import Credentials

__all__ = ["NodeSettings"]


@dataclass(frozen=True)
class NodeSettings:
    """Who this node is and where it goes (the `gwtf node` flags)."""

    stage: int | None
    """The stage this node holds; None (`--stage auto`): the one where it adds the most flow,
    chosen on entering the swarm (docs/design.md 2.11), after which the node's state holds
    these settings with that stage."""
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    """The host peers reach this node at (behind NAT or a wildcard `host`); None: `host`, or the
    machine's host name when `host` is a wildcard."""
    node_id: str | None = None
    """Default: the address it listens on, HOST:PORT (unique in a swarm)."""
    bootstrap: tuple[str, ...] = ()
    """Addresses of members to join through; none: this node creates a swarm."""
    location: str = ""
    links: Mapping[frozenset[str], LinkSpec] | None = None
    """The link matrix of the emulated WAN (with `location`), None: no emulation."""
    routing_links: str = "matrix"
    """What local routing takes a link no member measured to be: "matrix", the link matrix's
    (the intra-location link without one); "measured", the intra-location link whatever the
    matrix says (the matrix then only emulates the WAN, and routing learns it by measuring)."""
    wan_schedule: str | None = None
    """A file of the emulated WAN's partitions, re-read when it changes (gwtf.node.control.peers);
    None: no partition."""
    compute_s: float | None = None
    """Seconds per microbatch; None: measured by a warm-up of the stage of `job`."""
    job: str = "tiny-gpt"
    # Only for the first node of a swarm:
    num_stages: int | None = None
    activation_bytes: int = DEFAULT_ACTIVATION_BYTES
    max_arc_cost_s: float = DEFAULT_MAX_ARC_COST_S
    min_arc_cost_s: float = DEFAULT_MIN_ARC_COST_S
    quiet_s: float | None = None
    routing: str = "local"
    """How the swarm routes (`SwarmSettings.routing`): "local", "relax" or "swarm"."""
    seed: int | None = None
    """Seed of the gossip partner order; default: derived from the node id."""
    credentials: Credentials = field(default_factory=Credentials)
    """The swarm's token and/or TLS certificates (gwtf.node.rpc.security); empty: an open swarm."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port of `host` (0: a free one); None: no metrics."""
    memory_slots: int = 8
    """Microbatches whose forward state this node keeps at once (training jobs)."""
    device: str = "auto"
    """Where this node's stage runs: auto, cpu, cuda, cuda:N or mps (gwtf.train.device)."""
    precision: str = "fp32"
    """fp32, or bf16 / fp16 under autocast (gwtf.train.device)."""
    threads: int | None = None
    """torch CPU threads; None: auto (gwtf.train.device.resolve_threads)."""
    train: bool = True
    """Take part in training jobs: load torch before entering the swarm (importing it takes
    seconds in which the process answers nothing, which peers would take for a death). False:
    route only, start fast, and refuse jobs."""
    emulate_compute: bool = False
    """Pad each microbatch's stage work to `compute_s` (with sleep), as the emulated WAN pads
    messages: a local swarm then runs at the speeds its flows were computed for."""
    pace: str = "auto"
    """"live": the record's compute time follows what the node measures on every microbatch
    (gwtf.flow.pace, docs/design.md 2.13); "declared": it stays what the node entered with;
    "auto": live unless the operator declared `compute_s` for real compute (`live_pace`)."""
    fault: Fault | None = None
    """Crash (SIGKILL itself) at this point of a job: chaos tests (gwtf.node.faults)."""
    rate_limit: RateLimit = field(default_factory=RateLimit)
    """Calls per second each peer may make (gwtf.node.rpc.ratelimit); rate 0: no limit."""
    moves: bool = True
    """A node that chooses its stage (`stage` None) may be moved to another by the job
    coordinator when the flow gains by it (docs/design.md 2.11); False (`--no-moves`): it keeps
    the stage it took. A pinned node never moves, whatever this says."""
    uplink_gbps: float = 0.0
    """This node's access uplink as its operator declares it (`--uplink-mbps`; 0: not said),
    announced in its member record (`MemberInfo.uplink_gbps`)."""
    relay: str = "auto"
    """Whether members reach it through a relay (`--relay`, gwtf.node.rpc.relay): "auto" when
    the member it joined through cannot dial it back, "always", or "never"."""
    relay_limits: RelayLimits = field(default_factory=RelayLimits)
    """What it carries for members it relays (`--relay-peers`, `--relay-mbps`)."""
    placed: bool = False
    """`stage` was chosen by placement, not pinned by the user: the new incarnation of a node
    the coordinator moved, which stays movable."""

    @property
    def live_pace(self) -> bool:
        """Whether the record follows the measured pace. "auto" follows it where the node's
        speed is its own (measured by a warm-up, or an emulated compute time it pads to), not
        where an operator declared a compute time for work that runs at another speed: that
        declaration is the operator's model of the swarm, which measuring would overrule."""
        if self.pace == "auto":
            return self.compute_s is None or self.emulate_compute
        return self.pace == "live"

    @property
    def movable(self) -> bool:
        """What the node's member record announces (`MemberInfo.movable`)."""
        return self.moves and (self.stage is None or self.placed)
