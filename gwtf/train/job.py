"""The training job: model, optimizer, seed and schedule, read from a TOML file or a preset.

File format (TOML; every key is listed, optional ones with their default)::

    name = "my-job"            # optional, free text (default "")
    seed = 0                   # optional, the one seed every random draw derives from (default 0)
    iterations = 40            # optimizer steps
    microbatches = 8           # microbatches per iteration (ids 0..microbatches-1)
    microbatch_size = 8        # sequences per microbatch
    data = "corpus.txt"        # optional, a text file, a .jsonl file or a folder, relative to
                               # this file's folder (default: the Python standard library
                               # sources on the machine); formats in gwtf.train.data
    tokenizer = "tok.json"     # optional, a Hugging Face tokenizer.json, relative to this file's
                               # folder (default: none, the tokens are the bytes)
    data_field = "text"        # optional, the key of a .jsonl line that holds the text
                               # (default "text")
    data_order = "random"      # optional, random|sequential: windows at random offsets, or
                               # consecutive windows in corpus order (default "random")
    data_sha256 = "9f86d0..."  # optional, the digest `data` must have (gwtf.train.digests);
                               # computed from the file when left out, and stated in the job
                               # that travels to the nodes and is saved beside a checkpoint
    tokenizer_sha256 = "..."   # optional, the same for `tokenizer`
    grad_accum = "float64"     # optional, float64|float32: dtype of the gradient sums (below)
    replay_bound = "auto"      # optional, "auto" or N (0: off): how often a node ships its
                               # running gradient sum to a stage peer, so that its death
                               # replays at most N microbatches (docs/design.md 4.9)
    aggregation = "mean"       # optional, mean|trimmed-mean|centered-clip (below); or a table:

    [model]
    kind = "gpt"               # gpt (LayerNorm, GELU, learned positions) | llama (RMSNorm,
                               # SwiGLU, rotary positions)
    layers = 6                 # transformer blocks; the swarm cuts them into stages
    width = 64                 # model dimension
    heads = 4                  # attention heads; must divide width
    seq_len = 64               # tokens per sequence
    vocab = 256                # optional (default 256; at least 256 for byte-level data, at
                               # least the tokenizer's vocabulary with a tokenizer)
    dropout = 0.1              # optional (default 0.1), on embeddings and residual branches
    kv_heads = 2               # optional (default: heads), key/value heads; must divide heads
                               # (grouped-query attention: heads / kv_heads share each)
    mlp_hidden = 176           # optional (default: 4 x width for gpt, 8/3 x width rounded up
                               # to 16 for llama), hidden size of the MLP
    norm_eps = 1e-5            # optional (default 1e-5), the epsilon of every norm
    rope_theta = 10000.0       # optional, llama only (default 10000), base of rotary angles
    activation = "gelu"        # optional, gpt: gelu (default, exact) | gelu-tanh (GPT-2's
                               # gelu_new); llama: silu (its only one, SwiGLU)
    positions = 1024           # optional (default: seq_len), the longest sequence the model has
                               # positions for; gpt learns that many; at least seq_len
    pretrained = "hf-folder"   # optional, a Hugging Face folder to start from (below), relative
                               # to this file's folder (default: initialised from the seed)
    pretrained_sha256 = "..."  # optional, the digest `pretrained` must have, as data_sha256

    [optimizer]                # optional table: AdamW
    lr = 0.003                 # default 0.001
    betas = [0.9, 0.95]        # default [0.9, 0.95]
    weight_decay = 0.1         # default 0.1, on matrices and embeddings, not on norms or biases
    eps = 1e-8                 # default 1e-8

    [aggregation]              # optional table, instead of the one-word `aggregation = ...`
    rule = "trimmed-mean"      # mean (default) | trimmed-mean | centered-clip
    trim = 0.2                 # trimmed-mean: fraction of the replicas cut at each end, [0, 0.5)
    clip_iterations = 3        # centered-clip: clipping rounds, at least 1
    norm_factor = 10.0         # screen: a replica whose mean gradient's norm is above this
                               # times its stage's median is excluded from the job; above 1

    [compression]              # optional table (or `compression = "off"`): what crosses a stage
                               # boundary (docs/design.md 2.15, gwtf.train.codecs)
    allow = ["int8"]           # default ["int8"]: the codecs the swarm may choose where a link
                               # binds (int8, int4); [] never compresses
    after = { 3 = "int8" }     # optional: the plan, after which block which codec; the swarm
                               # plans a job that leaves it out when the job starts

`aggregation` is how the replicas of a stage combine their gradients at each commit
(`gwtf.train.robust`). `mean` is the exact weighted mean, equal to the one-process reference bit
for bit, and trusts every replica. `trimmed-mean` and `centered-clip` bound what one poisoning
replica can do to the step, and with either the swarm also excludes a replica whose gradient
norm its stage peers find out of bounds (`norm_factor`) or whose parameters disagree with the
majority of its stage after a step (`gwtf.node.jobs.manager`).

`model.pretrained` starts the job from the weights of a Hugging Face LLaMA or GPT-2 folder
(`config.json` and `model.safetensors`, or shards with their index; `gwtf.train.models.hf`) instead
of the seeded initialisation. When the [model] table leaves `kind` out, every architecture key is
read from the folder's `config.json` (`gwtf.train.models.hfconfig`), and a key the table states
anyway must agree with it; the table then needs only `pretrained` and `seq_len`. A table that states
`kind` is taken as written: that is the form a job travels in to the nodes and is saved in beside
a checkpoint (`to_dict` writes every key that differs from its default), so reading it never
needs the folder, and each node checks it against its own copy of the folder when it builds its
stage. The folder is read on the node, at the same path, as `data` is.

`data`, `tokenizer` and `model.pretrained` may each be a URL that fsspec opens instead of a path
(`https://...`, `s3://...`, `file://...`): each node fetches it once into its cache and checks it
against the pinned digest (`gwtf.train.remote`); a URL is never joined to the job file's folder.

`grad_accum = "float64"` keeps each node's gradient sums in float64. A float64 holds the sum of
float32 values exactly as long as their magnitudes span less than about 2**29, which gradients of
one parameter over the microbatches of an iteration practically always do; the sum then does not
depend on the order in which the microbatches arrived or on how they were split over replicas,
and a swarm ends bit-identical to the one-process reference. It costs 8 bytes per parameter of
memory and of aggregation traffic instead of 4; `float32` halves that and leaves differences at
the level of float rounding.

**The id is the content.** `job_id` is a hash of the job's settings and of the digests of the
files it names (`data_sha256`, `tokenizer_sha256`, `model.pretrained_sha256`: a streamed sha256 of
what each path holds, `gwtf.train.digests`), never of the paths themselves: the same job copied to
another folder, or kept by its volunteers at other paths, has the same id, and a job whose data,
tokenizer or weights changed by one byte has a new one, so a swarm that trained it once trains it
again. `pinned` states the digests (read from the files, once, where the job leaves them out);
the client submits a job pinned, so the nodes never hash a file to know a job's id, and every node
that reads a file checks it against its digest before training (`gwtf.train.data.job_corpus`,
`gwtf.train.models.hf.check_folder`): a volunteer whose copy differs refuses the job at submission.

Every mistake is reported as one `JobError` sentence that names the key and says what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gwtf.flow.compression import CODECS, DEFAULT_ALLOWED
from gwtf.job.catchup import CATCH_UP_STEPS
from gwtf.train.digests import DigestError, data_digest, pretrained_digest, tokenizer_digest
from gwtf.train.models.hfconfig import CONFIG_FILE, HFConfigError, model_keys, read_config
from gwtf.train.remote import data_location, is_url, pretrained_location, tokenizer_location

__all__ = [
    "BYTE_VOCAB",
    "AGGREGATION_RULES",
    "ACTIVATIONS",
    "DATA_ORDERS",
    "GRAD_ACCUM_DTYPES",
    "AggregationConfig",
    "CompressionConfig",
    "MODEL_KINDS",
    "NORM_EPS",
    "PRESETS",
    "ROPE_THETA",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_KEEPERS",
    "SNAPSHOT_THIN",
    "JobConfig",
    "JobError",
    "ModelConfig",
    "OptimizerConfig",
    "job_from_dict",
    "load_job",
    "preset",
    "resolve_job",
]

BYTE_VOCAB = 256
MODEL_KINDS = ("gpt", "llama")
GRAD_ACCUM_DTYPES = ("float64", "float32")
# Stage snapshots (docs/design.md 4.6), chosen on the bytes they cost against the iterations a
# rollback redoes. A stage's state is 12 bytes per parameter (fp32 weights and two AdamW
# moments); each iteration a stage of n replicas already moves n(n-1) float64 gradient sums
# (8 bytes per parameter each) between its replicas. A periodic snapshot every K iterations adds
# 12/K bytes per parameter per iteration, to one keeper: with K = 4, 3 bytes, 6% of a 3-replica
# stage's gradient exchange and 19% of a 2-replica one's, while a stage wiped at a random moment
# redoes (K - 1) / 2 + 1/2 = 2 iterations on average, at most 4. A stage with at most 2 live
# replicas is thin: one spot wave or one rack takes both (the measured case of issue 16), so it is
# snapshotted after every step, 12 bytes per parameter per iteration, and a wipe costs no
# rollback; a stage of 3 or more is left to the periodic snapshot.
#
# Each snapshot goes to SNAPSHOT_KEEPERS nodes of other stages, chosen across failure domains
# (gwtf.job.snapshots.snapshot_keepers). A correlated event (a spot wave) that takes a share p of
# the swarm takes all k keepers with a chance of about p^k: for the waves of
# simulations/spot_waves.toml (three nodes in four), 0.56 with two keepers, 0.42 with three and
# 0.32 with four. Measured there (seeds 0-7, `python -m benchmarks keepers`, benchmarks/RESULTS.md
# "keepers"), two keepers sent the swarm back to the job's start in 4 of 8 runs, three in 5 or 6
# (two runs), four in 1 of 8. A copy
# costs the training little once snapshots stream in the background on idle links, and a keeper
# holds at most two snapshots per stage it keeps.
SNAPSHOT_EVERY = 4
SNAPSHOT_THIN = 2
SNAPSHOT_KEEPERS = 4
AGGREGATION_RULES = ("mean", "trimmed-mean", "centered-clip")
DATA_ORDERS = ("random", "sequential")
# The MLP activations of each kind, its default first.
ACTIVATIONS: Mapping[str, tuple[str, ...]] = {"gpt": ("gelu", "gelu-tanh"), "llama": ("silu",)}
NORM_EPS = 1e-5
ROPE_THETA = 10000.0
# [model] keys left out of `to_dict` at these values (None: the kind's default).
_MODEL_OMITTED_AT: Mapping[str, object] = {
    "kv_heads": None, "mlp_hidden": None, "norm_eps": NORM_EPS, "rope_theta": ROPE_THETA,
    "activation": None, "positions": None, "pretrained": None, "pretrained_sha256": None,
}  # fmt: skip
# The keys that name where a file is, on one machine: left out of the id, whose digests stand
# for them.
_PATH_KEYS = ("data", "tokenizer")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class JobError(ValueError):
    """A job file or job value is wrong; the message is one sentence that says what to change."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float)


