"""A node to start on this machine: what `gwtf launch`, its churn replay and the demo start."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodePlan"]


@dataclass(frozen=True)
class NodePlan:
    id: str
    stage: int
    location: str
    compute_s: float
