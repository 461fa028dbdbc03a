"""The stage executor: forward/backward bookkeeping, refusals, recompute on a replacement node
(docs/design.md 4 rules 2 and 3), the commit and state transfer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from gwtf.train.commit import ContributionError, GradContribution, combine_contributions
from gwtf.train.data import Corpus, job_microbatch, load_corpus
from gwtf.train.executor import (
    BadTensorError,
    CapacityError,
    DuplicateMicrobatchError,
    ExecutorError,
    MicrobatchKey,
    StageExecutor,
    UnknownMicrobatchError,
)
from gwtf.train.job import JobConfig, ModelConfig
from gwtf.train.state import StateError

JOB = JobConfig(
    model=ModelConfig(kind="gpt", layers=3, width=32, heads=2, seq_len=16, dropout=0.2),
    iterations=3,
    microbatches=6,
    microbatch_size=3,
    seed=11,
)
S = 3


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus()


def key(m: int, iteration: int = 0, job: JobConfig = JOB) -> MicrobatchKey:
    return MicrobatchKey(job.job_id, iteration, m)


@dataclass
class Ledger:
    """What the neighbours of each stage keep for one microbatch until the commit."""

    inputs: dict[int, Tensor] = field(default_factory=dict)  # stage -> its input
    grads: dict[int, Tensor] = field(default_factory=dict)  # stage -> gradient it received
    labels: Tensor | None = None


def run(path: list[StageExecutor], corpus: Corpus, m: int, iteration: int = 0) -> Ledger:
    """One microbatch forward and backward through one executor per stage."""
    ledger = Ledger()
    job = path[0].job
    x, ledger.labels = job_microbatch(corpus, job, iteration, m)
    k = key(m, iteration, job)
    for s, executor in enumerate(path[:-1]):
        ledger.inputs[s] = x
        out = executor.forward(k, x).output
        assert out is not None
        x = out
    ledger.inputs[S - 1] = x
    g = path[-1].forward(k, x, ledger.labels).grad_input
    for s in range(S - 2, -1, -1):
        assert g is not None
        ledger.grads[s] = g
        g = path[s].backward(k, g)
    assert g is None
    return ledger


def replicas() -> list[StageExecutor]:
    return [StageExecutor(JOB, s, S) for s in range(S)]


def test_forward_keeps_state_until_backward_and_accumulates_once(corpus: Corpus) -> None:
    first, middle, last = replicas()
    tokens, labels = job_microbatch(corpus, JOB, 0, 4)
    h0 = first.forward(key(4), tokens).output
    assert h0 is not None and h0.shape == (3, 16, 32) and not h0.requires_grad
    assert first.in_flight == 1 and first.is_in_flight(key(4))
    h1 = middle.forward(key(4), h0).output
    assert h1 is not None
    result = last.forward(key(4), h1, labels)
    assert result.output is None and result.grad_input is not None and result.loss is not None
    assert last.in_flight == 0 and last.accumulated == (4,)
    g0 = middle.backward(key(4), result.grad_input)
    assert g0 is not None and g0.shape == h0.shape
    assert middle.in_flight == 0 and middle.accumulated == (4,)
    assert first.backward(key(4), g0) is None
    assert first.accumulated == (4,) and first.in_flight_keys() == ()
    assert (first.stats.forwards, first.stats.backwards, first.stats.recomputes) == (1, 1, 0)

    before = {n: t.clone() for n, t in middle.contribution("m").grad_sums.items()}
    with pytest.raises(DuplicateMicrobatchError, match="a second backward would count it twice"):
        middle.backward(key(4), result.grad_input)
    with pytest.raises(DuplicateMicrobatchError, match="already accumulated"):
        middle.forward(key(4), h0)
    with pytest.raises(DuplicateMicrobatchError, match="already accumulated"):
        last.forward(key(4), h1, labels)
    after = middle.contribution("m").grad_sums
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert middle.stats.refused == 2


def test_refusals_are_one_sentence_and_change_nothing(corpus: Corpus) -> None:
    first, middle, last = replicas()
    tokens, labels = job_microbatch(corpus, JOB, 0, 0)
    with pytest.raises(UnknownMicrobatchError, match="no forward state .* recomputed here"):
        middle.backward(key(0), torch.zeros(3, 16, 32))
    with pytest.raises(ExecutorError, match="for iteration 1 but stage 0 is at iteration 0"):
        first.forward(key(0, iteration=1), tokens)
    with pytest.raises(ExecutorError, match="another job"):
        first.forward(MicrobatchKey("job-other", 0, 0), tokens)
    with pytest.raises(ExecutorError, match=r"outside 0..5"):
        first.forward(key(6), tokens)
    with pytest.raises(BadTensorError, match=r"must be torch.int64 of shape \[3, 16\]"):
        first.forward(key(0), tokens[:, :8])
    with pytest.raises(BadTensorError, match="token ids outside 0..255"):
        first.forward(key(0), tokens + 256)
    with pytest.raises(BadTensorError, match=r"must be torch.float32 of shape \[3, 16, 32\]"):
        middle.forward(key(0), torch.zeros(3, 16, 32, dtype=torch.float64))
    with pytest.raises(BadTensorError, match="contains NaN or inf"):
        middle.forward(key(0), torch.full((3, 16, 32), float("nan")))
    with pytest.raises(BadTensorError, match="needs the labels"):
        last.forward(key(0), torch.zeros(3, 16, 32))

    h = first.forward(key(0), tokens).output
    assert h is not None
    with pytest.raises(DuplicateMicrobatchError, match="already in flight"):
        first.forward(key(0), tokens)
    with pytest.raises(BadTensorError, match="gradient on stage 0 must be"):
        first.backward(key(0), torch.zeros(3, 16, 31))
    with pytest.raises(BadTensorError, match="contains NaN"):
        first.backward(key(0), torch.full((3, 16, 32), float("inf")))
    assert first.in_flight == 1 and first.accumulated == ()  # the state survived the refusals
    first.backward(key(0), torch.ones(3, 16, 32))
    assert first.accumulated == (0,)


def test_a_diverged_loss_is_refused_and_not_accumulated(corpus: Corpus) -> None:
    last = StageExecutor(JOB, 2, S)
    with torch.no_grad():
        last.module.head.out.weight.fill_(float("inf"))  # type: ignore[union-attr]
    _, labels = job_microbatch(corpus, JOB, 0, 0)
    with pytest.raises(ExecutorError, match="the training diverged; lower optimizer.lr"):
        last.forward(key(0), torch.zeros(3, 16, 32), labels)
    assert last.accumulated == () and last.in_flight == 0


def test_capacity_and_drop(corpus: Corpus) -> None:
    first = StageExecutor(JOB, 0, S, capacity=1)
    a, _ = job_microbatch(corpus, JOB, 0, 0)
    b, _ = job_microbatch(corpus, JOB, 0, 1)
    first.forward(key(0), a)
    with pytest.raises(CapacityError, match="holds 1 microbatches, its capacity"):
        first.forward(key(1), b)
    assert first.drop(key(0)) and not first.drop(key(0))
    first.forward(key(1), b)
    assert first.in_flight_keys() == (key(1),)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_recompute_on_a_replacement_is_bit_for_bit(corpus: Corpus, stage: int) -> None:
    """Rule 2: a node built from a live replica's state bytes, after other work, recomputes the
    dead node's activation and gradient for microbatch 3 exactly."""
    survivor = StageExecutor(JOB, stage, S)  # a replica of the dead node, idle so far
    dead_path = replicas()
    ledger = run(dead_path, corpus, 3)  # the neighbours' records of what the dead node did
    dead_sums = dead_path[stage].contribution("dead").grad_sums

    replacement = StageExecutor.from_state(JOB, stage, S, survivor.state_bytes())
    other_path = [replacement if s == stage else StageExecutor(JOB, s, S) for s in range(S)]
    run(other_path, corpus, 1)  # unrelated work first: the order of calls must not matter
    redo = replacement.recompute(key(3), ledger.inputs[stage], ledger.labels)
    assert replacement.stats.recomputes == 1
    if stage < S - 1:
        assert redo.output is not None
        assert torch.equal(redo.output, ledger.inputs[stage + 1])
        grad_input = replacement.backward(key(3), ledger.grads[stage])
    else:
        grad_input = redo.grad_input
    if stage > 0:
        assert grad_input is not None and torch.equal(grad_input, ledger.grads[stage - 1])

    only_1 = StageExecutor(JOB, stage, S)
    run([only_1 if s == stage else StageExecutor(JOB, s, S) for s in range(S)], corpus, 1)
    expected = only_1.contribution("x").grad_sums
    for name, total in replacement.contribution("new").grad_sums.items():
        assert torch.equal(total, expected[name] + dead_sums[name]), name


