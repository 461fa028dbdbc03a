"""What the parts of a node share (docs/design.md 3.1): who it is, its swarm, its member table,
its flow driver, whether it serves, its counters and its tasks.

The parts (gwtf.node.control's entry, membercontrol, flowcontrol and routing, and
gwtf.node.status) each hold this one object rather than copies of what is in it: the node learns
its id (and so its log) only once it listens, and the flow driver is replaced when the node comes
back as a new incarnation, and every part must see the new one at once. Everything here is read
and written on the node's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gwtf.flow.pace import Pace
from gwtf.node.config import NodeConfig, SwarmSettings
from gwtf.node.control.driver import FlowDriver
from gwtf.node.control.membership import MemberInfo, Membership
from gwtf.node.errors import NotReady
from gwtf.node.observe import NodeLog
from gwtf.node.settings import NodeSettings

__all__ = ["LOG", "NodeState", "Stats"]

LOG = logging.getLogger("gwtf.node")


@dataclass
class Stats:
    """The node's own cumulative counters (its status and metrics)."""

    gossip_bytes: int = 0
    gossip_calls: int = 0
    deaths: int = 0
    leaves: int = 0
    joins: int = 0
    started: float = field(default_factory=time.monotonic)


class NodeState:
    """One node's shared state. `swarm`, `members` and `driver` exist once it entered a swarm
    (reading one before is a bug: an AssertionError)."""

    def __init__(
        self, settings: NodeSettings, config: NodeConfig, clock: Callable[[], float]
    ) -> None:
        self.settings = settings
        self.config = config
        self.clock = clock
        self.node_id = settings.node_id or ""
        """Until the node listens, the id it was given, if any (default: its address)."""
        self.address = ""
        self.log: logging.LoggerAdapter[logging.Logger] = NodeLog(
            LOG, {"node": settings.node_id or "-", "stage": settings.stage}
        )
        self.rng: np.random.Generator | None = None
        """Set once the id is known (the gossip partner order, probe nonces)."""
        self.ready = False
        self.stopping = False
        self.stats = Stats()
        self._swarm: SwarmSettings | None = None
        self._members: Membership | None = None
        self._driver: FlowDriver | None = None
        self.pace: Pace | None = None
        """This node's pace (gwtf.flow.pace), from its entry into a swarm: the compute time it
        entered with (`declared_s`, what emulated compute pads to) and what it measures."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def identify(self, address: str) -> None:
        """The node listens: its address, its id (the address unless one was given), the log
        that names it, and its random generator (seeded with `seed`, or from the id, so that
        two nodes do not pick the same gossip partners in the same order)."""
        self.address = address
        if not self.node_id:
            self.node_id = address
        self.log = NodeLog(LOG, {"node": self.node_id, "stage": self.settings.stage})
        seed = self.settings.seed
        if seed is None:
            seed = zlib.crc32(self.node_id.encode())
        self.rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ the swarm

    @property
    def in_swarm(self) -> bool:
        return self._members is not None

    @property
    def swarm(self) -> SwarmSettings:
        assert self._swarm is not None, "not in a swarm yet"
        return self._swarm

    @swarm.setter
    def swarm(self, swarm: SwarmSettings) -> None:
        self._swarm = swarm

    @property
    def members(self) -> Membership:
        assert self._members is not None, "not in a swarm yet"
        return self._members

    @members.setter
    def members(self, members: Membership) -> None:
        self._members = members

    @property
    def driver(self) -> FlowDriver:
        assert self._driver is not None, "not in a swarm yet"
        return self._driver

    @driver.setter
    def driver(self, driver: FlowDriver) -> None:
        self._driver = driver

    def member(self, node_id: str) -> MemberInfo | None:
        """The live member `node_id` (this node included), None if not alive here."""
        if node_id == self.node_id:
            return self.members.me
        found = self.members.get(node_id)
        return found if found is not None and found.alive else None

    # ------------------------------------------------------------------ serving

    @property
    def serving(self) -> bool:
        """In a swarm and not leaving: peers' calls are served."""
        return self.ready and not self.stopping

    def require_ready(self) -> None:
        """Refuses a peer's call (UNAVAILABLE) until the node is in a swarm, and once it leaves."""
        if not self.serving:
            raise NotReady(f"node {self.node_id} is not serving")

    # ------------------------------------------------------------------ tasks

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task of this node's: cancelled when it stops, its failure logged."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            self.log.error("task %s failed: %r", task.get_name(), err, exc_info=err)

    async def cancel_tasks(self) -> None:
        """Cancel every task but the caller's own, and wait for them to end."""
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
