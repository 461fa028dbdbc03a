"""The job's copy off the swarm in the simulation: the checkpoints its client keeps (docs/design.md
4.6), as `gwtf submit --wait --checkpoint-dir DIR --checkpoint-every K` keeps them
(`gwtf.client.AsyncGwtfClient.wait_resuming`):

- at every iteration boundary that is a multiple of K (`[client] checkpoint_every`), but the one
  the job was last resumed at, the client downloads the whole model, weights and optimizer state
  (`params * state_bytes_per_param` per stage), from the first live replica of each stage in
  the order of its snapshot senders (`sender_rank`: the fastest declared uplink, then by id),
  every stage at once. Each replica's state is read when the stage's stream starts, so the
  copy is of that boundary however long it streams. A boundary that falls due while a download
  is still on its way is not queued: once the download ends, the client downloads the state of
  the iteration then in progress instead. A stream whose sender dies on the way is cut off, the
  download is missed, and the client tries again at once (the node: the next replica, whose
  state is of a later iteration, so the whole download again);
- the streams go out in the background, as the swarm's own snapshots do
(gwtf/sim/recovery/snapshots.py):
  in chunks of `SNAPSHOT_CHUNK_BYTES`, each once the sender's uplink, the client's downlink and
  the pair's link carry nothing queued before it, so that the data plane waits behind at most
  one chunk;
- the client sits at `[client] location` (default: the first data holder's) on its own access
  link (`uplink_gbps`, `downlink_gbps`; default none: the matrix's links bound it);
- when a stage loses every replica and no snapshot of the swarm restores it (the node fails the
  job then, `gwtf.job.snapshots.stage_lost`), the client resumes the job from its newest copy,
  of iteration c: it waits until every stage has a live node again (polling once a second, as
  `wait_resuming`, for at most `resume_within_s`), then sends every live node its stage's state
  of c, stage after stage, the nodes of a stage at once (`AsyncGwtfClient.resume`), then submits
  the job again, which every member prepares (`restart_delay_s`, the time the scenario gives a
  restart). The swarm rolls back to c, reported as a rollback; the iterations undone are lost
  progress. Without a copy (K = 0, or none landed yet) the swarm goes back to the job's start
  (`restore_point(rebuilt=True)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gwtf.job.snapshots import SNAPSHOT_CHUNK_BYTES, checkpoint_due, sender_rank
from gwtf.sim.engine import Kind, returns_events
from gwtf.sim.entities import SimNode
from gwtf.sim.scenario import NodeInfo

if TYPE_CHECKING:
    from gwtf.sim.simulator import Simulation

__all__ = ["ClientCopies"]

POLL_S = 1.0
"""How often the client looks for a live node of every stage (`gwtf.client.RESUME_POLL_S`)."""


@dataclass
class _Stream:
    stage: int
    sender: SimNode
    epoch: int
    left: float
    token: int


class ClientCopies:
    """The client's downloads and its resumes of a simulated job."""

    def __init__(self, sim: Simulation, every: int) -> None:
        self.sim = sim
        self.sink = sim.sink
        self.every = every
        sc = sim.sc
        first = min((sc.nodes[i] for i in sc.initial if sc.nodes[i].stage == 0),
                    key=lambda info: info.id, default=None)
        location = sc.client_location or (first.location if first is not None else "")
        self.info = NodeInfo("client", -1, location, "", 0.0, uplink_gbps=sc.client_uplink_gbps,
                             downlink_gbps=sc.client_downlink_gbps)
        self.latest: int | None = None
        """The iteration of the newest copy that fully landed."""
        self.resumed_at = -1
        self.token = 0
        self.downloading: int | None = None
        """The iteration of the download on its way (None: none)."""
        self.again = False
        self.streams: list[_Stream] = []
        self.downloads = 0
        self.missed = 0
        self.bytes = 0.0
        self.resumes = 0
        self.resuming = 0
        """Bumped by each resume: a resume's later steps check it is still the latest."""
        self.pending = False
        """A resume is on its way: a stage wiped meanwhile is restored by it too."""

    # ------------------------------------------------------------------ downloads

    def boundary(self, index: int) -> None:
        """Iteration `index` starts: a copy is due at every multiple of `every`."""
        if checkpoint_due(index, self.every, self.resumed_at) != index:
            return
        if self.downloading is not None:
            self.again = True
            return
        self._download(index)

    def _download(self, index: int) -> None:
        sim = self.sim
        senders = [min((n for n in sim.active_nodes(s) if not n.detected),
                       key=lambda n: sender_rank(n.id, n.info.uplink_gbps), default=None)
                   for s in range(sim.S)]
        if any(s is None for s in senders):
            self.again = True  # a stage has no replica to read: the next boundary
            return
        self.token += 1
        self.downloading = index
        self.again = False
        self.downloads += 1
        sc = sim.sc
        for stage, sender in enumerate(senders):
            assert sender is not None
            stream = _Stream(stage, sender, sender.epoch,
                             sc.params_per_stage[stage] * sc.state_bytes_per_param, self.token)
            self.streams.append(stream)
            self.sink.emit(sim.engine.now, Kind.ARRIVE, self._chunk, stream)

    @returns_events
    def _chunk(self, stream: _Stream) -> None:
        """The stream's next chunk goes once the sender's uplink and the pair's link carry
        nothing queued before it, as the swarm's own snapshots do
        (gwtf/sim/recovery/snapshots.py)."""
        if stream.token != self.token:
            return  # of a download abandoned since
        sender = stream.sender
        if not sender.alive or sender.epoch != stream.epoch:
            self._missed()
            return
        network = self.sim.network
        now = self.sim.engine.now
        free = network.idle_at(sender.info, self.info)
        if free > now:
            self.sink.emit(free, Kind.ARRIVE, self._chunk, stream)
            return
        chunk = min(stream.left, SNAPSHOT_CHUNK_BYTES)
        arrive = network.transfer(now, sender.info, self.info, chunk)
        self.bytes += chunk
        stream.left -= chunk
        if stream.left > 0:
            self.sink.emit(network.idle_at(sender.info, self.info), Kind.ARRIVE, self._chunk,
                           stream)
        else:
            self.sink.emit(arrive, Kind.ARRIVE, self._landed, stream)

    @returns_events
    def _landed(self, stream: _Stream) -> None:
        if stream.token != self.token:
            return
        self.streams.remove(stream)
        if self.streams:
            return
        assert self.downloading is not None
        self.latest = self.downloading
        self.downloading = None
        if self.again:
            self._again()

    def _missed(self) -> None:
        self.missed += 1
        self.token += 1
        self.streams.clear()
        self.downloading = None
        self._again()

    def _again(self) -> None:
        it = self.sim.iteration
        if it is not None and it.index > 0 and it.index != self.resumed_at:
            self._download(it.index)
        else:
            self.again = True

    # ------------------------------------------------------------------ resumes

    def restores(self, current: int) -> int | None:
        """The iteration a resume from the client's copy would go back to from `current`
        (None: it holds none of an iteration the swarm has reached)."""
        latest = self.latest
        return latest if latest is not None and 0 < latest <= current else None

    def resume(self, to: int, stage: int) -> None:
        """`stage` lost every replica and no snapshot restores it: the job fails, and the client
        resumes it from its copy of `to` once every stage has a live node (module doc)."""
        sim = self.sim
        self.token += 1  # a download on its way is of the failed run
        self.streams.clear()
        self.downloading = None
        self.again = False
        self.resumed_at = to
        self.resumes += 1
        self.resuming += 1
        self.pending = True
        sim.paused_until = math.inf  # nothing trains until the resume is done
        sim.rollback(to, stage)
        self.sink.emit(sim.engine.now, Kind.TICK, self._poll,
                       (self.resuming, sim.engine.now + sim.sc.client_resume_within_s))

    @returns_events
    def _poll(self, payload: tuple[int, float]) -> None:
        token, deadline = payload
        if token != self.resuming:
            return
        sim = self.sim
        now = sim.engine.now
        live = [[n for n in sim.nodes.values() if n.alive and not n.detected and n.stage == s]
                for s in range(sim.S)]
        if not all(live):
            if now >= deadline:
                empty = next(s for s, nodes in enumerate(live) if not nodes)
                sim.fail(f"stage {empty} had no live node within "
                         f"{sim.sc.client_resume_within_s:g} s to resume the job from the "
                         f"client's checkpoint of iteration {self.resumed_at}")
                return
            self.sink.emit(now + POLL_S, Kind.TICK, self._poll, payload)
            return
        sc = sim.sc
        at = now
        for stage, nodes in enumerate(live):
            nbytes = sc.params_per_stage[stage] * sc.state_bytes_per_param
            at = max(sim.network.transfer(at, self.info, n.info, nbytes) for n in nodes)
        sim.paused_until = at + sc.restart_delay_s
        self.sink.emit(sim.paused_until, Kind.ITERATION, self._resumed, token)

    @returns_events
    def _resumed(self, token: int) -> None:
        if token != self.resuming:
            return
        self.pending = False
        sim = self.sim
        sim.check_paused()
        for holder in sim.active_nodes(0):
            sim.try_inject(holder)

    def totals(self) -> dict[str, float]:
        return {"client_downloads": self.downloads, "client_missed": self.missed,
                "client_bytes": self.bytes, "client_resumes": self.resumes}