def _type_name(value: object) -> str:
    return type(value).__name__


def _check_int(key: str, value: object, *, minimum: int) -> None:
    if not _is_int(value):
        raise JobError(f"{key} must be an integer, got {value!r} ({_type_name(value)})")
    assert isinstance(value, int)
    if value < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise JobError(f"{key} must be {what}, got {value}")


def _check_sha256(key: str, value: object, path_key: str, path: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise JobError(f"{key} must be 64 lowercase hex digits (a sha256), got {value!r}")
    if path is None:
        raise JobError(f"{key} pins the content of {path_key}, which the job does not set; "
                       f"set {path_key} or leave {key} out")  # fmt: skip


def _check_float(key: str, value: object) -> float:
    if not _is_number(value):
        raise JobError(f"{key} must be a number, got {value!r} ({_type_name(value)})")
    assert isinstance(value, int | float)
    number = float(value)
    if not math.isfinite(number):
        raise JobError(f"{key} must be a finite number, got {value!r}")
    return number


@dataclass(frozen=True)
class ModelConfig:
    """The transformer. Sizes are validated on construction."""

    kind: str
    layers: int
    width: int
    heads: int
    seq_len: int
    vocab: int = BYTE_VOCAB
    dropout: float = 0.1
    # The keys below came with models from Hugging Face folders (`gwtf.train.models.hf`). Each
    # default is what the presets compute, and `JobConfig.to_dict` leaves a key out at its default,
    # so a job that does not state them keeps its id. A value equal to the kind's default is stored
    # as None, so stating the default or leaving it out is the same job.
    kv_heads: int | None = None
    mlp_hidden: int | None = None
    norm_eps: float = NORM_EPS
    rope_theta: float = ROPE_THETA
    activation: str | None = None
    positions: int | None = None
    pretrained: str | None = None
    pretrained_sha256: str | None = None
    """The digest of the pretrained folder's files (`gwtf.train.digests.pretrained_digest`)."""

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise JobError(f"model.kind must be one of {', '.join(MODEL_KINDS)}, got {self.kind!r}")
        for key in ("layers", "width", "heads", "seq_len"):
            _check_int(f"model.{key}", getattr(self, key), minimum=1)
        # At least 256 only for byte-level data: JobConfig checks it, knowing the tokenizer.
        _check_int("model.vocab", self.vocab, minimum=1)
        if self.width % self.heads != 0:
            raise JobError(
                f"model.heads ({self.heads}) must divide model.width ({self.width}); "
                "choose a width that is a multiple of heads"
            )
        if self.kind == "llama" and self.head_dim % 2 != 0:
            raise JobError(
                f"model.width / model.heads must be even for rotary positions (llama), "
                f"got {self.width} / {self.heads} = {self.head_dim}"
            )
        dropout = _check_float("model.dropout", self.dropout)
        if not 0.0 <= dropout < 1.0:
            raise JobError(f"model.dropout must be in [0, 1), got {self.dropout}")
        object.__setattr__(self, "dropout", dropout)
        self._check_hf_keys()

    def _check_hf_keys(self) -> None:
        if self.kv_heads is not None:
            _check_int("model.kv_heads", self.kv_heads, minimum=1)
            if self.heads % self.kv_heads != 0:
                raise JobError(
                    f"model.kv_heads ({self.kv_heads}) must divide model.heads ({self.heads}): "
                    "each key/value head serves the same number of query heads"
                )
            if self.kv_heads == self.heads:
                object.__setattr__(self, "kv_heads", None)
        if self.mlp_hidden is not None:
            _check_int("model.mlp_hidden", self.mlp_hidden, minimum=1)
            if self.mlp_hidden == self._default_mlp():
                object.__setattr__(self, "mlp_hidden", None)
        for key in ("norm_eps", "rope_theta"):
            number = _check_float(f"model.{key}", getattr(self, key))
            if number <= 0:
                raise JobError(f"model.{key} must be positive, got {getattr(self, key)}")
            object.__setattr__(self, key, number)
        if self.kind == "gpt" and self.rope_theta != ROPE_THETA:
            raise JobError(
                "model.rope_theta applies to llama only (gpt learns its positions); leave it out"
            )
        allowed = ACTIVATIONS[self.kind]
        if self.activation is not None:
            if self.activation not in allowed:
                raise JobError(
                    f"model.activation must be {' or '.join(allowed)} for {self.kind}, "
                    f"got {self.activation!r}"
                )
            if self.activation == allowed[0]:
                object.__setattr__(self, "activation", None)
        if self.positions is not None:
            _check_int("model.positions", self.positions, minimum=1)
            if self.seq_len > self.positions:
                raise JobError(
                    f"model.seq_len ({self.seq_len}) is longer than model.positions "
                    f"({self.positions}), the longest sequence the model has positions for"
                )
            if self.positions == self.seq_len:
                object.__setattr__(self, "positions", None)
        if self.pretrained is not None and (
            not isinstance(self.pretrained, str) or not self.pretrained
        ):
            raise JobError(
                f"model.pretrained must be a non-empty folder path, got {self.pretrained!r}"
            )
        _check_sha256("model.pretrained_sha256", self.pretrained_sha256, "model.pretrained",
                      self.pretrained)  # fmt: skip

    def _default_mlp(self) -> int:
        if self.kind == "gpt":
            return 4 * self.width
        return -(-8 * self.width // (3 * 16)) * 16

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def key_value_heads(self) -> int:
        """Key/value heads: `kv_heads`, or one per query head."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def mlp_size(self) -> int:
        """Hidden size of the MLP: `mlp_hidden`, or 4x width (GPT), or 8/3 x width rounded up
        to 16 (SwiGLU)."""
        return self.mlp_hidden if self.mlp_hidden is not None else self._default_mlp()

    @property
    def mlp_activation(self) -> str:
        """`activation`, or the kind's own: gelu (gpt), silu (llama)."""
        return self.activation if self.activation is not None else ACTIVATIONS[self.kind][0]

    @property
    def max_positions(self) -> int:
        """`positions`, or seq_len: the size of gpt's position table."""
        return self.positions if self.positions is not None else self.seq_len


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW hyper-parameters (torch.optim.AdamW semantics)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    eps: float = 1e-8

    def __post_init__(self) -> None:
        lr = _check_float("optimizer.lr", self.lr)
        if lr <= 0:
            raise JobError(f"optimizer.lr must be positive, got {self.lr}")
        betas = self.betas
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise JobError(f"optimizer.betas must be a list of two numbers, got {betas!r}")
        pair = tuple(_check_float("optimizer.betas", beta) for beta in betas)
        if not all(0.0 <= beta < 1.0 for beta in pair):
            raise JobError(f"optimizer.betas must both be in [0, 1), got {list(betas)}")
        weight_decay = _check_float("optimizer.weight_decay", self.weight_decay)
        if weight_decay < 0:
            raise JobError(f"optimizer.weight_decay must be zero or positive, got {weight_decay}")
        eps = _check_float("optimizer.eps", self.eps)
        if eps <= 0:
            raise JobError(f"optimizer.eps must be positive, got {self.eps}")
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "betas", pair)
        object.__setattr__(self, "weight_decay", weight_decay)
        object.__setattr__(self, "eps", eps)


@dataclass(frozen=True)
class AggregationConfig:
    """How a stage's replicas combine their gradients (`gwtf.train.robust`)."""

    rule: str = "mean"
    trim: float = 0.2
    clip_iterations: int = 3
    norm_factor: float = 10.0

    def __post_init__(self) -> None:
        if self.rule not in AGGREGATION_RULES:
            raise JobError(
                f"aggregation must be one of {', '.join(AGGREGATION_RULES)}, got {self.rule!r}"
            )
        trim = _check_float("aggregation.trim", self.trim)
        if not 0.0 <= trim < 0.5:
            raise JobError(f"aggregation.trim must be in [0, 0.5), got {self.trim}")
        _check_int("aggregation.clip_iterations", self.clip_iterations, minimum=1)
        norm_factor = _check_float("aggregation.norm_factor", self.norm_factor)
        if norm_factor <= 1.0:
            raise JobError(
                f"aggregation.norm_factor must be above 1 (a multiple of the median gradient "
                f"norm), got {self.norm_factor}"
            )
        object.__setattr__(self, "trim", trim)
        object.__setattr__(self, "norm_factor", norm_factor)

    @property
    def robust(self) -> bool:
        """Anything but the plain mean: the swarm screens and excludes bad replicas."""
        return self.rule != "mean"


@dataclass(frozen=True)
class CompressionConfig:
    """What crosses a stage boundary (`gwtf.flow.compression`, `gwtf.train.codecs`): the codecs
    the swarm may choose, and the plan, `after` (block count before a boundary -> codec; None:
    not planned yet, the swarm plans it when the job starts)."""

    allow: tuple[str, ...] = DEFAULT_ALLOWED
    after: tuple[tuple[int, str], ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.allow, str) or not all(isinstance(a, str) for a in self.allow):
            raise JobError(f"compression.allow must be a list of codec names, got {self.allow!r}")
        lossy = [name for name in CODECS if name != "none"]
        for name in self.allow:
            if name not in lossy:
                raise JobError(
                    f"compression.allow names {name!r}; the codecs are {', '.join(lossy)}"
                )
        allow = tuple(sorted(set(self.allow), key=list(CODECS).index))
        object.__setattr__(self, "allow", allow)
        if self.after is None:
            return
        after = []
        for block, name in self.after:
            if not _is_int(block) or block < 1:
                raise JobError(f"compression.after keys are block counts of at least 1, got "
                               f"{block!r}")
            if name != "none" and name not in allow:
                raise JobError(
                    f"compression.after uses {name!r} after block {block}, which "
                    f"compression.allow ({', '.join(allow) or 'nothing'}) does not allow"
                )
            if name != "none":
                after.append((int(block), name))
        object.__setattr__(self, "after", tuple(sorted(after)))

    def codec_after(self, blocks: int) -> str:
        """The codec of the boundary after `blocks` blocks ("none" where the plan says none)."""
        return dict(self.after or ()).get(blocks, "none")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"allow": list(self.allow)}
        if self.after is not None:
            out["after"] = {str(block): name for block, name in self.after}
        return out


