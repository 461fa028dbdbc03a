"""A heapq discrete-event loop (the shape of microsoft/vidur's simulator).

An event is `(time, kind, id, handler, payload)`: ties are broken by kind (a fixed priority,
below) and then by id, the order in which events were scheduled, so a run is a pure function of
its inputs. A handler gets the payload and returns the new events to schedule as
`(time, kind, handler, payload)` tuples (or None). The simulator's handlers are methods marked
`@returns_events`: the helpers they call `emit` into an `EventSink`, and the handler returns
what was emitted, in order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import Any

__all__ = ["Engine", "EventSink", "Kind", "NewEvent", "returns_events"]


class Kind(IntEnum):
    """Event kinds, in the order they run when they fall at the same time."""

    LINK = 0
    """A link, or a machine's speed, changes (the world before anything reacts to it)."""
    CRASH = 1
    LEAVE = 2
    JOIN = 3
    DETECT = 4
    CONTROL = 5
    TICK = 6
    COMPUTE = 7
    ARRIVE = 8
    INJECT = 9
    ITERATION = 10
    PERIODIC = 11
    SAMPLE = 12


Handler = Callable[[Any], "Iterable[NewEvent] | None"]
NewEvent = tuple[float, Kind, Handler, Any]


class EventSink:
    """Collects the events a handler's helpers create, for the handler to return."""

    def __init__(self) -> None:
        self._out: list[NewEvent] = []

    def emit(self, time: float, kind: Kind, handler: Handler, payload: Any = None) -> None:
        self._out.append((time, kind, handler, payload))

    def take(self) -> list[NewEvent]:
        out, self._out = self._out, []
        return out


def returns_events(
    method: Callable[[Any, Any], None],
) -> Callable[[Any, Any], list[NewEvent]]:
    """Make a method (of an object with a `sink: EventSink`) an engine handler: it runs, and
    returns the events it and its helpers emitted."""

    def handler(self: Any, payload: Any) -> list[NewEvent]:
        method(self, payload)
        sink: EventSink = self.sink
        return sink.take()

    handler.__name__ = method.__name__
    handler.__doc__ = method.__doc__
    return handler


class Engine:
    """The event heap and the clock. `now` only moves forward."""

    __slots__ = ("now", "events", "_heap", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = 0

    def clock(self) -> float:
        return self.now

    def schedule(self, time: float, kind: Kind, handler: Handler, payload: Any = None) -> None:
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, int(kind), self._seq, handler, payload))

    def schedule_all(self, new: Iterable[NewEvent] | None) -> None:
        if new:
            for time, kind, handler, payload in new:
                self.schedule(time, kind, handler, payload)

    def stop(self) -> None:
        """Drop every scheduled event: `run` returns (the simulated job ended)."""
        self._heap.clear()

    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        """Run events with time <= `until` (or until `stop()` is true after an event)."""
        heap = self._heap
        pop = heapq.heappop
        push = heapq.heappush
        while heap and heap[0][0] <= until:
            time, _, _, handler, payload = pop(heap)
            self.now = time
            self.events += 1
            new = handler(payload)
            if new:
                for t, kind, h, p in new:
                    self._seq += 1
                    push(heap, (t if t >= time else time, int(kind), self._seq, h, p))
            if stop is not None and stop():
                return
        if self.now < until and (not heap or heap[0][0] > until):
            self.now = until
