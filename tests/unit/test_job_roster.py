"""The rules on a running job's participants (gwtf.job.roster): who coordinates next, who is the
last replica of a stage, who keeps its backup, and which starts and weights fit."""

from __future__ import annotations

from collections.abc import Callable

from gwtf.job.roster import (
    MAX_WEIGHT,
    flow_to_stage,
    last_replica,
    live_holders,
    nodes_by_stage,
    orphaned,
    start_fits,
    weights_fit,
)

PARTICIPANTS = {"h1": 0, "h0": 0, "a": 1, "b": 1, "z": 2}


def alive_but(*dead: str) -> Callable[[str], bool]:
    return lambda node: node not in dead


def test_every_stage_is_listed_even_an_empty_one() -> None:
    found = nodes_by_stage([("h0", 0), ("a", 1), ("h1", 0)], 3)
    assert found == {0: ["h0", "h1"], 1: ["a"], 2: []}


def test_weights_fit_none_or_one_per_holder_within_the_limit() -> None:
    assert weights_fit(("h0", "h1"), ())
    assert weights_fit(("h0", "h1"), (3, 4))
    assert not weights_fit(("h0", "h1"), (3,))
    assert not weights_fit(("h0",), (MAX_WEIGHT + 1,))


def test_a_start_fits_only_with_holders_of_stage_0_a_holder_coordinating_and_every_stage() -> None:
    assert start_fits(PARTICIPANTS, ("h0", "h1"), (), "h0", 3)
    assert not start_fits(PARTICIPANTS, (), (), "h0", 3)
    assert not start_fits(PARTICIPANTS, ("h0", "a"), (), "h0", 3)
    assert not start_fits(PARTICIPANTS, ("h0",), (), "h1", 3)
    assert not start_fits(PARTICIPANTS, ("h0", "h1"), (1,), "h0", 3)
    assert not start_fits(PARTICIPANTS, ("h0", "h1"), (), "h0", 4)


def test_the_live_holders_in_order_of_succession() -> None:
    assert live_holders(PARTICIPANTS, set(), alive_but()) == ["h0", "h1"]
    assert live_holders(PARTICIPANTS, {"h0"}, alive_but()) == ["h1"]
    assert live_holders(PARTICIPANTS, set(), alive_but("h0")) == ["h1"]
    assert not orphaned(PARTICIPANTS, {"h0"}, alive_but())
    assert orphaned(PARTICIPANTS, {"h0"}, alive_but("h1"))


def test_the_last_replica_of_a_stage() -> None:
    assert not last_replica(PARTICIPANTS, set(), 1, "a", alive_but())
    assert last_replica(PARTICIPANTS, {"b"}, 1, "a", alive_but())
    assert last_replica(PARTICIPANTS, set(), 1, "a", alive_but("b"))
    assert last_replica(PARTICIPANTS, set(), 2, "z", alive_but())


def test_a_holders_flow_counts_the_live_participants_of_the_next_stage() -> None:
    routes = {"a": 3, "b": 4, "x": 5}
    assert flow_to_stage(routes, PARTICIPANTS, set()) == 7
    assert flow_to_stage(routes, PARTICIPANTS, {"b"}) == 3
