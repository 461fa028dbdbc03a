"""When a node ships its running gradient sum to a keeper (gwtf.node.worker.shipping, docs/design.md
4.9): every N microbatches with a fixed `replay_bound`; with "auto" only once the deaths it has
seen make the replay it saves outweigh the shipment; never for a robust aggregation or without a
live stage peer. The shipment itself (a contribution stream) is the chaos test's
(tests/chaos/test_recovery.py); here the decision, on a node's real context and ledger."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gwtf.node.dataplane.gradsync import KEPT, ContributionError, ContributionHeader
from gwtf.node.errors import NotReady, StaleIteration
from gwtf.node.worker.commit import CommitParticipant
from gwtf.node.worker.shipping import SumShipper
from gwtf.node.worker.stage import StageContext, WorkerConfig


class Host:
    log = logging.LoggerAdapter(logging.getLogger("test"), {})

    def __init__(self, alive: set[str]) -> None:
        self.node_id = "a0"
        self.alive = alive
        self.metrics = SimpleNamespace(count=lambda *a, **k: None)
        self.shipped: list[str] = []

    def member(self, node_id: str) -> Any:
        return SimpleNamespace(id=node_id, uplink_gbps=0.0) if node_id in self.alive else None

    def link(self, a: Any, b: Any) -> None:
        return None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> Any:
        coro.close()  # the decision is what is tested: the stream is not sent
        self.shipped.append(name)
        return Task()


class Task:
    def add_done_callback(self, callback: Any) -> None:
        pass


def shipper(bound: int | str, *, robust: bool = False, peers: tuple[str, ...] = ("a1",)
            ) -> tuple[SumShipper, StageContext, Host]:
    host = Host({"a0", *peers})
    job = SimpleNamespace(job_id="job-ship", microbatches=64, iterations=8, snapshot_every=4,
                          snapshot_thin=2, replay_bound=bound, grad_accum="float64",
                          aggregation=SimpleNamespace(robust=robust))
    executor = SimpleNamespace(
        stage=1, num_stages=3, iteration=0,
        # A stage of 50 M parameters: a 400 MB float64 sum (only its size is read).
        parameters=lambda: {"w": SimpleNamespace(numel=lambda: 50_000_000)},
        stats=SimpleNamespace(compute_s=2.0, backwards=20),
    )
    ctx = StageContext(host, job, executor, slots=2,  # type: ignore[arg-type]
                       config=WorkerConfig(), fault=None)
    ctx.participants = {"h0": 0, "a0": 1, "z0": 2, **{p: 1 for p in peers}}
    ctx.it.began -= 100.0  # the iteration began 100 s ago: 0.4 microbatches/s at 40
    return SumShipper(ctx, runtime=None), ctx, host  # type: ignore[arg-type]


def accumulate(s: SumShipper, ctx: StageContext, mbs: range) -> None:
    for m in mbs:
        ctx.ledger.accumulated(m)
        s.accumulated(ctx.it)


def test_a_fixed_bound_ships_every_n_microbatches_to_the_live_peer() -> None:
    s, ctx, host = shipper(2)
    accumulate(s, ctx, range(1))
    assert host.shipped == []
    accumulate(s, ctx, range(1, 2))
    assert host.shipped == ["ship to a1"]
    accumulate(s, ctx, range(2, 6))
    assert host.shipped == ["ship to a1"]  # one shipment on the wire at a time
    s._busy = False  # it landed (gwtf.node.worker.shipping records it)
    ctx.ledger.shipped(range(6), "a1")
    accumulate(s, ctx, range(6, 7))
    assert host.shipped == ["ship to a1"]
    accumulate(s, ctx, range(7, 8))
    assert host.shipped == ["ship to a1"] * 2


def test_auto_ships_on_evidence_of_deaths_not_on_the_prior() -> None:
    s, ctx, host = shipper("auto")
    accumulate(s, ctx, range(40))
    assert host.shipped == []  # one death a day a node: a replay is not worth a shipment
    for _ in range(200):
        s.death()  # deaths seen in the swarm: every node-second now counts
    accumulate(s, ctx, range(40, 48))
    assert host.shipped == ["ship to a1"]


def test_nothing_ships_without_a_peer_or_for_a_robust_rule_or_when_off() -> None:
    for s, ctx, host in (shipper(1, peers=()), shipper(1, robust=True), shipper(0)):
        accumulate(s, ctx, range(8))
        assert host.shipped == []
    s, ctx, host = shipper(1)
    host.alive.discard("a1")  # its keeper died: no peer left
    accumulate(s, ctx, range(4))
    assert host.shipped == []


def test_a_keeper_takes_a_sum_of_its_own_iteration_only_and_none_from_a_sealed_sender() -> None:
    """A shipment for the next iteration, from a sender that stepped first, is "not ready" (the
    sender retries once this node stepped; refused as stale, it was lost: seen in the soak); one
    of a round started over is stale; one from a dead sender this node already reported is
    refused."""
    host = Host({"a0", "a1"})
    job = SimpleNamespace(job_id="job-ship", microbatches=8, iterations=8, snapshot_every=4,
                          snapshot_thin=2, grad_accum="float64",
                          aggregation=SimpleNamespace(robust=False))
    executor = SimpleNamespace(stage=1, num_stages=3, iteration=5,
                               parameters=lambda: {"w": torch.zeros(3)})
    ctx = StageContext(host, job, executor, slots=2,  # type: ignore[arg-type]
                       config=WorkerConfig(), fault=None)
    ctx.participants = {"h0": 0, "a0": 1, "a1": 1, "z0": 2}
    ctx.started.set()
    keeper = CommitParticipant(ctx, runtime=None, advance=lambda order: None)  # type: ignore

    def shipment(iteration: int) -> ContributionHeader:
        return ContributionHeader("a1", "job-ship", iteration, 1, (0, 2), "float64", 3,
                                  kind=KEPT)

    assert keeper.contribution_numel(shipment(5)) == 3
    with pytest.raises(NotReady, match="iteration 6 round 0 came at iteration 5"):
        keeper.contribution_numel(shipment(6))
    ctx.it.number, ctx.it.round = 6, 1  # stepped, then the round started again
    with pytest.raises(StaleIteration, match="iteration 6 round 0 came at iteration 6 round 1"):
        keeper.contribution_numel(shipment(6))
    ctx.it.round = 0
    ctx.it.sealed.add("a1")
    with pytest.raises(ContributionError, match="sealed"):
        keeper.contribution_numel(shipment(6))


def test_a_keeper_adopts_a_kept_sum_once_however_often_the_order_comes() -> None:
    """The coordinator's `Keep` order is a retried call: the keeper adopts the dead sender's sum
    once (a second adoption would count its microbatches twice), answers a repeat as the first,
    refuses an order for another sum (the round then starts over), and a neighbour of the dead
    node moves its records to the keeper."""
    import asyncio

    from gwtf.node.errors import NotHeld
    from gwtf.node.worker.recoveries import RecoveryHandler
    from gwtf.recovery import Evidence, Ledger
    from gwtf.train import GradContribution
    from gwtf.v1 import job_pb2

    s, ctx, host = shipper(1)
    adopted: list[tuple[int, ...]] = []
    ctx.executor.adopt = lambda kept: adopted.append(kept.microbatch_ids)  # type: ignore

    class Runtime:
        async def compute(self, priority: int, work: Any, emulate: float, it: Any) -> Any:
            await asyncio.sleep(0)  # the compute thread: the repeated order comes meanwhile
            return work()

    handler = RecoveryHandler(ctx, Runtime(), None, None,  # type: ignore[arg-type]
                              begin=lambda holders, weights: None,
                              own_forward=None, adopted=s.accumulated)  # type: ignore
    sum_of = GradContribution("a1", 1, 0, (2, 3), {})
    ctx.it.kept_sums["a1"] = (sum_of, ())
    ctx.ledger.kept("a1", (2, 3), {2: ("h0", "z0"), 3: ("h0", "z0")})

    def order(*mbs: int) -> job_pb2.KeepRequest:
        return job_pb2.KeepRequest(sender="h0", job_id="job-ship", iteration=0, round=0,
                                   dead="a1", stage=1, keeper="a0", hops=[job_pb2.KeptHop(
                                       microbatch=m, upstream="h0", downstream="z0")
                                       for m in mbs])

    async def twice() -> None:
        await asyncio.gather(handler.keep(order(2, 3)), handler.keep(order(2, 3)))
        await handler.keep(order(2, 3))

    asyncio.run(twice())
    assert adopted == [(2, 3)]
    assert ctx.ledger.contributions() == {2, 3}
    with pytest.raises(NotHeld, match="adopted another sum"):
        asyncio.run(handler.keep(order(2)))
    # z0, the dead node's downstream neighbour: its records of 2 and 3 now name the keeper, so
    # a death of the keeper would be reported as a replay's (its backward done).
    _, z_ctx, z_host = shipper(1)
    z_host.node_id = "z0"
    z_ctx.ledger = Ledger("z0", 2)
    for m in (2, 3):
        z_ctx.ledger.activation_received(m, "a1")
    z0 = RecoveryHandler(z_ctx, Runtime(), None, None,  # type: ignore[arg-type]
                         begin=lambda holders, weights: None, own_forward=None,  # type: ignore
                         adopted=lambda it: None)
    asyncio.run(z0.keep(order(2, 3)))
    assert dict(z_ctx.ledger.report_about("a0").evidence) == {
        2: Evidence.BACKWARD_DONE, 3: Evidence.BACKWARD_DONE}
    assert z_ctx.ledger.report_about("a1").evidence == ()
