"""`two_phase_commit_s`: the node's commit over the simulated links (docs/design.md 3.7, 5), and
what a rerun of it moves (`gwtf.sim.exchange`)."""

from __future__ import annotations

import math

import pytest

from gwtf.flow.topology import LinkSpec
from gwtf.sim.exchange import ExchangeLedger
from gwtf.sim.network import Network, commit_timeline, two_phase_commit_s
from gwtf.sim.scenario import NodeInfo


def node(node_id: str, stage: int, location: str, uplink: float = math.inf) -> NodeInfo:
    return NodeInfo(node_id, stage, location, "gpu", 1.0, uplink_gbps=uplink)


def test_six_one_way_legs_each_as_slow_as_its_slowest_message() -> None:
    # A (coordinator) -- B: 100 ms RTT; A -- C: 40 ms; B -- C: 60 ms; 8 Gbit/s everywhere.
    links = {
        frozenset(("A", "B")): LinkSpec(100.0, 8.0),
        frozenset(("A", "C")): LinkSpec(40.0, 8.0),
        frozenset(("B", "C")): LinkSpec(60.0, 8.0),
    }
    net = Network(links, LinkSpec(1.0, 8.0))
    h0, h1 = node("h0", 0, "A"), node("h1", 0, "B")
    r0, r1 = node("r0", 1, "C"), node("r1", 1, "B")
    commit = two_phase_commit_s(net, h0, [h0, h1], [[h0, h1], [r0, r1]], [1e9, 1e9], 0.0)
    # report from h1 (0.05) + order to B (0.05) + the slowest exchange (h0 <-> h1: a
    # reduce-scatter and an all-gather, each 0.05 + half the sum, 0.5 s of bytes) + prepared
    # from B (0.05) + step order to B (0.05)
    assert commit == pytest.approx(0.05 * 4 + 2 * (0.05 + 0.5))


def test_a_shared_uplink_sends_the_slices_one_after_the_other() -> None:
    net = Network({}, LinkSpec(0.0, 8.0))
    stage = [node(f"n{i}", 0, "A", uplink=8.0) for i in range(3)]
    # Two legs; in each a replica sends a third of the sum to each of two peers in turn.
    assert two_phase_commit_s(net, stage[0], stage, [stage], [1e9], 0.0) == pytest.approx(4 / 3)
    free = [node(f"n{i}", 0, "A") for i in range(3)]
    assert two_phase_commit_s(net, free[0], free, [free], [1e9], 0.0) == pytest.approx(2 / 3)
    # A shared downlink takes what the peers send in turn too.
    down = [NodeInfo(f"n{i}", 0, "A", "gpu", 1.0, downlink_gbps=4.0) for i in range(3)]
    assert two_phase_commit_s(net, down[0], down, [down], [1e9], 0.0) == pytest.approx(
        2 * 2 / 3 * 2)


def test_six_home_replicas_send_a_third_of_what_all_to_all_sent() -> None:
    # home_links: 600 MB sums, 20 Mbit/s uplinks, 6 replicas: (r - 1) S = 1200 s all to all.
    net = Network({}, LinkSpec(0.0, 10.0))
    stage = [node(f"n{i}", 0, "A", uplink=0.02) for i in range(6)]
    commit = two_phase_commit_s(net, stage[0], stage, [stage], [600e6], 0.0)
    assert commit == pytest.approx(2 * 5 / 6 * 600e6 * 8 / 0.02e9)  # 400 s


def test_a_rerun_moves_only_what_the_earlier_attempt_did_not_deliver() -> None:
    net = Network({}, LinkSpec(0.0, 8.0))  # 1 GB/s
    s0 = [node(f"a{i}", 0, "A", uplink=8.0) for i in range(3)]
    s1 = [node(f"b{i}", 1, "A", uplink=8.0) for i in range(3)]
    ids = {n.id: frozenset({i}) for i, n in enumerate(s0 + s1)}
    ledger = ExchangeLedger()
    first = ledger.moves(0.0, (0, 0.0), net, [s0, s1], ids, [300, 300], 1e6, 0.0)
    # A first attempt: a 100-value slice (100 MB) from every replica to every other, both legs.
    assert set(first[0][0].values()) == {100e6} and set(first[1][1].values()) == {100e6}
    # b2 died after both stages finished their exchanges (0.4 s); a1 replayed its work.
    after = [n for n in s1 if n.id != "b2"]
    ids["b1"] = frozenset({4, 5})
    again = ledger.moves(10.0, (0, 0.0), net, [s0, after], ids, [300, 300], 1e6, 0.0)
    # Stage 0 lost nobody and changed nothing: headers only.
    assert set(again[0][0].values()) == {0.0} and set(again[0][1].values()) == {0.0}
    scatter, gather = again[1]
    # b0's slice grew from [0, 100) to [0, 150): b1 (new ids) sends it all, and b0 was sent
    # [100, 150) of nothing before; b1's slice is [150, 300): b0 had sent it [100, 200).
    assert scatter[("b1", "b0")] == 150e6
    assert scatter[("b0", "b1")] == 100e6
    assert gather == {("b0", "b1"): 150e6, ("b1", "b0"): 150e6}  # a new basis: all again
    # Another iteration starts afresh.
    fresh = ledger.moves(20.0, (1, 20.0), net, [s0, after], ids, [300, 300], 1e6, 0.0)
    assert fresh[0][0][("a0", "a1")] == 100e6


