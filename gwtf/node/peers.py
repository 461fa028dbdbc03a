"""How a node reaches its peers: one channel per peer, the emulated WAN its calls go through, and
the one retry policy of its flow sends (docs/design.md 3.1, 3.6).

The channels (gwtf.node.transport) exist once the node knows its own id: every call carries it,
for the callee's emulated WAN and rate limit. A failed or refused `Exchange` to a peer
holds further calls to that peer for a delay that doubles from `retry_min_s` up to `retry_max_s`,
and an acknowledged one ends the hold: a dead or overloaded peer is not hammered, and a peer
that comes back gets its queued flow messages within `retry_max_s`.
"""

from __future__ import annotations

from collections.abc import Callable

from gwtf.node.config import NodeConfig
from gwtf.node.membership import MemberInfo
from gwtf.node.settings import NodeSettings
from gwtf.node.transport import ChannelPool, Stubs
from gwtf.node.wan import WanEmulator

__all__ = ["Peers"]


class Peers:
    """The channel pool, the emulated WAN (None: none) and the per-peer backoff of one node."""

    def __init__(
        self, settings: NodeSettings, config: NodeConfig, clock: Callable[[], float]
    ) -> None:
        self._settings = settings
        self._config = config
        self._clock = clock
        self.wan: WanEmulator | None = None
        if settings.links is not None and settings.location:
            self.wan = WanEmulator(settings.location, settings.links, clock)
        self._pool: ChannelPool | None = None
        self._backoff: dict[str, tuple[float, float]] = {}  # peer -> (until, last delay)

    def open(self, node_id: str) -> None:
        """The node knows its id: calls to peers may start."""
        s = self._settings
        self._pool = ChannelPool(node_id, s.location, self.wan, s.credentials)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close_all()

    # ------------------------------------------------------------------ channels

    def stubs(self, member: MemberInfo) -> Stubs:
        assert self._pool is not None
        return self._pool.stubs(member.address, member.id, member.location)

    def stubs_at(self, address: str) -> Stubs:
        """A bootstrap node's, known only by its address."""
        assert self._pool is not None
        return self._pool.stubs(address)

    # ------------------------------------------------------------------ the emulated WAN

    def wan_delay(self, member: MemberInfo, nbytes: int) -> float:
        """How long the emulated WAN holds `nbytes` to `member` (streams are not intercepted:
        their senders wait this long before the first chunk)."""
        if self.wan is None:
            return 0.0
        return self.wan.delay(member.id, member.location, nbytes)

    def linked(self, member: MemberInfo) -> bool:
        """The link matrix has a link to `member`'s location (always, without emulation)."""
        return self.wan is None or self.wan.link_to(member.location) is not None

    def forget(self, peer: str) -> None:
        """`peer` died or left: its queue in the emulated WAN goes."""
        if self.wan is not None:
            self.wan.forget(peer)

    # ------------------------------------------------------------------ retry policy

    def backing_off(self, peer: str, now: float) -> bool:
        """A call to `peer` failed and its delay is not over at `now`."""
        backoff = self._backoff.get(peer)
        return backoff is not None and backoff[0] > now

    def back_off(self, peer: str) -> float:
        """A call to `peer` failed: hold the next one; returns the delay."""
        cfg = self._config
        _, delay = self._backoff.get(peer, (0.0, cfg.retry_min_s / 2))
        delay = min(2 * delay, cfg.retry_max_s)
        self._backoff[peer] = (self._clock() + delay, delay)
        return delay

    def succeeded(self, peer: str) -> None:
        """A call to `peer` was acknowledged: the next failure starts from `retry_min_s`."""
        self._backoff.pop(peer, None)

    def reset(self) -> None:
        """A new incarnation of this node: what failed for the old one says nothing."""
        self._backoff.clear()
