"""Scenario files (TOML): the model, the nodes, the network, the churn, the training, the policies.

Layout (every key but the ones marked required has a default; unknown keys are errors)::

    name = "geo10_spot"                 # required
    description = "..."
    seed = 0
    duration_s = 41000                  # simulated seconds; default: the trace's last event

    [model]
    stages = 4                          # required
    params_per_stage = [3.0e8, ...]     # required: parameters of each stage (compute and state)
    tokens_per_microbatch = 8192        # required
    hidden_size = 2048                  # required
    activation_dtype_bytes = 2          # bytes per activation value (fp16/bf16)
    compute = "measured"                # measured | peak: where stage compute comes from (below)
    utilisation = 0.4                   # peak: the fraction of the GPU's peak a stage reaches
    compute_s_v100 = [0.3, ...]         # or each stage's seconds per microbatch on a V100,
                                        # given (a job whose nodes emulate their compute)
    grad_bytes_per_param = 2            # bytes per parameter in the intra-stage all-reduce
    state_bytes_per_param = 16          # what a joiner downloads (weights + optimizer state)

    [training]
    iterations = 100                    # required: time to train is measured to this iteration
    microbatches_per_iteration = 512    # required: the global batch
    memory_slots = 16                   # microbatches a node can hold in flight
    replay_bound = "auto"               # ship partial gradient sums when it pays (the default),
                                        # or every N microbatches (0: off); docs/design.md 4.9
    snapshot_every = 4                  # stage snapshots every K iterations, and after every
    snapshot_thin = 2                   # step of a stage of at most T replicas (4.6; the node's
    snapshot_keepers = 4                # defaults, gwtf/train/job.py), each kept by 4 nodes
    catch_up_steps = 3                  # a joiner this many steps behind applies them (3.8)

    [network]
    matrix = "../gwtf/data/geo10_aws.csv"   # src,dst,rtt_ms,bandwidth_gbps (relative to this file)
    intra_rtt_ms = 1.0
    intra_bandwidth_gbps = 10.0

    [nodes]
    count = 24                          # initial nodes (ignored when the trace has joins at 0)
    gpus = ["LambdaCloud V100 16GB"]    # names from gwtf/data/gpu_train_throughput.csv
    locations = []                      # default: every location of the matrix
    uplink_gbps = []                    # each node's own uplink, drawn from this list; empty:
    downlink_gbps = []                  # none (the pair model of gwtf/sim/network.py)

    [churn]
    trace = "traces/spot_p3_bamboo.csv" # or a generator below, or nothing (no churn)
    format = "bamboo"                   # csv | bamboo
    generator = "poisson"               # Poisson joins, sessions from a distribution
    join_rate_per_h = 40.0
    session_mean_s = 1800.0
    session_distribution = "exponential"   # or lognormal
    leave_fraction = 0.0
    link_trace = "traces/links.csv"     # extra CSV trace with link rows
    detection_timeout_s = 10.0          # how long a crash goes unnoticed (heartbeat timeout)
    restart_delay_s = 120.0             # dtfm: from noticing a crash to running again

    [drift]                             # machines that slow down and recover (docs/design.md 5)
    trace = "traces/speeds.csv"         # speed rows, time_s,speed,node,factor; and/or generated:
    episodes_per_node_hour = 0.0        # slow episodes per machine and hour (0: none)
    slowdowns = [[1.1, 1.5, 0.70], [1.5, 3.0, 0.25], [3.0, 10.0, 0.05]]
                                        # an episode's factor: a [low, high, weight] bin by
                                        # weight, log-uniform inside it
    episode_median_s = 300.0            # episode length: log-normal of this median,
    episode_sigma = 1.2                 # this shape, clipped to [min, max]
    episode_min_s = 20.0
    episode_max_s = 36000.0

    [control]
    phase_end_s = 0.0                   # time to learn a scaling phase is done everywhere; 0: auto
    message_bytes = 100
    batch_s = 0.0                       # messages landing within batch_s are handled together
    jitter = 0.1                        # each control message's delay x (1 + jitter * U(0, 1))
    routing = "local"                   # gwtf: local solves (as the node), or "relax"
    route_quiet_s = 1.0                 # local: solve once the view was quiet this long

    [client]                            # the job's client (gwtf/sim/recovery/clientcopy.py)
    checkpoint_every = 10               # a checkpoint every K iterations (gwtf submit
                                        # --checkpoint-every K; 0: none), resumed from when a
                                        # stage is lost with every snapshot of it
    location = "eu-west-1"              # default: where the first data holder is
    uplink_gbps = 1.0                   # its access link; default none (the matrix's links)
    downlink_gbps = 1.0
    resume_within_s = 600.0             # wait this long for every stage to have a node

    [policies]
    names = ["gwtf", "gwtf-fixed", "swarm", "swarm-rebalance", "dtfm", "oracle"]
    swarm_rebalance_period_s = 300.0
    placement_horizon_s = 600.0         # gwtf: a move must pay its state download back in this
    swarm_ema_alpha = 0.1
    swarm_refresh_s = 30.0
    dtfm_search_evaluations = 4000

    [compression]                       # activation compression at stage boundaries (default:
    allow = ["int8"]                    # none; gwtf/sim/compression.py): the codecs the job
                                        # allows (int8, int4); the planning policies choose per
                                        # boundary, the swarm ones send int8 everywhere, and
                                        # "gwtf-uncompressed" joins the default policies
    codec_cost = 1.0                    # the codecs' compute, times the CPU figure measured
                                        # (compression.CODEC_S_PER_BYTE; 0: free)

Compute per stage, `compute = "measured"`: a V100 trains Transformer-XL large (257 M
parameters) at the measured `transformerxl_large_tok_per_s` of
gwtf/data/gpu_train_throughput.csv, i.e. 6 * 257e6 * tok/s FLOP/s at 6 FLOP per parameter per
token (forward + backward). A stage of P parameters and T tokens per microbatch therefore takes
`6 P T / that` seconds on a V100, and `/ relative_to_v100` on another GPU.
`compute = "peak"`: a GPU runs at `utilisation` times its dense 16-bit tensor peak
(gwtf/data/gpu_peak_tflops.csv, the vendors' datasheets), so a stage takes
`6 P T / (peak * utilisation)` seconds; current training stacks reach 30-50% of that peak,
several times the V100 figure above. `compute_s_v100`, where given, replaces either: each
stage's seconds per microbatch on a V100, as nodes that emulate their compute run it (`gwtf node
--emulate-compute`; simulations/fidelity.toml). A microbatch's activation is `tokens * hidden *
activation_dtype_bytes` bytes.
"""

