"""Moves of nodes between stages on the real swarm (docs/design.md 2.11, "Moves").

A move is named by the job coordinator at a commit and made by the mover alone:

- `MovePlanner` (the coordinator's): at the step of an iteration after the swarm changed (a
  join, a death, the end of a move), it weighs `gwtf.flow.placement.weigh_move` on its view (the
  job's live participants as its member table describes them: stage, announced compute time,
  location, whether each may move) and names at most one move in the step order it sends every
  member (`IterationCoordinator.moving`, `StepRequest.move`). Every member reads the same
  decision from the same message; the job's progress records it (`JobProgress.moves`). One move
  is under way at a time: the next is weighed once the mover entered its new stage (or did not
  within `prepare_timeout_s`). The coordinator itself is never moved (it would hand the job
  over), nor a node that did not choose its stage.
- `leave_for` (the mover's): it stepped the iteration at its old stage and holds no work of the
  next one (it is neither a participant nor a holder of it). Once the coordinator counted its
  step, it checks that a peer of its old stage answers (it must not be the stage's last live
  node, which a membership table may not show yet), stops its stage worker and asks its node
  for a new incarnation at the new stage (`JobsHost.move_to`): a graceful leave of the swarm
  and a join of the running job at the new stage with its state from a replica there (3.8).
  Its peers marked it departed at the step, so its leave is no crash to the recovery rules: no
  work of it is recovered, and no crash is counted. When no peer of its old stage answers, the
  move is cancelled and the node enters the job again at its old stage the same way.

The speed of a member at another stage is estimated from the one it announced, scaled by the
stages' relative FLOPs (`gwtf.train.costs.stage_profile`, from the job's model cut into the
swarm's stages); a move's transfer is the new stage's state (weights and AdamW's moments) over
the link from the stage's first live replica (the donor a joiner tries first) plus a fixed
overhead (`gwtf.flow.placement.MOVE_OVERHEAD_S`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from grpc import aio

from gwtf.flow.placement import Move, weigh_move
from gwtf.flow.topology import LinkSpec
from gwtf.job.iterations import IterationCoordinator, ReportError, StepOrder
from gwtf.node.control.entry import member_links, swarm_view
from gwtf.node.control.membership import MemberInfo
from gwtf.node.jobs.host import JobsHost
from gwtf.v1 import job_pb2

__all__ = ["PLACEMENT_HORIZON_S", "MovePlanner", "leave_for", "move_pb"]

PLACEMENT_HORIZON_S = 600.0
"""How long a move's gain is counted for: the swarm is taken to stay as it is this long (the
simulator's `placement_horizon_s`, docs/design.md 2.11)."""

COUNTED_WAIT_S = 10.0
"""How long a mover waits for the coordinator to count its step before it leaves anyway (its
peers' step is independent of its report; the coordinator's completion of the iteration waits
for it)."""


class Coordinating(Protocol):
    """The job coordinator (gwtf.node.jobs.coordinator.coordinator.JobCoordinator) as its move
    planner uses it."""

    plan: IterationCoordinator
    job: Any
    job_id: str
    active: Any

    @property
    def host(self) -> JobsHost: ...

    def progress(self) -> job_pb2.JobProgress: ...


def move_pb(move: Move, order: StepOrder, flow: float) -> job_pb2.Move:
    return job_pb2.Move(node=move.node, from_stage=order.mover_from, stage=move.stage,
                        iteration=order.iteration, flow=flow, gain=move.gain)


