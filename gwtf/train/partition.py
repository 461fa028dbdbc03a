"""Cutting L transformer blocks into S pipeline stages by layer count.

Rule: every stage holds at least one block; the blocks are spread as evenly as possible, and when
L is not a multiple of S the first `L mod S` stages hold one block more. Stage 0 also holds the
embedding (the data holders) and the last stage also holds the final norm, the head and the loss,
so the earlier stages take the extra blocks: the head is the heavier end. Stage `s` holds blocks
`[first, end)`, numbered globally `0..L-1`.

Examples: 6 blocks in 3 stages -> 2, 2, 2; 7 in 3 -> 3, 2, 2; 2 in 3 -> PartitionError.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PartitionError", "StageSpec", "partition", "stage_spec"]


class PartitionError(ValueError):
    """The model cannot be cut into the requested stages; the message says what would work."""


@dataclass(frozen=True)
class StageSpec:
    """Which part of the model stage `stage` of `num_stages` holds."""

    stage: int
    num_stages: int
    first_layer: int
    end_layer: int

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.end_layer)

    @property
    def is_first(self) -> bool:
        """Holds the embedding: a data holder."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """Holds the final norm, the head and the loss."""
        return self.stage == self.num_stages - 1


def partition(layers: int, num_stages: int) -> tuple[StageSpec, ...]:
    """All stages of a model with `layers` blocks cut into `num_stages` stages."""
    if num_stages < 1:
        raise PartitionError(f"a pipeline needs at least one stage, got {num_stages} stages")
    if layers < 1:
        raise PartitionError(f"a model needs at least one layer, got {layers}")
    if layers < num_stages:
        raise PartitionError(
            f"a model with {layers} layers cannot be cut into {num_stages} stages (every stage "
            f"holds at least one block); use at most {layers} stages or a model with at least "
            f"{num_stages} layers"
        )
    base, extra = divmod(layers, num_stages)
    specs = []
    first = 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        specs.append(StageSpec(stage, num_stages, first, first + size))
        first += size
    return tuple(specs)


def stage_spec(layers: int, num_stages: int, stage: int) -> StageSpec:
    """Stage `stage` of `partition(layers, num_stages)`."""
    specs = partition(layers, num_stages)
    if not 0 <= stage < num_stages:
        raise PartitionError(
            f"stage {stage} does not exist in a pipeline of {num_stages} stages "
            f"(stages are 0..{num_stages - 1})"
        )
    return specs[stage]
