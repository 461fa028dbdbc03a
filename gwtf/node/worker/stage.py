"""What the parts of a stage worker share (docs/design.md 3.7 and 4): the job's stage on this
node, the iteration in progress, who takes part, and the small rules of waiting for an iteration.

The worker (gwtf.node.worker.worker: receiving, forward and backward) drives four parts around one
`StageContext`: the compute runtime (gwtf.node.worker.runtime), the data-plane sender
(gwtf.node.worker.sender), the commit participant (gwtf.node.worker.commit) and the recovery handler
(gwtf.node.worker.recoveries). Each reads and changes the state here, on the event loop only, so
none of it needs a lock; none of them imports another's module but the ones it calls, and none
imports the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from torch import Tensor

from gwtf.flow.topology import LinkSpec
from gwtf.job.iterations import CommitOrder, CommittedReport, PreparedReport
from gwtf.job.microbatches import MicrobatchTable, StageRole
from gwtf.job.snapshots import SnapshotPolicy, own_kept
from gwtf.node.control.membership import MemberInfo
from gwtf.node.dataplane.gradsync import KeptHop
from gwtf.node.dataplane.tensors import DataPlaneStub, TensorError
from gwtf.node.errors import Busy
from gwtf.node.faults import Fault
from gwtf.node.observe import JobMetrics
from gwtf.node.rpc.retry import FINAL, Backoff
from gwtf.node.worker.slices import Summed
from gwtf.recovery import Ledger
from gwtf.train import GradContribution, JobConfig, StageExecutor
from gwtf.v1 import job_pb2_grpc

__all__ = [
    "FINAL_CODES",
    "FORWARD_SHARE",
    "Iteration",
    "LastStep",
    "Stale",
    "StageContext",
    "WorkerConfig",
    "WorkerHost",
    "WorkerStopped",
]

FORWARD_SHARE = 1 / 3
"""Share of a microbatch's compute that is its forward (backward is about twice the forward)."""

FINAL_CODES = FINAL
"""gRPC codes of a peer that will refuse a resend too (the node's retry policy,
gwtf.node.rpc.retry.FINAL)."""


class WorkerStopped(Exception):
    """The job ended (completed, failed or aborted) while something was waiting on it."""


class Stale(Exception):
    """The iteration (or its round) moved on while this work waited: its result is moot."""


@dataclass(frozen=True)
class WorkerConfig:
    """Timeouts of the data plane and the commit, seconds."""

    data_timeout_s: float = 60.0
    """Deadline of one microbatch's send: it covers the time the receiver holds the stream
    while it waits for a free slot or for its commit of the previous iteration."""
    commit_timeout_s: float = 120.0
    """How long a replica waits for its stage peers' gradient sums."""
    rpc_timeout_s: float = 3.0
    send_attempts: int = 5
    """Sends of a contribution to a peer that does not answer (UNAVAILABLE)."""
    retry_s: float = 0.2
    """First wait before a resend; doubles each attempt, up to `retry_max_s`."""
    retry_max_s: float = 1.0
    failure_timeout_s: float = 5.0
    """The failure detector's: how long a forward keeps going to a live node whose call failed
    (gwtf.node.worker.sender)."""


@dataclass(frozen=True)
class LastStep:
    """The last step this node took (a coordinator that takes over asks for it)."""

    iteration: int
    loss: float
    trained: int
    dropped: tuple[int, ...]
    periodic: bool = False
    """Its order declared the boundary after it periodic (docs/design.md 4.6)."""


class WorkerHost(Protocol):
    """What the worker needs from its node (gwtf.node.jobs.manager implements it)."""

    node_id: str
    log: logging.LoggerAdapter[logging.Logger]
    metrics: JobMetrics

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member with this id (None: dead, left or unknown)."""
        ...

    def known_member(self, node_id: str) -> MemberInfo | None:
        """The latest incarnation of `node_id` this node knows, alive or not."""
        ...

    def refused(self, member: MemberInfo) -> None:
        """A call to `member` was refused: evidence for the node's failure detector."""
        ...

    def data_stub(self, member: MemberInfo) -> DataPlaneStub: ...

    def job_stub(self, member: MemberInfo) -> job_pb2_grpc.JobServiceStub: ...

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        """Seconds the emulated WAN holds `nbytes` to `member` (0 without emulation)."""
        ...

    def link(self, a: MemberInfo, b: MemberInfo) -> LinkSpec | None:
        """The link matrix's link between two members (None: no matrix, or not in it)."""
        ...

    def next_hop_weights(self, capacities: Mapping[str, float]) -> tuple[dict[str, int], str]:
        """Weights over these candidates, from the node's flows or their capacities."""
        ...

    def routing(self) -> str:
        """How the swarm routes (`SwarmSettings.routing`): "swarm" has the sender choose its
        next hops as SWARM does (gwtf.job.swarmroute), any other by the flows."""
        ...

    def compress(self, codecs: tuple[str, ...] | None) -> None:
        """The job's compression plan, one codec per boundary, holds here (None: no longer):
        the node's routing prices arcs with its bytes (docs/design.md 2.15)."""
        ...

    def observe_compute(self, kind: str, started: float, ended: float,
                        device_s: float | None = None) -> None:
        """A forward or backward of this stage ran from `started` to `ended` (monotonic
        clock): a sample of the node's pace (`device_s`: an emulated device's time for it)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    def report_done(self, job_id: str, iteration: int, round_: int, microbatches: tuple[int, ...]
                    ) -> None:
        """These microbatches finished at this holder: tell the coordinator."""
        ...

    def report_replayed(self, job_id: str, iteration: int, round_: int, mb: int, stage: int
                        ) -> None:
        """This node replayed a dead node's microbatch (rule 3): tell the coordinator."""
        ...

    def report_prepared(self, job_id: str, report: PreparedReport) -> None:
        """Phase one of a commit is done here: tell the coordinator."""
        ...

    def report_committed(self, job_id: str, report: CommittedReport) -> None:
        """This node committed an iteration: tell the coordinator."""
        ...

    async def keep_backup(self, job_id: str, stage: int, iteration: int, state: bytes,
                          periodic: bool = False) -> bool:
        """Keep this stage's snapshot (its state at the start of `iteration`, a `periodic`
        boundary or not) at other nodes, so that a node joining the stage finds it if every
        replica dies (docs/design.md 4.6); returns once it is kept, True, or could not be."""
        ...

    def fail(self, job_id: str, reason: str) -> None:
        """The job cannot go on (one sentence): stop it everywhere."""
        ...