class MovePlanner:
    """The coordinator's side of moves (module doc)."""

    def __init__(self, coord: Coordinating) -> None:
        self.coord = coord
        self.changed = False
        """The swarm changed (a join, a death, the end of a move) since moves were weighed."""
        self.pending: tuple[str, int, float] | None = None
        """The move under way: (mover, its new stage, until when it is waited for)."""
        self._profile: tuple[tuple[float, ...], tuple[int, ...]] | None = None

    def swarm_changed(self) -> None:
        self.changed = True

    def entered(self, node: str, stage: int) -> None:
        """`node` entered the job at `stage`: a swarm change, and the end of its move if it
        was the mover."""
        self.changed = True
        if self.pending is not None and self.pending[:2] == (node, stage):
            self.pending = None
            self.coord.host.log.info("job %s: the move of %s to stage %d is done",
                                     self.coord.job_id, node, stage)

    def weigh(self, order: StepOrder) -> StepOrder:
        """The step order to send: `order`, or `order` with a move (module doc)."""
        coord = self.coord
        if order.final or not self.changed:
            return order
        if self.pending is not None:
            node, _, until = self.pending
            if time.monotonic() < until:
                return order  # one move at a time
            coord.host.log.warning("job %s: the move of %s did not end in time", coord.job_id,
                                   node)
            self.pending = None
        self.changed = False
        try:
            found = self._propose()
        except Exception as err:  # noqa: BLE001 - weighing a move must never hold a step back
            coord.host.log.warning("job %s: no move weighed: %s", coord.job_id, err)
            return order
        if found is None:
            return order
        move, flow = found
        try:
            moved = coord.plan.moving(move.node, move.stage)
        except ReportError as err:
            coord.host.log.info("job %s: no move of %s: %s", coord.job_id, move.node, err)
            return order
        record = move_pb(move, moved, flow)
        coord.progress().moves.append(record)
        self.pending = (move.node, move.stage,
                        time.monotonic() + coord.host.config.prepare_timeout_s)
        coord.host.log.warning(
            "job %s iteration %d: %s moves from stage %d to stage %d (flow %.3f -> %.3f "
            "microbatches/s)", coord.job_id, order.iteration, move.node, moved.mover_from,
            move.stage, flow, flow + move.gain,
        )
        return moved

    def message(self, order: StepOrder) -> job_pb2.Move | None:
        """The move `order` names, as its step message carries it (None: no move)."""
        if not order.mover:
            return None
        for record in reversed(self.coord.progress().moves):
            if (record.node, record.iteration) == (order.mover, order.iteration):
                return record
        return None

    def _propose(self) -> tuple[Move, float] | None:
        coord = self.coord
        host = coord.host
        infos: dict[str, MemberInfo] = {}
        for node in coord.plan.participants:
            info = host.member(node)
            if info is not None:
                infos[node] = info
        me = host.node_id
        movable = {n for n, i in infos.items() if i.movable and n != me}
        if not movable:
            return None
        view = swarm_view(infos.values(), coord.plan.num_stages,
                          host.activation_bytes(), member_links(list(infos.values()), host.link))
        if self._profile is None:
            from gwtf.train.costs import stage_profile

            self._profile = stage_profile(coord.job, coord.plan.num_stages)
        costs, sizes = self._profile
        move = weigh_move(view, movable, costs, sizes, _donor_link(host, infos),
                          PLACEMENT_HORIZON_S)
        return None if move is None else (move, view.max_flow())


def _donor_link(host: JobsHost, infos: Mapping[str, MemberInfo]
                ) -> Callable[[str, int], LinkSpec | None]:
    def link(node: str, stage: int) -> LinkSpec | None:
        donors = sorted(n for n, i in infos.items() if i.stage == stage and n != node)
        if not donors or infos[node].location == infos[donors[0]].location:
            return None
        return host.link(infos[node], infos[donors[0]])

    return link


# ---------------------------------------------------------------------- the mover


class _Manager(Protocol):
    host: JobsHost

    def progress(self, job_id: str) -> job_pb2.JobProgress | None: ...

    def holds(self, active: Any) -> bool: ...


async def leave_for(manager: _Manager, active: Any, move: job_pb2.Move) -> None:
    """This node is the mover of `move`, and stepped its iteration (module doc)."""
    host = manager.host
    log = host.log
    deadline = time.monotonic() + COUNTED_WAIT_S
    while time.monotonic() < deadline:
        progress = manager.progress(active.job_id)
        if progress is None or progress.iterations_completed > move.iteration:
            break
        await asyncio.sleep(host.config.step_poll_s)
    if not manager.holds(active):
        return  # the job ended or this node dropped its part meanwhile
    stage = move.stage
    if not await _peer_answers(host, active, move.from_stage):
        log.warning("job %s: move cancelled: no live peer of stage %d answers; this node "
                    "enters the job again at stage %d", active.job_id, move.from_stage,
                    move.from_stage)
        stage = move.from_stage
    worker, active.worker = active.worker, None
    if worker is not None:
        await worker.stop()
    if stage != move.from_stage:
        note = (f"moved: stage {move.from_stage} -> {stage} (flow {move.flow:.3f} -> "
                f"{move.flow + move.gain:.3f} microbatches/s)")
    else:
        note = f"move cancelled: enters stage {stage} again"
    host.move_to(stage, note)


async def _peer_answers(host: JobsHost, active: Any, stage: int) -> bool:
    """Does a live replica of `stage` other than this node answer with its part of the job?"""
    me = host.node_id
    request = job_pb2.SyncRequest(sender=me, job_id=active.job_id)
    for node, s in sorted(active.participants.items()):
        if s != stage or node == me or node in active.departed:
            continue
        member = host.member(node)
        if member is None:
            continue
        try:
            await host.stubs(member).jobs.Sync(request, timeout=host.config.rpc_timeout_s)
        except aio.AioRpcError:
            continue
        return True
    return False
