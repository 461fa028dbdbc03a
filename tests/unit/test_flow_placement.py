"""Placement from the flow (gwtf.flow.placement): joiners take the stage where they add the most
flow, moves go to the minimum cut's stage when they pay for themselves, a stage with no node gets
one, and a stage's last node never moves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.flow.placement import Seat, Swarm, best_stage, open_stage, propose_move
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, NodeSpec

LINKS = {frozenset(("a", "b")): LinkSpec(20.0, 10.0)}
ACT = 1024  # small activations: the links never bind, the nodes do


def swarm(*nodes: tuple[str, int, float]) -> Swarm:
    """Nodes as (id, stage, capacity in microbatches/s), all in location 'a'."""
    specs = tuple(NodeSpec.make(i, s, 1.0 / cap, "a") for i, s, cap in nodes)
    return Swarm(3, ACT, specs, LINKS, DEFAULT_INTRA)


def seat_of(capacity: float, node_id: str = "new") -> Seat:
    return lambda stage: NodeSpec.make(node_id, stage, 1.0 / capacity, "a")


def test_a_joiner_takes_the_bottleneck_stage() -> None:
    s = swarm(("h0", 0, 10), ("h1", 0, 10), ("r0", 1, 3), ("t0", 2, 10), ("t1", 2, 10))
    assert s.max_flow() == 3
    assert best_stage(s, seat_of(4.0)) == 1


def test_equal_joiners_fill_the_stages_evenly() -> None:
    s = swarm(("h0", 0, 5), ("r0", 1, 5), ("t0", 2, 5))
    stages = []
    for k in range(6):
        stage = best_stage(s, seat_of(5.0, f"j{k}"))
        stages.append(stage)
        s = s.replaced(NodeSpec.make(f"j{k}", stage, 0.2, "a"))
    assert sorted(stages) == [0, 0, 1, 1, 2, 2]


def test_a_stage_without_a_node_gets_the_joiner() -> None:
    s = swarm(("h0", 0, 5), ("h1", 0, 5), ("t0", 2, 5))
    assert s.max_flow() == 0
    assert best_stage(s, seat_of(1.0)) == 1


@settings(max_examples=60, deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(0, 2), st.floats(0.5, 20.0)), max_size=6),
    speeds=st.lists(st.floats(0.5, 20.0), min_size=3, max_size=3),
)
def test_with_a_stage_empty_the_joiner_takes_the_lowest_empty_one_whatever_its_speeds(
    held: list[tuple[int, float]], speeds: list[float]
) -> None:
    s = swarm(*((f"n{k}", stage, cap) for k, (stage, cap) in enumerate(held)))
    empty = open_stage(s)
    if empty is None:
        assert {stage for stage, _ in held} == {0, 1, 2}
        return
    assert empty == min({0, 1, 2} - {stage for stage, _ in held})
    # The node needs no speed at the other stages to know where it goes (design 2.11).
    assert best_stage(s, lambda stage: NodeSpec.make("new", stage, 1.0 / speeds[stage], "a")) \
        == empty


def test_an_empty_swarm_gives_its_first_node_stage_0() -> None:
    assert open_stage(swarm()) == 0
    assert best_stage(swarm(), seat_of(3.0)) == 0


def seats(s: Swarm) -> dict[str, Seat]:
    return {n.id: (lambda stage, i=n.id, c=n.capacity: NodeSpec.make(i, stage, 1.0 / c, "a"))
            for n in s.nodes}


def test_a_node_moves_from_a_stage_with_slack_to_the_cut() -> None:
    s = swarm(("h0", 0, 10), ("h1", 0, 10), ("h2", 0, 10), ("r0", 1, 2), ("t0", 2, 10),
              ("t1", 2, 10))
    move = propose_move(s, seats(s), lambda node, stage: 60.0, 600.0)
    assert move is not None and move.stage == 1 and move.node.startswith("h")
    # h* and t* hold 10 each: moving one to stage 1 lifts the flow from 2 to 12; its old
    # stage still carries 20, so nothing is lost while it downloads.
    assert move.gain == 10 and move.loss == 0
    moved = s.replaced(NodeSpec.make(move.node, 1, 0.1, "a"))
    assert moved.max_flow() == 12


def test_no_move_whose_download_outlasts_the_horizon() -> None:
    """The gain comes only once the mover has its new stage's state: a move that loses
    nothing but downloads for longer than the horizon gains nothing within it."""
    s = swarm(("h0", 0, 10), ("h1", 0, 10), ("h2", 0, 10), ("r0", 1, 2), ("t0", 2, 10),
              ("t1", 2, 10))
    assert propose_move(s, seats(s), lambda node, stage: 599.0, 600.0) is not None
    assert propose_move(s, seats(s), lambda node, stage: 600.0, 600.0) is None
    assert propose_move(s, seats(s), lambda node, stage: 1933.0, 600.0) is None


def test_no_move_when_the_swarm_is_balanced_or_a_move_would_empty_a_stage() -> None:
    balanced = swarm(("h0", 0, 5), ("r0", 1, 5), ("t0", 2, 5))
    assert propose_move(balanced, seats(balanced), lambda n, s: 1.0, 600.0) is None
    # Stage 1 is the cut, but every other stage has a single node: none can be spared.
    thin = swarm(("h0", 0, 10), ("r0", 1, 1), ("t0", 2, 10))
    assert propose_move(thin, seats(thin), lambda n, s: 1.0, 600.0) is None


def test_a_stage_with_no_node_gets_the_fastest_spare_at_any_cost() -> None:
    s = swarm(("h0", 0, 10), ("h1", 0, 4), ("t0", 2, 10))
    move = propose_move(s, seats(s), lambda n, st: 1e9, 1.0)
    assert move is not None and (move.node, move.stage) == ("h0", 1)


def test_the_answer_does_not_depend_on_the_order_nodes_are_listed() -> None:
    nodes = [("h0", 0, 10), ("h1", 0, 10), ("h2", 0, 10), ("r0", 1, 2), ("t0", 2, 10),
             ("t1", 2, 10)]
    a, b = swarm(*nodes), swarm(*reversed(nodes))
    assert propose_move(a, seats(a), lambda n, s: 60.0, 600.0) == \
        propose_move(b, seats(b), lambda n, s: 60.0, 600.0)
