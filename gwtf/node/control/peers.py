"""How a node reaches its peers: one channel per peer, the emulated WAN its calls go through, and
the ban list of its flow sends (docs/design.md 3.1, 3.6, 3.10).

The channels (gwtf.node.rpc.transport) exist once the node knows its own id: every call carries it,
for the callee's emulated WAN and rate limit. A failed or refused `Exchange` to a peer
bans further calls to that peer for a delay that doubles from `retry_min_s` up to `retry_max_s`
(the node's retry policy, gwtf.node.rpc.retry.BanList), and an acknowledged one lifts the ban: a
dead or overloaded peer is not hammered, and a peer
that comes back gets its queued flow messages within `retry_max_s`.

With `--wan-schedule FILE` the emulated WAN's partitions come from FILE (gwtf.node.rpc.wan,
`parse_schedule`), read at start and again whenever it changes (`watch_schedule`, every
`SCHEDULE_POLL_S`): an operator or a test cuts two groups of locations apart at run time by
writing the file. A rewrite that does not parse is logged and the schedule in force is kept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable

from gwtf.flow.topology import LinkSpec
from gwtf.node.config import NodeConfig
from gwtf.node.control.membership import MemberInfo
from gwtf.node.rpc.retry import Backoff, BanList
from gwtf.node.rpc.transport import ChannelPool, Stubs
from gwtf.node.rpc.wan import Partition, ScheduleError, WanEmulator, parse_schedule
from gwtf.node.settings import NodeSettings

__all__ = ["SCHEDULE_POLL_S", "Peers", "read_schedule"]

SCHEDULE_POLL_S = 0.2
"""How often the partition schedule file is checked for a change: a cut starts on every node
of a local swarm within this of its scheduled time, well under a heartbeat."""


def read_schedule(path: str, known: set[str]) -> tuple[Partition, ...]:
    """The partitions of the schedule file at `path`; ScheduleError (one sentence) if it cannot
    be read or used."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ScheduleError(f"cannot read the partition schedule {path}: {err.strerror}") from None
    return parse_schedule(text, known, path)


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
            self.wan = WanEmulator(settings.location, settings.links, clock, wall=time.time,
                                   uplink_gbps=settings.uplink_gbps or math.inf)
            if settings.wan_schedule is not None:
                self.wan.partitions = read_schedule(settings.wan_schedule, self.wan.locations())
        self._pool: ChannelPool | None = None
        self.bans = BanList(Backoff(config.retry_min_s, config.retry_max_s), clock)

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

    def wan_delay(self, member: MemberInfo, nbytes: int, *, bulk: bool = False) -> float:
        """How long the emulated WAN holds `nbytes` to `member` (streams are not intercepted:
        their senders wait this long before the first chunk); `bulk`: a stage snapshot. The data
        plane's tensors (not `bulk`) queue on this node's declared uplink too."""
        if self.wan is None:
            return 0.0
        return self.wan.delay(member.id, member.location, nbytes, bulk=bulk, data=not bulk)

    def link(self, a: MemberInfo, b: MemberInfo) -> LinkSpec | None:
        """The link matrix's link between two members' locations (None: no emulated WAN, or
        a location the matrix does not name): what every node of the swarm reads alike."""
        if self.wan is None or not a.location or not b.location:
            return None
        return self.wan.link(a.location, b.location)

    def linked(self, member: MemberInfo) -> bool:
        """The link matrix has a link to `member`'s location (always, without emulation)."""
        return self.wan is None or self.wan.link_to(member.location) is not None

    async def watch_schedule(self, log: logging.LoggerAdapter[logging.Logger]) -> None:
        """Re-read the partition schedule file whenever it changes (module docstring)."""
        path, wan = self._settings.wan_schedule, self.wan
        if path is None or wan is None:
            return
        seen: tuple[float, int] | None = None
        while True:
            try:
                stat = os.stat(path)
                now = (stat.st_mtime, stat.st_size)
            except OSError:
                now = None
            if now is not None and now != seen:
                seen = now
                try:
                    wan.partitions = read_schedule(path, wan.locations())
                    log.warning("emulated WAN: partition schedule %s read: %s", path,
                                "; ".join(_describe(p) for p in wan.partitions) or "none")
                except ScheduleError as err:
                    log.warning("emulated WAN: %s; the schedule in force is kept", err)
            await asyncio.sleep(SCHEDULE_POLL_S)

    def forget(self, peer: str) -> None:
        """`peer` died or left: its queue in the emulated WAN goes."""
        if self.wan is not None:
            self.wan.forget(peer)

    # ------------------------------------------------------------------ ban list

    def backing_off(self, peer: str, now: float) -> bool:
        """A call to `peer` failed and its ban is not over at `now`."""
        return self.bans.banned(peer, now)

    def back_off(self, peer: str) -> float:
        """A call to `peer` failed: ban the next ones for a while; returns the ban's length."""
        return self.bans.ban(peer)

    def succeeded(self, peer: str) -> None:
        """A call to `peer` was acknowledged: the next failure starts from `retry_min_s`."""
        self.bans.lift(peer)

    def reset(self) -> None:
        """A new incarnation of this node: what failed for the old one says nothing."""
        self.bans.clear()


def _describe(p: Partition) -> str:
    return (f"{','.join(sorted(p.side_a))} | {','.join(sorted(p.side_b))} cut for "
            f"{p.end - p.start:g} s from {p.start:.3f}")