from __future__ import annotations

import csv
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gwtf.flow.compression import CODECS
from gwtf.flow.generate import GPU_FILE, data_path
from gwtf.flow.topology import LinkSpec, TopologyError, load_link_matrix
from gwtf.job.catchup import CATCH_UP_STEPS
from gwtf.recovery.shipments import DEFAULT_REPLAY_BOUND, REPLAY_AUTO
from gwtf.sim.traces import (
    TraceError,
    TraceEvent,
    generate_churn,
    generate_stragglers,
    read_trace,
)

__all__ = [
    "KNOWN_POLICIES",
    "LOSSY_CODECS",
    "POLICIES",
    "ROUTINGS",
    "TXL_LARGE_PARAMS",
    "NodeInfo",
    "Scenario",
    "ScenarioError",
    "gpu_table",
    "load_scenario",
    "parse_scenario",
]

POLICIES = ("gwtf", "gwtf-fixed", "swarm", "swarm-rebalance", "swarm-routing", "dtfm", "oracle")
"""The policies a scenario runs unless it names them (with `gwtf-uncompressed` added where the
scenario compresses)."""
KNOWN_POLICIES = (*POLICIES, "gwtf-uncompressed")
"""Every policy a scenario or `gwtf simulate --policy` may name."""
LOSSY_CODECS = tuple(name for name, codec in CODECS.items() if not codec.lossless)
ROUTINGS = ("local", "relax")
"""How the gwtf policies route (`Scenario.routing`), as `gwtf node --routing`."""
TXL_LARGE_PARAMS = 257e6
"""Parameters of Transformer-XL large (WikiText-103), the model of the measured tokens/s."""
_V100 = "LambdaCloud V100 16GB"
_PEAK_FILE = "gpu_peak_tflops.csv"