def test_a_send_still_on_the_wire_when_the_rerun_starts_is_sent_again() -> None:
    net = Network({}, LinkSpec(0.0, 8.0))
    stage = [node(f"n{i}", 0, "A", uplink=8.0) for i in range(2)]
    ids = {"n0": frozenset({0}), "n1": frozenset({1})}
    ledger = ExchangeLedger()
    ledger.moves(0.0, (0, 0.0), net, [stage], ids, [200], 1e7, 0.0)  # 1 s per slice
    again = ledger.moves(0.5, (0, 0.0), net, [stage], ids, [200], 1e7, 0.0)
    assert again[0][0][("n0", "n1")] == 1e9  # had not landed
    last = ledger.moves(3.0, (0, 0.0), net, [stage], ids, [200], 1e7, 0.0)
    assert last[0][0][("n0", "n1")] == 0.0 and last[0][1][("n0", "n1")] == 0.0


def test_an_all_to_all_stage_pays_one_leg_of_whole_sums() -> None:
    # The first test's swarm with both stages all to all (gwtf.job.exchange): one leg of the
    # whole 1 GB sum (1 s at 8 Gbit/s) where the two legs of half sums took 2 (0.05 + 0.5).
    links = {
        frozenset(("A", "B")): LinkSpec(100.0, 8.0),
        frozenset(("A", "C")): LinkSpec(40.0, 8.0),
        frozenset(("B", "C")): LinkSpec(60.0, 8.0),
    }
    net = Network(links, LinkSpec(1.0, 8.0))
    h0, h1 = node("h0", 0, "A"), node("h1", 0, "B")
    r0, r1 = node("r0", 1, "C"), node("r1", 1, "B")
    stages = [[h0, h1], [r0, r1]]
    commit = two_phase_commit_s(net, h0, [h0, h1], stages, [1e9, 1e9], 0.0, whole={0, 1})
    assert commit == pytest.approx(0.05 * 4 + 0.05 + 1.0)
    # One stage each way: the slower of the two sets the exchange.
    mixed = two_phase_commit_s(net, h0, [h0, h1], stages, [1e9, 1e9], 0.0, whole={1})
    assert mixed == pytest.approx(0.05 * 4 + 2 * (0.05 + 0.5))


def test_an_all_to_all_stage_keeps_nothing_for_a_rerun() -> None:
    # The node keeps no whole vector across attempts: the ledger has nothing for such a stage,
    # and the reduce-scatter stages beside it keep theirs.
    net = Network({}, LinkSpec(0.0, 8.0))
    s0 = [node(f"a{i}", 0, "A", uplink=8.0) for i in range(2)]
    s1 = [node(f"b{i}", 1, "A", uplink=8.0) for i in range(3)]
    ids = {n.id: frozenset({i}) for i, n in enumerate(s0 + s1)}
    ledger = ExchangeLedger()
    first = ledger.moves(0.0, (0, 0.0), net, [s0, s1], ids, [300, 300], 1e6, 0.0, whole={0})
    assert first[0] == ({}, {})
    assert set(first[1][0].values()) == {100e6}
    again = ledger.moves(10.0, (0, 0.0), net, [s0, s1], ids, [300, 300], 1e6, 0.0, whole={0})
    assert again[0] == ({}, {})
    assert set(again[1][0].values()) == {0.0}


def fidelity_swarm() -> tuple[Network, list[list[NodeInfo]]]:
    """simulations/fidelity.toml's first six nodes on its links (one way: Virginia-Oregon
    33.5 ms, Virginia-Frankfurt 45 ms, Oregon-Frankfurt 71.5 ms; 0.5 ms within a region)."""
    links = {
        frozenset(("V", "O")): LinkSpec(67.0, 0.79),
        frozenset(("V", "F")): LinkSpec(90.0, 0.6),
        frozenset(("O", "F")): LinkSpec(143.0, 0.404),
    }
    net = Network(links, LinkSpec(1.0, 10.0))
    return net, [[node("f0", 0, "V"), node("f1", 0, "O")],
                 [node("f2", 1, "V"), node("f3", 1, "F")],
                 [node("f4", 2, "O"), node("f5", 2, "F")]]


