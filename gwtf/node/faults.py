"""Fault injection: a node that SIGKILLs itself at one chosen point of a job, or that poisons its
stage, for chaos tests.

A test arms it with `gwtf node --fault SPEC` or the environment variable `GWTF_FAULT=SPEC`, read
once at start. SPEC is `crash-in:POINT[:iteration=K][:microbatch=M]` or
`poison:WHAT[:scale=S][:from=K]`. A crash point is one of:

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

A poisoning node keeps running and lies to its stage peers:

- `poison:gradients`: from iteration K on (default 0), the gradient sums it sends to its stage
  peers at every commit are its true sums times S (default 1e4; `nan` or `inf` send non-finite
  sums); it keeps the true ones for its own step, as a node that wants to push the others off
  course would;
- `poison:weights`: once it stepped iteration K (default 0), it adds noise of relative size S
  (default 1e-2) to its stage's parameters, as a node whose memory went bad: its checksum no
  longer matches its stage peers'.

A slow node, `slow:state-transfer[:seconds=S]`, is a donor behind a thin uplink: once it
streamed the first chunk of its stage's state to a joiner, it waits S seconds (default 5) before
the rest, so that the state arrives stale by the steps taken meanwhile (docs/design.md 3.8).

A straggler, `slow:compute:factor=F[:from=K][:until=K2]`, takes F times longer over its stage
work (F > 0; below 1 it is faster) from iteration K (default 0) until iteration K2 (excluded;
default: for ever), as a GPU shared with another program or a throttling laptop: with emulated
compute its padding is F times longer, otherwise it sleeps F - 1 times what the work took. The
node is not told (it measures its own pace as any node does, docs/design.md 2.13).
`slow:link:factor=F[:peer=ID][:from=K][:until=K2]` makes its data-plane sends to ID (any peer,
left out) take F times longer in the emulated WAN, as an uplink shared with a video call.

Like torchft's `EventInjector.fail_at(rank, step)`, it is a first-class test tool, not a mock: the
rest of the swarm sees a real crash.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from dataclasses import dataclass

__all__ = ["FAULT_ENV", "POINTS", "POISONS", "SLOW", "Fault", "FaultError", "parse_fault"]

FAULT_ENV = "GWTF_FAULT"
POINTS = ("forward", "backward", "after-backward", "aggregation", "state-transfer")
POISONS = {"gradients": 1e4, "weights": 1e-2}
"""What a poisoning node corrupts, and the default scale."""
SLOW = ("state-transfer", "compute", "link")
"""Where a slow node waits (`state-transfer`) or what it is slow at (`compute`, `link`)."""
LOG = logging.getLogger("gwtf.node.faults")


class FaultError(ValueError):
    """A fault spec that does not parse (one sentence)."""


@dataclass(frozen=True)
class Fault:
    """Crash at `point` of iteration `iteration` and microbatch `microbatch` (None: any); or,
    with `poison` set (point ""), poison `poison` by `scale` from iteration `start` on."""

    point: str
    iteration: int | None = None
    microbatch: int | None = None
    poison: str = ""
    scale: float = 0.0
    start: int = 0
    slow: str = ""
    """The point this node is slow at (`slow:POINT`): `scale` seconds each time at a point, or
    `scale` times longer for `compute` and `link` from iteration `start` until `until`."""
    until: int | None = None
    peer: str = ""
    """`slow:link`: the peer whose sends are slow ("": every peer)."""

    def gradient_scale(self, iteration: int) -> float | None:
        """The factor on the gradient sums sent to stage peers at `iteration` (None: honest)."""
        if self.poison == "gradients" and iteration >= self.start:
            return self.scale
        return None

    def weight_noise(self, iteration: int) -> float | None:
        """The relative noise to add to the stage's parameters once `iteration` stepped."""
        if self.poison == "weights" and iteration == self.start:
            return self.scale
        return None

    def delay_s(self, point: str) -> float:
        """Seconds a slow node waits at `point` (0: none)."""
        return self.scale if self.slow == point == "state-transfer" else 0.0

    def slowdown(self, what: str, iteration: int, peer: str = "") -> float:
        """How many times longer `what` ("compute", "link" to `peer`) takes at `iteration`
        (1: as fast as it is)."""
        if self.slow != what or iteration < self.start:
            return 1.0
        if self.until is not None and iteration >= self.until:
            return 1.0
        if what == "link" and self.peer and peer != self.peer:
            return 1.0
        return self.scale

    def matches(self, point: str, iteration: int | None, microbatch: int | None = None) -> bool:
        return (
            bool(self.point)
            and point == self.point
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


def _poison(spec: str, parts: list[str]) -> Fault:
    what = parts[1]
    if what not in POISONS:
        raise FaultError(f"poison {what!r} is not one of {', '.join(POISONS)}")
    scale = POISONS[what]
    start = 0
    seen: set[str] = set()
    for part in parts[2:]:
        name, sep, value = part.partition("=")
        if not sep or name not in ("scale", "from") or name in seen:
            raise FaultError(f"fault {spec!r}: {part!r} is not scale=S or from=K")
        seen.add(name)
        if name == "scale":
            try:
                scale = float(value)
            except ValueError:
                raise FaultError(f"fault {spec!r}: {value!r} is not a number") from None
            if scale == 0 or (what == "weights" and not math.isfinite(scale)):
                raise FaultError(
                    f"fault {spec!r}: scale must not be 0 (and be finite for weights)"
                )
        else:
            try:
                start = int(value)
            except ValueError:
                raise FaultError(f"fault {spec!r}: {value!r} is not a whole number") from None
            if start < 0:
                raise FaultError(f"fault {spec!r}: from must not be negative")
    return Fault("", poison=what, scale=scale, start=start)


def _slower(spec: str, parts: list[str]) -> Fault:
    """`slow:compute:...` and `slow:link:...` (module doc)."""
    what = parts[1]
    allowed = ("factor", "from", "until") + (("peer",) if what == "link" else ())
    values: dict[str, str] = {}
    for part in parts[2:]:
        name, sep, value = part.partition("=")
        if not sep or name not in allowed or name in values:
            raise FaultError(
                f"fault {spec!r}: {part!r} is not one of " + ", ".join(f"{a}=" for a in allowed)
            )
        values[name] = value
    if "factor" not in values:
        raise FaultError(f"fault {spec!r}: slow:{what} needs factor=F")
    try:
        factor = float(values["factor"])
    except ValueError:
        raise FaultError(f"fault {spec!r}: {values['factor']!r} is not a number") from None
    if not 0 < factor < math.inf:
        raise FaultError(f"fault {spec!r}: factor must be positive and finite")
    bounds: dict[str, int] = {}
    for name in ("from", "until"):
        if name in values:
            try:
                bounds[name] = int(values[name])
            except ValueError:
                raise FaultError(
                    f"fault {spec!r}: {values[name]!r} is not a whole number"
                ) from None
            if bounds[name] < 0:
                raise FaultError(f"fault {spec!r}: {name} must not be negative")
    start, until = bounds.get("from", 0), bounds.get("until")
    if until is not None and until <= start:
        raise FaultError(f"fault {spec!r}: until must come after from")
    return Fault("", slow=what, scale=factor, start=start, until=until,
                 peer=values.get("peer", ""))


def _slow(spec: str, parts: list[str]) -> Fault:
    if parts[1] not in SLOW:
        raise FaultError(f"slow point {parts[1]!r} is not one of {', '.join(SLOW)}")
    if parts[1] in ("compute", "link"):
        return _slower(spec, parts)
    seconds = 5.0
    if len(parts) > 3 or (len(parts) == 3 and not parts[2].startswith("seconds=")):
        raise FaultError(f"fault {spec!r}: only seconds=S may follow the point")
    if len(parts) == 3:
        try:
            seconds = float(parts[2].removeprefix("seconds="))
        except ValueError:
            raise FaultError(f"fault {spec!r}: {parts[2]!r} is not seconds=S") from None
        if not 0 < seconds < math.inf:
            raise FaultError(f"fault {spec!r}: seconds must be positive and finite")
    return Fault("", slow=parts[1], scale=seconds)


def parse_fault(spec: str) -> Fault:
    """`crash-in:POINT[:iteration=K][:microbatch=M]`, `poison:WHAT[:scale=S][:from=K]`,
    `slow:state-transfer[:seconds=S]`, `slow:compute:factor=F[:from=K][:until=K2]` or
    `slow:link:factor=F[:peer=ID][:from=K][:until=K2]`; FaultError if it is anything else."""
    parts = spec.strip().split(":")
    if len(parts) >= 2 and parts[0] == "poison":
        return _poison(spec, parts)
    if len(parts) >= 2 and parts[0] == "slow":
        return _slow(spec, parts)
    if len(parts) < 2 or parts[0] != "crash-in":
        raise FaultError(
            f"fault {spec!r} must read crash-in:POINT[:iteration=K][:microbatch=M], "
            f"POINT one of {', '.join(POINTS)}, poison:WHAT[:scale=S][:from=K], WHAT one "
            f"of {', '.join(POISONS)}, slow:state-transfer[:seconds=S], "
            f"slow:compute:factor=F[:from=K][:until=K2] or "
            f"slow:link:factor=F[:peer=ID][:from=K][:until=K2]"
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
