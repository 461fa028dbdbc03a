"""Who takes part in a running job, and who stands in for whom, pure (docs/design.md 3.7, 4.5,
4.6).

A job's participants map node ids to stages; stage 0's participants are its data holders.
Nodes that died, left or were excluded are `departed`, and `alive` says whether this node sees a
member alive now (the node asks its member table; a test asks a set). These rules are what the
node decides from them:

    nodes_by_stage   the nodes a submission finds per stage (a job needs one in every stage)
    start_fits       a Start's holders, weights and coordinator agree with its participants
    weights_fit      holder weights (a Step's, a Restart's) agree with their holders
    live_holders     the holders that may coordinate, in order of succession (4.5)
    orphaned         no live holder is left: the job waits for one to join (rule 5)
    last_replica     this node is the last live replica of its stage (4.6: it backs its state up)
    flow_to_stage    a holder's flow units to the job's next-stage participants (the
                     coordinator weights the holders' shares by them)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

__all__ = [
    "MAX_WEIGHT",
    "flow_to_stage",
    "last_replica",
    "live_holders",
    "nodes_by_stage",
    "orphaned",
    "start_fits",
    "weights_fit",
]


MAX_WEIGHT = 2**40
"""Largest holder weight accepted (flow units; far above any real flow)."""


def nodes_by_stage(members: Iterable[tuple[str, int]], num_stages: int) -> dict[int, list[str]]:
    """The members' ids per stage, every stage of the swarm present (an empty list: no node)."""
    found: dict[int, list[str]] = {s: [] for s in range(num_stages)}
    for node, stage in members:
        found.setdefault(stage, []).append(node)
    return found


def weights_fit(holders: Sequence[str], weights: Sequence[int]) -> bool:
    """No weights (equal shares), or one per holder, none over MAX_WEIGHT."""
    return not ((weights and len(weights) != len(holders)) or any(w > MAX_WEIGHT for w in weights))


def start_fits(
    participants: Mapping[str, int],
    holders: Sequence[str],
    weights: Sequence[int],
    coordinator: str,
    num_stages: int,
) -> bool:
    """The holders are stage-0 participants, the coordinator is one of them, the weights fit
    the holders, and every stage of the swarm has a participant."""
    return not (
        not holders
        or not weights_fit(holders, weights)
        or any(participants.get(h) != 0 for h in holders)
        or coordinator not in holders
        or set(participants.values()) != set(range(num_stages))
    )


def live_holders(
    participants: Mapping[str, int], departed: Collection[str], alive: Callable[[str], bool]
) -> list[str]:
    """The holders that have not departed and are alive, by id: the first coordinates."""
    return sorted(
        p for p, s in participants.items() if s == 0 and p not in departed and alive(p)
    )


def orphaned(
    participants: Mapping[str, int], departed: Collection[str], alive: Callable[[str], bool]
) -> bool:
    """Every data holder of the job died or left (a stage-0 joiner may take it over)."""
    return not any(
        s == 0 and p not in departed and alive(p) for p, s in participants.items()
    )


def last_replica(
    participants: Mapping[str, int],
    departed: Collection[str],
    stage: int,
    me: str,
    alive: Callable[[str], bool],
) -> bool:
    """No participant of `stage` but `me` is left alive."""
    return not any(
        s == stage and p != me and p not in departed and alive(p)
        for p, s in participants.items()
    )


def flow_to_stage(
    routes: Mapping[str, int], participants: Mapping[str, int], departed: Collection[str],
    stage: int = 1,
) -> int:
    """The flow units of `routes` to the participants of `stage` that have not departed."""
    return sum(
        units for peer, units in routes.items()
        if participants.get(peer) == stage and peer not in departed
    )
