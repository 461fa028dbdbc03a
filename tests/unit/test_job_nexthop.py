"""Next hops by smooth weighted round-robin over the flows (gwtf.job.nexthop)."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gwtf.job.nexthop import SmoothRoundRobin, live_weights, next_hop_weights


def picks(weights: dict[str, int], n: int, rr: SmoothRoundRobin | None = None) -> list[str]:
    rr = rr or SmoothRoundRobin()
    out = []
    for _ in range(n):
        peer = rr.pick(weights)
        assert peer is not None
        out.append(peer)
    return out


def test_the_split_is_smooth_not_in_runs() -> None:
    assert picks({"a": 2, "b": 1}, 6) == ["a", "b", "a", "a", "b", "a"]
    assert picks({"a": 1, "b": 1}, 4) == ["a", "b", "a", "b"]  # ties: the smallest id first


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 9), min_size=1), st.integers(1, 4))
def test_every_window_of_the_total_weight_follows_the_rates(
    weights: dict[str, int], windows: int
) -> None:
    total = sum(weights.values())
    sequence = picks(weights, total * windows)
    for w in range(windows):
        assert Counter(sequence[w * total : (w + 1) * total]) == Counter(weights)
    # The same weights always give the same sequence.
    assert sequence == picks(weights, total * windows)


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 50), min_size=2),
    st.integers(1, 200),
)
def test_any_prefix_is_within_one_pick_of_the_rates(weights: dict[str, int], n: int) -> None:
    total = sum(weights.values())
    counts = Counter(picks(weights, n))
    for peer, weight in weights.items():
        assert abs(counts[peer] - n * weight / total) < len(weights)


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 9), min_size=1),
       st.sampled_from(["s0", "s1", "node-7"]))
def test_a_senders_own_order_keeps_the_rates_and_the_determinism(
    weights: dict[str, int], owner: str
) -> None:
    total = sum(weights.values())
    sequence = picks(weights, 2 * total, SmoothRoundRobin(owner=owner))
    assert Counter(sequence[:total]) == Counter(weights)
    assert sequence == picks(weights, 2 * total, SmoothRoundRobin(owner=owner))


def test_senders_with_equal_weights_do_not_all_start_at_the_same_peer() -> None:
    # Every stage-s node with the same flows to four stage-s+1 nodes: by the smallest id each
    # sends its first microbatch to "n0"; each in its own order, they spread.
    weights = {f"n{i}": 1 for i in range(4)}
    firsts = {picks(weights, 1, SmoothRoundRobin(owner=f"s{k}"))[0] for k in range(8)}
    assert len(firsts) >= 3
    assert {picks(weights, 1)[0] for _ in range(8)} == {"n0"}


def test_exclusion_and_weights_that_change() -> None:
    rr = SmoothRoundRobin()
    assert rr.pick({"a": 1, "b": 1}, exclude={"a"}) == "b"
    assert rr.pick({"a": 0, "b": 0}) is None
    assert rr.pick({}) is None
    assert rr.pick({"a": 3}, exclude={"a"}) is None
    # A peer that leaves the weights is forgotten; the others go on.
    assert set(picks({"a": 1, "c": 1}, 4, rr)) == {"a", "c"}


def test_weights_come_from_settled_flows_else_capacities() -> None:
    routes = {"x": 300, "y": 0, "gone": 500}
    capacities = {"x": 2.0, "y": 0.5}
    assert next_hop_weights(routes, capacities, settled=True) == ({"x": 300}, "flows")
    assert next_hop_weights(routes, capacities, settled=False) == (
        {"x": 2000, "y": 500},
        "capacity",
    )
    # Settled flows that send nothing to a candidate (this node carries no flow): capacities.
    assert next_hop_weights({"gone": 5}, capacities, settled=True)[1] == "capacity"
    assert next_hop_weights({}, {}, settled=True) == ({}, "capacity")


def test_a_straggler_gets_its_share_cut_by_its_slowdown_until_the_flows_move() -> None:
    """gwtf.job.nexthop.live_weights: a peer that runs 4x slower than its record gets a quarter
    of its share; within the slack, or without a live figure, the picks are the same as from
    the weights themselves."""
    weights = {"a": 5, "b": 5}
    solved = {"a": 0.08, "b": 0.08}
    cut = live_weights(weights, solved, {"a": 0.32, "b": 0.08})
    assert cut == {"a": 1250, "b": 5000}
    rr = SmoothRoundRobin()
    picks = Counter(rr.pick(cut) for _ in range(625))
    assert picks == {"a": 125, "b": 500}
    for live in ({}, {"a": 0.09, "b": 0.07}, {"a": 0.32 / 4}):
        same = live_weights(weights, solved, live)
        rr_same, rr_plain = SmoothRoundRobin("x"), SmoothRoundRobin("x")
        assert [rr_same.pick(same) for _ in range(50)] == [rr_plain.pick(weights) for _ in
                                                           range(50)]
    assert live_weights({"a": 1}, {"a": 0.01}, {"a": 100.0}) == {"a": 1}  # never cut to 0
    assert live_weights({"a": 0, "b": 2}, solved, {"a": 1.0}) == {"a": 0, "b": 2000}
