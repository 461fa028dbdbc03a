"""The links a node owns: one task per head, measuring the link and keeping its arc up to date.

The tail of an arc owns its parameters (gwtf.node.control.links): it measures the link before the
arc exists (a few latency echoes, the first discarded because it pays for the connection, then
`initial_transfers` bandwidth probe pairs), creates the arc, and keeps probing: an echo every
`probe_s`, a bandwidth pair at 2, 4, 8... probe periods and then every `bandwidth_probe_s`. It
gives the arc new parameters only when they have moved beyond the hysteresis for
`change_persistence_s`, and only once the swarm is not scaling (a change in the middle of the
scaling would restart it). A live head that no echo reaches for a failure timeout is reported
unreachable (a failed link: local routing blocks the arc), and reachable again at the next echo
that gets through.

While the swarm scales, its own flow messages load every machine: a bandwidth probe pair then
measures that load (on a shared 2-core machine, loopback "bandwidth" read 0.27 to 2 Gbit/s), and
the next quiet spell reads the link again. Counted, such samples made every scaling re-measure
arcs, and each re-measured arc started another scaling: a cascade of rescales after one crash.
So a bandwidth pair waits for a settled swarm, and its sample counts only if the swarm was still
settled when it returned; and a change must persist over `change_persistence_s` of settled swarm
(a scaling restarts the count). RTT samples always count: their minimum is the estimate, and
load only ever adds to a sample.

The prober knows when and what to measure; its host (gwtf.node.control.flowcontrol.FlowControl)
knows how to call a peer and what an arc is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from gwtf.node.config import NodeConfig
from gwtf.node.control.links import ArcParamsSpec, LinkEstimate, changed
from gwtf.node.control.membership import MemberInfo
from gwtf.node.rpc.retry import Backoff

__all__ = ["LinkProber", "ProberHost"]


class ProberHost(Protocol):
    def echo(self, member: MemberInfo, payload: bytes = b"") -> Awaitable[float | None]:
        """One probe's round trip in seconds (None if the call failed)."""
        ...

    def is_alive(self, member: MemberInfo) -> bool:
        """This incarnation of `member` is still a live member."""
        ...

    def announced(self, peer: str) -> ArcParamsSpec | None:
        """The parameters of the arc to `peer` as last announced (None: no arc)."""
        ...

    def params(self, member: MemberInfo, estimate: LinkEstimate) -> ArcParamsSpec:
        """The arc parameters these estimates give."""
        ...

    def create_arc(self, member: MemberInfo, estimate: LinkEstimate, reason: str) -> None:
        """Create the arc to `member`, or give it new parameters (a new generation)."""
        ...

    def settled(self) -> bool:
        """The swarm is not in the middle of a scaling."""
        ...

    def reachable(self, member: MemberInfo, ok: bool) -> None:
        """`member` lives but every probe to it failed for a failure timeout (`ok` False), or
        a probe got through again after that (`ok` True)."""
        ...


Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class LinkProber:
    """One measuring task per head this node owns an arc to."""

    def __init__(
        self, host: ProberHost, config: NodeConfig, clock: Callable[[], float], spawn: Spawn
    ) -> None:
        self._host = host
        self._config = config
        self._clock = clock
        self._spawn = spawn
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self.estimates: dict[str, LinkEstimate] = {}
        self.measuring: set[str] = set()
        """Heads whose first measurement is under way (this node is not quiet meanwhile)."""
        self._failing_since: dict[str, float] = {}
        self.unreachable: set[str] = set()
        """Live heads every probe has failed to reach for a failure timeout."""

    def start(self, member: MemberInfo) -> None:
        self.stop(member.id)
        self.measuring.add(member.id)
        self._tasks[member.id] = self._spawn(self._run(member), f"link-{member.id}")

    def stop(self, peer: str) -> None:
        task = self._tasks.pop(peer, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self.measuring.discard(peer)
        self.estimates.pop(peer, None)
        self._failing_since.pop(peer, None)
        self.unreachable.discard(peer)

    def _outcome(self, member: MemberInfo, ok: bool) -> None:
        """One probe got through or failed. A refused one is the failure detector's business
        (the member is dead); one that fails while the member lives, for as long as the failure
        detector would wait, is a failed link."""
        if ok:
            self._failing_since.pop(member.id, None)
            if member.id in self.unreachable:
                self.unreachable.discard(member.id)
                self._host.reachable(member, True)
            return
        now = self._clock()
        since = self._failing_since.setdefault(member.id, now)
        if (
            now - since >= self._config.failure_timeout_s
            and member.id not in self.unreachable
            and self._host.is_alive(member)
        ):
            self.unreachable.add(member.id)
            self._host.reachable(member, False)

    def probing(self) -> set[str]:
        """Heads with a measuring task."""
        return set(self._tasks)

    def stop_all(self) -> None:
        for peer in list(self._tasks):
            self.stop(peer)

    async def _run(self, member: MemberInfo) -> None:
        try:
            if await self._first_measurement(member):
                await self._keep_measuring(member)
        finally:
            if self._tasks.get(member.id) is asyncio.current_task():
                del self._tasks[member.id]
                self.measuring.discard(member.id)

    async def _transfer(
        self, member: MemberInfo, estimate: LinkEstimate, *, settled_only: bool = False
    ) -> bool:
        """A bandwidth probe pair (an empty echo, then the payload); True if it gave a sample.
        `settled_only`: the sample is dropped unless the swarm stayed settled throughout."""
        empty = await self._host.echo(member)
        if empty is None:
            return False
        payload = bytes(self._config.probe_bytes)
        full = await self._host.echo(member, payload)
        if full is None:
            return False
        estimate.add_rtt(empty)
        if settled_only and not self._host.settled():
            return False  # the swarm started scaling meanwhile: the pair measured its load
        return estimate.add_transfer(len(payload), full, empty)

    async def _first_measurement(self, member: MemberInfo) -> bool:
        cfg = self._config
        estimate = LinkEstimate(cfg.rtt_window, cfg.bandwidth_window)
        self.estimates[member.id] = estimate
        backoff = Backoff(cfg.retry_min_s, cfg.retry_max_s)
        failures = 0
        echoes = 0
        while estimate.samples[1] < cfg.initial_transfers:
            if not self._host.is_alive(member):
                return False
            if echoes < cfg.initial_echoes:
                rtt = await self._host.echo(member)
                ok = rtt is not None
                self._outcome(member, ok)
                if rtt is not None:
                    echoes += 1
                    if echoes > 1:  # the first one pays for the connection
                        estimate.add_rtt(rtt)
            else:
                ok = await self._transfer(member, estimate)
            if not ok:
                await asyncio.sleep(backoff.delay(failures))
                failures += 1
        if not self._host.is_alive(member):
            return False
        self.measuring.discard(member.id)
        self._host.create_arc(member, estimate, "measured")
        return True

    async def _keep_measuring(self, member: MemberInfo) -> None:
        cfg = self._config
        estimate = self.estimates[member.id]
        gap = 2 * cfg.probe_s
        next_transfer = self._clock() + min(gap, cfg.bandwidth_probe_s)
        changed_since: float | None = None
        while True:
            await asyncio.sleep(cfg.probe_s)
            if not self._host.is_alive(member):
                return
            rtt = await self._host.echo(member)
            self._outcome(member, rtt is not None)
            if rtt is not None:
                estimate.add_rtt(rtt)
            if self._clock() >= next_transfer and self._host.settled():
                gap = min(2 * gap, cfg.bandwidth_probe_s)
                next_transfer = self._clock() + gap
                await self._transfer(member, estimate, settled_only=True)
            announced = self._host.announced(member.id)
            if announced is None or not self._host.is_alive(member):
                continue
            if not self._host.settled():
                changed_since = None  # persistence counts over a settled swarm only
                continue
            new = self._host.params(member, estimate)
            if not changed(
                announced, new, cost_rel=cfg.cost_hysteresis, cap_rel=cfg.cap_hysteresis
            ):
                changed_since = None
            elif changed_since is None:
                changed_since = self._clock()
            elif self._clock() - changed_since >= cfg.change_persistence_s:
                changed_since = None
                self._host.create_arc(member, estimate, "re-measured")