class ScenarioError(ValueError):
    """A scenario file is invalid; the message is one sentence saying what to fix."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node of the scenario's universe: where it is, what GPU it has, which stage it holds."""

    id: str
    stage: int
    location: str
    gpu: str
    speed: float
    """Training speed relative to a V100."""
    pinned: bool = False
    """The trace names the stage (as `gwtf node --stage K`): placement leaves the joiner there."""
    uplink_gbps: float = math.inf
    """The node's own uplink, shared by everything it sends (inf: the pair model, see
    gwtf/sim/network.py)."""
    downlink_gbps: float = math.inf
    """The node's own downlink, shared by everything it receives."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    seed: int
    duration_s: float
    stages: int
    params_per_stage: tuple[float, ...]
    tokens_per_microbatch: int
    hidden_size: int
    activation_bytes: int
    grad_bytes_per_param: float
    state_bytes_per_param: float
    compute_s_v100: tuple[float, ...]
    iterations: int
    microbatches_per_iteration: int
    memory_slots: int
    links: Mapping[frozenset[str], LinkSpec]
    intra: LinkSpec
    nodes: Mapping[str, NodeInfo]
    initial: tuple[str, ...]
    events: tuple[TraceEvent, ...]
    detection_timeout_s: float
    restart_delay_s: float
    phase_end_s: float
    message_bytes: int
    control_batch_s: float
    control_jitter: float
    policies: tuple[str, ...]
    swarm_rebalance_period_s: float
    placement_horizon_s: float
    swarm_ema_alpha: float
    swarm_refresh_s: float
    dtfm_search_evaluations: int
    sources: Mapping[str, str] = field(default_factory=dict)
    replay_bound: int = DEFAULT_REPLAY_BOUND
    """Microbatches between shipments of partial sums (0: off; REPLAY_AUTO: adaptive)."""
    snapshot_every: int = 4
    snapshot_thin: int = 2
    snapshot_keepers: int = 4
    catch_up_steps: int = CATCH_UP_STEPS
    """A joiner whose state download missed at most this many steps fetches their gradients
    instead of the state again (gwtf.job.catchup; 0: never)."""
    routing: str = "local"
    """How the gwtf policies route (docs/design.md 5): "local", by local solves on each node's
    membership view as the node does by default (`gwtf node --routing local`), or "relax", by
    the flow machines' messages (`--routing relax`)."""
    route_quiet_s: float = 1.0
    """Local routing: a node solves its view once it has not changed for this long (the node's
    `NodeConfig.route_quiet_s`)."""
    client_checkpoint_every: int = 10
    """The job's client keeps a checkpoint every this many iterations (`gwtf submit
    --checkpoint-every`; 0: none) and resumes the job from it when a stage is lost with every
    snapshot of it (gwtf/sim/recovery/clientcopy.py)."""
    client_location: str = ""
    """Where the client is (empty: where the first data holder is)."""
    client_uplink_gbps: float = math.inf
    client_downlink_gbps: float = math.inf
    client_resume_within_s: float = 600.0
    compression: tuple[str, ...] = ()
    """The codecs the job allows at stage boundaries (`[compression] allow`; empty: off)."""
    codec_plan: tuple[str, ...] = ()
    """The codec of each boundary as the policy simulated sends (gwtf/sim/compression.py sets
    it per policy; empty: none anywhere)."""
    boundary_bytes: tuple[int, ...] = ()
    """Bytes one microbatch sends across each boundary under `codec_plan` (empty: the
    activation's, everywhere)."""
    codec_s: tuple[float, ...] = ()
    """Per stage, seconds of encoding and decoding per microbatch under `codec_plan`."""
    codec_cost: float = 1.0
    """The codecs' compute as a multiple of the CPU figure measured (`[compression]
    codec_cost`; 0: free, as on an accelerator)."""

    def compute_s(self, node: NodeInfo, stage: int | None = None) -> float:
        """Seconds of forward + backward per microbatch of `node` at `stage` (default: its own),
        with the codecs' encoding and decoding there (`codec_s`)."""
        at = node.stage if stage is None else stage
        if self.codec_s:
            return self.compute_s_v100[at] / node.speed + self.codec_s[at]
        return self.compute_s_v100[at] / node.speed

    def boundary(self, k: int) -> int:
        """Bytes one microbatch sends across boundary k (between stages k and k+1), each way."""
        return self.boundary_bytes[k] if self.boundary_bytes else self.activation_bytes

    def link(self, loc_a: str, loc_b: str) -> LinkSpec | None:
        if loc_a == loc_b:
            return self.intra
        return self.links.get(frozenset((loc_a, loc_b)))


def gpu_peak_table() -> dict[str, float]:
    """GPU name -> dense 16-bit tensor peak, TFLOP/s, from the shipped CSV."""
    with open(data_path(_PEAK_FILE), encoding="utf-8", newline="") as handle:
        return {row["gpu"]: float(row["dense_fp16_bf16_tflops"])
                for row in csv.DictReader(handle)}


