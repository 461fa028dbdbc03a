"""A node without a stage (`gwtf node --stage auto`, docs/design.md 2.11) chooses it from the
members its bootstrap member knows: gwtf.node.control.entry.swarm_view and choose_stage, pure."""

from __future__ import annotations

from collections.abc import Callable

from gwtf.flow.topology import LinkSpec
from gwtf.node.control.entry import choose_stage, swarm_view
from gwtf.node.control.membership import MemberInfo, State

ACT = 8 * 2**20  # the swarm default: on the intra-location link (10 Gbit/s) ~149 mb/s per arc


def member(node_id: str, stage: int, compute_s: float, location: str = "",
           state: State = State.ALIVE) -> MemberInfo:
    return MemberInfo(node_id, f"127.0.0.1:{7000 + len(node_id)}", stage, location, compute_s,
                      1.0 / compute_s, epoch=1, state=state)


def same_everywhere(compute_s: float, calls: list[int] | None = None) -> Callable[[int], float]:
    def at(stage: int) -> float:
        if calls is not None:
            calls.append(stage)
        return compute_s
    return at


def test_a_joiner_takes_the_bottleneck_stage_even_where_it_has_the_most_nodes() -> None:
    # Stage 1 holds two slow nodes (2 mb/s in all), stages 0 and 2 one fast node each (10):
    # the flow is 2, and only a node at stage 1 raises it. "Fewest nodes" alone would say 0.
    members = [member("h", 0, 0.1), member("r1", 1, 1.0), member("r2", 1, 1.0),
               member("t", 2, 0.1)]
    view = swarm_view(members, 3, ACT, None)
    assert view.max_flow() == 2.0
    calls: list[int] = []
    assert choose_stage(view, "new", "", same_everywhere(0.1, calls)) == 1
    assert sorted(set(calls)) == [0, 1, 2]  # it weighed every stage at its own speed there


def test_where_links_bind_the_joiner_is_weighed_at_its_speed_at_each_stage() -> None:
    # The cut is the thin link (0.1 Gbit/s: ~1.5 microbatches/s of 8 MiB) from stage 0 in "a"
    # to stages 1 and 2 in "b". A joiner in "b" raises the flow at stage 0 (its arcs to r are
    # intra-site: it adds up to its speed there) and at stage 1 (a new thin arc from h: ~1.5).
    # Which gains more depends on its speed at each stage, which is why it measures each.
    links = {frozenset(("a", "b")): LinkSpec(50.0, 0.1)}
    members = [member("h", 0, 0.1, "a"), member("r", 1, 0.1, "b"), member("t", 2, 0.1, "b")]
    view = swarm_view(members, 3, ACT, links)
    assert 1.4 < view.max_flow() < 1.6
    fast = {0: 0.1, 1: 0.1, 2: 0.1}
    assert choose_stage(view, "new", "b", fast.__getitem__) == 0  # +8.5 against +1.5
    slow_at_0 = {0: 2.0, 1: 0.1, 2: 0.1}
    assert choose_stage(view, "new", "b", slow_at_0.__getitem__) == 1  # +0.5 against +1.5


def test_dead_and_departed_members_do_not_count() -> None:
    members = [member("h", 0, 0.1), member("r", 1, 0.1), member("t", 2, 0.1),
               member("t2", 2, 0.1, state=State.DEAD), member("r2", 1, 0.1, state=State.LEFT)]
    view = swarm_view(members, 3, ACT, None)
    assert {n.id for n in view.nodes} == {"h", "r", "t"}


def test_an_empty_stage_is_taken_without_measuring_anything() -> None:
    calls: list[int] = []
    # The first node of a swarm (its bootstrap is itself: no members) takes stage 0.
    assert choose_stage(swarm_view([], 3, ACT, None), "first", "", same_everywhere(1.0, calls)) == 0
    members = [member("h", 0, 0.1), member("h2", 0, 0.1), member("t", 2, 0.1)]
    assert choose_stage(swarm_view(members, 3, ACT, None), "new", "",
                        same_everywhere(1.0, calls)) == 1
    members = [member("h", 0, 0.1), member("r", 1, 0.1), member("r2", 1, 0.1),
               member("t", 2, 0.1, state=State.DEAD)]
    assert choose_stage(swarm_view(members, 3, ACT, None), "new", "",
                        same_everywhere(1.0, calls)) == 2
    assert calls == []


def test_the_link_matrix_decides_where_links_bind() -> None:
    # Two sites joined by a thin link (0.1 Gbit/s: ~1.5 microbatches/s of 8 MiB). Stage 1's
    # one node is in "far", stages 0 and 2 in "near": the thin link binds, not a node. A joiner
    # in "near" takes stage 1, where its arcs are intra-site and the flow goes from ~1.5 to 10+.
    links = {frozenset(("near", "far")): LinkSpec(50.0, 0.1)}
    members = [member("h", 0, 0.1, "near"), member("h2", 0, 0.1, "near"),
               member("r", 1, 0.1, "far"), member("t", 2, 0.1, "near")]
    view = swarm_view(members, 3, ACT, links)
    assert 1.4 < view.max_flow() < 1.6
    assert choose_stage(view, "new", "near", same_everywhere(0.1)) == 1


def test_a_restarted_node_does_not_count_its_earlier_incarnation() -> None:
    # "r" crashed and restarts before the swarm noticed: its old record still holds stage 1,
    # stage 1's only node. The new incarnation replaces it, so for it stage 1 is open; for any
    # other node stage 2 (5 microbatches/s) is the bottleneck.
    members = [member("h", 0, 0.1), member("h2", 0, 0.1), member("r", 1, 0.1),
               member("t", 2, 0.2)]
    view = swarm_view(members, 3, ACT, None)
    calls: list[int] = []
    assert choose_stage(view, "r", "", same_everywhere(0.1, calls)) == 1
    assert calls == []
    assert choose_stage(view, "new", "", same_everywhere(0.1)) == 2
