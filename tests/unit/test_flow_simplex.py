"""gwtf.flow.simplex gives networkx's answers exactly (docs/design.md 2.12): the same flow dict
as `nx.max_flow_min_cost`, ties included, the same maximum flow value, and the same errors; on
random graphs and on the networks the local solve and the oracle build."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest

from gwtf.flow import localsolve, oracle, simplex
from gwtf.flow.balance import JOB_OBJECTIVE
from gwtf.flow.generate import geo10, geo10_members


def _random_graph(rng: random.Random) -> nx.DiGraph:
    """Integer weights (some negative) and capacities (some 0, some absent: infinite), arcs
    from the source and into the sink, self-loops and nodes off any path."""
    n = rng.randrange(2, 30)
    graph = nx.DiGraph()
    graph.add_node("s")
    for _ in range(rng.randrange(1, 150)):
        u = "s" if rng.random() < 0.1 else rng.randrange(n)
        v = "t" if rng.random() < 0.1 else rng.randrange(n)
        attrs: dict[str, int] = {
            "weight": rng.choice([0, rng.randrange(20), rng.randrange(-5, 100)])
        }
        if rng.random() < 0.8:
            attrs["capacity"] = rng.choice([0, rng.randrange(1, 10), rng.randrange(1, 10**6)])
        graph.add_edge(u, v, **attrs)
    graph.add_node("t")
    return graph


def _outcome(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except nx.NetworkXException as exc:
        return type(exc).__name__


@pytest.fixture(params=["lists", "numpy"])
def search(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both entering-arc searches: over Python lists, and vectorised (every network at least
    VECTOR_ARCS arcs)."""
    monkeypatch.setattr(simplex, "VECTOR_ARCS", 10**9 if request.param == "lists" else 0)
    return str(request.param)


def test_random_graphs_match_networkx(search: str) -> None:
    outcomes: dict[str, int] = {}
    for seed in range(600):
        graph = _random_graph(random.Random(seed))
        theirs = _outcome(lambda g=graph: nx.max_flow_min_cost(
            g, "s", "t", capacity="capacity", weight="weight"))
        ours = _outcome(lambda g=graph: simplex.max_flow_min_cost(g, "s", "t"))
        # repr: a negative cycle of infinite capacity can leave nan flows in networkx's answer
        # without an error (inf - inf), and nan never equals itself.
        assert repr(ours) == repr(theirs), seed
        kind = theirs if isinstance(theirs, str) else "solved"
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if kind == "solved":
            assert simplex.max_flow_value(graph, "s", "t") == nx.maximum_flow_value(
                graph, "s", "t", capacity="capacity")
    # Both kinds occur: solved flows, and the unbounded ones (negative cycles of infinite
    # capacity, infinite source-sink paths).
    assert outcomes["solved"] > 300
    assert outcomes.get("NetworkXUnbounded", 0) > 10


def test_demands_and_float_weights_match_networkx(search: str) -> None:
    rng = random.Random(7)
    for _ in range(100):
        graph = _random_graph(rng)
        for u, v in graph.edges:
            graph[u][v]["capacity"] = graph[u][v].get("capacity", 50)
            graph[u][v]["weight"] = abs(graph[u][v]["weight"])
        if rng.random() < 0.3:  # a float weight: networkx itself answers
            u, v = next(iter(graph.edges))
            graph[u][v]["weight"] = 0.5
        demand = {"s": -3, "t": 3}
        copy = nx.DiGraph(graph)
        for node, d in demand.items():
            copy.add_node(node, demand=d)
        theirs = _outcome(lambda c=copy: nx.min_cost_flow(c, capacity="capacity",
                                                          weight="weight"))
        ours = _outcome(lambda g=graph, d=demand: simplex.min_cost_flow(g, d))
        assert repr(ours) == repr(theirs)


def test_huge_capacities_go_to_networkx_and_agree() -> None:
    graph = nx.DiGraph()
    graph.add_edge("s", "a", capacity=2**62, weight=1)
    graph.add_edge("a", "t", capacity=2**61, weight=2)
    graph.add_edge("s", "t", capacity=5, weight=9)
    assert simplex.max_flow_min_cost(graph, "s", "t") == nx.max_flow_min_cost(
        graph, "s", "t", capacity="capacity", weight="weight")


def test_network_keeps_digraph_order() -> None:
    """A Network and a DiGraph built by the same calls list the same nodes and arcs in the same
    order (the simplex numbers them in that order)."""
    rng = random.Random(3)
    ours, theirs = simplex.Network(), nx.DiGraph()
    ours.add_node("s")
    theirs.add_node("s")
    for _ in range(300):
        u, v = rng.randrange(40), rng.randrange(40)
        data = {"weight": rng.randrange(9)} if rng.random() < 0.5 else {"capacity": 3}
        ours.add_edge(u, v, **data)
        theirs.add_edge(u, v, **data)
    assert list(ours) == list(theirs)
    assert list(ours.edges(data=True)) == list(theirs.edges(data=True))
    assert 5 in ours and "x" not in ours


def test_missing_or_equal_ends_are_refused() -> None:
    graph = nx.DiGraph([("s", "t")])
    with pytest.raises(nx.NetworkXError, match="not in graph"):
        simplex.max_flow_value(graph, "s", "x")
    with pytest.raises(nx.NetworkXError, match="same node"):
        simplex.max_flow_value(graph, "s", "s")


@pytest.mark.parametrize(("nodes", "stages", "seed"), [(40, 4, 0), (64, 4, 1), (100, 5, 2)])
def test_local_solve_and_oracle_networks_match_networkx(
    nodes: int, stages: int, seed: int, search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flows of the local solve (least cost and the jobs' headroom objective) and of the
    oracle are those networkx's own max_flow_min_cost gives."""
    members = geo10_members(np.random.default_rng(seed), nodes, stages)
    topology = geo10(np.random.default_rng(seed), nodes, stages)
    ours = [localsolve.solve_members(members, balance=b) for b in (None, JOB_OBJECTIVE)]
    ours_oracle = oracle.solve_oracle(topology, balance=JOB_OBJECTIVE)

    def networkx_solver(graph: nx.DiGraph, source: object, sink: object) -> object:
        return nx.max_flow_min_cost(simplex.as_digraph(graph), source, sink,
                                    capacity="capacity", weight="weight")

    monkeypatch.setattr(localsolve, "max_flow_min_cost", networkx_solver)
    monkeypatch.setattr(oracle, "max_flow_min_cost", networkx_solver)
    theirs = [localsolve.solve_members(members, balance=b) for b in (None, JOB_OBJECTIVE)]
    assert ours == theirs
    assert ours[0].flows and ours[1].flows != {}
    assert oracle.solve_oracle(topology, balance=JOB_OBJECTIVE) == ours_oracle