def test_the_timeline_times_each_message_from_when_its_sender_had_it() -> None:
    net, stages = fidelity_swarm()
    f0, f1 = stages[0]
    whole = {0, 1, 2}
    # The last microbatch finished at the coordinator itself: no report is on the way.
    mine = commit_timeline(net, f0, {"f0": (f0, 0.0), "f1": (f1, -0.2)}, stages, [0.0] * 3,
                           0.0, whole=whole)
    assert mine.ordered_s == pytest.approx(0.045)  # the order reaches Frankfurt last
    # Stage 2: f4 has the order at 33.5 ms, f5 at 45 ms; each holds the other's sum one
    # Oregon-Frankfurt leg after the other started; f5 reports from Frankfurt (45 ms), f4 from
    # Oregon (33.5 ms): the coordinator decides at 0.045 + 0.0715 + 0.0335 (both 0.150).
    assert mine.decided_s == pytest.approx(0.150)
    assert mine.step_s["f0"] == pytest.approx(mine.decided_s)  # its own step: a local call
    assert mine.step_s["f2"] == pytest.approx(0.150 + 0.0005)
    assert mine.step_s["f5"] == pytest.approx(0.150 + 0.045)
    # The last one finished at f1 in Oregon: its report is on the way first.
    theirs = commit_timeline(net, f0, {"f0": (f0, -0.2), "f1": (f1, 0.0)}, stages, [0.0] * 3,
                             0.0, whole=whole)
    assert theirs.decided_s == pytest.approx(0.0335 + 0.150)
    # Charged leg by leg at each leg's slowest message it was five legs: 33.5 ms of reports,
    # 45 of order, 71.5 of exchange, 45 of prepared and 45 of step.
    legs = two_phase_commit_s(net, f0, stages[0], stages, [0.0] * 3, 0.0, whole=whole)
    assert legs == pytest.approx(0.0335 + 0.045 + 0.0715 + 0.045 + 0.045)
    assert max(theirs.step_s.values()) < legs


@pytest.mark.parametrize("whole", [set(), {0}, {0, 1, 2}])
@pytest.mark.parametrize("nbytes", [0.0, 4e5, 1e9])
def test_the_timeline_never_takes_longer_than_the_legs(whole: set[int], nbytes: float) -> None:
    net, stages = fidelity_swarm()
    f0, f1 = stages[0]
    timeline = commit_timeline(net, f0, {"f0": (f0, 0.0), "f1": (f1, 0.0)}, stages,
                               [nbytes] * 3, 100.0, whole=whole)
    legs = two_phase_commit_s(net, f0, stages[0], stages, [nbytes] * 3, 100.0, whole=whole)
    assert timeline.decided_s <= max(timeline.step_s.values()) <= legs + 1e-12
    # The same on shared uplinks, where a sender's slices go one after the other.
    up = [[node(n.id, n.stage, n.location, uplink=0.1) for n in stage] for stage in stages]
    timeline = commit_timeline(net, up[0][0], {"f1": (up[0][1], 0.0)}, up, [nbytes] * 3,
                               100.0, whole=whole)
    legs = two_phase_commit_s(net, up[0][0], up[0], up, [nbytes] * 3, 100.0, whole=whole)
    assert max(timeline.step_s.values()) <= legs + 1e-12


def test_a_slow_uplink_sends_its_second_leg_only_after_its_first() -> None:
    # Three fast replicas (8 Gbit/s uplinks) and one on 0.008: the slow one holds what the
    # reduce-scatter sends it at once, but its own slices of that leg still take 0.75 s on its
    # uplink; its all-gather slices queue behind them (real processes, benchmarks versus: the
    # commit took as long as both legs of the slow uplink, not one and a bit).
    net = Network({}, LinkSpec(0.0, 80.0))
    stage = [node(f"n{i}", 0, "A", uplink=8.0) for i in range(3)]
    stage.append(node("slow", 0, "A", uplink=0.008))
    timeline = commit_timeline(net, stage[0], {}, [stage], [1e6], 0.0)
    leg = 3 * 1e6 / 4 * 8 / 0.008e9  # three quarter-sums through the slow uplink: 0.75 s
    assert timeline.decided_s == pytest.approx(2 * leg, rel=1e-3)