def _compression(value: object) -> CompressionConfig:
    """`compression = "off"` or a [compression] table."""
    if value == "off":
        return CompressionConfig(allow=())
    if not isinstance(value, dict):
        raise JobError(f'compression must be "off" or a [compression] table, got {value!r}')
    _check_keys("compression", value, {"allow", "after"})
    allow = value.get("allow", list(DEFAULT_ALLOWED))
    if not isinstance(allow, list):
        raise JobError(f"compression.allow must be a list of codec names, got {allow!r}")
    after = value.get("after")
    if after is not None:
        if not isinstance(after, dict):
            raise JobError(f"compression.after must be a table of block = codec, got {after!r}")
        pairs = []
        for key, name in after.items():
            try:
                block = int(key)
            except ValueError:
                raise JobError(f"compression.after keys are block counts, got {key!r}") from None
            if not isinstance(name, str) or name not in CODECS:
                raise JobError(f"compression.after.{key} must be one of {', '.join(CODECS)}, "
                               f"got {name!r}")
            pairs.append((block, name))
        after = tuple(pairs)
    return CompressionConfig(allow=tuple(allow), after=after)


@dataclass(frozen=True)
class JobConfig:
    """One training job. `job_id` is derived from the content, so equal jobs share an id."""

    model: ModelConfig
    iterations: int
    microbatches: int
    microbatch_size: int
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seed: int = 0
    data: str | None = None
    grad_accum: str = "float64"
    name: str = ""
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    tokenizer: str | None = None
    data_field: str = "text"
    data_order: str = "random"
    snapshot_every: int = SNAPSHOT_EVERY
    """Every stage's state is snapshotted at every iteration that is a multiple of this (and at
    the job's first): docs/design.md 4.6."""
    snapshot_thin: int = SNAPSHOT_THIN
    """A stage with at most this many live replicas is snapshotted after every step as well."""
    snapshot_keepers: int = SNAPSHOT_KEEPERS
    """How many nodes of other stages keep each snapshot (fewer where fewer exist)."""
    catch_up_steps: int = CATCH_UP_STEPS
    """How many of its last steps' mean gradients each replica keeps, so that a joiner whose
    state a step made stale applies them instead of fetching the state again (0: never;
    docs/design.md 3.8). Costs that many gradients of the stage in every replica's memory."""
    replay_bound: int | str = "auto"
    """Bounded replay (docs/design.md 4.9): a node ships its running gradient sum to a stage
    peer every this many microbatches (0: never), or when the replay it saves outweighs the
    upload ("auto"), so that its death replays at most that many."""
    data_sha256: str | None = None
    """The digest of `data` (`gwtf.train.digests.data_digest`); None: not pinned yet."""
    tokenizer_sha256: str | None = None
    """The digest of `tokenizer` (`gwtf.train.digests.tokenizer_digest`); None: not pinned yet."""
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    """What crosses a stage boundary: the codecs allowed and the plan (docs/design.md 2.15)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig):
            raise JobError("model must be a [model] table")
        if self.tokenizer is not None and (
            not isinstance(self.tokenizer, str) or not self.tokenizer
        ):
            raise JobError(f"tokenizer must be a non-empty path string, got {self.tokenizer!r}")
        # A tokenizer's own size is checked where it is read (gwtf.train.data.job_corpus).
        if self.tokenizer is None and self.model.vocab < BYTE_VOCAB:
            raise JobError(
                f"model.vocab must be at least {BYTE_VOCAB} for byte-level data (no tokenizer), "
                f"got {self.model.vocab}"
            )
        if not isinstance(self.data_field, str) or not self.data_field:
            raise JobError(f"data_field must be a non-empty string, got {self.data_field!r}")
        if self.data_order not in DATA_ORDERS:
            raise JobError(
                f"data_order must be one of {', '.join(DATA_ORDERS)}, got {self.data_order!r}"
            )
        if not isinstance(self.optimizer, OptimizerConfig):
            raise JobError("optimizer must be an [optimizer] table")
        for key in ("iterations", "microbatches", "microbatch_size", "snapshot_every"):
            _check_int(key, getattr(self, key), minimum=1)
        _check_int("snapshot_thin", self.snapshot_thin, minimum=0)
        _check_int("snapshot_keepers", self.snapshot_keepers, minimum=1)
        _check_int("catch_up_steps", self.catch_up_steps, minimum=0)
        if self.replay_bound != "auto":
            if not _is_int(self.replay_bound) or self.replay_bound < 0:  # type: ignore[operator]
                raise JobError(f'replay_bound must be "auto" or an integer of at least 0, got '
                               f"{self.replay_bound!r}")
        _check_int("seed", self.seed, minimum=0)
        if self.data is not None and (not isinstance(self.data, str) or not self.data):
            raise JobError(f"data must be a non-empty path string, got {self.data!r}")
        if self.grad_accum not in GRAD_ACCUM_DTYPES:
            raise JobError(
                f"grad_accum must be one of {', '.join(GRAD_ACCUM_DTYPES)}, got {self.grad_accum!r}"
            )
        if not isinstance(self.aggregation, AggregationConfig):
            raise JobError("aggregation must be a rule name or an [aggregation] table")
        if not isinstance(self.name, str):
            raise JobError(f"name must be a string, got {self.name!r} ({_type_name(self.name)})")
        _check_sha256("data_sha256", self.data_sha256, "data", self.data)
        _check_sha256("tokenizer_sha256", self.tokenizer_sha256, "tokenizer", self.tokenizer)
        if not isinstance(self.compression, CompressionConfig):
            raise JobError('compression must be "off" or a [compression] table')
        for block, _ in self.compression.after or ():
            if block >= self.model.layers:
                raise JobError(
                    f"compression.after names block count {block}, but a boundary lies between "
                    f"blocks: 1..{self.model.layers - 1} for a model of {self.model.layers}"
                )

    @property
    def is_planned(self) -> bool:
        """The job states its compression plan (an empty one included)."""
        return self.compression.after is not None

    def planned(self, after: Mapping[int, str]) -> JobConfig:
        """The job with the compression plan `after` (block count -> codec) stated."""
        plan = CompressionConfig(self.compression.allow, tuple(sorted(after.items())))
        return dataclasses.replace(self, compression=plan)

    @property
    def is_pinned(self) -> bool:
        """Every file the job names has its digest stated."""
        return ((self.data is None or self.data_sha256 is not None)
                and (self.tokenizer is None or self.tokenizer_sha256 is not None)
                and (self.model.pretrained is None or self.model.pretrained_sha256 is not None))

    def pinned(self) -> JobConfig:
        """The job with the digest of every file it names stated: a digest the job states is kept,
        a missing one is computed from the file (cached by file identity). JobError (one sentence)
        if a file it must read is missing or unreadable."""
        if self.is_pinned:
            return self
        try:  # a URL is fetched (into the cache) to be summed; a path is summed where it is
            model = self.model
            if model.pretrained is not None and model.pretrained_sha256 is None:
                folder, digest = pretrained_location(model.pretrained, None)
                model = dataclasses.replace(
                    model, pretrained_sha256=digest or pretrained_digest(folder)
                )
            data_sha256 = self.data_sha256
            if self.data is not None and data_sha256 is None:
                data, digest = data_location(self.data, None)
                data_sha256 = digest or data_digest(data)
            tokenizer_sha256 = self.tokenizer_sha256
            if self.tokenizer is not None and tokenizer_sha256 is None:
                tokenizer, digest = tokenizer_location(self.tokenizer, None)
                tokenizer_sha256 = digest or tokenizer_digest(tokenizer)
        except DigestError as err:
            raise JobError(str(err)) from None
        return dataclasses.replace(self, model=model, data_sha256=data_sha256,
                                   tokenizer_sha256=tokenizer_sha256)  # fmt: skip

    @cached_property
    def job_id(self) -> str:
        """`job-` and 16 hex digits of the sha256 of the pinned job's canonical JSON without its
        paths: the settings and what the files hold, wherever they are (JobError if a file the
        job names and does not pin cannot be read)."""
        table = self.pinned().to_dict()
        for key in _PATH_KEYS:
            table.pop(key, None)
        # What the swarm may choose does not change what a job computes; the plan it chose does,
        # where it compresses anything.
        table.pop("compression", None)
        if self.compression.after:
            table["compression"] = {"after": self.compression.to_dict()["after"]}
        table["model"].pop("pretrained", None)
        text = json.dumps(table, sort_keys=True, separators=(",", ":"))
        return "job-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The job as plain data, the same shape as the TOML file (`data` only when set)."""
        out = dataclasses.asdict(self)
        out["optimizer"]["betas"] = list(self.optimizer.betas)
        if self.data is None:
            del out["data"]
        # Data keys at their default are left out too: jobs from before them keep their ids.
        if self.tokenizer is None:
            del out["tokenizer"]
        if self.data_field == "text":
            del out["data_field"]
        if self.data_order == "random":
            del out["data_order"]
        if self.snapshot_every == SNAPSHOT_EVERY:
            del out["snapshot_every"]
        if self.snapshot_thin == SNAPSHOT_THIN:
            del out["snapshot_thin"]
        if self.snapshot_keepers == SNAPSHOT_KEEPERS:
            del out["snapshot_keepers"]
        if self.catch_up_steps == CATCH_UP_STEPS:
            del out["catch_up_steps"]
        if self.replay_bound == "auto":
            del out["replay_bound"]
        for key in ("data_sha256", "tokenizer_sha256"):
            if out[key] is None:
                del out[key]
        # The default is left out, so that a job that does not choose keeps its id.
        if self.aggregation == AggregationConfig():
            del out["aggregation"]
        if self.compression == CompressionConfig():
            del out["compression"]
        else:
            out["compression"] = self.compression.to_dict()
        for key, default in _MODEL_OMITTED_AT.items():
            if out["model"][key] == default:
                del out["model"][key]
        return out


