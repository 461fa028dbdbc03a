"""FlowDriver over an in-memory network that loses calls and replies: the same flows as the oracle.

The harness plays the node's part without gRPC: tails own their arcs (announced to heads), each
peer pair has at most one call in flight, a lost call is retried, a lost *reply* makes the sender
retry what was already merged (a duplicate), and the coordinator's waves end the phases.
"""

from __future__ import annotations

import numpy as np
import pytest

from gwtf.flow.generate import geo10, random_layered
from gwtf.flow.oracle import solve_oracle
from gwtf.flow.relax.bus import flow_config
from gwtf.flow.relax.decentralized import FlowMessage
from gwtf.flow.solution import make_result
from gwtf.flow.topology import LinkSpec, Topology
from gwtf.node.control.driver import ArcAnnounce, FlowDriver, Outgoing
from gwtf.node.control.links import ArcParamsSpec, ring_params
from gwtf.node.control.phases import PhaseDetector


class Harness:
    def __init__(self, topology: Topology, seed: int, loss: float) -> None:
        self.topology = topology
        self.rng = np.random.default_rng(seed)
        self.loss = loss
        self.now = 0.0
        self.config = flow_config(topology)
        self.drivers: dict[str, FlowDriver] = {}
        self.detector = PhaseDetector(topology.num_stages)
        self.calls = 0
        for node in topology.nodes:
            self.add(node.id, warm=False)
        for node in topology.nodes:
            self.link(node.id)

    def clock(self) -> float:
        return self.now

    def add(self, node_id: str, *, warm: bool, epoch: int = 1) -> FlowDriver:
        node = self.topology.node(node_id)
        cmd = self.detector.command
        driver = FlowDriver(
            node_id, node.stage, self.topology.num_stages, node.cap_units, self.config,
            self.clock, epoch=epoch, warm=warm, round_=cmd.round,
            tightens=0 if warm else cmd.tightens,
        )  # fmt: skip
        self.drivers[node_id] = driver
        return driver

    def link(self, node_id: str) -> None:
        """`node_id` creates the arcs it owns, to every live head (as a tail does)."""
        driver = self.drivers[node_id]
        for arc in self.topology.out_arcs(node_id):
            if arc.dst in self.drivers:
                params = ArcParamsSpec(arc.cap_units, arc.cost_units, 0.0, 0.0)
                driver.own_arc(arc.dst, self.drivers[arc.dst].epoch, params, ring=False)
        if driver.stage == self.topology.num_stages - 1:
            for h in self.topology.stage_nodes(0):
                if h in self.drivers:
                    caps = ring_params(
                        self.topology.node(node_id).capacity, self.topology.node(h).capacity
                    )
                    driver.own_arc(h, self.drivers[h].epoch, caps, ring=True)

    def deliver(self, tail: str, ann: ArcAnnounce) -> bool:
        head = self.drivers.get(ann.head)
        if head is None or tail not in self.drivers or ann.head_epoch != head.epoch:
            return False
        head.accept_arc(ann)
        return True

    def run(self, max_steps: int = 100_000) -> None:
        """Calls take 1 to 3 steps, so several are in flight per peer (pipelining) and they
        land out of order; a wave runs when nothing is queued or in flight, or at once when a
        node wants a rescale."""
        flight: list[tuple[int, FlowDriver, Outgoing]] = []
        for step in range(max_steps):
            self.now += 1.0
            for driver in list(self.drivers.values()):
                while ready := driver.ready_peers():
                    for peer in ready:
                        out = driver.take(peer)
                        if out is not None:
                            self.calls += 1
                            flight.append((step + int(self.rng.integers(1, 4)), driver, out))
            due = [f for f in flight if f[0] <= step]
            flight = [f for f in flight if f[0] > step]
            if not due and not flight:
                if self.wave():
                    return
                continue
            for k in self.rng.permutation(len(due)).tolist():
                _, driver, out = due[k]
                self.land(driver, out)
            if any(d.node.wants_rescale() for d in self.drivers.values()):
                self.wave()  # the node nudges its coordinator, which runs a wave at once
        raise AssertionError("no quiescence")

    def land(self, driver: FlowDriver, out: Outgoing) -> None:
        draw = self.rng.random()
        receiver = self.drivers.get(out.peer)
        if draw < self.loss or receiver is None:  # the call is lost
            driver.failed(out)
            return
        ok = all(self.deliver(driver.node_id, a) for a in out.arcs)
        receiver.receive(list(out.messages))
        if draw < 2 * self.loss:  # merged, but the reply is lost: a duplicate follows
            driver.failed(out)
        else:
            driver.delivered(out, accepted=ok)

    def wave(self) -> bool:
        cmd = self.detector.command
        reports = {}
        for node_id, driver in self.drivers.items():
            driver.apply(cmd.round, cmd.tightens)
            reports[node_id] = driver.report(measuring=False, view=0)
        stages = {i: d.stage for i, d in self.drivers.items()}
        return self.detector.observe(reports, stages).done

    def flows(self) -> dict[tuple[str, str], int]:
        return {
            (node_id, peer): units
            for node_id, driver in self.drivers.items()
            for peer, units in driver.routes().items()
        }

    def crash(self, node_id: str) -> None:
        del self.drivers[node_id]
        for driver in self.drivers.values():
            driver.drop_peer(node_id)
        self.topology = self.topology.without_node(node_id)