def gpu_table() -> dict[str, tuple[float, float]]:
    """GPU name -> (relative_to_v100, transformerxl_large_tok_per_s) from the shipped CSV."""
    table: dict[str, tuple[float, float]] = {}
    with open(data_path(GPU_FILE), encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            table[row["gpu"]] = (
                float(row["relative_to_v100"]),
                float(row["transformerxl_large_tok_per_s"]),
            )
    return table


# -- parsing helpers ------------------------------------------------------------------------

_TOP = ("name", "description", "seed", "duration_s", "model", "training", "network", "nodes",
        "churn", "drift", "control", "policies", "client", "compression")
_SECTIONS = {
    "model": ("stages", "params_per_stage", "tokens_per_microbatch", "hidden_size",
              "activation_dtype_bytes", "grad_bytes_per_param", "state_bytes_per_param",
              "compute", "utilisation", "compute_s_v100"),
    "training": ("iterations", "microbatches_per_iteration", "memory_slots", "replay_bound",
                 "snapshot_every", "snapshot_thin", "snapshot_keepers", "catch_up_steps"),
    "network": ("matrix", "intra_rtt_ms", "intra_bandwidth_gbps"),
    "nodes": ("count", "gpus", "locations", "uplink_gbps", "downlink_gbps"),
    "churn": ("trace", "format", "generator", "join_rate_per_h", "session_mean_s",
              "session_distribution", "leave_fraction", "link_trace", "detection_timeout_s",
              "restart_delay_s"),
    "drift": ("trace", "episodes_per_node_hour", "slowdowns", "episode_median_s",
              "episode_sigma", "episode_min_s", "episode_max_s"),
    "control": ("phase_end_s", "message_bytes", "batch_s", "jitter", "routing", "route_quiet_s"),
    "policies": ("names", "swarm_rebalance_period_s", "placement_horizon_s", "swarm_ema_alpha",
                 "swarm_refresh_s", "dtfm_search_evaluations"),
    "client": ("checkpoint_every", "location", "uplink_gbps", "downlink_gbps",
               "resume_within_s"),
    "compression": ("allow", "codec_cost"),
}


class _Reader:
    def __init__(self, where: str, table: Mapping[str, Any], allowed: Sequence[str]) -> None:
        self.where = where
        self.table = table
        for key in table:
            if key not in allowed:
                raise ScenarioError(
                    f"{where}: unknown key {key!r}; the allowed keys are {', '.join(allowed)}"
                )

    def _get(self, key: str, default: Any, required: bool) -> Any:
        if key not in self.table:
            if required:
                raise ScenarioError(f"{self.where}: missing {key!r}")
            return default
        return self.table[key]

    def number(
        self, key: str, default: float = 0.0, *, required: bool = False, positive: bool = False
    ) -> float:
        value = self._get(key, default, required)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value
        ):
            raise ScenarioError(f"{self.where}: {key!r} must be a number, got {value!r}")
        if value < 0 or (positive and value == 0):
            need = "positive" if positive else ">= 0"
            raise ScenarioError(f"{self.where}: {key!r} must be {need}, got {value!r}")
        return float(value)

    def integer(
        self, key: str, default: int = 0, *, required: bool = False, minimum: int = 0
    ) -> int:
        value = self._get(key, default, required)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ScenarioError(
                f"{self.where}: {key!r} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    def positives(
        self, key: str, count: int | None = None, *, required: bool = False
    ) -> tuple[float, ...]:
        """A list of positive numbers (of `count` of them, one per stage, where given); () where
        the key is absent and optional."""
        value = self._get(key, None, required)
        if value is None:
            return ()
        if not isinstance(value, list) or (count is not None and len(value) != count) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in value
        ):
            many = "" if count is None else f"{count} "
            raise ScenarioError(f"{self.where}: {key!r} must be a list of {many}positive numbers")
        return tuple(float(v) for v in value)

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        value = self._get(key, default, required)
        if not isinstance(value, str):
            raise ScenarioError(f"{self.where}: {key!r} must be a string, got {value!r}")
        return value

    def strings(self, key: str, default: Sequence[str] = ()) -> tuple[str, ...]:
        value = self._get(key, list(default), False)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ScenarioError(f"{self.where}: {key!r} must be a list of strings, got {value!r}")
        return tuple(value)


def _section(where: str, doc: Mapping[str, Any], name: str) -> _Reader:
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ScenarioError(f"{where}: [{name}] must be a table")
    return _Reader(f"{where} [{name}]", table, _SECTIONS[name])


