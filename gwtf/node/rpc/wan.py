"""The emulated WAN (docs/design.md 3): how long a message from this node to a peer takes.

There is no kernel traffic shaping where gwtf is tested, so the transport delays every outgoing
message (requests it sends and replies it returns) by what the link between the two locations
would take: `one-way latency + size / bandwidth`, with a first-in-first-out queue per peer, so
that a message sent while a large one is still being serialised waits for it, as on a real link.
One-way latency is RTT / 2. Two nodes at the same location get `intra` (1 ms RTT, 10 Gbit/s,
as shared/data/README.md says). Probes measure these links like real ones.

The local transport takes time too (a loopback gRPC round trip between two Python processes is
about 1.5 ms on a loaded 2-core machine, as much as a sixth of the shortest geo10 link), and a
real link's measured RTT already includes its hosts' stacks. So the emulator subtracts the local
stack's own round trip, calibrated as the least RTT of un-delayed probes (`calibrate`), from
each link's RTT: end to end, a probe then sees the matrix, not the matrix plus the machine.

Partitions (docs/design.md 3.6). A `Partition` cuts every link between two groups of locations
for a time: while it holds, a message between the groups is dropped, both ways, not delayed
(`cut`): the caller sees its call time out, as over a WAN path that loses everything, never a
refusal (which would read as a dead process). Schedules are read from a TOML file
(`parse_schedule`, layout in its docstring) at wall-clock times, so that every process of a
local swarm cuts at the same moment; the emulator converts them to its own clock.

Pure: time comes from the injected clock.
"""

from __future__ import annotations

import math
import tomllib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec

__all__ = [
    "CALIBRATION_WINDOW",
    "Partition",
    "ScheduleError",
    "WanEmulator",
    "parse_schedule",
]

CALIBRATION_WINDOW = 32
"""Un-delayed probes kept for the stack's RTT (their minimum)."""
CALIBRATION_MIN = 8
"""Un-delayed probes needed before the stack's RTT is subtracted."""


class ScheduleError(ValueError):
    """A partition schedule that cannot be used (one sentence)."""


@dataclass(frozen=True)
class Partition:
    """Every link between `side_a` and `side_b` (two disjoint sets of locations) is cut from
    `start` until `end` (seconds on the wall clock, `time.time()`)."""

    side_a: frozenset[str]
    side_b: frozenset[str]
    start: float
    end: float

    def cuts(self, here: str, there: str, wall: float) -> bool:
        """Does this partition drop a message between locations `here` and `there` at `wall`?"""
        if not self.start <= wall < self.end:
            return False
        return (here in self.side_a and there in self.side_b) or (
            here in self.side_b and there in self.side_a
        )