def assert_oracle(h: Harness) -> None:
    mine = make_result(h.topology, h.flows())
    assert mine.flow_value_units == solve_oracle(h.topology).flow_value_units
    for driver in h.drivers.values():
        assert driver.quiet() and driver.node.final


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lossy_delivery_reaches_the_oracle_flow(seed: int) -> None:
    h = Harness(geo10(np.random.default_rng(seed), 12, 3), seed, loss=0.1)
    h.run()
    assert_oracle(h)


def test_crash_and_join_reconverge_warm() -> None:
    topology = random_layered(np.random.default_rng(5), 10, 3)
    h = Harness(topology, 5, loss=0.05)
    h.run()
    assert_oracle(h)
    victim = topology.stage_nodes(1)[0]
    h.crash(victim)
    h.run()
    assert_oracle(h)
    # The node comes back as a new incarnation and joins warm: its tails re-create their arcs.
    h.topology = topology
    h.add(victim, warm=True, epoch=2)
    h.link(victim)
    for tail in topology.stage_nodes(0):
        h.link(tail)
    h.run()
    assert_oracle(h)


@pytest.mark.parametrize("seed", [0, 1])
def test_re_measured_arcs_are_updated_in_place_and_reconverge(seed: int) -> None:
    # The busiest link between two regions gets slower; each tail over it re-measures its arc
    # and announces a new generation, which its head applies in place, over a lossy network.
    topology = geo10(np.random.default_rng(seed), 12, 3)
    h = Harness(topology, seed, loss=0.1)
    h.run()
    assert_oracle(h)
    per_link: dict[frozenset[str], int] = {}
    for (src, dst), units in h.flows().items():
        pair = frozenset((topology.node(src).location, topology.node(dst).location))
        if len(pair) == 2:
            per_link[pair] = per_link.get(pair, 0) + units
    a, b = sorted(max(per_link, key=lambda p: (per_link[p], sorted(p))))
    old = topology.link_between(a, b)
    assert old is not None
    h.topology = topology.with_link(a, b, LinkSpec(old.rtt_ms * 3, old.bandwidth_gbps / 5))
    gens = {}
    for arc in h.topology.arcs:
        if {h.topology.node(arc.src).location, h.topology.node(arc.dst).location} == {a, b}:
            tail = h.drivers[arc.src]
            params = ArcParamsSpec(arc.cap_units, arc.cost_units, 0.0, 0.0)
            tail.own_arc(arc.dst, h.drivers[arc.dst].epoch, params, ring=False)
            gens[(arc.src, arc.dst)] = tail.owned[arc.dst].gen
    assert gens
    h.run()
    assert_oracle(h)
    for (src, dst), gen in gens.items():
        assert h.drivers[dst].incoming[src] == (1, gen)


def test_the_outbox_keeps_the_latest_state_of_each_arc() -> None:
    h = Harness(random_layered(np.random.default_rng(3), 6, 2), 3, loss=0.0)
    driver = next(iter(h.drivers.values()))
    peer = next(iter(driver.owned))
    base = FlowMessage(driver.node_id, peer, 1, 1, 1, True, 10, 5, 0, 100)
    driver._emit([base, base._replace(price=20, flow=9)])
    out = driver.take(peer)
    assert out is not None
    assert [(m.price, m.flow) for m in out.messages if m.from_tail] == [(20, 9)]
    assert driver.take(peer) is None  # nothing new: the announcement alone is not re-sent
    driver.failed(out)
    again = driver.take(peer)
    assert again is not None and again.messages == out.messages and again.arcs == out.arcs


def test_pipelined_calls_retransmit_only_what_no_newer_call_carries() -> None:
    h = Harness(random_layered(np.random.default_rng(3), 6, 2), 3, loss=0.0)
    driver = next(iter(h.drivers.values()))
    driver.max_inflight = 2
    peer = next(iter(driver.owned))
    base = FlowMessage(driver.node_id, peer, 1, 1, 1, True, 10, 5, 0, 100)
    driver._emit([base])
    first = driver.take(peer)
    driver._emit([base._replace(price=20, flow=9)])
    second = driver.take(peer)
    assert first is not None and second is not None and second.seq > first.seq
    driver._emit([base._replace(price=30, flow=12)])
    assert driver.take(peer) is None  # two calls in flight: the third state waits
    driver.failed(first)  # superseded by the second call: nothing to resend for it
    third = driver.take(peer)
    assert third is not None
    assert [m.flow for m in third.messages if m.from_tail] == [12]
    driver.failed(third)
    driver.failed(second)  # older than the third, which is queued again
    again = driver.take(peer)
    assert again is not None and [m.flow for m in again.messages if m.from_tail] == [12]
    driver.delivered(again, accepted=True)
    assert driver.take(peer) is None  # nothing left for this peer: queued, announced or sent


def test_announcements_are_idempotent_and_refusals_resend() -> None:
    h = Harness(random_layered(np.random.default_rng(4), 4, 2), 4, loss=0.0)
    tail = next(d for d in h.drivers.values() if d.stage == 0)
    head_id = next(iter(p for p, a in tail.owned.items() if not a.ring))
    head = h.drivers[head_id]
    out = tail.take(head_id)
    assert out is not None and len(out.arcs) == 1
    before = head.activity
    head.accept_arc(out.arcs[0])
    head.accept_arc(out.arcs[0])  # a duplicate: nothing changes
    assert head.incoming[tail.node_id] == (1, out.arcs[0].gen)
    assert head.activity == before + 1
    tail.delivered(out, accepted=False)  # refused: announced and sent again
    again = tail.take(head_id)
    assert again is not None and again.arcs == out.arcs
