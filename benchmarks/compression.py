"""Convergence with compressed stage boundaries: jobs trained in the one-process reference
(`gwtf.train.reference.train_reference`) to the same number of steps with no codec, with int8
at every boundary of a 4-stage cut (the most the default rule, `compression.allow = ["int8"]`,
can ever plan) and with int4 at every boundary, and the final losses compared.

Jobs: the presets `tiny-gpt` and `tiny-llama` (6 blocks, width 64) and an 8-block LLaMA-like
model of width 128. The plan compresses the boundaries after the blocks where
`gwtf.train.partition.partition(layers, 4)` ends its first three stages (after blocks 2, 4, 5
of 6; 2, 4, 6 of 8): the activation through the codec forward, its gradient backward, as a
swarm of that cut sends them. The runs of one seed share the initialisation, the microbatches
and the dropout masks, so within a seed the codec is the only difference; each job is run with
several seeds because one seed says little: a small perturbation early (a codec, or another
seed) can move when the loss leaves a plateau, and at these lengths that moves the final loss of
tiny-gpt by several percent either way (docs/results/compression.md).

Figures per job and codec: the final loss of each seed, the mean of the training losses of the
last `TAIL` iterations (each the mean over the iteration's microbatches; fresh batches of the
corpus every iteration, the same batches for every codec of a seed); its ratio to `none`'s of
the same seed, per seed and their mean; the mean ratio of an evaluation loss (the final weights
on 16 fixed microbatches drawn with another seed, dropout off, through the plan's codecs); and
the mean wall time of a run (after one untimed warm-up iteration). Runs go two at a time, one
torch thread each: about 15 minutes on 2 cores shared with other work (about 8 idle),
`--quick` under a minute.

`python -m benchmarks.compression [--quick]` (`--quick`: the two presets, 10 iterations, 2
seeds). Writes the `compression` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from benchmarks.report import machine, run_all, write_section
from gwtf.flow.compression import wire_bytes
from gwtf.train.data import load_corpus, microbatch
from gwtf.train.job import PRESETS, CompressionConfig, JobConfig, ModelConfig
from gwtf.train.partition import partition
from gwtf.train.reference import train_reference
from gwtf.train.stage import build_model

STAGES = 4
TAIL = 20
CODECS = ("none", "int8", "int4")
EVAL_SEED = 9_999
EVAL_MICROBATCHES = 16
WORKERS = 2

LLAMA_8 = JobConfig(
    name="llama-8x128",
    model=ModelConfig(kind="llama", layers=8, width=128, heads=4, seq_len=64, dropout=0.1),
    seed=0,
    iterations=60,
    microbatches=8,
    microbatch_size=8,
)


def jobs(quick: bool) -> list[tuple[JobConfig, int, tuple[int, ...]]]:
    """(job, iterations, seeds) for every job measured, the longest runs first."""
    if quick:
        return [(PRESETS["tiny-gpt"], 10, (0, 1)), (PRESETS["tiny-llama"], 10, (0, 1))]
    return [
        (LLAMA_8, 60, (0, 1)),
        (PRESETS["tiny-gpt"], 100, (0, 1, 2)),
        (PRESETS["tiny-llama"], 100, (0, 1, 2)),
    ]


def boundaries(job: JobConfig) -> tuple[int, ...]:
    """Block counts before each boundary of the job's `STAGES`-stage cut."""
    return tuple(spec.end_layer for spec in partition(job.model.layers, STAGES)[:-1])


def variant(job: JobConfig, codec: str, seed: int) -> JobConfig:
    """`job` with seed `seed` and `codec` planned at every boundary of the cut."""
    allowed = CompressionConfig(allow=("int8", "int4"))
    base = dataclasses.replace(job, seed=seed, compression=allowed)
    return base.planned({} if codec == "none" else dict.fromkeys(boundaries(job), codec))