DEFAULT_SLOWDOWNS = ((1.1, 1.5, 0.70), (1.5, 3.0, 0.25), (3.0, 10.0, 0.05))
"""Slow episodes' factors: most a little slower, a few several times (docs/results/stragglers.md
says what is measured and what is assumed)."""


def _side_trace(
    where: str, path: Path, kind: str, key: str, sources: dict[str, str], name: str
) -> list[TraceEvent]:
    """A CSV trace of `kind` rows only (link changes, speeds), given as `name` in the file; its
    path kept in `sources` as `key`."""
    path = path.resolve()
    sources[key] = str(path)
    try:
        events = read_trace(path, "csv")
    except TraceError as err:
        raise ScenarioError(f"{where}: {err}") from None
    if any(e.kind != kind for e in events):
        raise ScenarioError(f"{where}: '{name}' may only hold {kind} rows")
    return events


def _drift(
    where: str,
    doc: Mapping[str, Any],
    base: Path,
    seed: int,
    initial_ids: Sequence[str],
    events: Sequence[TraceEvent],
    duration: float,
    sources: dict[str, str],
) -> list[TraceEvent]:
    """The `[drift]` section's speed rows: a trace of them and/or generated slow episodes of
    every machine of the scenario (its own random stream: a scenario without drift draws the
    same as before it existed)."""
    drift = _section(where, doc, "drift")
    out: list[TraceEvent] = []
    machines = list(dict.fromkeys([*initial_ids, *(e.node for e in events if e.kind == "join")]))
    trace_name = drift.text("trace")
    if trace_name:
        out = _side_trace(f"{where} [drift]", base / trace_name, "speed", "drift_trace",
                          sources, "trace")
        unknown = sorted({e.node for e in out} - set(machines))
        if unknown:
            raise ScenarioError(f"{where} [drift]: speed rows name machines the scenario does "
                                f"not have: {', '.join(unknown[:5])}")
    rate = drift.number("episodes_per_node_hour", 0.0)
    if rate > 0:
        if duration <= 0:
            raise ScenarioError(f"{where}: generated drift needs 'duration_s'")
        bins = drift.table.get("slowdowns", [list(b) for b in DEFAULT_SLOWDOWNS])
        if not isinstance(bins, list) or not all(
            isinstance(b, list) and len(b) == 3
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in b)
            for b in bins
        ):
            raise ScenarioError(f"{where} [drift]: 'slowdowns' must be a list of "
                                "[low, high, weight] triples")
        try:
            out += generate_stragglers(
                np.random.default_rng([seed, 29]),
                nodes=machines,
                duration_s=duration,
                episodes_per_node_h=rate,
                slowdowns=[(float(a), float(b), float(w)) for a, b, w in bins],
                median_s=drift.number("episode_median_s", 300.0, positive=True),
                sigma=drift.number("episode_sigma", 1.2),
                min_s=drift.number("episode_min_s", 20.0, positive=True),
                max_s=drift.number("episode_max_s", 36000.0, positive=True),
            )
        except ValueError as err:
            raise ScenarioError(f"{where} [drift]: {err}") from None
    return out