def test_replayed_accumulation_ends_equal_to_no_crash(corpus: Corpus) -> None:
    """Rule 3: replica A of stage 1 dies after accumulating microbatches 0, 2, 4; a joiner built
    from replica B's state replays them (in another order) from the neighbours' ledgers; the
    commit equals the commit without the crash."""

    def iteration(crash: bool) -> str:
        firsts, lasts = replicas(), replicas()
        a, b = StageExecutor(JOB, 1, S), StageExecutor(JOB, 1, S)
        ledgers = {}
        for m in range(JOB.microbatches):
            middle = a if m % 2 == 0 else b
            path = [firsts[0], middle, lasts[2]]
            ledgers[m] = run(path, corpus, m)
        if crash:
            a = StageExecutor.from_state(JOB, 1, S, b.state_bytes())
            for m in (4, 0, 2):
                a.recompute(key(m), ledgers[m].inputs[1])
                a.backward(key(m), ledgers[m].grads[1])
            assert a.stats.recomputes == 3
        aggregated = combine_contributions(
            [b.contribution("b"), a.contribution("a")], expected_ids=range(JOB.microbatches)
        )
        checksums = {a.commit(aggregated), b.commit(aggregated)}
        assert len(checksums) == 1
        return checksums.pop()

    assert iteration(crash=True) == iteration(crash=False)


