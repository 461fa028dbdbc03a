"""A node's pace: the seconds its stage takes per microbatch, measured on every microbatch it
computes, and the rule that decides when the routing hears of a change (docs/design.md 2.13).

The routing solves for the capacities in the members' records (`compute_s`, capacity
`1 / compute_s`). A record that is told once, at start, is wrong as soon as the machine drifts:
a volunteer's GPU shared with a game, a laptop that throttles, a noisy cloud neighbour. So every
compute item a node runs is a sample, and the record follows the samples:

- *Estimate.* The last `window` durations of each kind of item (a microbatch's forward, its
  backward, each while the process ran) are kept; the pace is the sum of the two medians over
  the share of the time the process runs at all (`availability`, 1 unless the driver says: a
  process stopped and continued, or whose host takes its CPU for stretches, does its items at
  full speed in between, and a microbatch that arrives while it is stopped waits in its
  sender's call, where no item of its own can see it). A median moves only when more than half
  of its window moved, so one slow item (a page fault, a garbage collection, a neighbour's
  burst) never moves it, and `window // 2 + 1` consecutive samples of a new speed always do:
  with the default 9, five microbatches after a change the estimate is the new speed. The
  spread is the median absolute deviation of the samples around their median, relative to it:
  how noisy the machine is.
- *Hysteresis.* The estimate reaches the record only when it differs from the pace the record
  says by at least `factor` (1.5: either way, the record off by more than half or by a third):
  a solve moves flows swarm-wide and costs every member a solve, and capacities off by less
  cost the flows little (`gwtf.flow.balance` keeps a stage's nodes below their capacities by
  headroom). A machine whose noise reaches the band is held off by the next two rules.
- *Persistence.* The estimate must stay out of the band, on the same side, for `persist_s`
  (2 s) before it is told: a burst of load on a shared machine that moves the median of nine
  for a moment (seen with two test swarms on two cores, the spread near 30%) is not a slower
  node, and two seconds are little against the minutes a slowdown lasts.
- *Hold.* A publication that goes back the way the one before it came (slower then faster
  again, or the reverse) is at least `hold_s` after it; one that goes on the same way (a
  slowdown told while it was still deepening, then its full depth) needs the persistence only,
  for publications that all go one way move the record 1.5 times each and so are few. A
  reversal within two holds doubles the hold (a slowdown that lasts longer, and its recovery,
  do not), up to `max_hold_s`, and a quiet
  spell of twice that brings it back to `hold_s` (a flapping node held at the longest hold publishes
  every `max_hold_s`, never quiet). A node whose speed oscillates around the band publishes a few
  times, then ever more rarely: the swarm re-solves at most once per hold for it, and never in step
  with the oscillation.

How fast: the first publication follows a change by about `window // 2 + 1` microbatches of
the node (at a quarter of a 0.08 s node's speed, 5 x 0.32 s = 1.6 s) and the persistence (2 s),
then the record's gossip (a second or so, docs/design.md 3.4) and the quiet spell of the local
solve (`route_quiet_s`), a few seconds in all: well inside the minutes to hours that fail-slows last
(docs/results/stragglers.md). A node the flows stop feeding stops measuring, so a slowed node
keeps a share in proportion to its capacity (`gwtf.flow.balance`'s headroom loads every node of
a stage alike) and so sees its recovery.

Pure and deterministic: samples in, a decision out, the clock injected.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "PACE_FACTOR",
    "PACE_HOLD_S",
    "PACE_MAX_HOLD_S",
    "PACE_WINDOW",
    "Pace",
    "PaceConfig",
    "PaceWindow",
]

PACE_WINDOW = 9
"""Samples of each kind kept: the median moves after five samples of a new speed, never after
four outliers."""

PACE_FACTOR = 1.5
"""How far the estimate must be from the record's pace, as a factor either way, to be told."""

PACE_HOLD_S = 5.0
"""Least seconds between two publications of one node: about one solve's quiet spell and its
gossip, several times over."""

PACE_MAX_HOLD_S = 80.0
"""The longest a flapping node's hold grows to (five doublings of `PACE_HOLD_S`)."""

PACE_PERSIST_S = 2.0
"""How long the estimate must stay out of the band before it is told."""

MIN_AVAILABILITY = 0.05
"""The least share of the time a process is taken to run (a pace at most 20x its work's)."""

KINDS = ("forward", "backward")


@dataclass(frozen=True, slots=True)
class PaceConfig:
    """How a node follows its pace (module doc)."""

    window: int = PACE_WINDOW
    factor: float = PACE_FACTOR
    hold_s: float = PACE_HOLD_S
    max_hold_s: float = PACE_MAX_HOLD_S
    persist_s: float = PACE_PERSIST_S

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("the pace window needs at least one sample")
        if not self.factor > 1.0:
            raise ValueError("the pace factor must be above 1")
        if not 0 <= self.hold_s <= self.max_hold_s:
            raise ValueError("the pace hold must be between 0 and its maximum")
        if self.persist_s < 0:
            raise ValueError("the pace persistence must not be negative")


