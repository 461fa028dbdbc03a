"""What a node is told: its timeouts (`NodeConfig`) and the swarm's shared settings.

Every timeout and period lives in `NodeConfig`, each with the reason for its default, so that no
call in the node waits without a bound. `SwarmSettings` is what the first node of a swarm decides
and every joiner receives unchanged (docs/design.md 2: all nodes must run the same FlowConfig).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtf.flow.pace import PaceConfig
from gwtf.flow.relax.decentralized import FlowConfig
from gwtf.flow.topology import cost_to_units

__all__ = [
    "DEFAULT_ACTIVATION_BYTES",
    "DEFAULT_MAX_ARC_COST_S",
    "DEFAULT_MIN_ARC_COST_S",
    "MAX_ID_LENGTH",
    "MAX_MESSAGE_BYTES",
    "MAX_STAGES",
    "ROUTINGS",
    "NodeConfig",
    "SwarmSettings",
]

MAX_MESSAGE_BYTES = 4 * 2**20
"""Largest control message a node sends or accepts (gRPC rejects bigger ones with
RESOURCE_EXHAUSTED before any handler runs). The biggest legitimate one is a bandwidth probe."""

ROUTINGS = ("local", "relax", "swarm")
"""The routing methods of a swarm (`SwarmSettings.routing`)."""

MAX_ID_LENGTH = 128
"""Longest node id, location or address accepted from a peer."""

MAX_STAGES = 1024
"""Most pipeline stages a swarm may have (a bound on what a peer can make a node allocate)."""

DEFAULT_ACTIVATION_BYTES = 8 * 2**20
"""8 MiB, as the benchmark topologies (`gwtf.flow.generate.geo10`); a job sets its own."""

DEFAULT_MAX_ARC_COST_S = 2.0
"""Largest arc cost the swarm is sized for, seconds: half a second of compute on each end plus
the slowest geo10 link (about 0.3 s RTT, 8 MiB at 0.4 Gbit/s) and headroom for slower joiners.
Costlier arcs are clamped (their cost is understated, the maximum flow is never missed)."""

DEFAULT_MIN_ARC_COST_S = 0.01
"""Smallest arc cost expected, seconds; sets the final epsilon, hence the cost accuracy (1%)."""


@dataclass(frozen=True)
class NodeConfig:
    """Timeouts, periods and sizes of one node. Seconds throughout."""

    heartbeat_s: float = 0.5
    """Gossip period: the node increments its heartbeat and gossips with `gossip_fanout` peers.
    Failure detection is a few periods, so this bounds how fast a crash is seen."""
    failure_timeout_s: float = 5.0
    """A member whose heartbeat has not progressed for this long is declared dead. After half of
    it, the node calls the silent member directly, and a refused connection (no process there)
    declares it dead at once. Several times the heartbeat period plus the gossip's propagation
    (a few hops of the largest RTT), or slow links produce false suspicions."""
    gossip_fanout: int = 3
    """Peers gossiped with per period: heartbeats reach everyone in about log_fanout(n) periods."""
    rpc_timeout_s: float = 3.0
    """Deadline of every control call: above the largest emulated RTT (0.3 s) plus a queue of
    probes and a loaded event loop, below the failure timeout."""
    probe_s: float = 1.0
    """Period of the latency echo on each arc this node owns (as tail)."""
    bandwidth_probe_s: float = 30.0
    """Period of the bandwidth probe on each owned arc: it sends `probe_bytes`, so it is rare
    (after an arc is created, its probes come at 2, 4, 8... `probe_s` until this period)."""
    probe_bytes: int = 2**20
    """Payload of a bandwidth probe: large enough that transfer time dominates on a WAN link."""
    initial_echoes: int = 4
    """Latency echoes before an arc is created; the first warms the channel and is discarded."""
    initial_transfers: int = 3
    """Bandwidth probe pairs before an arc is created (the estimate is their median)."""
    rtt_window: int = 16
    """RTT samples kept: the link's RTT is their minimum (queueing and a busy machine only ever
    add to a sample; on a loaded 2-core machine 8 samples were not always enough to see one
    undisturbed round trip)."""
    bandwidth_window: int = 5
    """Bandwidth samples kept: the estimate is their median (robust to one stalled probe)."""
    cost_hysteresis: float = 0.5
    """An owned arc gets new parameters (a new gen, updated in place; if that breaks a
    condition the swarm re-scales: about a cold start's messages) only when its cost moves by
    more than this fraction, so that probe noise never churns the flow. Routing with a cost off
    by less than this costs little; re-routing costs a lot."""
    cap_hysteresis: float = 1.0
    """The same for its capacity, as a factor: more than 1 + this, or less than 1 / (1 + this).
    Bandwidth estimates on a shared machine wander by tens of percent."""
    change_persistence_s: float = 30.0
    """...and only when the change has been seen continuously for this long while the swarm
    was not scaling (which spans the next bandwidth probe): a burst of load on the machine, such
    as a local swarm starting up, its own scaling or a neighbour's benchmark, is not a slower
    link. Bandwidth probes wait for a settled swarm too (gwtf.node.control.prober)."""
    max_inflight: int = 4
    """`Exchange` calls in flight to one peer at a time: pipelining cuts the wait for a reply
    out of every hop of the algorithm (up to a round trip on a WAN link); beyond it, new arc
    states coalesce in the outbox."""
    route_quiet_s: float = 1.0
    """Local routing (docs/design.md 2.12): a node solves its membership view once the view has
    not changed for this long. A death reaches every member within about a second of its first
    detection (3.4), so the nodes switch to the new solution within about this long of each
    other, and a burst of joins costs one solve; meanwhile a dead next hop is repaired at once."""
    explore_peers: int = 2
    """Local routing: next-stage members without flow from this node that it probes anyway, so
    that a link no flow uses is measured too (a faster one can then win flow back). Few: every
    next-stage member at 64 nodes in 4 stages (1,024 probed arcs on 2 cores) delayed heartbeats
    into false deaths."""
    explore_s: float = 30.0
    """...and how long each explored window is probed before the next one: every link out of a
    node is measured once every (next-stage members / explore_peers) windows."""
    report_bandwidth: bool = False
    """Local routing: put measured bandwidth in the record too, not only RTT and failed links.
    Off by default: on a loaded machine a loopback's bandwidth probes wander by a factor of
    several, and every unlocated node that reports becomes a cell of its own in every solve."""
    pace: PaceConfig = PaceConfig()
    """How the node's record follows the pace it measures on every microbatch (`--pace live`):
    the window of samples, the hysteresis factor and the hold between two publications, each
    with its reason in gwtf.flow.pace (docs/design.md 2.13)."""
    retry_min_s: float = 0.05
    """First retry delay of a failed flow batch; doubles up to `retry_max_s`."""
    retry_max_s: float = 1.0
    phase_poll_s: float = 0.5
    """While the swarm is scaling, the coordinator runs a wave at least this often, even if no
    member nudges it (a lost nudge then costs at most this long)."""
    phase_gap_s: float = 0.01
    """Least time between two waves: bounds the coordinator's load."""
    leave_timeout_s: float = 1.0
    """Deadline of the goodbye calls of a graceful leave."""
    shutdown_grace_s: float = 1.0
    """Calls still running when the server stops get this long to finish."""
    tombstone_s: float = 300.0
    """How long a dead or departed incarnation is remembered (and gossiped), so that an old
    rumour of it being alive is not believed."""
    status_timeout_s: float = 3.0
    """Deadline of the per-member calls of a swarm-wide status."""
    prepare_timeout_s: float = 120.0
    """Deadline of a member's preparation of a job: it imports torch (seconds of CPU, and every
    node of a local swarm does it at once on a small machine), builds its stage and reads the
    data."""
    data_timeout_s: float = 60.0
    """Deadline of one microbatch's send. The receiver holds the stream open while it waits for
    a free memory slot or for its commit of the previous iteration, so this bounds those waits."""
    commit_timeout_s: float = 120.0
    """How long a stage replica waits for its peers' gradient sums at a commit."""
    recovery_stall_s: float = 10.0
    """An iteration whose coordinator hears of no progress this long (no microbatch finished,
    no replay done, no commit report) while no stage is empty is swept for late evidence about
    its dead nodes, and after as long again started over. Well above a microbatch's round trip
    on a loaded machine (about a second here), so only a recovery that went wrong triggers it."""
    drain_timeout_s: float = 8.0
    """How long a node that leaves gracefully waits for the iteration in progress to step, so
    that nothing it accumulated must be replayed (below `gwtf launch`'s 10 s before SIGKILL)."""

    # How often a loop that waits for a condition looks again. Each look is cheap (a comparison
    # or one call), so these trade a little work for a quicker reaction.
    step_poll_s: float = 0.05
    """A node that waits for an iteration to step here (a graceful leave's drain, a mover before
    it leaves) looks this often: a look is a comparison, and the leave follows the step within
    this, far below the `drain_timeout_s` it is bounded by."""
    member_poll_s: float = 0.25
    """A job that waits to see a node in the member table again (the coordinator, a participant
    that came back before it starts the round over; a stale node, the coordinator it is to
    follow) looks this often, 20 times (5 s at this default): the node's new incarnation
    reaches the table by gossip within a few heartbeats."""
    spread_gap_s: float = 0.2
    """The coordinator spreads a changed job record (a crash, a pause, a join) to every member
    at most once per this: a burst of changes costs one round of calls, and each member hears
    of a change within this (a few times a second)."""
    admit_poll_s: float = 0.2
    """A joiner whose state is of the iteration in its commit asks to be admitted again this
    often rather than fetch the same state again (a commit that takes longer than a fetch would
    keep it out), and one whose state came too stale starts its entry over after this."""
    bootstrap_wait_s: float = 60.0
    """A joiner whose bootstrap nodes do not answer (not listening yet, or restarting) calls
    them again every `bootstrap_retry_s` for this long before it gives up: the nodes of a swarm
    are often started together, by hand or by a script, and the first one takes seconds to load
    torch and listen. A node that answers and refuses (a token, a stage, a taken id) is final at
    once. 0: one try."""
    bootstrap_retry_s: float = 1.0
    """...the wait between two tries: a few per failure timeout of a starting node, one line in
    its log for the first failure only."""
    entry_retry_s: float = 0.5
    """A node entering a running job tries again after this when the job's coordinator is not a
    live member or did not answer, or no donor gave it its stage's state: short against the
    `prepare_timeout_s` that bounds the whole entry, so a joiner tries many times, without
    calling a coordinator that is being replaced in a tight loop."""
    evidence_retry_s: float = 1.0
    """The coordinator asks a live neighbour that did not report what it holds of a dead node's
    work again after this (a plan without that evidence could redo what the neighbour holds),
    before it starts the round over: a neighbour busy with the crash gets a moment to answer,
    well within `recovery_stall_s`."""
    watchdog_s: float = 1.0
    """Period of the job coordinator's watchdog: it re-checks a pause and the quorum, orders a
    commit that may have become possible, and sweeps or starts over an iteration that made no
    progress for `recovery_stall_s`, which it so sees within a tenth of that timeout."""
    idle_tick_s: float = 1.0
    """With `quiet_s` (each node tightens on its own after a quiet spell), the tick loop that
    has no tick due waits for a change of the flow state, which wakes it at once, and looks
    again after at most this long anyway."""

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_s",
            "failure_timeout_s",
            "rpc_timeout_s",
            "probe_s",
            "bandwidth_probe_s",
            "route_quiet_s",
            "explore_s",
            "retry_min_s",
            "retry_max_s",
            "phase_poll_s",
            "leave_timeout_s",
            "status_timeout_s",
            "prepare_timeout_s",
            "data_timeout_s",
            "commit_timeout_s",
            "recovery_stall_s",
            "drain_timeout_s",
            "step_poll_s",
            "member_poll_s",
            "spread_gap_s",
            "admit_poll_s",
            "entry_retry_s",
            "bootstrap_retry_s",
            "evidence_retry_s",
            "watchdog_s",
            "idle_tick_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not (math.isfinite(self.bootstrap_wait_s) and self.bootstrap_wait_s >= 0):
            raise ValueError(f"bootstrap_wait_s must be 0 or more seconds, got "
                             f"{self.bootstrap_wait_s!r}")  # fmt: skip
        if self.failure_timeout_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"the failure timeout ({self.failure_timeout_s:g} s) must be at least twice the "
                f"heartbeat period ({self.heartbeat_s:g} s)"
            )
        if self.gossip_fanout < 1 or self.initial_echoes < 2 or self.max_inflight < 1:
            raise ValueError("gossip_fanout and max_inflight must be >= 1, initial_echoes >= 2")
        if self.explore_peers < 0:
            raise ValueError(f"explore_peers must be >= 0, got {self.explore_peers}")
        if not 0 < self.probe_bytes <= MAX_MESSAGE_BYTES // 2:
            raise ValueError(f"probe_bytes must be in 1..{MAX_MESSAGE_BYTES // 2}")


