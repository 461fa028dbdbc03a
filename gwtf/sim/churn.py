"""Churn in the simulation (docs/design.md 5): the trace's joins, graceful leaves, crashes and
link changes, joiners downloading their stage's state, moves between stages, and deaths being
noticed (`detection_timeout_s` after a crash, at once for a leave; the policy decides, so the
`oracle` notices at once). What is done about a dead node's work is the recovery's
(`gwtf.sim.recovery.recovering`)."""

from __future__ import annotations

from dataclasses import replace

from gwtf.flow.topology import LinkSpec
from gwtf.job.catchup import catches_up
from gwtf.job.nexthop import SmoothRoundRobin
from gwtf.recovery import Ledger
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.recovery.snapshots import StageSnapshots
from gwtf.sim.simulator import Simulation
from gwtf.sim.traces import TraceEvent

__all__ = ["Churn"]


class Churn:
    """Nodes coming, going and moving in one simulation."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.sink = sim.sink

    @returns_events
    def on_trace(self, event: TraceEvent) -> None:
        sim = self.sim
        if event.kind == "join":
            self._join(event)
        elif event.kind in ("crash", "leave"):
            node = sim.nodes.get(event.node)
            if node is not None and node.alive:
                self.crash(node, graceful=event.kind == "leave")
        elif event.kind == "link":
            a, b = event.link_pair
            assert event.rtt_ms is not None and event.bandwidth_gbps is not None
            sim.links[frozenset((a, b))] = LinkSpec(event.rtt_ms, event.bandwidth_gbps)
            sim.policy.on_link_change(a, b)
        elif event.kind == "speed":
            assert event.factor is not None
            sim.slowdowns[event.node] = event.factor
            node = sim.nodes.get(event.node)
            if node is not None and node.alive:
                node.set_slow(event.factor)
                sim.policy.on_speed_change(node)

    def _join(self, event: TraceEvent) -> None:
        sim = self.sim
        info = sim.sc.nodes[event.node]
        old = sim.nodes.get(event.node)
        if old is not None and old.alive:
            return
        stage = None if info.pinned else sim.policy.place(info)
        if stage is not None and stage != info.stage:
            info = replace(info, stage=stage)
        node = sim.new_node(info)
        sim.joins += 1
        self.schedule_ready(node)

    def _replicas(self, node: SimNode, stage: int) -> list[SimNode]:
        """The live replicas of `stage` other than `node`."""
        return [n for n in self.sim.nodes.values() if n.alive and n.ready and n.stage == stage
                and n is not node]

    def transfer_s(
        self, node: SimNode, stage: int, nbytes: float | None = None,
        peers: list[SimNode] | None = None,
    ) -> float:
        """Seconds `node` takes to download the state of `stage` (or `nbytes` of it) from its
        best-connected live peer of that stage (of `peers` when given), or the stage's
        checkpoint, stored near it, when it has none."""
        sim = self.sim
        if peers is None:
            peers = self._replicas(node, stage)
        if nbytes is None:
            nbytes = sim.sc.params_per_stage[stage] * sim.sc.state_bytes_per_param
        net = sim.network
        if peers:
            best = max(peers, key=lambda p: (net.gbps(p.info, node.info), p.id))
            link = sim.link(best, node) or sim.sc.intra
            gbps = net.gbps(best.info, node.info)
        elif (keeper := sim.recovery.snapshot_source(stage)) is not None:
            # The stage was wiped: its state comes from the keeper of its snapshots.
            link = sim.link(keeper, node) or sim.sc.intra
            gbps = net.gbps(keeper.info, node.info)
        else:
            link = sim.sc.intra
            gbps = min(link.bandwidth_gbps, node.info.downlink_gbps)
        return link.rtt_ms / 1000 + nbytes * 8 / (gbps * 1e9)

    def schedule_ready(self, node: SimNode) -> None:
        """`node` downloads its stage's state (`transfer_s`), then is ready."""
        sim = self.sim
        node.ready = False
        node.steps_from = sim.committed
        ready_at = sim.engine.now + self.transfer_s(node, node.stage)
        self.sink.emit(ready_at, Kind.JOIN, self._on_ready,
                       (node, node.epoch, sim.committed, len(sim.rollbacks)))

    def move(self, node: SimNode, stage: int) -> None:
        """`node` leaves its stage for `stage` at an iteration boundary (nothing of its own is
        in flight then): it stops taking work, downloads the new stage's state and enters it as
        a joiner would, in a new life for the flow machines."""
        sim = self.sim
        if node.active:
            sim.shipping.census(-1, death=False)
        node.active = False
        node.ready = False
        node.stage = stage
        node.set_compute(sim.sc.compute_s(node.info, stage))
        node.wrr = SmoothRoundRobin(owner=node.id)
        sim.reincarnate(node.id)
        sim.moves += 1
        self.schedule_ready(node)

    def relocate(self, node: SimNode, stage: int) -> None:
        """A move in the middle of an iteration: the machine leaves gracefully (its work of
        the iteration is recovered by the crash rules) and joins `stage` at once."""
        snapshots = getattr(self.sim.recovery, "snapshots", None)
        carried = snapshots.carry(node) if isinstance(snapshots, StageSnapshots) else None
        self.crash(node, graceful=True)
        fresh = self.sim.new_node(replace(node.info, stage=stage))
        fresh.started = node.started  # the same machine, started when it was
        if carried is not None and isinstance(snapshots, StageSnapshots):
            # The same machine: the stage snapshots it keeps stay in its memory.
            snapshots.carried(fresh, carried)
        self.sim.moves += 1
        self.schedule_ready(fresh)

    @returns_events
    def _on_ready(self, payload: tuple[SimNode, int, int, int]) -> None:
        node, epoch, held, rollbacks = payload
        sim = self.sim
        if not node.alive or node.epoch != epoch:
            return
        if held != sim.committed and sim.active_nodes(node.stage):
            # The stage stepped during the download: the steps it missed from a replica that
            # keeps them all (gwtf.job.catchup), else the new state.
            donors = [p for p in self._replicas(node, node.stage) if p.steps_from <= held]
            if (donors and rollbacks == len(sim.rollbacks)
                    and catches_up(held, sim.committed, sim.sc.catch_up_steps)):
                stage = node.stage
                nbytes = ((sim.committed - held) * sim.sc.params_per_stage[stage]
                          * sim.sc.grad_bytes_per_param)
                at = sim.engine.now + self.transfer_s(node, stage, nbytes, donors)
                sim.catch_ups += 1
                self.sink.emit(at, Kind.JOIN, self._on_ready,
                               (node, epoch, sim.committed, rollbacks))
            else:
                sim.refetches += 1
                self.schedule_ready(node)
            return
        node.ready = True
        if sim.policy.activate_now(node):
            self.activate(node, start=True)
        else:
            sim.pending_activation.append(node)

    def activate(self, node: SimNode, *, start: bool) -> None:
        """A ready node enters the job (`start`: a data holder injects at once)."""
        if node.active or not node.alive:
            return
        sim = self.sim
        node.active = True
        node.ledger = Ledger(node.id, node.stage,
                             sim.iteration.index if sim.iteration is not None else 0)
        node.iter_compute = 0.0
        node.work.clear()
        sim.shipping.census(1, death=False)
        sim.policy.on_activate(node)
        sim.check_paused()
        sim.recovery.wake(node.stage)
        if node.stage == 0 and start:
            sim.try_inject(node)

    def crash(self, node: SimNode, *, graceful: bool) -> None:
        sim = self.sim
        sim.crashes += 0 if graceful else 1
        node.alive = False
        node.left = graceful
        if node.busy and node.job is not None:
            partial = sim.engine.now - node.job_start
            sim.total_compute += partial
            sim.wasted += partial
        node.busy = False
        node.job = None
        it = sim.iteration
        if node.active and it is not None:
            sim.wasted += node.iter_compute + sim.shipping.crashed(node)
        node.iter_compute = 0.0
        node.bwd_q.clear()
        node.fwd_q.clear()
        node.slot_mbs.clear()
        sim.pending_activation = [n for n in sim.pending_activation if n is not node]
        delay = 0.0 if graceful else sim.policy.detection_delay()
        self.sink.emit(sim.engine.now + delay, Kind.DETECT, self._on_detect, node)

    @returns_events
    def _on_detect(self, node: SimNode) -> None:
        sim = self.sim
        node.detected = True
        was_active = node.active
        node.active = False
        sim.policy.on_death(node, was_active)
        if was_active:
            sim.shipping.census(-1, death=True)
            sim.check_paused()
            sim.recovery.on_death(node)