_TOP_KEYS = {
    "name",
    "seed",
    "iterations",
    "microbatches",
    "microbatch_size",
    "data",
    "tokenizer",
    "data_field",
    "data_order",
    "snapshot_every",
    "snapshot_thin",
    "snapshot_keepers",
    "catch_up_steps",
    "replay_bound",
    "data_sha256",
    "tokenizer_sha256",
    "grad_accum",
    "model",
    "optimizer",
    "aggregation",
    "compression",
}
_REQUIRED_TOP = ("iterations", "microbatches", "microbatch_size", "model")
_MODEL_KEYS = {f.name for f in dataclasses.fields(ModelConfig)}
_REQUIRED_MODEL = ("kind", "layers", "width", "heads", "seq_len")
_OPTIMIZER_KEYS = {f.name for f in dataclasses.fields(OptimizerConfig)}
_AGGREGATION_KEYS = {f.name for f in dataclasses.fields(AggregationConfig)}


def _check_keys(where: str, table: Mapping[str, Any], known: set[str]) -> None:
    for key in table:
        if key not in known:
            name = f"{where}.{key}" if where else key
            place = f" in [{where}]" if where else " at the top level"
            raise JobError(
                f"unknown key '{name}'; the keys allowed{place} are {', '.join(sorted(known))}"
            )