@dataclass(frozen=True)
class SwarmSettings:
    """The swarm-wide settings: the first node's choice, every joiner's copy."""

    swarm_id: str
    num_stages: int
    activation_bytes: int
    flow: FlowConfig
    routing: str = "local"
    """How the swarm routes (docs/design.md 2.12): "local", every node solving the whole flow on
    its membership view, or "relax", the decentralized epsilon-relaxation of 2.3-2.7, or "swarm",
    SWARM's routing (2.14: every sender chooses its next hops from its own throughput estimates,
    `gwtf.job.swarmroute`; the flows are still solved locally, for `gwtf status` only).
    Swarm-wide: they do not mix (a relaxing node needs its peers' arc messages)."""

    @staticmethod
    def create(
        swarm_id: str,
        num_stages: int,
        *,
        activation_bytes: int = DEFAULT_ACTIVATION_BYTES,
        max_arc_cost_s: float = DEFAULT_MAX_ARC_COST_S,
        min_arc_cost_s: float = DEFAULT_MIN_ARC_COST_S,
        quiet_s: float | None = None,
        routing: str = "local",
    ) -> SwarmSettings:
        """The settings of a new swarm (ValueError with one sentence if a value is wrong)."""
        if not 2 <= num_stages <= MAX_STAGES:
            raise ValueError(f"a swarm needs 2 to {MAX_STAGES} stages, got {num_stages}")
        if activation_bytes < 1:
            raise ValueError(f"activation bytes must be positive, got {activation_bytes}")
        for name, value in (("max", max_arc_cost_s), ("min", min_arc_cost_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the {name} arc cost must be a positive number of seconds")
        if min_arc_cost_s > max_arc_cost_s:
            raise ValueError(
                f"the min arc cost ({min_arc_cost_s:g} s) exceeds the max ({max_arc_cost_s:g} s)"
            )
        if quiet_s is not None and not (math.isfinite(quiet_s) and quiet_s > 0):
            raise ValueError(f"quiet_s must be a positive number of seconds, got {quiet_s}")
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        flow = FlowConfig.for_costs(
            num_stages,
            cost_to_units(max_arc_cost_s),
            cost_to_units(min_arc_cost_s),
            quiet_s=quiet_s,
        )
        return SwarmSettings(swarm_id, num_stages, activation_bytes, flow, routing)
