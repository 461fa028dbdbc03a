"""How much of the time this process actually runs: a watcher thread that notices when the
process was not scheduled at all (docs/design.md 2.13).

A node's compute items measure how long its work takes while it runs. A machine busy with
something else may instead not run the node for stretches (a process stopped and continued, a
VM whose host steals its CPU, a laptop that suspends the process): while it is stopped nothing
in it can measure anything, and a microbatch that arrives meanwhile waits in its sender's call,
not in this node's queue. So a thread sleeps `tick_s` at a time and counts any wake-up later
than `gap_s` as time the process was stalled; `availability(window_s)` is the share of the
last `window_s` it was not, and `stalled_between(start, end)` what of a compute item's wall time
was stall, taken off the item (so that an item that spans a stall is not counted twice: once as
a slow item, once as lost availability).

`gap_s` (50 ms) is ten times Python's thread switch interval and above a loaded machine's
scheduling delays (a few to tens of milliseconds with more runnable processes than cores), so
only real stalls count; a stop of a few hundred milliseconds, or a host that takes the CPU for
that long, is seen whole.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["AVAILABILITY_WINDOW_S", "GAP_S", "TICK_S", "StallWatch"]

TICK_S = 0.02
"""How long the watcher sleeps between looks at the clock."""
GAP_S = 0.05
"""A wake-up this much later than asked for counts as a stall (module doc)."""
AVAILABILITY_WINDOW_S = 2.0
"""The window a node's availability is measured over (gwtf.flow.pace): long enough to hold
several stop-and-go cycles of a busy machine (five of 0.4 s), and no longer than the pace's
persistence, so that the estimate a change publishes has settled (with 5 s, a relay that
recovered published a value half way, 0.086 s for its 0.05, which the band then kept)."""
KEEP_S = 120.0
"""Stalls older than this are forgotten (longer than any window asked for)."""


class StallWatch:
    """A daemon thread that counts the stretches the process did not run."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        tick_s: float = TICK_S,
        gap_s: float = GAP_S,
    ) -> None:
        self._clock = clock
        self._tick_s = tick_s
        self._gap_s = gap_s
        self._lock = threading.Lock()
        self._stalls: deque[tuple[float, float]] = deque()
        """(when it ended, seconds stalled), oldest first."""
        self._started = clock()
        self._last = self._started
        """When the watcher last looked at the clock."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="gwtf-stalls",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        clock = self._clock
        last = clock()
        while not self._stop.wait(self._tick_s):
            now = clock()
            late = now - last - self._tick_s
            if late > self._gap_s:
                self.stalled(now, late)
            last = self._last = now

    def stalled(self, at: float, seconds: float) -> None:
        """The process did not run for `seconds` up to `at` (the watcher's, or a test's)."""
        with self._lock:
            self._stalls.append((at, seconds))
            while self._stalls and self._stalls[0][0] < at - KEEP_S:
                self._stalls.popleft()

    def stalled_between(self, start: float, end: float) -> float:
        """Seconds of [start, end] the process was stalled: the stalls the watcher counted,
        and one it has not counted yet (the process was continued a moment ago and the item
        that asks ran on before the watcher woke: it has not looked at the clock since)."""
        with self._lock:
            stalled = 0.0
            for at, seconds in reversed(self._stalls):
                if at <= start:
                    break
                stalled += max(0.0, min(at, end) - max(at - seconds, start))
        pending = end - self._last - self._tick_s
        if self._thread is not None and pending > self._gap_s:
            stalled += max(0.0, end - max(self._last + self._tick_s, start))
        return min(stalled, max(0.0, end - start))

    def availability(self, window_s: float) -> float:
        """The share of the last `window_s` seconds (or of the time since the watch began, if
        shorter) the process ran: 1.0 for a process never stalled."""
        now = self._clock()
        span = min(window_s, now - self._started)
        if span <= 0:
            return 1.0
        with self._lock:
            stalled = 0.0
            for end, seconds in reversed(self._stalls):
                if end < now - span:
                    break
                stalled += min(seconds, end - (now - span))
        return max(0.0, 1.0 - stalled / span)
