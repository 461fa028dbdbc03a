"""Placement from the flow: which stage a node should hold (docs/design.md 2.11).

A swarm trains at most at its maximum flow, and the minimum cut names what limits it. A node
that holds a stage outside the cut adds nothing to that flow; the same node in a stage of the
cut raises it. So:

- a joiner takes the stage where the maximum flow with it is largest (`best_stage`); ties go
  to the stage with the fewest nodes, then the lowest index, so that a swarm of equal nodes
  fills its stages evenly;
- a node moves (`propose_move`) when the cut has moved (crashes, joins, a faster peer) and the
  move pays for itself: a move costs the mover's contribution to the flow while it downloads
  the new stage's state (`transfer_s`) and gains the flow the move adds once it has arrived,
  for as long as the swarm stays as it is. With `horizon_s` that time, a move is made when

      (F(moved) - F) * (horizon_s - transfer_s) > (F - F(without the mover)) * transfer_s,

  so a move whose download outlasts the horizon is never made, however idle the mover was (on
  home links a stage's state can take half an hour to download),

  and of the moves that pass, the one of largest net gain. Only nodes of other stages than
  the cut's are tried, the ones with the most capacity at the cut's stage first, and a stage's
  last node never moves (its stage would be wiped). A stage left with no node at all (the job
  pauses until it is held again) gets the fastest node a stage of two or more can spare, at
  any cost.

Everything here is a pure function of a topology: every node with the same view of the swarm
(members, their speeds per stage and the link table, all gossiped) reaches the same answer.
The maximum flows are networkx's (the oracle's network, without costs): for the swarms a
placement decision looks at (tens of nodes) one is a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import networkx as nx

from gwtf.flow.oracle import SINK, SOURCE, build_oracle_network
from gwtf.flow.simplex import max_flow_value
from gwtf.flow.topology import CAP_SCALE, LinkSpec, NodeSpec, Topology, TopologyError

__all__ = ["Move", "Seat", "Swarm", "best_stage", "open_stage", "propose_move"]


@dataclass(frozen=True)
class Swarm:
    """The nodes that hold stages now, and what a placement needs to know about the world."""

    stages: int
    activation_bytes: int
    nodes: tuple[NodeSpec, ...]
    links: Mapping[frozenset[str], LinkSpec]
    intra: LinkSpec

    def replaced(self, node: NodeSpec | None, drop: str = "") -> Swarm:
        """This swarm without `drop` (an id) and with `node` added or put in place of its id."""
        gone = {drop} | ({node.id} if node is not None else set())
        nodes = tuple(n for n in self.nodes if n.id not in gone)
        if node is not None:
            nodes += (node,)
        return Swarm(self.stages, self.activation_bytes, nodes, self.links, self.intra)

    def max_flow(self) -> float:
        """The swarm's maximum flow in microbatches/s; 0 while a stage has no node."""
        if {n.stage for n in self.nodes} != set(range(self.stages)):
            return 0.0
        try:
            topology = Topology.build(self.activation_bytes, self.nodes, self.links, self.intra)
        except TopologyError:
            return 0.0
        return _max_flow(topology)

    def count(self, stage: int) -> int:
        return sum(1 for n in self.nodes if n.stage == stage)


def _max_flow(topology: Topology) -> float:
    graph = build_oracle_network(topology)
    # The value is unique: the faster exact algorithm gives networkx's (docs/design.md 2.12).
    return max_flow_value(graph, SOURCE, SINK) / CAP_SCALE


Seat = Callable[[int], NodeSpec]
"""A node as it would be at a stage: its speed, and so its capacity, depend on the stage."""


def open_stage(swarm: Swarm) -> int | None:
    """The lowest stage with no node, None if every stage has one.

    While a stage has no node the flow is 0 at every other stage, whoever joins, and the one
    stage where a joiner can make it positive is the empty one (when there is one); ties go to
    the fewest nodes. So `best_stage` returns this stage whatever the joiner's seat: a joiner
    needs no speed at the other stages to know where it goes (the first node of a swarm takes
    stage 0), and the node measures only the stage it takes (docs/design.md 2.11)."""
    return next((s for s in range(swarm.stages) if swarm.count(s) == 0), None)


def best_stage(swarm: Swarm, seat: Seat) -> int:
    """The stage where the node `seat` describes adds the most flow to `swarm` (the
    `open_stage` when there is one)."""
    best = 0
    best_key: tuple[float, int, int] | None = None
    for stage in range(swarm.stages):
        flow = swarm.replaced(seat(stage)).max_flow()
        key = (round(flow, 9), -swarm.count(stage), -stage)
        if best_key is None or key > best_key:
            best, best_key = stage, key
    return best


@dataclass(frozen=True)
class Move:
    node: str
    stage: int
    gain: float
    """Microbatches/s the move adds once it is done."""
    loss: float
    """Microbatches/s the swarm trains slower while the mover downloads its new stage."""


def _cut_stages(swarm: Swarm) -> list[int]:
    """The stages whose nodes the minimum cut crosses, most cut capacity first."""
    topology = Topology.build(swarm.activation_bytes, swarm.nodes, swarm.links, swarm.intra)
    graph = build_oracle_network(topology)
    _, (reachable, _) = nx.minimum_cut(graph, SOURCE, SINK, capacity="capacity")
    cut = [0.0] * swarm.stages
    for node in topology.nodes:
        if (node.id, 0) in reachable and (node.id, 1) not in reachable:
            cut[node.stage] += node.capacity
    return sorted((s for s in range(swarm.stages) if cut[s] > 0), key=lambda s: (-cut[s], s))


def propose_move(
    swarm: Swarm,
    seats: Mapping[str, Seat],
    transfer_s: Callable[[str, int], float],
    horizon_s: float,
    *,
    candidates: int = 6,
) -> Move | None:
    """The move of one node to a stage of the minimum cut that pays for itself (module doc),
    or None. `seats[id]` describes each movable node at any stage; `transfer_s(id, stage)` is
    the time it would take that node to download the stage's state."""
    empty = [s for s in range(swarm.stages) if swarm.count(s) == 0]
    if empty:
        return _fill(swarm, seats, empty[0])
    flow = swarm.max_flow()
    try:
        targets = _cut_stages(swarm)[:2]
    except TopologyError:
        return None
    best: Move | None = None
    best_net = 0.0
    for stage in targets:
        movable = [
            n for n in swarm.nodes
            if n.stage != stage and n.id in seats and swarm.count(n.stage) > 1
        ]
        movable.sort(key=lambda n: (-seats[n.id](stage).capacity, n.id))
        for node in movable[:candidates]:
            moved = swarm.replaced(seats[node.id](stage)).max_flow()
            gain = moved - flow
            if gain <= 1e-9:
                continue
            loss = flow - swarm.replaced(None, drop=node.id).max_flow()
            busy = transfer_s(node.id, stage)
            net = gain * (horizon_s - busy) - loss * busy
            if net > best_net:
                best, best_net = Move(node.id, stage, gain, loss), net
    return best



def _fill(swarm: Swarm, seats: Mapping[str, Seat], stage: int) -> Move | None:
    """A stage without a node stops the job (docs/design.md 4.3, rule 5): whatever it costs,
    the node that would serve `stage` fastest, of a stage that keeps another node, moves
    there (its loss is nothing: nothing trains until the stage is held again)."""
    movable = [n for n in swarm.nodes if n.id in seats and swarm.count(n.stage) > 1]
    if not movable:
        return None
    node = min(movable, key=lambda n: (-seats[n.id](stage).capacity, n.id))
    return Move(node.id, stage, seats[node.id](stage).capacity, 0.0)
