"""What the job runtime needs from its node (gwtf.node.node.Node implements it), apart from the
runtime so that the job manager and the job coordinator both name it without naming each other."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from gwtf.flow.topology import LinkSpec
from gwtf.node.config import NodeConfig
from gwtf.node.control.membership import MemberInfo
from gwtf.node.faults import Fault
from gwtf.node.rpc.transport import Stubs

__all__ = ["JobsHost"]


class JobsHost(Protocol):
    """What the job manager needs from its node (gwtf.node.node.Node)."""

    node_id: str
    config: NodeConfig
    log: logging.LoggerAdapter[logging.Logger]

    def own_stage(self) -> int: ...

    def num_stages(self) -> int: ...

    def live_members(self) -> list[MemberInfo]:
        """The live members other than this node."""
        ...

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member with this id, this node included."""
        ...

    def known_member(self, node_id: str) -> MemberInfo | None:
        """The latest incarnation of `node_id` this node knows, alive or not."""
        ...

    def stubs(self, member: MemberInfo) -> Stubs: ...

    def refused(self, member: MemberInfo) -> None:
        """A call of the job's to `member` was refused (nothing listens there): evidence for
        the node's failure detector, whichever part of the node made the call."""
        ...

    def hear_verdicts(self, infos: list[MemberInfo]) -> None:
        """Membership verdicts (dead or left) another node acted on: merged as gossip is, so
        this node's membership, flows and jobs hear of them now."""
        ...

    def stubs_at(self, address: str) -> Stubs: ...

    def wan_delay(self, member: MemberInfo, nbytes: int, *, bulk: bool = False) -> float:
        """Seconds the emulated WAN holds `nbytes` to `member` (0 without emulation); `bulk`:
        a stage snapshot, queued apart from the data plane."""
        ...

    def link(self, a: MemberInfo, b: MemberInfo) -> LinkSpec | None:
        """The link matrix's link between two members (None: unknown)."""
        ...

    def activation_bytes(self) -> int:
        """The swarm's activation size, which its flows are computed with."""
        ...

    def routing(self) -> str:
        """How the swarm routes (`SwarmSettings.routing`)."""
        ...

    def compress(self, codecs: tuple[str, ...] | None) -> None:
        """A job's compression plan holds here (one codec per boundary) or no longer (None):
        the routing prices arcs with its bytes (docs/design.md 2.15)."""
        ...

    def move_to(self, stage: int, note: str) -> None:
        """The job coordinator moved this node to `stage` (docs/design.md 2.11) and its worker
        stopped: leave the swarm gracefully and enter it again at `stage`, logging `note`."""
        ...

    def settled(self) -> bool: ...

    def routes(self) -> dict[str, int]: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    @property
    def memory_slots(self) -> int: ...

    @property
    def trains(self) -> bool: ...

    @property
    def emulate_compute_s(self) -> float | None: ...

    def observe_compute(self, kind: str, started: float, ended: float,
                        device_s: float | None = None) -> None:
        """A compute item of the job's stage ran from `started` to `ended` (monotonic clock):
        a sample of the node's pace (`device_s`: an emulated device's time for it)."""
        ...

    def live_pace_s(self) -> float:
        """Seconds per microbatch the node measures now (0: not in a swarm)."""
        ...

    @property
    def fault(self) -> Fault | None:
        """The fault this node is armed with (chaos tests), if any."""
        ...
