"""Moves between stages, the pure parts (docs/design.md 2.11, "Moves"): the coordinator's weighing
(`gwtf.flow.placement.weigh_move`, `scaled_seat`, `download_s`), the stages' relative cost and
state size (`gwtf.train.costs.stage_profile`), the move in the commit's step order
(`IterationCoordinator.moving`), and which nodes announce themselves movable."""

from __future__ import annotations

import pytest
from test_job_iterations import PARTICIPANTS, all_prepared, committed, coordinator

from gwtf.flow.placement import (
    MOVE_OVERHEAD_S,
    Swarm,
    download_s,
    scaled_seat,
    weigh_move,
)
from gwtf.flow.topology import DEFAULT_INTRA, LinkSpec, NodeSpec
from gwtf.job.iterations import (
    CommittedReport,
    IterationCoordinator,
    PreparedReport,
    ReportError,
    StepOrder,
)
from gwtf.job.journal import decisions, replay, to_record
from gwtf.node.settings import NodeSettings

ACT = 131072


def swarm_of(*nodes: tuple[str, int, float], stages: int = 2) -> Swarm:
    return Swarm(stages, ACT, tuple(NodeSpec.make(i, s, c, "one") for i, s, c in nodes), {},
                 DEFAULT_INTRA)


# ---------------------------------------------------------------------- weighing


def test_a_seat_scales_the_announced_time_by_the_stages_relative_cost() -> None:
    node = NodeSpec.make("m", 0, 0.05, "one")
    seat = scaled_seat(node, (2.0, 3.0, 1.0))
    assert seat(0) is node
    assert seat(1).compute_s == pytest.approx(0.075) and seat(1).stage == 1
    assert seat(2).capacity == pytest.approx(1 / 0.025)
    assert seat(1).location == "one" and seat(1).id == "m"


def test_a_download_is_a_round_trip_and_the_bytes_at_the_links_bandwidth() -> None:
    assert download_s(10**9, LinkSpec(rtt_ms=100.0, bandwidth_gbps=8.0)) == pytest.approx(1.1)


def test_the_cut_stage_gains_the_movable_node_and_pinned_ones_stay() -> None:
    # 3/1 nodes of equal speed: stage 1 is the cut. h1 comes first by id and is as fast as m0,
    # so only its being left out (not movable) makes m0 the mover.
    swarm = swarm_of(("h0", 0, 0.05), ("h1", 0, 0.05), ("m0", 0, 0.05), ("a0", 1, 0.05))
    move = weigh_move(swarm, {"m0"}, (1.0, 1.0), (10**6, 10**6), lambda n, s: None, 600.0)
    assert move is not None and (move.node, move.stage) == ("m0", 1)
    assert move.gain == pytest.approx(20.0) and move.loss == pytest.approx(0.0)
    pinned = weigh_move(swarm, {"h1", "m0"}, (1.0, 1.0), (10**6, 10**6), lambda n, s: None,
                        600.0)
    assert pinned is not None and pinned.node == "h1"  # what the coordinator must not be given
    assert weigh_move(swarm, set(), (1.0, 1.0), (10**6, 10**6), lambda n, s: None, 600.0) is None


def test_no_move_where_it_gains_nothing_or_its_download_outlasts_the_horizon() -> None:
    balanced = swarm_of(("h0", 0, 0.05), ("m0", 0, 0.05), ("a0", 1, 0.05), ("a1", 1, 0.05))
    assert weigh_move(balanced, {"m0", "a1"}, (1.0, 1.0), (10**6, 10**6),
                      lambda n, s: None, 600.0) is None
    swarm = swarm_of(("h0", 0, 0.05), ("h1", 0, 0.05), ("m0", 0, 0.05), ("a0", 1, 0.05))
    slow = LinkSpec(rtt_ms=50.0, bandwidth_gbps=0.001)  # 1 Mbit/s: 10 GB in 22 hours
    assert weigh_move(swarm, {"m0"}, (1.0, 1.0), (10**10, 10**10), lambda n, s: slow,
                      600.0) is None
    # The fixed overhead is counted: a horizon shorter than it never pays.
    assert weigh_move(swarm, {"m0"}, (1.0, 1.0), (1, 1), lambda n, s: None,
                      MOVE_OVERHEAD_S / 2) is None


