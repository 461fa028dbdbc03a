"""Robust aggregation benchmark: the cost of `trimmed-mean` and `centered-clip` against the plain
weighted mean, on the parameters of a real stage (tiny-gpt, 4 stages) and on a 25 M-parameter
stage, for 2 to 8 replicas; how far each lands from the honest mean when one replica poisons; and
the whole commit a replica runs (the screen, the rule, the AdamW step of a real stage executor
and its checksum) with each rule against the mean.

`python -m benchmarks robust [--quick]`.
"""

from __future__ import annotations

import math
import time

import torch

from benchmarks.report import machine, write_section
from gwtf.train import JobConfig, ModelConfig, StageExecutor, resolve_job
from gwtf.train.commit import GradContribution, combine_contributions
from gwtf.train.robust import aggregate, norm_outliers

RULES = ("trimmed-mean", "centered-clip")


def tiny_gpt_shapes() -> dict[str, tuple[int, ...]]:
    job = resolve_job("tiny-gpt")
    executor = StageExecutor(job, 1, 4)
    return {n: tuple(p.shape) for n, p in executor.module.named_parameters()}


def big_shapes() -> dict[str, tuple[int, ...]]:
    # 25 M parameters in layers of a 1024-wide transformer block's sizes.
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(2):
        shapes[f"l{layer}.attn"] = (1024, 3 * 1024)
        shapes[f"l{layer}.proj"] = (1024, 1024)
        shapes[f"l{layer}.up"] = (1024, 4 * 1024)
        shapes[f"l{layer}.down"] = (4 * 1024, 1024)
    return shapes


def contributions(
    shapes: dict[str, tuple[int, ...]], replicas: int, poison: bool
) -> list[GradContribution]:
    """Each replica: 2 microbatches of the same true gradient plus 10% noise (and the last one
    scaled by 1e4 when `poison`)."""
    g = torch.Generator().manual_seed(0)
    true = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    out = []
    for r in range(replicas):
        sums = {n: 2 * t + 0.1 * torch.randn(t.shape, generator=g) for n, t in true.items()}
        if poison and r == replicas - 1:
            sums = {n: 1e4 * t for n, t in sums.items()}
        out.append(GradContribution(f"n{r}", 1, 0, (2 * r, 2 * r + 1), sums))
    return out