def test_an_adopted_running_sum_ends_equal_to_no_crash(corpus: Corpus) -> None:
    """Bounded replay (docs/design.md 4.9): replica A of stage 1 shipped its running sum of 0
    and 2 to B, then accumulated 4 and died. B adopts the shipped sum (0 and 2 count as B's),
    4 is replayed at B, and the commit equals the one without the crash. A sum that overlaps
    what B accumulated, or of another iteration, is refused and changes nothing."""

    def iteration(crash: bool) -> str:
        firsts, lasts = replicas(), replicas()
        a, b = StageExecutor(JOB, 1, S), StageExecutor(JOB, 1, S)
        ledgers = {}
        shipped = None
        for m in range(JOB.microbatches):
            middle = a if m % 2 == 0 else b
            ledgers[m] = run([firsts[0], middle, lasts[2]], corpus, m)
            if m == 2:
                shipped = a.contribution("a")
        assert shipped is not None and shipped.microbatch_ids == (0, 2)
        if not crash:
            contributions = [b.contribution("b"), a.contribution("a")]
        else:
            before = b.contribution("b")
            with pytest.raises(ExecutorError, match="already accumulated"):
                b.adopt(dataclasses.replace(shipped, microbatch_ids=(0, 1)))
            with pytest.raises(ExecutorError, match="iteration 1"):
                b.adopt(dataclasses.replace(shipped, iteration=1))
            assert b.contribution("b").microbatch_ids == before.microbatch_ids
            b.adopt(shipped)
            b.recompute(key(4), ledgers[4].inputs[1])
            b.backward(key(4), ledgers[4].grads[1])
            assert b.accumulated == (1, 3, 5, 0, 2, 4)
            contributions = [b.contribution("b")]
        aggregated = combine_contributions(contributions, expected_ids=range(JOB.microbatches))
        return b.commit(aggregated)

    assert iteration(crash=True) == iteration(crash=False)


def test_commit_steps_every_replica_the_same_and_checks_the_aggregate(corpus: Corpus) -> None:
    a, b = replicas(), replicas()
    for m in range(4):
        run(a if m < 2 else b, corpus, m)
    start = a[2].checksum()
    assert start == b[2].checksum()
    with pytest.raises(ContributionError, match=r"microbatches \[4, 5\] .* no replica"):
        combine_contributions(
            [a[2].contribution("a"), b[2].contribution("b")], expected_ids=range(6)
        )
    aggregated = combine_contributions([a[2].contribution("a"), b[2].contribution("b")])
    assert aggregated.microbatch_ids == (0, 1, 2, 3)
    only_a = combine_contributions([a[2].contribution("a")])
    with pytest.raises(ExecutorError, match=r"leaves out microbatches \[2, 3\]"):
        b[2].commit(only_a)
    assert a[2].commit(aggregated) == b[2].commit(aggregated) != start
    assert a[2].iteration == 1 and a[2].accumulated == ()
    with pytest.raises(ExecutorError, match="cannot commit stage 2 iteration 1"):
        a[2].commit(aggregated)
    empty = combine_contributions([GradContribution("x", 1, 0, (), {})])
    fresh = StageExecutor(JOB, 1, S)
    before = fresh.checksum()
    assert fresh.commit(empty) == before  # nothing finished: no step, next iteration
    assert fresh.iteration == 1


