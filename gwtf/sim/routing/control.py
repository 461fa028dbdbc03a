"""The control plane alone: the flow state machines on simulated WAN delays, to time reconvergence.

The full simulator (`gwtf.sim.simulator`) runs the flow machines among compute, memory and the
data plane; measuring how long the routing takes to settle after one change needs only the
control plane, with the same rules and the same delays:

- every control message takes the one-way delay of the link between its ends' locations
  (`rtt / 2 + size / bandwidth`, the links of the topology, `intra` within a location), times
  `1 + jitter * U(0, 1)` (as `GwtfPolicy`: without jitter the machines run in lockstep);
- a scaling phase ends swarm-wide `phase_end_s` after the moment no message is in flight (the
  time a real swarm takes to learn it: the scenario's default is two of the slowest one-way
  delays, the node's coordinator two waves of calls), unless anything happened meanwhile
  (`gwtf.flow.relax.swarm.PhaseClock`, as `RelaxRouting`);
- when a machine asks for a rescale (`FlowNode.wants_rescale`), every machine rescales at once;
- a crash, a join and a link change touch every machine (`note_change`, as the membership does
  in the node and `GwtfPolicy` in the simulator); a re-measured arc only its two ends (as
  `FlowDriver.own_arc` / `accept_arc`).

`ControlPlane` subclasses the in-process bus, whose swarm edits and rules (`gwtf.flow.relax.swarm`:
`remove`, `join`, `cut`, `link`, `update`, `recreate`, `link_changed`, rescales, phase ends) it
reuses, and replaces its delivery in rounds by delivery at simulated times.
`benchmarks/reconverge.py` times changes with it.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gwtf.flow.relax.bus import BusStats, MessageBus, node_views
from gwtf.flow.relax.decentralized import FlowConfig, FlowMessage, FlowNode
from gwtf.flow.relax.swarm import PhaseClock
from gwtf.flow.topology import LinkSpec, Topology

__all__ = ["ControlPlane", "Settled"]


@dataclass(frozen=True)
class Settled:
    """What one run to quiescence took, from its start (a change, or a cold start)."""

    seconds: float
    """Simulated seconds until the last message was handled and the last phase ended: the
    swarm is final and quiet (what the node's tests call reconverged)."""
    messages: int
    rescales: int
    phases: int


class ControlPlane(MessageBus):
    """The machines of a swarm, their messages delayed by the links between their locations."""

    def __init__(
        self,
        locations: Mapping[str, str],
        links: Mapping[frozenset[str], LinkSpec],
        intra: LinkSpec,
        *,
        seed: int = 0,
        jitter: float = 0.1,
        message_bytes: int = 100,
        phase_end_s: float | None = None,
        in_place: bool = True,
    ) -> None:
        super().__init__(seed)
        self.locations = dict(locations)
        self._links = dict(links)
        self._intra = intra
        self._message_bits = message_bytes * 8
        self.jitter = jitter
        self.in_place = in_place
        """`recreate` and `link_changed` update an arc in place (`FlowNode.update_arc`), as
        `FlowDriver` and `GwtfPolicy` do; False: re-create it empty (`add_peer`), as they did
        before (kept to measure the difference)."""
        self._delays: dict[tuple[str, str], float] = {}
        if phase_end_s is None:
            used = set(self.locations.values())
            worst = max(
                (self._one_way(a, b) for a in used for b in used),
                default=self._one_way("", ""),
            )
            phase_end_s = 2 * worst + 0.001  # as gwtf.sim.scenario's automatic value
        self.phase_end_s = phase_end_s
        self.time = 0.0
        self.phases = 0
        self._heap: list[tuple[float, int, FlowMessage | float]] = []
        self._seq = 0
        self._phase = PhaseClock(phase_end_s, self._timer)
        self._counted = (0, 0, 0)  # messages, rescales, phases at the end of the last run
        self._rng = random.Random(seed)

    @classmethod
    def for_topology(
        cls,
        topology: Topology,
        config: FlowConfig,
        *,
        seed: int = 0,
        jitter: float = 0.1,
        message_bytes: int = 100,
        phase_end_s: float | None = None,
        in_place: bool = True,
    ) -> ControlPlane:
        """A swarm of `topology`'s nodes, cold (call `run_timed` to converge)."""
        plane = cls(
            {n.id: n.location for n in topology.nodes},
            topology.links,
            topology.intra,
            seed=seed,
            jitter=jitter,
            message_bytes=message_bytes,
            phase_end_s=phase_end_s,
            in_place=in_place,
        )
        views = node_views(topology)
        for node_id in sorted(views):
            plane.add(FlowNode(views[node_id], config, plane.clock), start=False)
        for node_id in sorted(views):
            plane.send(plane.nodes[node_id].start())
        return plane

    # ------------------------------------------------------------------ delays

    def _one_way(self, loc_a: str, loc_b: str) -> float:
        link = self._intra if loc_a == loc_b else self._links.get(frozenset((loc_a, loc_b)))
        link = link or self._intra
        return link.rtt_ms / 2000 + self._message_bits / (link.bandwidth_gbps * 1e9)

    def delay(self, sender: str, receiver: str) -> float:
        key = (sender, receiver)
        base = self._delays.get(key)
        if base is None:
            base = self._one_way(self.locations[sender], self.locations[receiver])
            self._delays[key] = base
        return base

    def clock(self) -> float:
        return self.time

    # ------------------------------------------------------------------ the bus, timed

    def send(self, msgs: Iterable[FlowMessage]) -> None:
        rand = self._rng.random
        for msg in msgs:
            if msg.receiver not in self.nodes:
                continue
            at = self.time + self.delay(msg.sender, msg.receiver) * (1 + self.jitter * rand())
            self._seq += 1
            heapq.heappush(self._heap, (at, self._seq, msg))
            self._phase.in_flight += 1
        self._phase.activity += 1

    def note_change(self) -> None:
        super().note_change()
        self._phase.activity += 1

    def place(self, node_id: str, location: str) -> None:
        """Where a joiner is (before `join`)."""
        self.locations[node_id] = location

    def run(self, max_rounds: int = 1_000_000) -> BusStats:
        """As `run_timed`; `rounds` are simulated seconds here, rounded up."""
        settled = self.run_timed()
        return BusStats(settled.messages, math.ceil(settled.seconds))

    def run_timed(self, max_events: int = 50_000_000) -> Settled:
        """Deliver and end phases until every machine is final and nothing is in flight."""
        # Counted from the end of the last run: a change may rescale before it runs.
        start = self.time
        messages0, rescales0, phases0 = self._counted
        self._maybe_end_phase()
        for _ in range(max_events):
            if not self._heap:
                break
            at, _, msg = heapq.heappop(self._heap)
            self.time = max(self.time, at)
            if isinstance(msg, float):
                self._end_phase(msg)
                continue
            self._phase.in_flight -= 1
            self._phase.activity += 1
            node = self.nodes.get(msg.receiver)
            if node is not None:
                self.messages += 1
                self.send(node.on_messages((msg,)))
                self.rescale_if_asked(node)
            self._maybe_end_phase()
        else:
            raise RuntimeError(f"no quiescence after {max_events} events")
        self._counted = (self.messages, self.rescales, self.phases)
        return Settled(
            seconds=self.time - start,
            messages=self.messages - messages0,
            rescales=self.rescales - rescales0,
            phases=self.phases - phases0,
        )

    def _settled(self) -> bool:
        return all(m.final for m in self.nodes.values())

    def _maybe_end_phase(self) -> None:
        self._phase.quiet(self.time, self._settled())

    def _timer(self, at: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, at))

    def _end_phase(self, at: float) -> None:
        if not self._phase.fire(at, self._settled()):
            return
        if self.tighten():
            self.phases += 1
        self._maybe_end_phase()