@dataclass
class Iteration(MicrobatchTable):
    """The microbatch table (gwtf.job.microbatches) and what this node keeps of the iteration's
    I/O: the events, tensors and tasks of its microbatches (reset at each step and restart)."""

    fwd_done: dict[int, asyncio.Event] = field(default_factory=dict)
    """Set when the microbatch's forward is done here: its backward waits for it (a recovered
    microbatch's gradient may come before the replacement recomputed its forward)."""
    kept: dict[tuple[int, str], tuple[str, dict[str, Tensor]]] = field(default_factory=dict)
    """(microbatch, direction) -> (receiver, tensors) of every send: what a recovery resends."""
    sending: set[tuple[int, str]] = field(default_factory=set)
    """Sends with a loop running (a redirect only changes its target)."""
    prepared: tuple[CommitOrder, list[GradContribution] | Summed] | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    kept_sums: dict[str, tuple[GradContribution, tuple[KeptHop, ...]]] = field(
        default_factory=dict)
    """Bounded replay (gwtf.node.worker.shipping): the last running sum each stage peer shipped
    here, with its records of the microbatches it covers."""
    adopting: dict[str, tuple[frozenset[int], asyncio.Future[None]]] = field(
        default_factory=dict)
    """Dead senders whose kept sum this node adopts or adopted (a repeated order waits for
    the first one's outcome)."""
    sealed: set[str] = field(default_factory=set)
    """Dead senders whose kept sum this node reported to the coordinator: it takes no later one
    from them (the plan adopts the sum that was reported, or none)."""
    sent_bytes: int = 0
    """Data-plane payload bytes this node sent in the iteration (its uplink's load)."""
    began: float = field(default_factory=time.monotonic)