def test_contributions_that_count_a_microbatch_twice_are_refused() -> None:
    grads = {"w": torch.ones(2, dtype=torch.float64)}
    one = GradContribution("n1", 1, 0, (0, 1), grads)
    with pytest.raises(ContributionError, match="microbatch 1 of iteration 0 was accumulated by"):
        combine_contributions([one, GradContribution("n2", 1, 0, (1, 2), grads)])
    with pytest.raises(ContributionError, match="node n1 sent two contributions"):
        combine_contributions([one, GradContribution("n1", 1, 0, (2,), grads)])
    with pytest.raises(ContributionError, match="stage 1 iteration 1, not stage 1 iteration 0"):
        combine_contributions([one, GradContribution("n2", 1, 1, (2,), grads)])
    with pytest.raises(ContributionError, match=r"\[1\] were accumulated .* not finished"):
        combine_contributions([one], expected_ids=[0])
    with pytest.raises(ContributionError, match="no contribution"):
        combine_contributions([])
    mean = combine_contributions([GradContribution("n2", 1, 0, (2,), grads), one])
    assert mean.grads["w"].dtype == torch.float32
    assert torch.equal(mean.grads["w"], torch.full((2,), 2 / 3))


def test_contribution_does_not_change_after_later_backwards(corpus: Corpus) -> None:
    path = replicas()
    run(path, corpus, 0)
    sent = path[1].contribution("n")
    copy = {n: t.clone() for n, t in sent.grad_sums.items()}
    run(path, corpus, 1)
    assert all(torch.equal(copy[n], sent.grad_sums[n]) for n in copy)
    assert sent.microbatch_ids == (0,)


def test_state_round_trip_carries_weights_optimizer_and_iteration(corpus: Corpus) -> None:
    path = replicas()
    for iteration in range(2):
        for m in range(2):
            run(path, corpus, m, iteration)
        for executor in path:
            executor.commit(combine_contributions([executor.contribution("n")]))
    donor = path[1]
    joiner = StageExecutor.from_state(JOB, 1, S, donor.state_bytes())
    assert joiner.checksum() == donor.checksum()
    assert joiner.iteration == donor.iteration == 2
    assert joiner.digests() == donor.digests()
    # AdamW's moments came along: one more identical step keeps them identical.
    ledger = run(path, corpus, 5, 2)
    joiner.recompute(key(5, 2), ledger.inputs[1])
    joiner.backward(key(5, 2), ledger.grads[1])
    a = donor.commit(combine_contributions([donor.contribution("d")]))
    b = joiner.commit(combine_contributions([joiner.contribution("j")]))
    assert a == b


