"""The asyncio side of the swarm-wide scaling phases (the rule itself is gwtf.node.control.phases).

Every member runs a `PhaseCoordinator`; the one that is the live member with the smallest id in
its own view runs waves: the current command to every live member, their reports, the
detector's decision. It runs a wave when a member nudges it (a member that becomes quiet while
the swarm is scaling, or that wants a rescale), at least every `phase_poll_s` while the swarm is
scaling, and never more often than one wave's own duration while members are busy (a wave costs
a call per member). Once everybody is final and quiet it stops until the next nudge. When the
coordinator dies, the next smallest id takes over from its own state and catches up with the
members' reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from gwtf.node.config import NodeConfig
from gwtf.node.control.membership import MemberInfo
from gwtf.node.control.phases import Command, PhaseDetector, PhaseReportData

__all__ = ["CoordinatorHost", "PhaseCoordinator"]

_LOGGED = ("phase over", "rescale asked", "topology changed while scaling")


class CoordinatorHost(Protocol):
    @property
    def node_id(self) -> str: ...

    def live_members(self) -> list[MemberInfo]:
        """The live members other than this node."""
        ...

    def own_stage(self) -> int: ...

    def apply_command(self, command: Command) -> PhaseReportData:
        """Apply a command to this node and report (what a member does in a wave)."""
        ...

    def call_phase(self, member: MemberInfo, command: Command) -> Awaitable[PhaseReportData | None]:
        """The same at `member`; None if it did not answer with a report of that incarnation."""
        ...

    def nudge_coordinator(self, coordinator: MemberInfo) -> Awaitable[None]:
        """Tell `coordinator` that this node became quiet or wants a rescale."""
        ...

    def wants_rescale(self) -> bool: ...

    def phase_state(self) -> tuple[int, int]:
        """This node's (round, phases ended)."""
        ...


class PhaseCoordinator:
    def __init__(
        self,
        host: CoordinatorHost,
        *,
        num_stages: int,
        coordinated: bool,
        config: NodeConfig,
        clock: Callable[[], float],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self._host = host
        self._num_stages = num_stages
        self._coordinated = coordinated
        self._config = config
        self._clock = clock
        self.log = log
        self._wave_wanted = asyncio.Event()
        self._nudge_wanted = asyncio.Event()

    def coordinator(self) -> str:
        """The live member with the smallest id, as this node sees the swarm."""
        return min([self._host.node_id, *(m.id for m in self._host.live_members())])

    def nudge(self) -> None:
        """This node became quiet while the swarm scales, or wants a rescale."""
        self._nudge_wanted.set()

    def nudged(self) -> None:
        """A member nudged this node (as the coordinator)."""
        self._wave_wanted.set()

    async def run(self) -> None:
        await asyncio.gather(self._nudges(), self._waves())

    async def _nudges(self) -> None:
        cfg = self._config
        while True:
            await self._nudge_wanted.wait()
            self._nudge_wanted.clear()
            coordinator = self.coordinator()
            if coordinator == self._host.node_id:
                self._wave_wanted.set()
            else:
                member = next((m for m in self._host.live_members() if m.id == coordinator), None)
                if member is not None:
                    await self._host.nudge_coordinator(member)
            await asyncio.sleep(cfg.phase_gap_s)
            if self._host.wants_rescale():
                # Asked and not applied yet: ask again later (a nudge may be lost).
                await asyncio.sleep(cfg.phase_poll_s)
                if self._host.wants_rescale():
                    self._nudge_wanted.set()

    async def _waves(self) -> None:
        cfg = self._config
        detector: PhaseDetector | None = None
        timer = True
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wave_wanted.wait(), cfg.phase_poll_s if timer else None
                )
            self._wave_wanted.clear()
            if self.coordinator() != self._host.node_id:
                detector = None
                timer = True
                continue
            if detector is None:
                detector = PhaseDetector(self._num_stages, coordinated=self._coordinated)
                detector.adopt(*self._host.phase_state())
                self.log.info("coordinating the scaling phases")
            while True:
                began = self._clock()
                wave = await self._wave(detector.command)
                elapsed = self._clock() - began
                if wave is None:
                    self.log.debug("wave incomplete: a member did not answer")
                    detector.forget()
                    timer = True
                    break
                reports, stages = wave
                decision = detector.observe(reports, stages)
                if self.log.isEnabledFor(logging.DEBUG):
                    busy = sorted(i for i, r in reports.items() if not r.quiet)
                    self.log.debug("wave %d: %s; busy: %s", detector.waves, decision.reason,
                                   ", ".join(busy) or "none")  # fmt: skip
                if decision.reason in _LOGGED:
                    command = decision.command
                    self.log.info(
                        "%s: round %d, phase %d", decision.reason, command.round, command.tightens
                    )
                timer = not decision.done
                if not decision.again:
                    if not decision.done:
                        # Busy members will nudge again; a wave costs a call per member, so
                        # the next one waits at least as long as this one took.
                        await asyncio.sleep(max(cfg.phase_gap_s, elapsed))
                    break
                await asyncio.sleep(cfg.phase_gap_s)

    async def _wave(
        self, command: Command
    ) -> tuple[dict[str, PhaseReportData], dict[str, int]] | None:
        """One wave: the command to every live member (this node first), their reports; None
        if a member did not answer (the wave is no evidence then)."""
        host = self._host
        members = host.live_members()
        stages = {m.id: m.stage for m in members}
        stages[host.node_id] = host.own_stage()
        reports = {host.node_id: host.apply_command(command)}
        results = await asyncio.gather(*(host.call_phase(m, command) for m in members))
        for member, report in zip(members, results, strict=True):
            if report is None:
                return None
            reports[member.id] = report
        return reports, stages