class StageContext:
    """The job's stage on this node and the state its worker's parts share."""

    def __init__(
        self,
        host: WorkerHost,
        job: JobConfig,
        executor: StageExecutor,
        *,
        slots: int,
        config: WorkerConfig,
        fault: Fault | None,
    ) -> None:
        self.host = host
        self.job = job
        self.job_id = job.job_id
        self.executor = executor
        self.stage = executor.stage
        self.num_stages = executor.num_stages
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.num_stages - 1
        self.role = StageRole(
            job_id=job.job_id, node_id=host.node_id, stage=self.stage,
            num_stages=self.num_stages, microbatches=job.microbatches, iterations=job.iterations,
        )
        self.slots = slots
        self.config = config
        self.fault = fault
        self.metrics = host.metrics
        self.free = asyncio.Semaphore(slots)
        """Memory slots (the module docstring of gwtf.node.worker.worker); a restart replaces it."""
        self.participants: dict[str, int] = {}
        """Every node that took part in the job (a dead one too: paths still name it)."""
        self.departed: set[str] = set()
        self.excluded: set[str] = set()
        """Bad peers excluded from the job: departed for good, and nothing they send is taken."""
        self.started = asyncio.Event()
        self.changed = asyncio.Event()
        """Set (and replaced) whenever the iteration advances or contributions arrive."""
        self.it = Iteration(executor.iteration)
        self.ledger = Ledger(host.node_id, self.stage, executor.iteration)
        self.policy = SnapshotPolicy(job.snapshot_every, job.snapshot_thin,
                                     start=executor.iteration, declared=())
        """The periodic boundaries are those the step orders declare (docs/design.md 4.6)."""
        self.floor = executor.iteration
        """The newest periodic boundary whose snapshot landed at every stage, as the last step
        order said (`StepOrder.floor`)."""
        self.snapshots: dict[int, bytes] = {}
        """This stage's own states at the start of iterations, what it restores in a rollback
        (docs/design.md 4.6): of its latest periodic boundary (or of the iteration it entered
        at), and of the floor until the stage snapshots of the latest have landed everywhere
        (`keep_snapshot`)."""
        self.landed: set[int] = set()
        """Periodic boundaries whose snapshot of this stage this node sent and landed at every
        keeper (it reports them with its steps)."""
        self.sending: set[int] = set()
        """Boundaries whose snapshot of this stage this node is streaming to its keepers."""
        self.stopped = False
        self.tasks: set[asyncio.Task[Any]] = set()

    def boundaries(self, declared: Iterable[int], floor: int, start: int) -> None:
        """The job's periodic boundaries declared so far, its floor and its first iteration, as
        its coordinator says (a node entering a running job). Only those up to the iteration its
        state is at count: later ones are of work a rollback to it undoes, and the step orders
        bring the next ones."""
        at = self.executor.iteration
        self.policy = replace(self.policy, start=start,
                              declared=tuple(sorted(b for b in declared if b <= at)))
        self.floor = min(floor, at)

    def declare(self, boundary: int | None, floor: int | None) -> None:
        """A step order declared `boundary` periodic (None: none) and names the floor."""
        if boundary is not None and not self.policy.periodic(boundary):
            self.policy = self.policy.declare(boundary)
        if floor is not None:
            self.floor = floor
            self.landed = {b for b in self.landed if b >= floor}

    def rolled_back(self, to: int) -> None:
        """The swarm rolled back to `to`: the boundaries after it are of undone work."""
        self.policy = self.policy.undo(to)
        self.floor = min(self.floor, to)
        self.landed = {b for b in self.landed if b <= to}

    def keep_snapshot(self, iteration: int, state: bytes | None) -> None:
        """This stage is at the start of `iteration` (stepped or entered), with `state` its own
        snapshot of it to keep (None: none due). It keeps the boundaries `own_kept` names (the
        latest and the floor) and anything newer: the previous periodic state stays until every
        stage's snapshot of the new boundary has landed, so that a stage wiped while its
        snapshot was on its way can still be rolled back to the one before."""
        if state is not None:
            self.snapshots[iteration] = state
        kept = own_kept(self.policy, iteration, floor=self.floor)
        floor = min(kept)
        # A periodic state neither latest nor the floor is dropped: boundaries declared while
        # a stage is thin (`declare_due`) come whether the one before landed or not, and a
        # node keeps two of them, not every one since the floor.
        self.snapshots = {i: s for i, s in self.snapshots.items()
                          if floor <= i <= iteration
                          and (i in kept or not self.policy.periodic(i))}

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, it: Iteration | None = None
              ) -> None:
        """Run `coro` as a task of the job (cancelled when it stops) and, with `it`, of that
        iteration (cancelled when it starts again)."""
        task = self.host.spawn(coro, name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if it is not None:
            it.tasks.add(task)
            task.add_done_callback(it.tasks.discard)

    def signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_change(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), left)

    def fail(self, reason: str) -> None:
        if not self.stopped:
            self.host.fail(self.job_id, reason)

    def current(self, it: Iteration) -> bool:
        return it is self.it and not self.stopped

    def peer(self, node: str) -> MemberInfo | None:
        """The member to call for `node`, a participant of the job: the live one, or, while the
        job counts `node` in (it took part and has not departed), the latest incarnation this
        node knows, at its address, though membership may not show it alive yet: after a heal
        the job admits the stale side's nodes, and finds the deaths of the other side's false,
        up to a second before their new incarnations reach this node (docs/design.md 4.5).
        None: it died or left as far as the job knows (a recovery or a new attempt takes over
        what was meant for it)."""
        member = self.host.member(node)
        if member is not None:
            return member
        if node not in self.participants or node in self.departed:
            return None
        return self.host.known_member(node)

    def hit(self, point: str, iteration: int, microbatch: int | None = None) -> None:
        if self.fault is not None:
            self.fault.hit(point, iteration, microbatch)

    def backoff(self, attempt: int) -> float:
        """The wait before retry `attempt` (0: the first) of a microbatch's or a contribution's
        send: the node's retry policy (gwtf.node.rpc.retry.Backoff) from `retry_s` to
        `retry_max_s`."""
        return Backoff(self.config.retry_s, self.config.retry_max_s).delay(attempt)

    async def reach(self, iteration: int, round_: int, deadline: float) -> None:
        """Wait until this node works on `iteration` in `round_` (it may still be committing the
        one before, or not know of the restart yet); TensorError for one that is over."""
        while True:
            if self.stopped:
                raise TensorError(f"job {self.job_id} has ended here")
            it = self.it
            problem = it.too_far(iteration, round_)
            if problem is not None:
                raise TensorError(problem)
            if it.at(iteration, round_):
                return
            try:
                await self.wait_change(deadline)
            except TimeoutError:
                raise Busy(
                    f"this node did not reach iteration {iteration} round {round_} in time"
                ) from None
