"""The emulated WAN (DESIGN.md 3): how long a message from this node to a peer takes.

There is no kernel traffic shaping where gwtf is tested, so the transport delays every outgoing
message (requests it sends and replies it returns) by what the link between the two locations
would take: `one-way latency + size / bandwidth`, with a first-in-first-out queue per peer, so
that a message sent while a large one is still being serialised waits for it, as on a real link.
One-way latency is RTT / 2. Two nodes at the same location get `intra` (1 ms RTT, 10 Gbit/s,
as shared/data/README.md says). Probes measure these links like real ones.

Pure: time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec

__all__ = ["WanEmulator"]


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
        return departed - now + link.rtt_ms / 2000

    def forget(self, peer: str) -> None:
        self._free_at.pop(peer, None)
