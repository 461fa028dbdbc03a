"""One pipeline stage as a torch module, built alone, bit-identical to its slice of the model.

A stage module holds `embed` (stage 0 only), `blocks` (a ModuleDict keyed by the *global* block
index) and `head` (last stage only: final norm and LM head). Parameter names are therefore the
same in a stage and in the whole model (`blocks.3.attn.qkv.weight` is block 3 wherever it lives),
and a stage's `state_dict` is exactly a subset of the whole model's.

Each part is initialised from its own generator, seeded by (job seed, "init", part), so a node
builds only its own stage, and gets the same bits as the same slice of the whole model. A model
with `pretrained` weights reads its stage's parts from that Hugging Face folder instead
(`gwtf.train.models.hf`), the same tensors whichever stage holds them.

Randomness in a forward pass (dropout) comes from `DropoutSeeds`: one generator per part, seeded
by (job seed, "dropout", iteration, microbatch, part). Seeding per part rather than per stage
number is the same guarantee for a replacement node (the stage's parts are fixed by the stage) and
it also makes the whole model's forward the same function however the swarm cuts it, so the
one-process reference does not need to know the number of stages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gwtf.train.codecs import Boundary
from gwtf.train.job import CompressionConfig, ModelConfig
from gwtf.train.models.builtin import Embedding, Head, init_parameters, make_block
from gwtf.train.models.hf import stage_tensors
from gwtf.train.partition import StageSpec, partition, stage_spec
from gwtf.train.seeds import SeedPart, derive_seed, seeded_generator

__all__ = [
    "DropoutSeeds",
    "StageModule",
    "build_model",
    "build_stage",
    "build_stage_of",
    "canonical_order",
    "param_groups",
]


@dataclass(frozen=True)
class DropoutSeeds:
    """Where the dropout masks of one microbatch come from: a generator per model part."""

    seed: int
    iteration: int
    microbatch: int
    device: torch.device | None = None
    """Where the masks are drawn (the activations' device); None: the CPU."""

    def generator(self, *part: SeedPart) -> torch.Generator:
        parts = (self.seed, "dropout", self.iteration, self.microbatch, *part)
        if self.device is None or self.device.type == "cpu":
            return seeded_generator(*parts)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(derive_seed(*parts))
        return generator


class StageModule(nn.Module):
    """Blocks `spec.layers` of the model, with the embedding on stage 0 and the head on the last.

    `forward(x, seeds)` maps stage input to stage output: token ids [B, T] (int64) on stage 0,
    else hidden states [B, T, width]; the last stage returns logits [B, T, vocab]. `seeds=None`
    disables dropout.
    """

    def __init__(self, config: ModelConfig, spec: StageSpec) -> None:
        super().__init__()
        if spec.end_layer > config.layers:
            raise ValueError(f"stage {spec} is outside a model of {config.layers} layers")
        self.config = config
        self.spec = spec
        self.embed = Embedding(config) if spec.is_first else None
        self.blocks = nn.ModuleDict({str(i): make_block(config) for i in spec.layers})
        self.head = Head(config) if spec.is_last else None
        self.boundaries: dict[int, Boundary] = {}
        """Planned boundaries inside this module, by the global index of the block they follow:
        the activation passes the codec there as if it crossed to another stage (the
        reference's, or a plan made for another cut; `plan_boundaries`)."""

    def plan_boundaries(self, compression: CompressionConfig) -> None:
        """Apply `compression`'s plan at every boundary strictly inside this stage (the ones at
        its ends are the wire's: the node encodes what it sends there)."""
        self.boundaries = {
            blocks - 1: Boundary(name)
            for blocks, name in compression.after or ()
            if self.spec.first_layer < blocks < self.spec.end_layer
        }

    def forward(self, x: Tensor, seeds: DropoutSeeds | None) -> Tensor:
        if self.embed is not None:
            x = self.embed(x, seeds.generator("embed") if seeds else None)
        for index, block in self.blocks.items():
            x = block(x, seeds.generator("block", int(index)) if seeds else None)
            boundary = self.boundaries.get(int(index))
            if boundary is not None:
                x = boundary(x)
        if self.head is not None:
            x = self.head(x)
        return x

    @staticmethod
    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        """Mean cross-entropy over every token of the microbatch."""
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_stage(config: ModelConfig, seed: int, spec: StageSpec) -> StageModule:
    """Build and initialise only the parts of stage `spec`: from the seed, or, for a model with
    `pretrained` weights, from the tensors of those parts in its folder (`gwtf.train.models.hf`;
    PretrainedError if the folder cannot give them)."""
    with torch.device("meta"):
        module = StageModule(config, spec)
    if config.pretrained is not None:
        return _load_pretrained(module)
    if module.embed is not None:
        init_parameters(module.embed, seeded_generator(seed, "init", "embed"), layers=config.layers)
    for index, block in module.blocks.items():
        generator = seeded_generator(seed, "init", "block", int(index))
        init_parameters(block, generator, layers=config.layers)
    if module.head is not None:
        init_parameters(module.head, seeded_generator(seed, "init", "head"), layers=config.layers)
    return module


def _load_pretrained(module: StageModule) -> StageModule:
    expected = {name: tuple(p.shape) for name, p in module.named_parameters()}
    tensors = stage_tensors(module.config, expected)
    module.to_empty(device="cpu")
    module.load_state_dict(tensors, strict=True)
    return module


def build_stage_of(config: ModelConfig, seed: int, stage: int, num_stages: int) -> StageModule:
    """Build stage `stage` of the model cut into `num_stages` (raises PartitionError)."""
    return build_stage(config, seed, stage_spec(config.layers, num_stages, stage))


def build_model(config: ModelConfig, seed: int) -> StageModule:
    """The whole model: the one stage of a one-stage pipeline."""
    return build_stage(config, seed, partition(config.layers, 1)[0])


def _order_key(name: str) -> tuple[int, int, str]:
    part, _, rest = name.partition(".")
    if part == "embed":
        return (0, 0, name)
    if part == "blocks":
        return (1, int(rest.partition(".")[0]), name)
    return (2, 0, name)


def canonical_order(names: Iterator[str] | list[str]) -> list[str]:
    """Parameter names in the fixed order used for checksums: embed, blocks by index, head."""
    return sorted(names, key=_order_key)


def param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """AdamW groups: decay on matrices and embeddings (dim >= 2), none on norms and biases."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