def eval_loss(job: JobConfig, parameters: dict[str, torch.Tensor]) -> float:
    """Mean loss of the weights `parameters` on `EVAL_MICROBATCHES` fixed microbatches (seed
    `EVAL_SEED`), dropout off, through the job's planned codecs."""
    corpus = load_corpus()
    module = build_model(job.model, job.seed)
    module.plan_boundaries(job.compression)
    missing, unexpected = module.load_state_dict(parameters, strict=False)
    buffers = {name for name, _ in module.named_buffers()}
    assert not unexpected and set(missing) <= buffers, (missing, unexpected)
    module.eval()
    losses = []
    with torch.no_grad():
        for m in range(EVAL_MICROBATCHES):
            tokens, labels = microbatch(corpus, EVAL_SEED, 0, m, job.microbatch_size,
                                        job.model.seq_len)  # fmt: skip
            losses.append(float(module.loss(module(tokens, None), labels)))
    return sum(losses) / len(losses)


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: its losses per iteration, its evaluation loss, its wall time (s)."""

    loss: tuple[float, ...]
    eval: float
    wall: float

    def final(self, tail: int) -> float:
        """Mean training loss of the last `tail` iterations."""
        return sum(self.loss[-tail:]) / len(self.loss[-tail:])


def _one(name: str, codec: str, seed: int, quick: bool) -> Run:
    """Train one variant of job `name`."""
    torch.set_num_threads(1)
    job, iterations, _ = next(m for m in jobs(quick) if m[0].name == name)
    trained = variant(job, codec, seed)
    corpus = load_corpus()
    train_reference(trained, corpus, iterations=1)  # warm up the process; not timed
    start = time.perf_counter()
    result = train_reference(trained, corpus, iterations=iterations)
    wall = time.perf_counter() - start
    return Run(result.loss, eval_loss(trained, dict(result.parameters)), wall)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run(quick: bool = False) -> str:
    tail = 4 if quick else TAIL
    measured = jobs(quick)
    runs = [(job.name, c, seed) for job, _, seeds in measured for seed in seeds for c in CODECS]
    began = time.perf_counter()
    results = run_all(_one, runs, quick, workers=WORKERS)
    total = time.perf_counter() - began

    rows = []
    for job, iterations, seeds in measured:
        cut = boundaries(job)
        numel = job.microbatch_size * job.model.seq_len * job.model.width
        for codec in CODECS:
            mine = [results[(job.name, codec, seed)] for seed in seeds]
            base = [results[(job.name, "none", seed)] for seed in seeds]
            finals = [r.final(tail) for r in mine]
            ratios = [r.final(tail) / b.final(tail) for r, b in zip(mine, base, strict=True)]
            evals = [r.eval / b.eval for r, b in zip(mine, base, strict=True)]
            plan = "-" if codec == "none" else ", ".join(str(b) for b in cut)
            kib = wire_bytes(codec, numel) / 1024
            per_seed = ", ".join(f"{r:.3f}" for r in ratios) if codec != "none" else "-"
            rows.append(
                f"| {job.name} | {iterations} | {codec} | {plan} | {kib:.1f} | "
                f"{', '.join(f'{f:.3f}' for f in finals)} | {per_seed} | "
                f"**{_mean(ratios):.4f}** | {_mean(evals):.4f} | "
                f"{_mean([r.wall for r in mine]):.0f} |"
            )
    firsts = [r.loss[0] for r in results.values()]
    command = f"python -m benchmarks compression{' --quick' if quick else ''}"
    body = "\n".join([
        f"## Convergence with compressed stage boundaries (`{command}`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one torch thread per run, two "
        f"runs at a time on a machine shared with other work ({total:.0f} s in all). Each job is "
        "trained in the one-process reference (`train_reference`) once per codec and seed; "
        "the runs of a seed share the initialisation, data and dropout, so the codec is their "
        f"only difference. The plan puts the codec at every boundary of a {STAGES}-stage cut "
        "(`plan`: blocks before each boundary), forward on the activation and backward on its "
        "gradient; int8 everywhere is the most the default rule (`allow = [\"int8\"]`) can "
        "plan, its worst case. The first iteration's loss is "
        f"{min(firsts):.2f}-{max(firsts):.2f} in every run.",
        "",
        f"`final`: per seed, the mean training loss of the last {tail} iterations (fresh corpus "
        "windows every iteration, the same for every codec of a seed); the spread of `none`'s "
        "finals across seeds is what chance alone does. `final / none`: the ratio to `none` of "
        "the same seed, per seed and (bold) their mean; target for the default rule (int8): "
        "within 1%. `eval / none`: the same for the final weights on "
        f"{EVAL_MICROBATCHES} fixed microbatches drawn with seed {EVAL_SEED}, dropout off, "
        "through the plan's codecs, mean over seeds. `KiB/boundary`: one microbatch's "
        "activation on the wire at each boundary (`wire_bytes`). `wall s`: one training run, "
        "mean over seeds.",
        "",
        "| job | iterations | codec | plan | KiB/boundary | final per seed | final / none per "
        "seed | final / none | eval / none | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])  # fmt: skip
    write_section("compression", body)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compression", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="two presets, 10 iterations, 2 seeds")
    args = parser.parse_args()
    print(run(quick=args.quick))


if __name__ == "__main__":
    main()