def test_a_swarm_with_an_empty_stage_gets_no_move_here() -> None:
    swarm = swarm_of(("h0", 0, 0.05), ("m0", 0, 0.05), stages=2)
    assert weigh_move(swarm, {"m0"}, (1.0, 1.0), (1, 1), lambda n, s: None, 600.0) is None
    with pytest.raises(ValueError, match="per stage"):
        weigh_move(swarm, {"m0"}, (1.0,), (1, 1), lambda n, s: None, 600.0)


def test_the_stage_profile_counts_flops_and_state_from_the_partition() -> None:
    torch = pytest.importorskip("torch")
    from gwtf.train import PRESETS
    from gwtf.train.costs import stage_profile
    from gwtf.train.stage import build_stage_of

    job = PRESETS["tiny-gpt"]
    costs, sizes = stage_profile(job, 2)
    assert len(costs) == len(sizes) == 2 and all(c > 0 for c in costs)
    for stage in range(2):
        module = build_stage_of(job.model, job.seed, stage, 2)
        params = sum(p.numel() for p in module.parameters())
        assert sizes[stage] == 12 * params  # fp32 weights and AdamW's two moments
        assert all(p.dtype == torch.float32 for p in module.parameters())
    # The last stage holds the head (a vocab x width matmul), stage 0 an embedding lookup.
    assert costs[1] > costs[0]


# ---------------------------------------------------------------------- the step order


def stepped(c: IterationCoordinator) -> StepOrder:
    c.done("h0", c.injecting, c.round, c.assignment()["h0"])
    c.done("h1", c.injecting, c.round, c.assignment()["h1"])
    assert c.commit_order() is not None
    return all_prepared(c, range(5))


def test_a_move_rides_the_step_order_and_the_mover_leaves_the_next_iteration() -> None:
    c = coordinator()
    journal: list = []  # type: ignore[type-arg]
    c.attach(journal.append)
    step = stepped(c)
    assert "h1" in step.participants and "h1" in step.next_holders
    moved = c.moving("h1", 2)
    assert (moved.mover, moved.mover_from, moved.move_to) == ("h1", 0, 2)
    assert "h1" not in moved.participants and moved.next_holders == ("h0",)
    assert c.participants == {"h0": 0, "a": 1, "b": 1, "z": 2}
    assert c.holders == ("h0",) and c.assignment() == {"h0": (0, 1, 2, 3, 4)}
    assert "h1" not in c.base  # a move is no missing vote
    # The mover steps the iteration at its old stage; its report completes it as any other.
    for sender in ("h0", "h1", "a", "b"):
        assert committed(c, 0, sender) == []
    (outcome,) = committed(c, 0, "z")
    assert outcome.iteration == 0
    # One move at a time per step, and it enters again as a joiner does.
    with pytest.raises(ReportError, match="step just ordered"):
        c.moving("a", 2)
    c.admit("h1", 2)
    assert c.participants["h1"] == 2
    # The journal replays to the same decisions (the move is one of its inputs).
    records = [to_record(e) for e in journal]
    moves = [r for r in records if r["call"] == "moving"]
    assert [bool(r.get("error")) for r in moves] == [False, True]  # the refused one too
    recorded = decisions(records)
    assert replay(records) == recorded
    assert '"h1"' in next(d.result for d in recorded if d.call == "moving")


def test_a_move_that_would_empty_a_stage_or_comes_late_is_refused() -> None:
    c = coordinator()
    stepped(c)
    with pytest.raises(ReportError, match="last node of stage 2"):
        c.moving("z", 1)
    with pytest.raises(ReportError, match="holds stage 1 already"):
        c.moving("a", 1)
    with pytest.raises(ReportError, match="outside"):
        c.moving("a", 3)
    with pytest.raises(ReportError, match="does not take part"):
        c.moving("x", 2)
    c.done("h0", 1, 0, [0])
    with pytest.raises(ReportError, match="step just ordered"):
        c.moving("a", 2)  # work of the next iteration came in: too late
    assert c.participants == PARTICIPANTS


def test_no_move_at_the_last_step() -> None:
    c = coordinator(iterations=1)
    stepped(c)
    with pytest.raises(ReportError, match="last iteration"):
        c.moving("a", 2)


