"""Fault injection: a node that SIGKILLs itself at one chosen point of a job, for chaos tests.

A test arms it with `gwtf node --fault SPEC` or the environment variable `GWTF_FAULT=SPEC`, read
once at start. SPEC is `crash-in:POINT[:iteration=K][:microbatch=M]`:

- `forward`: while this node runs the forward of microbatch M of iteration K (its output never
  leaves it);
- `backward`: while it runs the backward of M (the gradient came, nothing was accumulated);
- `after-backward`: once it accumulated M's gradient, before it sends the input gradient on (the
  node upstream never hears that the backward finished);
- `aggregation`: during the commit of iteration K, once its gradient sums reached one stage peer
  and before they reach the others;
- `state-transfer`: as a donor, once it streamed the first chunk of its stage's state to a joiner.

Left out, `iteration` and `microbatch` match any. The node kills itself with SIGKILL, as a
preempted machine dies: no goodbye, no cleanup, nothing flushed but what is already written.
Like torchft's `EventInjector.fail_at(rank, step)`, it is a first-class test tool, not a mock: the
rest of the swarm sees a real crash.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

__all__ = ["FAULT_ENV", "POINTS", "Fault", "FaultError", "parse_fault"]

FAULT_ENV = "GWTF_FAULT"
POINTS = ("forward", "backward", "after-backward", "aggregation", "state-transfer")
LOG = logging.getLogger("gwtf.node.faults")


class FaultError(ValueError):
    """A fault spec that does not parse (one sentence)."""


@dataclass(frozen=True)
class Fault:
    """Crash at `point` of iteration `iteration` and microbatch `microbatch` (None: any)."""

    point: str
    iteration: int | None = None
    microbatch: int | None = None

    def matches(self, point: str, iteration: int | None, microbatch: int | None = None) -> bool:
        return (
            point == self.point
            and (self.iteration is None or iteration == self.iteration)
            and (self.microbatch is None or microbatch == self.microbatch)
        )

    def hit(self, point: str, iteration: int | None, microbatch: int | None = None) -> None:
        """SIGKILL this process if the fault is armed for this point."""
        if self.matches(point, iteration, microbatch):
            LOG.warning(
                "fault injected: crash in %s at iteration %s microbatch %s",
                point, iteration, microbatch,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def parse_fault(spec: str) -> Fault:
    """`crash-in:POINT[:iteration=K][:microbatch=M]`; FaultError if it is anything else."""
    parts = spec.strip().split(":")
    if len(parts) < 2 or parts[0] != "crash-in":
        raise FaultError(
            f"fault {spec!r} must read crash-in:POINT[:iteration=K][:microbatch=M], "
            f"POINT one of {', '.join(POINTS)}"
        )
    point = parts[1]
    if point not in POINTS:
        raise FaultError(f"fault point {point!r} is not one of {', '.join(POINTS)}")
    values: dict[str, int] = {}
    for part in parts[2:]:
        name, sep, value = part.partition("=")
        if not sep or name not in ("iteration", "microbatch") or name in values:
            raise FaultError(f"fault {spec!r}: {part!r} is not iteration=K or microbatch=M")
        try:
            number = int(value)
        except ValueError:
            raise FaultError(f"fault {spec!r}: {value!r} is not a whole number") from None
        if number < 0:
            raise FaultError(f"fault {spec!r}: {name} must not be negative")
        values[name] = number
    return Fault(point, values.get("iteration"), values.get("microbatch"))
