"""The reference: the job trained in one process with no pipeline, the swarm's yardstick.

It runs the very code a swarm runs, with a single stage that holds the whole model: for each
iteration k, the microbatch ids in ascending order (all of them, or the ids `microbatch_ids(k)`
returns, e.g. without those a dead data holder dropped), each through `StageExecutor.forward`
with the same tokens (`data.job_microbatch`) and the same dropout masks (seeded by job seed, k,
microbatch id and model part) a swarm uses, gradients summed, then `combine_contributions`
(sum / count) and one AdamW step. Because dropout is seeded per model part, not per stage number,
the result does not depend on how the swarm cuts the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from torch import Tensor

from gwtf.train.commit import combine_contributions, mean_loss
from gwtf.train.data import Corpus, check_corpus, job_corpus, job_microbatch
from gwtf.train.executor import MicrobatchKey, StageExecutor
from gwtf.train.job import JobConfig

__all__ = ["ReferenceResult", "train_reference"]


@dataclass(frozen=True, eq=False)
class ReferenceResult:
    """The outcome of a reference run; `to_json` is what `gwtf reference --json` prints."""

    job_id: str
    iterations_completed: int
    loss: tuple[float, ...]
    param_checksum: str
    throughput_mb_s: float
    dropped_microbatches: int
    parameters: Mapping[str, Tensor] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "iterations_completed": self.iterations_completed,
            "loss": list(self.loss),
            "param_checksum": self.param_checksum,
            "throughput_mb_s": self.throughput_mb_s,
            "dropped_microbatches": self.dropped_microbatches,
        }


def train_reference(
    job: JobConfig,
    corpus: Corpus | None = None,
    *,
    iterations: int | None = None,
    microbatch_ids: Callable[[int], Iterable[int]] | None = None,
    on_iteration: Callable[[int, float], None] | None = None,
) -> ReferenceResult:
    """Train `job` for `iterations` (default: all of the job's) in this process.

    `corpus` defaults to `job_corpus(job)`. `microbatch_ids(k)` gives the ids trained in
    iteration k (default: all); the others count as dropped. `on_iteration(k, loss)` is called
    after each commit.
    """
    if corpus is None:
        corpus = job_corpus(job)
    check_corpus(corpus, job.model.seq_len, vocab=job.model.vocab, pretrained=job.model.pretrained)
    total = job.iterations if iterations is None else iterations
    executor = StageExecutor(job, 0, 1)
    losses: list[float] = []
    trained = 0
    dropped = 0
    elapsed = 0.0
    for k in range(total):
        ids = sorted(set(microbatch_ids(k) if microbatch_ids else range(job.microbatches)))
        dropped += job.microbatches - len(ids)
        step_losses: dict[int, float] = {}
        batches = {m: job_microbatch(corpus, job, k, m) for m in ids}
        start = perf_counter()
        for m in ids:
            tokens, labels = batches[m]
            result = executor.forward(MicrobatchKey(job.job_id, k, m), tokens, labels)
            assert result.loss is not None
            step_losses[m] = result.loss
        aggregated = combine_contributions([executor.contribution("reference")], expected_ids=ids)
        executor.commit(aggregated)
        elapsed += perf_counter() - start
        trained += len(ids)
        losses.append(mean_loss(step_losses))
        if on_iteration is not None:
            on_iteration(k, losses[-1])
    return ReferenceResult(
        job_id=job.job_id,
        iterations_completed=total,
        loss=tuple(losses),
        param_checksum=executor.checksum(),
        throughput_mb_s=trained / elapsed if elapsed > 0 else 0.0,
        dropped_microbatches=dropped,
        parameters={name: p.detach().clone() for name, p in executor.parameters().items()},
    )
