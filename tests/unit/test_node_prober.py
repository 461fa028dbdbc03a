"""The link prober: a re-measured arc needs a change that persists over a settled swarm.

A fake host answers probes from a link model on a virtual clock (each probe moves it on by half
a second) and says whether the swarm is scaling; while it scales, the machine is loaded and a
bandwidth probe reads a tenth of the link, as a loopback probe did on a busy shared machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gwtf.node.config import NodeConfig
from gwtf.node.control.links import ArcParamsSpec, LinkEstimate, arc_params
from gwtf.node.control.membership import MemberInfo
from gwtf.node.control.prober import LinkProber

HEAD = MemberInfo("s1n0", "127.0.0.1:1", 1, "", 0.1, 10.0, epoch=1)
CONFIG = NodeConfig(probe_s=1e-4, bandwidth_probe_s=2.0, change_persistence_s=20.0)
TIMEOUT_S = 20.0  # real seconds: a bound on every wait, never reached when the test passes


class FakeHost:
    def __init__(self) -> None:
        self.now = 0.0
        self.scaling = False
        self.bandwidth_gbps = 1.0
        self.created: list[tuple[float, str, ArcParamsSpec]] = []
        self.cut = False
        """The link fails: every probe times out, while the head stays a live member."""
        self.reach: list[tuple[float, bool]] = []

    def clock(self) -> float:
        return self.now

    async def echo(self, member: MemberInfo, payload: bytes = b"") -> float | None:
        self.now += 0.5
        await asyncio.sleep(0)
        if self.cut:
            return None
        bandwidth = self.bandwidth_gbps / 10 if self.scaling else self.bandwidth_gbps
        return 0.001 + len(payload) * 8 / (bandwidth * 1e9)

    def is_alive(self, member: MemberInfo) -> bool:
        return True

    def announced(self, peer: str) -> ArcParamsSpec | None:
        return self.created[-1][2] if self.created else None

    def params(self, member: MemberInfo, estimate: LinkEstimate) -> ArcParamsSpec:
        rtt_ms, bandwidth = estimate.rtt_ms, estimate.bandwidth_gbps
        assert rtt_ms is not None and bandwidth is not None
        return arc_params(0.1, member.compute_s, rtt_ms, bandwidth, 8 * 2**20)

    def create_arc(self, member: MemberInfo, estimate: LinkEstimate, reason: str) -> None:
        self.created.append((self.now, reason, self.params(member, estimate)))

    def settled(self) -> bool:
        return not self.scaling

    def reachable(self, member: MemberInfo, ok: bool) -> None:
        self.reach.append((self.now, ok))


async def until(host: FakeHost, done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0)


def run(scenario: Callable[[FakeHost], Coroutine[Any, Any, None]]) -> FakeHost:
    async def main() -> FakeHost:
        host = FakeHost()
        prober = LinkProber(host, CONFIG, host.clock, lambda c, n: asyncio.create_task(c, name=n))
        prober.start(HEAD)
        await until(host, lambda: bool(host.created))
        try:
            await scenario(host)
        finally:
            prober.stop_all()
        return host

    return asyncio.run(main())


def test_samples_taken_while_the_swarm_scales_do_not_count() -> None:
    async def scenario(host: FakeHost) -> None:
        host.scaling = True
        start = host.now
        await until(host, lambda: host.now > start + 100)  # 20 bandwidth periods, loaded
        host.scaling = False
        start = host.now
        await until(host, lambda: host.now > start + 100)  # and as long again, settled

    host = run(scenario)
    assert [reason for _, reason, _ in host.created] == ["measured"]


def test_a_change_that_persists_over_a_settled_swarm_is_applied() -> None:
    async def scenario(host: FakeHost) -> None:
        host.bandwidth_gbps = 0.2  # the link got five times slower, for good
        await until(host, lambda: len(host.created) > 1)

    host = run(scenario)
    (_, _, first), (_, reason, second) = host.created
    assert reason == "re-measured"
    assert second.bandwidth_gbps < 0.3 and second.cap < first.cap / 3


def test_a_scaling_restarts_the_persistence_of_a_change() -> None:
    ended: list[float] = []

    async def scenario(host: FakeHost) -> None:
        host.bandwidth_gbps = 0.2
        start = host.now
        await until(host, lambda: host.now > start + 15)  # not yet persistent
        host.scaling = True
        start = host.now
        await until(host, lambda: host.now > start + 5)
        host.scaling = False
        ended.append(host.now)
        await until(host, lambda: len(host.created) > 1)

    host = run(scenario)
    assert host.created[1][0] >= ended[0] + CONFIG.change_persistence_s


def test_a_live_head_no_probe_reaches_for_a_failure_timeout_is_unreachable_until_one_does() -> None:
    async def scenario(host: FakeHost) -> None:
        host.cut = True
        cut_at = host.now
        await until(host, lambda: bool(host.reach))
        assert host.reach == [(host.reach[0][0], False)]
        # Not before the failure detector itself would have given up on the member.
        assert host.reach[0][0] - cut_at >= CONFIG.failure_timeout_s
        host.cut = False
        await until(host, lambda: len(host.reach) == 2)
        assert host.reach[1][1] is True

    run(scenario)