def job_from_dict(table: Mapping[str, Any], *, base_dir: Path | None = None) -> JobConfig:
    """Build a validated job from parsed TOML. Relative `data` and `tokenizer` paths are joined to
    `base_dir`."""
    _check_keys("", table, _TOP_KEYS)
    for key in _REQUIRED_TOP:
        if key not in table:
            raise JobError(f"missing required key '{key}'")
    model_table = table["model"]
    if not isinstance(model_table, dict):
        raise JobError("model must be a [model] table")
    _check_keys("model", model_table, _MODEL_KEYS)
    model_table = _pretrained_model(model_table, base_dir)
    for key in _REQUIRED_MODEL:
        if key not in model_table:
            raise JobError(f"missing required key 'model.{key}'")
    optimizer_table = table.get("optimizer", {})
    if not isinstance(optimizer_table, dict):
        raise JobError("optimizer must be an [optimizer] table")
    _check_keys("optimizer", optimizer_table, _OPTIMIZER_KEYS)
    if "betas" in optimizer_table and isinstance(optimizer_table["betas"], list):
        optimizer_table = {**optimizer_table, "betas": tuple(optimizer_table["betas"])}
    aggregation = _aggregation(table.get("aggregation", "mean"))
    compression = _compression(table.get("compression", {}))
    rest = {k: v for k, v in table.items()
            if k not in ("model", "optimizer", "aggregation", "compression")}
    for key in ("data", "tokenizer"):
        value = rest.get(key)
        if isinstance(value, str) and value and base_dir is not None and not is_url(value):
            if not Path(value).is_absolute():
                rest[key] = str((base_dir / value).resolve())
    return JobConfig(
        model=ModelConfig(**model_table),
        optimizer=OptimizerConfig(**optimizer_table),
        aggregation=aggregation,
        compression=compression,
        **rest,
    )