def parse_schedule(text: str, known: Iterable[str], source: str = "the schedule") -> tuple[
    Partition, ...
]:
    """The partitions of a schedule file (TOML), checked against the matrix's locations:

        [[partition]]
        groups = [["Oregon", "Virginia"], ["Tokyo", "Seoul"]]  # two disjoint groups of locations
        at = 1764028800.0        # wall-clock start (Unix seconds, as time.time())
        duration_s = 30          # how long every link between the groups is cut

    No `[[partition]]` table: no partition. ScheduleError (one sentence) for anything else."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScheduleError(f"{source} is not valid TOML: {err}") from None
    extra = set(table) - {"partition"}
    if extra:
        raise ScheduleError(f"{source}: unknown key {sorted(extra)[0]!r} (only [[partition]])")
    entries = table.get("partition", [])
    if not isinstance(entries, list):
        raise ScheduleError(f"{source}: partition must be an array of tables ([[partition]])")
    names = set(known)
    out = []
    for n, entry in enumerate(entries, 1):
        where = f"{source}, partition {n}"
        if not isinstance(entry, dict) or set(entry) != {"groups", "at", "duration_s"}:
            raise ScheduleError(f"{where}: needs exactly groups, at and duration_s")
        groups = entry["groups"]
        if (
            not isinstance(groups, list) or len(groups) != 2
            or not all(isinstance(g, list) and g and all(isinstance(x, str) for x in g)
                       for g in groups)
        ):
            raise ScheduleError(f"{where}: groups must be two non-empty lists of locations")
        side_a, side_b = frozenset(groups[0]), frozenset(groups[1])
        if side_a & side_b:
            raise ScheduleError(
                f"{where}: {sorted(side_a & side_b)[0]!r} is in both groups"
            )
        unknown = sorted((side_a | side_b) - names)
        if unknown:
            raise ScheduleError(f"{where}: location {unknown[0]!r} is not in the link matrix")
        at, duration = entry["at"], entry["duration_s"]
        numbers = (at, duration)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
            raise ScheduleError(f"{where}: at and duration_s must be numbers of seconds")
        if not math.isfinite(at) or not math.isfinite(duration) or duration <= 0:
            raise ScheduleError(f"{where}: at must be finite and duration_s above 0")
        out.append(Partition(side_a, side_b, float(at), float(at) + float(duration)))
    return tuple(out)


class WanEmulator:
    """Delays for messages leaving `location` (a node's own end of every link)."""

    def __init__(
        self,
        location: str,
        links: Mapping[frozenset[str], LinkSpec],
        clock: Callable[[], float],
        *,
        intra: LinkSpec = DEFAULT_INTRA,
        wall: Callable[[], float] | None = None,
        uplink_gbps: float = math.inf,
    ) -> None:
        """`clock`: for the links' queues; `wall`: the wall clock partitions are scheduled on
        (None: `clock`); `uplink_gbps`: this node's access uplink (inf: none, the pair links
        alone), shared by the data plane's messages to every peer (`delay(data=True)`)."""
        self.location = location
        self._links = dict(links)
        self._clock = clock
        self._wall = wall or clock
        self.partitions: tuple[Partition, ...] = ()
        self._intra = intra
        # Per peer: when the outgoing link to it has finished serialising what was queued.
        self._free_at: dict[str, float] = {}
        self._bulk_free_at: dict[str, float] = {}
        self.uplink_gbps = uplink_gbps
        self._uplink_free_at = 0.0
        """When the uplink has finished serialising the data plane's messages queued on it."""
        self._stack: deque[float] = deque(maxlen=CALIBRATION_WINDOW)

    def calibrate(self, rtt_s: float) -> None:
        """A round trip through the local stack alone (an un-delayed probe)."""
        self._stack.append(rtt_s)

    @property
    def stack_rtt_s(self) -> float:
        """The local stack's round trip: the least recent un-delayed probe, once there are
        `CALIBRATION_MIN` of them (0 before: a few probes at start-up, when every process of a
        local swarm is busy importing, overstate it, and an overstated stack would make the
        emulated links shorter than the matrix)."""
        return min(self._stack) if len(self._stack) >= CALIBRATION_MIN else 0.0

    def locations(self) -> set[str]:
        """Every location the matrix names."""
        return {name for pair in self._links for name in pair}

    def knows(self, location: str) -> bool:
        return location == self.location or location in self.locations()

    def link_to(self, location: str) -> LinkSpec | None:
        """The link from this node's location to `location`, None if the matrix has none."""
        if location == self.location:
            return self._intra
        return self._links.get(frozenset((self.location, location)))

    def link(self, loc_a: str, loc_b: str) -> LinkSpec | None:
        """The matrix's link between two locations (intra-location when they are the same),
        None if the matrix has none."""
        if loc_a == loc_b:
            return self._intra
        return self._links.get(frozenset((loc_a, loc_b)))

    def delay(self, peer: str, location: str, nbytes: int, *, bulk: bool = False,
              data: bool = False) -> float:
        """Seconds to hold a message of `nbytes` to `peer` at `location`, from now; 0 when the
        peer's location is unknown (a client with no location, such as `gwtf status`).
        `bulk`: a stage snapshot, streamed in the background (docs/design.md 4.6): it queues
        behind the snapshots sent to `peer` before it, not with the data plane's messages.
        `data`: a data-plane message (a tensor), which also queues on this node's uplink behind
        the data plane's messages to every peer, as the simulator's access links do
        (gwtf/sim/network.py); control messages are small and, on a real uplink, share it
        fairly with the streams rather than wait behind them."""
        link = self.link_to(location) if location else None
        if link is None:
            return 0.0
        now = self._clock()
        serialise = nbytes * 8 / (min(link.bandwidth_gbps, self.uplink_gbps) * 1e9)
        queue = self._bulk_free_at if bulk else self._free_at
        start = max(now, queue.get(peer, now))
        shared = data and math.isfinite(self.uplink_gbps)
        if shared:
            start = max(start, self._uplink_free_at)
        departed = start + serialise
        queue[peer] = departed
        if shared:
            self._uplink_free_at = departed
        one_way = max(0.0, link.rtt_ms / 2000 - self.stack_rtt_s / 2)
        return departed - now + one_way

    def cut(self, location: str) -> bool:
        """Is the link to `location` cut now by a partition? (Never for an unknown location: a
        client with no location, such as `gwtf status`, reaches every node.)"""
        if not location or not self.partitions:
            return False
        wall = self._wall()
        return any(p.cuts(self.location, location, wall) for p in self.partitions)

    def forget(self, peer: str) -> None:
        self._free_at.pop(peer, None)
        self._bulk_free_at.pop(peer, None)