def test_state_bytes_for_another_stage_or_job_or_garbage_are_refused() -> None:
    data = StageExecutor(JOB, 1, S).state_bytes()
    with pytest.raises(StateError, match=r"state holds stage 1 \(blocks 1..1\), not stage 2"):
        StageExecutor.from_state(JOB, 2, S, data)
    other = JobConfig(model=JOB.model, iterations=3, microbatches=6, microbatch_size=3, seed=12)
    with pytest.raises(StateError, match="state is for job"):
        StageExecutor.from_state(other, 1, S, data)
    with pytest.raises(StateError, match="cannot be read"):
        StageExecutor.from_state(JOB, 1, S, b"not a state")
    with pytest.raises(StateError, match="cannot be read"):
        StageExecutor.from_state(JOB, 1, S, data[: len(data) // 2])


def test_a_rollback_restores_an_earlier_state_and_trains_the_same_again(corpus: Corpus) -> None:
    # docs/design.md 4.6: a node keeps its stage's state of a boundary and goes back to it;
    # the iterations after it, redone with the same data, end in the very same bits.
    path = replicas()

    def iteration(k: int) -> None:
        for m in range(2):
            run(path, corpus, m, k)
        for executor in path:
            executor.commit(combine_contributions([executor.contribution("n")]))

    iteration(0)
    kept = [executor.state_bytes() for executor in path]
    iteration(1)
    iteration(2)
    first = [executor.checksum() for executor in path]
    run(path, corpus, 0, 3)  # work in progress when the rollback comes: forgotten
    for executor, state in zip(path, kept, strict=True):
        executor.restore(state)
        assert executor.iteration == 1 and executor.in_flight == 0 and not executor.accumulated
    iteration(1)
    iteration(2)
    assert [executor.checksum() for executor in path] == first
    with pytest.raises(StateError):
        path[0].restore(kept[1])


def _train(path: list[StageExecutor], corpus: Corpus, k: int, ids: range = range(2)) -> None:
    for m in ids:
        run(path, corpus, m, k)
    for executor in path:
        executor.commit(combine_contributions([executor.contribution("n")]))


def test_a_joiner_catches_up_with_a_replicas_steps_bit_for_bit(corpus: Corpus) -> None:
    # docs/design.md 3.8: a joiner whose state of iteration 1 three steps made stale applies the
    # replica's kept steps and ends with its very bits, weights and AdamW moments alike.
    path = replicas()
    _train(path, corpus, 0)
    donor = path[1]
    stale = donor.state_bytes()
    for k in (1, 2):
        _train(path, corpus, k)
    _train(path, corpus, 3, range(0))  # an iteration that trained nothing steps nothing
    joiner = StageExecutor.from_state(JOB, 1, S, stale)
    assert joiner.catch_up(donor.steps_bytes(1)) == donor.iteration == 4
    assert joiner.checksum() == donor.checksum()
    assert joiner.state_bytes() == donor.state_bytes()
    # It keeps the steps it applied: it can be a later joiner's donor in turn.
    late = StageExecutor.from_state(JOB, 1, S, stale)
    assert late.catch_up(joiner.steps_bytes(1)) == 4 and late.checksum() == donor.checksum()
    # And it trains on as its replica does.
    ledger = run(path, corpus, 5, 4)
    joiner.recompute(key(5, 4), ledger.inputs[1])
    joiner.backward(key(5, 4), ledger.grads[1])
    assert joiner.commit(combine_contributions([joiner.contribution("j")])) == donor.commit(
        combine_contributions([donor.contribution("d")])
    )


def test_steps_are_kept_for_the_jobs_count_and_refused_beyond(corpus: Corpus) -> None:
    job = dataclasses.replace(JOB, catch_up_steps=2)
    path = [StageExecutor(job, s, S) for s in range(S)]
    states = []
    for k in range(4):
        states.append(path[1].state_bytes())
        _train(path, corpus, k)
    donor = path[1]
    with pytest.raises(StateError, match=r"keeps the steps of iterations 2..3, not from 1"):
        donor.steps_bytes(1)
    with pytest.raises(StateError, match="not from 4"):
        donor.steps_bytes(4)  # nothing to catch up
    joiner = StageExecutor.from_state(job, 1, S, states[2])
    assert joiner.catch_up(donor.steps_bytes(2)) == 4
    off = [StageExecutor(dataclasses.replace(JOB, catch_up_steps=0), s, S) for s in range(S)]
    _train(off, corpus, 0)
    with pytest.raises(StateError, match="keeps the steps"):
        off[1].steps_bytes(0)


def test_steps_of_another_history_or_stage_are_refused(corpus: Corpus) -> None:
    path = replicas()
    _train(path, corpus, 0)
    base = path[1].state_bytes()
    _train(path, corpus, 1)
    _train(path, corpus, 2)
    steps = path[1].steps_bytes(1)
    # A rollback to iteration 1 forgets the steps after it, and another history follows.
    for executor in path:
        executor.restore(base if executor is path[1] else executor.state_bytes())
    with pytest.raises(StateError, match="keeps the steps"):
        path[1].steps_bytes(1)
    other = replicas()
    _train(other, corpus, 0, range(3, 5))  # another iteration 0: another state of iteration 1
    joiner = StageExecutor.from_state(JOB, 1, S, other[1].state_bytes())
    with pytest.raises(StateError, match="taken from another state of iteration 1"):
        joiner.catch_up(steps)
    fresh = StageExecutor.from_state(JOB, 1, S, base)
    with pytest.raises(StateError, match="steps from iteration 1 cannot catch up a state of "
                       "iteration 0"):
        StageExecutor(JOB, 1, S).catch_up(steps)
    with pytest.raises(StateError, match="cannot catch up"):
        StageExecutor.from_state(JOB, 2, S, path[2].state_bytes()).catch_up(steps)
    with pytest.raises(StateError, match="cannot be read"):
        fresh.catch_up(b"not steps")
    assert fresh.catch_up(steps) == 3