def _pretrained_model(table: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """The [model] table with `pretrained` joined to `base_dir` and, when `kind` is left out,
    the architecture read from the folder's config.json (a stated key must agree with it)."""
    folder = table.get("pretrained")
    if not isinstance(folder, str) or not folder:
        return table
    if base_dir is not None and not is_url(folder) and not Path(folder).is_absolute():
        folder = str((base_dir / folder).resolve())
        table = {**table, "pretrained": folder}
    if "kind" in table:
        return table
    where = f"{folder.rstrip('/')}/{CONFIG_FILE}"
    try:
        local, _ = pretrained_location(folder, table.get("pretrained_sha256"))
        derived = model_keys(read_config(local), where)
    except (DigestError, HFConfigError) as err:
        raise JobError(f"model.pretrained: {err}") from None
    for key, value in table.items():
        if key in derived and value != derived[key]:
            raise JobError(
                f"model.{key} is {value!r} but {where} gives {derived[key]!r}; leave model.{key} "
                "out to take the folder's"
            )
    return {**derived, **table}


def _aggregation(value: object) -> AggregationConfig:
    """`aggregation = "rule"` or an [aggregation] table."""
    if isinstance(value, str):
        return AggregationConfig(rule=value)
    if not isinstance(value, dict):
        raise JobError(
            f"aggregation must be one of {', '.join(AGGREGATION_RULES)} or an [aggregation] "
            f"table, got {value!r}"
        )
    _check_keys("aggregation", value, _AGGREGATION_KEYS)
    return AggregationConfig(**value)


def load_job(path: str | Path) -> JobConfig:
    """Read and validate a TOML job file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise JobError(
            f"job file {path} does not exist; give a TOML job file or a preset "
            f"({', '.join(PRESETS)})"
        ) from None
    except OSError as exc:
        raise JobError(f"cannot read job file {path}: {exc.strerror or exc}") from None
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise JobError(f"job file {path} is not valid TOML: {exc}") from None
    try:
        return job_from_dict(table, base_dir=path.resolve().parent)
    except JobError as exc:
        raise JobError(f"job file {path}: {exc}") from None
    except TypeError as exc:  # a dataclass refused an argument the checks above let through
        raise JobError(f"job file {path}: {exc}") from None


# A few hundred thousand parameters; 6 blocks cut evenly into 1, 2, 3 or 6 stages.
PRESETS: Mapping[str, JobConfig] = {
    "tiny-gpt": JobConfig(
        name="tiny-gpt",
        model=ModelConfig(kind="gpt", layers=6, width=64, heads=4, seq_len=64, dropout=0.1),
        optimizer=OptimizerConfig(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8),
        seed=0,
        iterations=40,
        microbatches=8,
        microbatch_size=8,
    ),
    "tiny-llama": JobConfig(
        name="tiny-llama",
        model=ModelConfig(kind="llama", layers=6, width=64, heads=4, seq_len=64, dropout=0.1),
        optimizer=OptimizerConfig(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8),
        seed=0,
        iterations=40,
        microbatches=8,
        microbatch_size=8,
    ),
}


def preset(name: str) -> JobConfig:
    """A built-in job by name."""
    try:
        return PRESETS[name]
    except KeyError:
        raise JobError(f"unknown preset {name!r}; presets are {', '.join(PRESETS)}") from None


def resolve_job(spec: str | Path) -> JobConfig:
    """A preset name, or else the path of a TOML job file."""
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.exists() and path.suffix != ".toml" and "/" not in text:
        raise JobError(
            f"{text!r} is neither a preset ({', '.join(PRESETS)}) nor an existing job file"
        )
    return load_job(path)