def load_scenario(path: str | Path, *, seed: int | None = None) -> Scenario:
    """Read and validate a scenario file; every problem is a one-line ScenarioError.

    `seed` replaces the file's seed (it draws the generated churn, the nodes' regions and GPUs,
    and every policy's randomness)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ScenarioError(f"cannot read scenario {str(path)!r}: {reason}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"scenario {str(path)!r} is not valid TOML: {err}") from None
    return parse_scenario(doc, str(path), base=p.resolve().parent, seed=seed)


def parse_scenario(
    doc: Mapping[str, Any], where: str, *, base: Path, seed: int | None = None
) -> Scenario:
    where = f"scenario {where!r}"
    top = _Reader(where, doc, _TOP)
    name = top.text("name", required=True)
    description = top.text("description")
    seed = top.integer("seed", 0) if seed is None else seed
    rng = np.random.default_rng(seed)

    model = _section(where, doc, "model")
    stages = model.integer("stages", required=True, minimum=2)
    params = model.positives("params_per_stage", stages, required=True)
    tokens = model.integer("tokens_per_microbatch", required=True, minimum=1)
    hidden = model.integer("hidden_size", required=True, minimum=1)
    act_dtype = model.number("activation_dtype_bytes", 2, positive=True)
    activation_bytes = int(tokens * hidden * act_dtype)
    grad_bpp = model.number("grad_bytes_per_param", 2, positive=True)
    state_bpp = model.number("state_bytes_per_param", 16, positive=True)

    gpus = gpu_table()
    v100_speed, v100_tok = gpus[_V100]
    v100_flops = 6 * TXL_LARGE_PARAMS * v100_tok / v100_speed
    compute_model = model.text("compute", "measured")
    if compute_model == "peak":
        utilisation = model.number("utilisation", 0.4, positive=True)
        if utilisation > 1:
            raise ScenarioError(f"{where} [model]: 'utilisation' is a fraction of the peak, "
                                f"at most 1 (got {utilisation:g})")
        peaks = gpu_peak_table()
        # A node's speed is its peak over the V100's, and the V100 runs at its own peak times
        # the utilisation: compute_s(node) = 6 P T / (peak(node) * utilisation).
        v100_flops = peaks[_V100] * 1e12 * utilisation
        gpus = {name: (peaks[name] / peaks[_V100], tok) for name, (_, tok) in gpus.items()
                if name in peaks}
    elif compute_model != "measured":
        raise ScenarioError(
            f"{where} [model]: unknown compute {compute_model!r}; use measured or peak")
    compute_v100 = model.positives("compute_s_v100", stages) or tuple(
        6 * p * tokens / v100_flops for p in params)

    training = _section(where, doc, "training")
    iterations = training.integer("iterations", required=True, minimum=1)
    per_iter = training.integer("microbatches_per_iteration", required=True, minimum=1)
    slots = training.integer("memory_slots", 16, minimum=1)
    if training.table.get("replay_bound", "auto") == "auto":
        replay_bound = REPLAY_AUTO
    elif isinstance(training.table["replay_bound"], str):
        raise ScenarioError(f"{where} [training]: 'replay_bound' must be \"auto\" or an integer "
                            f">= 0, got {training.table['replay_bound']!r}")
    else:
        replay_bound = training.integer("replay_bound", DEFAULT_REPLAY_BOUND)

    snapshot_every = training.integer("snapshot_every", 4, minimum=1)
    snapshot_thin = training.integer("snapshot_thin", 2)
    snapshot_keepers = training.integer("snapshot_keepers", 4, minimum=1)
    catch_up_steps = training.integer("catch_up_steps", CATCH_UP_STEPS)

    network = _section(where, doc, "network")
    matrix = network.text("matrix", str(data_path("geo10_aws.csv")))
    matrix_path = (base / matrix).resolve()
    try:
        links = load_link_matrix(matrix_path)
    except TopologyError as err:
        raise ScenarioError(f"{where} [network]: {err}") from None
    intra = LinkSpec(
        network.number("intra_rtt_ms", 1.0), network.number("intra_bandwidth_gbps", 10.0,
                                                            positive=True)
    )
    all_locations = sorted({loc for pair in links for loc in pair})

    nodes_sec = _section(where, doc, "nodes")
    count = nodes_sec.integer("count", 0)
    gpu_names = nodes_sec.strings("gpus", (_V100,))
    for gpu in gpu_names:
        if gpu not in gpus:
            table = GPU_FILE if compute_model == "measured" else _PEAK_FILE
            raise ScenarioError(
                f"{where} [nodes]: unknown GPU {gpu!r}; use a name from {table}"
            )
    uplinks = nodes_sec.positives("uplink_gbps")
    downlinks = nodes_sec.positives("downlink_gbps")
    # Access links come from their own stream, so that a scenario without them draws the same
    # nodes as before they existed.
    link_rng = np.random.default_rng([seed, 11])
    locations = nodes_sec.strings("locations", tuple(all_locations))
    for loc in locations:
        if loc not in all_locations and len(locations) > 1:
            raise ScenarioError(
                f"{where} [nodes]: location {loc!r} is not in the network matrix"
            )
    if not locations:
        raise ScenarioError(f"{where} [nodes]: 'locations' is empty")

    churn = _section(where, doc, "churn")
    detection = churn.number("detection_timeout_s", 10.0)
    restart = churn.number("restart_delay_s", 120.0)
    trace_name = churn.text("trace")
    generator = churn.text("generator")
    if trace_name and generator:
        raise ScenarioError(f"{where} [churn]: give either 'trace' or 'generator', not both")
    events: list[TraceEvent] = []
    sources = {"matrix": str(matrix_path)}
    duration_given = "duration_s" in doc
    duration = top.number("duration_s", 0.0, positive=duration_given)
    if trace_name:
        fmt = churn.text("format", "csv")
        trace_path = (base / trace_name).resolve()
        sources["trace"] = str(trace_path)
        try:
            events = read_trace(trace_path, fmt)
        except TraceError as err:
            raise ScenarioError(f"{where} [churn]: {err}") from None
    initial_ids: list[str] = [e.node for e in events if e.kind == "join" and e.time_s <= 0]
    if not initial_ids:
        initial_ids = [f"n{i}" for i in range(count)]
    if generator:
        if generator != "poisson":
            raise ScenarioError(f"{where} [churn]: unknown generator {generator!r}; use poisson")
        if not duration_given:
            raise ScenarioError(f"{where}: a generated churn needs 'duration_s'")
        try:
            events = generate_churn(
                rng,
                initial=initial_ids,
                duration_s=duration,
                join_rate_per_h=churn.number("join_rate_per_h", required=True),
                session_mean_s=churn.number("session_mean_s", required=True, positive=True),
                distribution=churn.text("session_distribution", "exponential"),
                leave_fraction=churn.number("leave_fraction", 0.0),
            )
        except ValueError as err:
            raise ScenarioError(f"{where} [churn]: {err}") from None
    link_trace = churn.text("link_trace")
    if link_trace:
        extra = _side_trace(f"{where} [churn]", base / link_trace, "link", "link_trace",
                            sources, "link_trace")
        events = sorted(events + extra, key=lambda e: e.time_s)
    events = sorted(events + _drift(where, doc, base, seed, initial_ids, events, duration,
                                    sources), key=lambda e: e.time_s)
    for event in events:
        if event.kind == "link":
            a, b = event.link_pair
            for loc in (a, b):
                if loc not in all_locations:
                    raise ScenarioError(
                        f"{where}: link event at {event.time_s:g} s names unknown location {loc!r}"
                    )
    if not initial_ids:
        raise ScenarioError(
            f"{where}: no initial node; set [nodes] count or a trace with joins at 0"
        )
    if not duration_given:
        if not events:
            raise ScenarioError(f"{where}: set 'duration_s' (there is no trace to take it from)")
        duration = max(e.time_s for e in events)

    # Each node's stage, location and GPU: seeded, and the same for every policy. A node without
    # a stage goes to the stage with the fewest live nodes at that moment of the trace.
    infos: dict[str, NodeInfo] = {}
    alive_per_stage = [0] * stages
    node_stage: dict[str, int] = {}

    def make(node_id: str, stage: int | None, location: str | None,
             uplink: float | None = None) -> NodeInfo:
        pinned = stage is not None
        if stage is None:
            stage = min(range(stages), key=lambda s: (alive_per_stage[s], s))
        if stage >= stages:
            raise ScenarioError(
                f"{where}: node {node_id!r} joins stage {stage}, but the model has {stages}"
            )
        loc = location or locations[int(rng.integers(len(locations)))]
        gpu = gpu_names[int(rng.integers(len(gpu_names)))]
        if uplink is not None:
            up = uplink
        else:
            up = uplinks[int(link_rng.integers(len(uplinks)))] if uplinks else math.inf
        down = downlinks[int(link_rng.integers(len(downlinks)))] if downlinks else math.inf
        return NodeInfo(node_id, stage, loc, gpu, gpus[gpu][0], pinned, up, down)

    explicit = {e.node: e for e in events if e.kind == "join" and e.time_s <= 0}
    for node_id in initial_ids:
        join = explicit.get(node_id)
        info = make(node_id, join.stage if join else None, join.location if join else None,
                    join.uplink_gbps if join else None)
        infos[node_id] = info
        alive_per_stage[info.stage] += 1
        node_stage[node_id] = info.stage
    body: list[TraceEvent] = []
    for event in events:
        if event.kind == "join" and event.node in explicit and event.time_s <= 0:
            continue
        if event.kind == "join":
            if event.node in infos and event.node in node_stage:
                raise ScenarioError(f"{where}: node {event.node!r} joins twice while alive")
            base_info = infos.get(event.node)
            info = make(event.node, event.stage, event.location, event.uplink_gbps)
            if base_info is not None:  # a rejoin keeps the machine, not the stage
                info = replace(base_info, stage=info.stage, pinned=info.pinned)
            infos[event.node] = info
            alive_per_stage[info.stage] += 1
            node_stage[event.node] = info.stage
        elif event.kind in ("leave", "crash"):
            stage = node_stage.pop(event.node, None)
            if stage is None:
                raise ScenarioError(
                    f"{where}: node {event.node!r} {event.kind}es at {event.time_s:g} s "
                    "but is not alive"
                )
            alive_per_stage[stage] -= 1
        if event.time_s <= duration:
            body.append(event)

    control = _section(where, doc, "control")
    phase_end = control.number("phase_end_s", 0.0)
    message_bytes = control.integer("message_bytes", 100, minimum=1)
    batch_s = control.number("batch_s", 0.0)
    jitter = control.number("jitter", 0.1)
    routing = control.text("routing", "local")
    if routing not in ROUTINGS:
        raise ScenarioError(
            f"{where} [control]: routing must be one of {', '.join(ROUTINGS)}, got {routing!r}"
        )
    route_quiet_s = control.number("route_quiet_s", 1.0, positive=True)
    if phase_end == 0:
        used = {info.location for info in infos.values()}
        worst = max(
            (link.rtt_ms / 2000 + message_bytes * 8 / (link.bandwidth_gbps * 1e9)
             for a in used for b in used
             if (link := (intra if a == b else links.get(frozenset((a, b))))) is not None),
            default=intra.rtt_ms / 2000,
        )
        # The flow machines' scaling phases are ended swarm-wide once no control message is in
        # flight (gwtf.flow.relax.bus does the same). A real swarm learns it by a
        # termination-detection round over its heartbeats: two of the slowest one-way control
        # delays, and a millisecond of processing.
        phase_end = 2 * worst + 0.001

    client = _section(where, doc, "client")
    client_location = client.text("location", "")
    if client_location and client_location not in all_locations:
        raise ScenarioError(f"{where} [client]: location {client_location!r} is not in the "
                            "network matrix")
    codecs = _section(where, doc, "compression")
    compression = codecs.strings("allow")
    for codec in compression:
        if codec not in LOSSY_CODECS:
            raise ScenarioError(f"{where} [compression]: unknown codec {codec!r} in 'allow'; "
                                f"use {', '.join(LOSSY_CODECS)}")
    compression = tuple(sorted(set(compression), key=LOSSY_CODECS.index))
    pol = _section(where, doc, "policies")
    names = pol.strings("names", POLICIES + (("gwtf-uncompressed",) if compression else ()))
    for policy in names:
        if policy not in KNOWN_POLICIES:
            raise ScenarioError(
                f"{where} [policies]: unknown policy {policy!r}; use {', '.join(KNOWN_POLICIES)}"
            )
    return Scenario(
        name=name,
        description=description,
        path=where,
        seed=seed,
        duration_s=duration,
        stages=stages,
        params_per_stage=params,
        tokens_per_microbatch=tokens,
        hidden_size=hidden,
        activation_bytes=activation_bytes,
        grad_bytes_per_param=grad_bpp,
        state_bytes_per_param=state_bpp,
        compute_s_v100=compute_v100,
        iterations=iterations,
        microbatches_per_iteration=per_iter,
        memory_slots=slots,
        links=links,
        intra=intra,
        nodes=infos,
        initial=tuple(initial_ids),
        events=tuple(body),
        detection_timeout_s=detection,
        restart_delay_s=restart,
        phase_end_s=phase_end,
        message_bytes=message_bytes,
        control_batch_s=batch_s,
        control_jitter=jitter,
        policies=names,
        swarm_rebalance_period_s=pol.number("swarm_rebalance_period_s", 300.0, positive=True),
        placement_horizon_s=pol.number("placement_horizon_s", 600.0, positive=True),
        swarm_ema_alpha=pol.number("swarm_ema_alpha", 0.1, positive=True),
        swarm_refresh_s=pol.number("swarm_refresh_s", 30.0, positive=True),
        dtfm_search_evaluations=pol.integer("dtfm_search_evaluations", 4000, minimum=1),
        sources=sources,
        replay_bound=replay_bound,
        snapshot_every=snapshot_every,
        snapshot_thin=snapshot_thin,
        snapshot_keepers=snapshot_keepers,
        catch_up_steps=catch_up_steps,
        routing=routing,
        route_quiet_s=route_quiet_s,
        client_checkpoint_every=client.integer("checkpoint_every", 10),
        client_location=client_location,
        client_uplink_gbps=client.number("uplink_gbps", positive=True)
        if "uplink_gbps" in client.table else math.inf,
        client_downlink_gbps=client.number("downlink_gbps", positive=True)
        if "downlink_gbps" in client.table else math.inf,
        client_resume_within_s=client.number("resume_within_s", 600.0, positive=True),
        compression=compression,
        codec_cost=codecs.number("codec_cost", 1.0),
    )
