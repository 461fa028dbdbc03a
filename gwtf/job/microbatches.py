"""A stage's microbatch table for the iteration in progress, and the rules a microbatch that
arrives must pass (docs/design.md 1, 3.7 and 4), pure.

`MicrobatchTable` is what one node knows of the iteration it works on: which microbatches it
injects (a data holder), which forwards and gradients came and from whom, each microbatch's path
and mode, and the losses and routes the last stage reports. The node's worker
(gwtf.node.worker.worker) keeps one per iteration and round, and forgets it at each step and
restart; the I/O it adds (the tensors it keeps for a resend, the tasks and events of the
microbatches in flight) stays there.

`tag_problem` is the check of an incoming microbatch's tag against the job's shape and its
participants, and `MicrobatchTable.too_far` the check of its iteration and round: both answer why a
microbatch must be refused (one sentence) or None, and the node answers the sender with it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gwtf.recovery import Mode

__all__ = ["MicrobatchTable", "StageRole", "Tag", "tag_problem"]


@dataclass
class MicrobatchTable:
    """What this node holds of the iteration in progress (reset at each step and restart)."""

    number: int
    round: int = 0
    mine: tuple[int, ...] = ()
    """Holders: the microbatches this node injects."""
    finished: set[int] = field(default_factory=set)
    """Holders: microbatches whose gradient came back here."""
    forwards: dict[int, str] = field(default_factory=dict)
    """Microbatches whose forward is here, and who sent it ("" for one this holder built)."""
    backwards: dict[int, str] = field(default_factory=dict)
    """Microbatches whose gradient came here, and who sent it."""
    modes: dict[int, Mode] = field(default_factory=dict)
    recovered: set[int] = field(default_factory=set)
    """Microbatches that came here to redo a dead node's work (any rule)."""
    paths: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The path of each microbatch up to and including this node (the whole path once its
    gradient came; this node's own prefix is kept, a redirect rewrites the stage above)."""
    losses: dict[int, float] = field(default_factory=dict)
    routes: dict[tuple[str, ...], int] = field(default_factory=dict)
    attempt: int = 0
    """The latest commit attempt ordered here."""

    def at(self, iteration: int, round_: int) -> bool:
        """Work of `iteration` in `round_` is this table's."""
        return (iteration, round_) == (self.number, self.round)

    def too_far(self, iteration: int, round_: int) -> str | None:
        """Why work of `iteration` in `round_` can never be taken by this node from here on: it
        is over, or more than one iteration ahead (None: now, or once this node gets there, as
        it commits the iteration before or hears of the restart)."""
        if (iteration, round_) < (self.number, self.round):
            return (
                f"iteration {iteration} round {round_} is over here (now at {self.number} "
                f"round {self.round})"
            )
        if iteration > self.number + 1:
            return f"iteration {iteration} is ahead of this node's {self.number}"
        return None


@dataclass(frozen=True)
class StageRole:
    """Who this node is in its job: what an incoming microbatch is checked against."""

    job_id: str
    node_id: str
    stage: int
    num_stages: int
    microbatches: int
    iterations: int

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


class Tag(Protocol):
    """What `tag_problem` reads of a microbatch's tag
    (gwtf.node.dataplane.tensors.MicrobatchTag)."""

    @property
    def iteration(self) -> int: ...

    @property
    def microbatch(self) -> int: ...

    @property
    def direction(self) -> str: ...

    @property
    def sender(self) -> str: ...

    @property
    def path(self) -> tuple[str, ...]: ...

    @property
    def mode(self) -> int: ...

    @property
    def downstream(self) -> str: ...


def tag_problem(
    tag: Tag, role: StageRole, participants: Mapping[str, int], excluded: Collection[str]
) -> str | None:
    """Why this node must refuse a microbatch with `tag` (None: it may take it): outside the
    job, from an excluded peer, or with a path, mode or downstream node that does not fit the
    stages of `participants` (node -> stage)."""
    me, stage = role.node_id, role.stage
    if not 0 <= tag.microbatch < role.microbatches:
        return f"microbatch {tag.microbatch} is outside 0..{role.microbatches - 1}"
    if tag.iteration >= role.iterations:
        return f"iteration {tag.iteration} is past the job's last"
    if tag.sender in excluded:
        return f"{tag.sender} was excluded from job {role.job_id} as a bad peer"
    path = tag.path
    if tag.direction == "forward":
        if len(path) != stage or not path or path[-1] != tag.sender:
            return (
                f"a forward to stage {stage} must come from stage {stage - 1} with a path of "
                f"{stage} nodes ending at its sender"
            )
        if role.is_last:
            # Forward and backward are one step here: a replay needs no next stage, and there
            # is nothing to recompute apart.
            if tag.mode == Mode.RECOMPUTE or tag.downstream:
                return (
                    f"the last stage replays microbatch {tag.microbatch} whole: no recompute "
                    "and no downstream node"
                )
        elif tag.mode != Mode.FORWARD and participants.get(tag.downstream) != stage + 1:
            return (
                f"a recompute or replay of microbatch {tag.microbatch} must name its "
                f"stage-{stage + 1} node"
            )
        elif tag.mode == Mode.FORWARD and tag.downstream:
            return "an ordinary forward names no downstream node"
    elif len(path) != role.num_stages or path[stage] != me or path[stage + 1] != tag.sender:
        return (
            f"a backward to {me} must carry the microbatch's whole path, with {me} at stage "
            f"{stage} and the sender after it"
        )
    for index, hop in enumerate(path):
        if participants.get(hop) != index:
            return f"{hop} is not a stage-{index} node of job {role.job_id}"
    return None