def test_a_report_from_the_mover_at_another_stage_is_refused() -> None:
    c = coordinator()
    stepped(c)
    c.moving("b", 2)
    with pytest.raises(ReportError, match="holds stage 1"):
        c.committed(CommittedReport("b", 0, 2, "c"))


# ---------------------------------------------------------------------- who may move


def test_only_a_node_that_chose_its_stage_and_allows_moves_is_movable() -> None:
    assert NodeSettings(stage=None).movable
    assert not NodeSettings(stage=1).movable
    assert not NodeSettings(stage=None, moves=False).movable
    # A moved node's new incarnation: its stage came from placement, it stays movable.
    assert NodeSettings(stage=1, placed=True).movable
    assert not NodeSettings(stage=1, placed=True, moves=False).movable


# ---------------------------------------------------------------------- the coordinator's planner


class _Host:
    """What the planner reads of its node: the members (each at its stage, equal speeds)."""

    def __init__(self, members: dict[str, tuple[int, bool]]) -> None:
        import logging

        from gwtf.node.config import NodeConfig
        from gwtf.node.control.membership import MemberInfo

        self.node_id = "h0"
        self.config = NodeConfig()
        self.log = logging.LoggerAdapter(logging.getLogger("test"), {})
        self.infos = {
            n: MemberInfo(n, f"{n}:1", s, "", 0.05, 20.0, 1, movable=m)
            for n, (s, m) in members.items()
        }

    def member(self, node: str) -> object:
        return self.infos.get(node)

    def activation_bytes(self) -> int:
        return ACT

    def link(self, a: object, b: object) -> None:
        return None


class _Coord:
    def __init__(self, host: _Host, plan: IterationCoordinator) -> None:
        from gwtf.train import PRESETS
        from gwtf.v1 import job_pb2

        self.host = host
        self.plan = plan
        self.job = PRESETS["tiny-gpt"]
        self.job_id = "j"
        self.active = None
        self._progress = job_pb2.JobProgress(job_id="j")

    def progress(self) -> object:
        return self._progress


def test_the_planner_moves_once_after_a_change_never_the_pinned_nor_itself() -> None:
    pytest.importorskip("torch")
    from gwtf.node.jobs.coordinator.moves import MovePlanner

    # 3/1 after a death at stage 1: h0 coordinates, h1 is pinned, m0 chose its stage. All are
    # equally fast, so h0 and h1 come before m0 (by id) if they were candidates.
    members = {"h0": (0, True), "h1": (0, False), "m0": (0, True), "a0": (1, False)}
    plan = IterationCoordinator(iterations=5, microbatches=4,
                                participants={n: s for n, (s, _) in members.items()},
                                num_stages=2, holders=("h0", "h1", "m0"))
    coord = _Coord(_Host(members), plan)
    planner = MovePlanner(coord)  # type: ignore[arg-type]

    def step() -> StepOrder:
        for holder, ids in plan.assignment().items():
            plan.done(holder, plan.injecting, plan.round, ids)
        order = plan.commit_order()
        assert order is not None
        out = None
        for node, stage in sorted(order.members.items()):
            ids = frozenset(range(4))
            mine = ids if stage == 1 else frozenset(plan.assignment().get(node, ()))
            out = plan.prepared(PreparedReport(
                node, order.iteration, order.round, order.attempt, stage, mine,
                losses={m: 1.0 for m in ids} if stage == 1 else {},
                routes={("h0", "a0"): 4} if stage == 1 else {}))
        assert isinstance(out, StepOrder)
        return out

    first = step()
    assert planner.weigh(first) is first  # nothing changed since the job began
    planner.swarm_changed()
    moved = planner.weigh(step())
    assert (moved.mover, moved.mover_from, moved.move_to) == ("m0", 0, 1)
    record = planner.message(moved)
    assert record is not None and (record.node, record.stage, record.iteration) == ("m0", 1, 1)
    assert record.flow == pytest.approx(20.0) and record.gain > 0
    assert list(coord.progress().moves) == [record]  # type: ignore[attr-defined]
    # A change while the move is under way: no second move until the mover entered.
    planner.swarm_changed()
    again = step()
    assert planner.weigh(again) is again and planner.message(again) is None
    planner.entered("m0", 1)
    assert planner.pending is None and planner.changed
