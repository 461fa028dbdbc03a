"""gwtf.train: the torch side of a pipeline stage. No gRPC, no asyncio, no global RNG.

What a node calls, in order (every name is importable from `gwtf.train`):

    job = resolve_job("tiny-gpt")                       # or load_job(path); JobError if wrong
    executor = StageExecutor(job, stage, num_stages)     # PartitionError if it does not cut
    # (a joiner: StageExecutor.from_state(job, stage, num_stages, peer_state_bytes))

    # data holders (stage 0), per iteration k:
    corpus = job_corpus(job)                             # once; compare corpus.digest with peers
    mine = assign_microbatches(job.microbatches, live_holder_ids)[my_id]
    tokens, labels = job_microbatch(corpus, job, k, m)   # the same on every holder

    key = MicrobatchKey(job.job_id, k, m)
    executor.forward(key, inputs, labels)   # -> ForwardResult(output | grad_input + loss)
    executor.backward(key, grad_output)     # -> grad w.r.t. the input, None on stage 0
    executor.recompute(key, inputs, labels) # replacement node, docs/design.md 4 rules 2 and 3
    executor.drop(key)

    # commit, with every live replica's contribution of the stage:
    aggregated = combine_contributions(contributions, expected_ids=finished_ids)
    checksum = executor.commit(aggregated)  # replicas compare it
    state = executor.state_bytes()          # for a joiner, at an iteration boundary

    # what the router needs: c_i and the activation size
    seconds = measure_stage_compute(executor.module, job); size = activation_bytes(job)

`train_reference(job)` trains the same job in one process: the swarm must end equal to it.
"""

from gwtf.train.commit import (
    AggregatedGradient,
    ContributionError,
    GradContribution,
    check_cover,
    combine_contributions,
    combine_summed,
    mean_loss,
    mean_of,
    sum_in_order,
)
from gwtf.train.costs import activation_bytes, measure_stage_compute
from gwtf.train.data import (
    Corpus,
    DataError,
    assign_microbatches,
    job_corpus,
    job_microbatch,
    load_corpus,
    microbatch,
)
from gwtf.train.executor import (
    BadTensorError,
    CapacityError,
    DuplicateMicrobatchError,
    ExecutorError,
    ForwardResult,
    MicrobatchKey,
    StageExecutor,
    UnknownMicrobatchError,
)
from gwtf.train.job import (
    PRESETS,
    AggregationConfig,
    JobConfig,
    JobError,
    ModelConfig,
    OptimizerConfig,
    load_job,
    resolve_job,
)
from gwtf.train.partition import PartitionError, StageSpec, partition, stage_spec
from gwtf.train.reference import ReferenceResult, train_reference
from gwtf.train.stage import StageModule, build_model, build_stage, build_stage_of
from gwtf.train.state import StateError, checksum_of_digests, param_checksum, param_digests

__all__ = [
    "PRESETS",
    "AggregatedGradient",
    "BadTensorError",
    "AggregationConfig",
    "CapacityError",
    "ContributionError",
    "Corpus",
    "DataError",
    "DuplicateMicrobatchError",
    "ExecutorError",
    "ForwardResult",
    "GradContribution",
    "JobConfig",
    "JobError",
    "MicrobatchKey",
    "ModelConfig",
    "OptimizerConfig",
    "PartitionError",
    "ReferenceResult",
    "StageExecutor",
    "StageModule",
    "StageSpec",
    "StateError",
    "UnknownMicrobatchError",
    "activation_bytes",
    "assign_microbatches",
    "build_model",
    "build_stage",
    "build_stage_of",
    "checksum_of_digests",
    "check_cover",
    "combine_contributions",
    "combine_summed",
    "mean_of",
    "sum_in_order",
    "job_corpus",
    "job_microbatch",
    "load_corpus",
    "load_job",
    "mean_loss",
    "measure_stage_compute",
    "microbatch",
    "param_checksum",
    "param_digests",
    "partition",
    "resolve_job",
    "stage_spec",
    "train_reference",
]