def best_of(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return math.sqrt(num / max(den, 1e-300))


def commit_seconds(job: JobConfig, stage: int, stages: int, replicas: int, rule: str,
                   repeats: int) -> tuple[float, int]:
    """Best time of one whole commit at a replica of `stage` (what `StageWorker` runs between
    holding its peers' sums and reporting its checksum): with a robust rule the screen
    (`norm_outliers`) and the rule, else the exact mean; then the executor's AdamW step and
    checksum. The sums are float64 (the job's grad_accum), 2 microbatches per replica."""
    executor = StageExecutor(job, stage, stages)
    shapes = {n: tuple(p.shape) for n, p in executor.parameters().items()}
    g = torch.Generator().manual_seed(1)
    sums = [{n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in shapes.items()}
            for _ in range(replicas)]
    ids = tuple(range(2 * replicas))
    times = []
    for _ in range(repeats):
        held = [GradContribution(f"n{r}", stage, executor.iteration, ids[2 * r : 2 * r + 2],
                                 sums[r]) for r in range(replicas)]  # fmt: skip
        t0 = time.perf_counter()
        if rule == "mean":
            combined = combine_contributions(held, expected_ids=ids)
        else:
            norm_outliers(held, job.aggregation.norm_factor)
            combined = aggregate(held, rule, expected_ids=ids)
        executor.commit(combined)
        times.append(time.perf_counter() - t0)
    return min(times), sum(math.prod(s) for s in shapes.values())


def commit_rows(quick: bool) -> list[str]:
    tiny = resolve_job("tiny-gpt")
    wide = JobConfig(
        name="wide", model=ModelConfig(kind="gpt", layers=6, width=512, heads=8, seq_len=64),
        iterations=1, microbatches=8, microbatch_size=8,
    )
    cases = [("tiny-gpt stage 1 of 3", tiny)]
    if not quick:
        cases.append(("gpt width 512, stage 1 of 3", wide))
    repeats = 3 if quick else 5
    rows = []
    for label, job in cases:
        for replicas in (3,) if quick else (3, 5):
            base, params = commit_seconds(job, 1, 3, replicas, "mean", repeats)
            cells = [f"{base * 1e3:.1f}"]
            for rule in RULES:
                t, _ = commit_seconds(job, 1, 3, replicas, rule, repeats)
                cells.append(f"{t * 1e3:.1f} ({t / base:.2f}x)")
            rows.append(f"| {label} ({params / 1e6:.2f} M) | {replicas} | "
                        + " | ".join(cells) + " |")
    return rows


def run(quick: bool = False) -> str:
    torch.set_num_threads(1)
    cases = [("tiny-gpt stage 1 of 4", tiny_gpt_shapes())]
    if not quick:
        cases.append(("25 M parameters", big_shapes()))
    replica_counts = (2, 4) if quick else (2, 4, 8)
    repeats = 2 if quick else 3
    rows = []
    for label, shapes in cases:
        params = sum(math.prod(s) for s in shapes.values())
        for n in replica_counts:
            honest = contributions(shapes, n, poison=False)
            base = best_of(lambda h=honest: aggregate(h, "mean"), repeats)
            cells = [f"{base * 1e3:.1f}"]
            for rule in RULES:
                t = best_of(lambda h=honest, r=rule: aggregate(h, r), repeats)
                cells.append(f"{t * 1e3:.1f} ({t / base:.1f}x)")
            rows.append(f"| {label} ({params / 1e6:.2f} M) | {n} | " + " | ".join(cells) + " |")
    # Robustness: one replica of 5 scaled by 1e4 (tiny-gpt stage).
    shapes = cases[0][1]
    honest = contributions(shapes, 4, poison=False)
    reference = aggregate(honest, "mean").grads
    attacked = contributions(shapes, 5, poison=True)
    robustness = [
        f"| {rule} | {distance(aggregate(attacked, rule).grads, reference):.3g} |"
        for rule in ("mean", *RULES)
    ]
    body = "\n".join([
        "## Robust aggregation against the plain mean "
        f"(`python -m benchmarks robust{' --quick' if quick else ''}`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, one torch thread, on a machine "
        "shared with other work. Each replica contributes 2 microbatches; best of "
        f"{repeats} runs; the ratio is against `mean` in the same run (which is the commit's "
        "exact float accumulation plus the checks every rule shares).",
        "",
        "| parameters | replicas | mean ms | trimmed-mean ms | centered-clip ms |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "One replica of 5 sends its gradient scaled by 1e4: distance of each rule's result from "
        "the mean of the 4 honest replicas, relative to its norm.",
        "",
        "| rule | relative distance |",
        "|---|---|",
        *robustness,
        "",
        "The whole commit at one replica, as `gwtf.node.worker.worker` runs it once it holds its "
        "stage peers' sums: with a robust rule the screen (`norm_outliers`) and the rule, with "
        "`mean` the exact mean; then the AdamW step of a real stage executor and its parameter "
        "checksum. float64 sums, 2 microbatches per replica; best of "
        f"{3 if quick else 5} commits; the ratio is against `mean` in the same run. The exchange "
        "of the sums between the replicas is the same bytes for every rule and is not in it.",
        "",
        "| stage | replicas | mean ms | trimmed-mean ms | centered-clip ms |",
        "|---|---|---|---|---|",
        *commit_rows(quick),
        "",
        "Reading: the exact mean only adds the sums, and the AdamW step and the checksum are the "
        "same for every rule; a robust rule first copies every replica's mean gradient to "
        "float64 and then sorts each coordinate across the replicas (trimmed-mean) or takes "
        "their median and clips the whole vector a few times (centered-clip), so its extra "
        "cost grows with parameters times replicas and is paid at every commit, by every "
        "replica, on the compute thread.",
    ])  # fmt: skip
    write_section("robust", body)
    return body
