"""Each simulated node's pace (docs/design.md 2.13, 5): the same `gwtf.flow.pace.Pace` the node
keeps, fed with the simulated compute items as they end; when a pace is due, `publish` puts it
in the node's record (the simulation's `set_record`, and the policy's `on_record`: gwtf gossips
the new revision as the node does). Only for the policies that follow paces (`paced`)."""

from __future__ import annotations

from collections.abc import Callable

from gwtf.flow.pace import Pace
from gwtf.sim.entities import J_BWD, J_FUSED, SimNode

__all__ = ["Paces"]


class Paces:
    """The nodes' paces in one simulation."""

    def __init__(
        self, clock: Callable[[], float], publish: Callable[[SimNode, float], None]
    ) -> None:
        self._clock = clock
        self._publish = publish
        self.publications = 0

    def sample(self, node: SimNode, kind: int, duration: float) -> None:
        """A compute job of `kind` ended at `node` after `duration` seconds. A forward and
        backward run as one (the last stage, replays) are a third and two thirds of it, as the
        node's items are."""
        pace = node.pace
        if pace is None:
            pace = node.pace = Pace(node.record_s, self._clock)
        if kind == J_BWD:
            pace.observe("backward", duration)
        elif kind == J_FUSED:
            pace.observe("forward", duration / 3)
            pace.observe("backward", duration - duration / 3)
        else:
            pace.observe("forward", duration)
        due = pace.due()
        if due is not None:
            pace.publish(due)
            self.publications += 1
            self._publish(node, due)
