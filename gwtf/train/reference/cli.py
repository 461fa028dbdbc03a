"""`gwtf reference --job JOB.toml|PRESET [--iterations N] [--data PATH] [--threads N] [--json]
[--checkpoint-dir DIR]`.

`--threads` matters for comparing bits: float reductions on the CPU split their work by thread
count, so a reference run equals a swarm bit for bit only with the nodes' thread count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from gwtf.train.checkpoints.checkpoint import CheckpointError, check_writable, save_model
from gwtf.train.data import DataError, job_corpus
from gwtf.train.job import JobError, resolve_job
from gwtf.train.reference.run import train_reference

__all__ = ["run_reference"]


def run_reference(args: argparse.Namespace) -> int:
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        job = resolve_job(args.job)
        changes: dict[str, object] = {}
        if args.iterations is not None:
            changes["iterations"] = args.iterations
        if args.data is not None:  # other data: whatever digest the job pinned is not its
            changes["data"] = args.data
            changes["data_sha256"] = None
        if changes:
            job = dataclasses.replace(job, **changes)  # type: ignore[arg-type]
        if args.checkpoint_dir is not None:
            try:
                check_writable(args.checkpoint_dir)
            except CheckpointError as err:
                raise CheckpointError(f"--checkpoint-dir: {err}") from None
        corpus = job_corpus(job)
        if args.json:
            result = train_reference(job, corpus)
        else:
            print(
                f"job {job.job_id}: {job.model.kind}, {job.model.layers} layers, width "
                f"{job.model.width}, {job.iterations} iterations of {job.microbatches} "
                f"microbatches of {job.microbatch_size}x{job.model.seq_len} tokens; "
                f"data {corpus.source} ({len(corpus)} "
                f"{'bytes' if corpus.tokenizer is None else 'tokens of ' + corpus.tokenizer})"
            )

            def show(k: int, loss: float) -> None:
                print(f"iteration {k + 1:>4}/{job.iterations}  loss {loss:.4f}", flush=True)

            result = train_reference(job, corpus, on_iteration=show)
        if args.checkpoint_dir is not None:
            saved = save_model(args.checkpoint_dir, result.parameters, job,
                               result.iterations_completed)  # fmt: skip
            if not args.json:
                print(f"model           {saved}")
    except (JobError, DataError, CheckpointError) as exc:
        print(f"gwtf reference: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    print(f"param checksum  {result.param_checksum}")
    print(f"throughput      {result.throughput_mb_s:.1f} microbatches/s")
    return 0
