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

Pure: time comes from the injected clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec

__all__ = ["CALIBRATION_WINDOW", "WanEmulator"]

CALIBRATION_WINDOW = 32
"""Un-delayed probes kept for the stack's RTT (their minimum)."""
CALIBRATION_MIN = 8
"""Un-delayed probes needed before the stack's RTT is subtracted."""


class WanEmulator:
    """Delays for messages leaving `location` (a node's own end of every link)."""

    def __init__(
        self,
        location: str,
        links: Mapping[frozenset[str], LinkSpec],
        clock: Callable[[], float],
        *,
        intra: LinkSpec = DEFAULT_INTRA,
    ) -> None:
        self.location = location
        self._links = dict(links)
        self._clock = clock
        self._intra = intra
        # Per peer: when the outgoing link to it has finished serialising what was queued.
        self._free_at: dict[str, float] = {}
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

    def delay(self, peer: str, location: str, nbytes: int) -> float:
        """Seconds to hold a message of `nbytes` to `peer` at `location`, from now; 0 when the
        peer's location is unknown (a client with no location, such as `gwtf status`)."""
        link = self.link_to(location) if location else None
        if link is None:
            return 0.0
        now = self._clock()
        serialise = nbytes * 8 / (link.bandwidth_gbps * 1e9)
        departed = max(now, self._free_at.get(peer, now)) + serialise
        self._free_at[peer] = departed
        one_way = max(0.0, link.rtt_ms / 2000 - self.stack_rtt_s / 2)
        return departed - now + one_way

    def forget(self, peer: str) -> None:
        self._free_at.pop(peer, None)