class PaceWindow:
    """The last `size` durations of one kind of item."""

    __slots__ = ("_samples",)

    def __init__(self, size: int) -> None:
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self._samples.append(seconds)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def full_enough(self) -> bool:
        """A majority of a full window: the median is a measured speed, not a first guess."""
        maxlen = self._samples.maxlen or 1
        return len(self._samples) >= maxlen // 2 + 1

    def median(self) -> float:
        ordered = sorted(self._samples)
        n = len(ordered)
        if n == 0:
            return math.nan
        mid = n // 2
        return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def spread(self) -> float:
        """The median absolute deviation, relative to the median (0 for a steady machine)."""
        centre = self.median()
        if not centre > 0:
            return 0.0
        deviations = sorted(abs(s - centre) for s in self._samples)
        n = len(deviations)
        mid = n // 2
        mad = deviations[mid] if n % 2 else (deviations[mid - 1] + deviations[mid]) / 2
        return mad / centre


class Pace:
    """One node's pace: samples in (`observe`), the value to publish out (`due`)."""

    def __init__(
        self,
        published_s: float,
        clock: Callable[[], float],
        config: PaceConfig = PaceConfig(),
    ) -> None:
        if not published_s > 0:
            raise ValueError("a pace is a positive number of seconds")
        self.config = config
        self.published_s = published_s
        """The pace the node's record says (what the routing solved for)."""
        self.declared_s = published_s
        """The pace the node entered with (declared, or its warm-up's)."""
        self._clock = clock
        self._windows = {kind: PaceWindow(config.window) for kind in KINDS}
        self.availability = 1.0
        """The share of the time the process runs at all (`set_availability`)."""
        self._hold_s = config.hold_s
        self._last_at: float | None = None
        self._last_direction = 0
        self._out: tuple[int, float] | None = None
        """(side, since when) the estimate has been out of the band."""
        self.publications = 0

    def observe(self, kind: str, seconds: float) -> None:
        """A compute item of `kind` ("forward" or "backward") took `seconds`."""
        window = self._windows.get(kind)
        if window is not None:
            window.add(seconds)

    def set_availability(self, share: float) -> None:
        """The process ran `share` of the recent time (the node's stall watcher); at least
        `MIN_AVAILABILITY`, so that one long stop does not make the pace unbounded."""
        self.availability = min(1.0, max(MIN_AVAILABILITY, share))

    def estimate(self) -> float | None:
        """Seconds per microbatch now: the sum of the medians over the availability, once each
        kind has a majority of its window (None before)."""
        if not all(w.full_enough for w in self._windows.values()):
            return None
        return sum(w.median() for w in self._windows.values()) / self.availability

    def spread(self) -> float:
        """The larger relative spread of the two kinds (module doc)."""
        return max(w.spread() for w in self._windows.values())

    def live_s(self) -> float:
        """The estimate, or the record's pace while there is none: what a sender should expect
        of this node now (`gwtf.job.nexthop.live_weights`)."""
        estimate = self.estimate()
        return self.published_s if estimate is None else estimate

    def due(self) -> float | None:
        """The pace to put in the record now, or None: the estimate when it is `factor` away
        from the record's and the hold has passed (module doc)."""
        estimate = self.estimate()
        if estimate is None or not estimate > 0:
            return None
        ratio = estimate / self.published_s
        if 1 / self.config.factor < ratio < self.config.factor:
            self._out = None
            return None
        now = self._clock()
        side = 1 if ratio > 1 else -1
        if self._out is None or self._out[0] != side:
            self._out = (side, now)
        if now - self._out[1] < self.config.persist_s:
            return None
        if self._last_at is not None:
            since = now - self._last_at
            if since >= 2 * self.config.max_hold_s:
                self._hold_s = self.config.hold_s
            elif since < self._hold_s and side != self._last_direction:
                return None
        return estimate

    def publish(self, pace_s: float) -> None:
        """The record now says `pace_s` (from `due`)."""
        now = self._clock()
        direction = 1 if pace_s > self.published_s else -1
        if (
            self._last_at is not None
            and direction != self._last_direction
            and now - self._last_at < 2 * self._hold_s
        ):
            self._hold_s = min(2 * self._hold_s, self.config.max_hold_s)
        self._last_at = now
        self._last_direction = direction
        self._out = None
        self.published_s = pace_s
        self.publications += 1

    @property
    def hold_s(self) -> float:
        """The hold in force (it doubles while the node flaps)."""
        return self._hold_s
