"""SWARM's next hops (Ryabinin et al., "SWARM Parallelism", ICML 2023), pure: one implementation
that the node's sender (`gwtf node --routing swarm`, gwtf.node.worker.sender) and the
simulator's `swarm` policies (gwtf.sim.policies) both run.

Where it follows SWARM's public code (`swarm/lib/moe/client/balancer.py` and hivemind's
`utils/performance_ema.py`, which it imports):

- `PerformanceEMA`: an exponential moving average of seconds per sample with the bias correction
  `1 - (1 - alpha)^n`. Concurrent calls count time from `max(call start, last update)`, as
  `update_threadsafe` does, so under concurrency the estimate is the peer's throughput as this
  sender sees it, not one call's latency.
- `SwarmBalancer` (`ExpertBalancer.use_another_expert`): each peer has a virtual "busy until"
  time; a sender takes the peer with the least (ties broken by a random number drawn anew at
  every charge, SWARM's randomisation) and charges it with the expected time of the task:
  `1 / estimated throughput`, or `initial_s` before any measurement. A peer newly seen starts at
  the current least load, so it is tried soon. A peer whose call fails is banned and forgotten
  (its estimate too); SWARM keeps the ban until the peer's DHT record expires, here until a time
  the caller gives (`ban(peer, until)`; forever by default), after which a refresh adds it back
  as new.

Where it cannot follow SWARM, and what stands in (docs/design.md 2.14):

- SWARM's forward call returns once the peer has computed the activation; gwtf's data plane is
  one-way, acknowledged once the receiver took the tensors into a memory slot. The node counts
  a call as ending at the acknowledgement plus the seconds per microbatch the receiver tells in
  it (`DataAck.pace_s`): the wait for a slot carries the receiver's queue, the told pace its
  compute. The simulator ends it when the forward is computed and the answer is back.
- SWARM learns the peers of the next stage from its DHT every 30 s (`update_period`); the
  simulator refreshes every `swarm_refresh_s`, the node adds a job's live next-stage
  participants as soon as its membership knows them (a little more than SWARM sees).
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = ["PerformanceEMA", "SwarmBalancer"]


class _Random(Protocol):
    def random(self) -> float: ...


class PerformanceEMA:
    """Samples per second, by a bias-corrected EMA of seconds per sample (hivemind)."""

    __slots__ = ("alpha", "ema_seconds_per_sample", "num_updates", "samples_per_second",
                 "timestamp")

    def __init__(self, alpha: float = 0.1, now: float = 0.0) -> None:
        self.alpha = alpha
        self.ema_seconds_per_sample = 0.0
        self.num_updates = 0
        self.samples_per_second = 1e-20
        self.timestamp = now

    def update(self, task_size: float, started: float, now: float) -> float:
        """A call that started at `started` answered at `now` (hivemind's update_threadsafe)."""
        interval = max(now - max(started, self.timestamp), 0.0)
        self.timestamp = now
        self.ema_seconds_per_sample = (
            self.alpha * interval / task_size + (1 - self.alpha) * self.ema_seconds_per_sample
        )
        self.num_updates += 1
        adjusted = self.ema_seconds_per_sample / (1 - (1 - self.alpha) ** self.num_updates)
        self.samples_per_second = 1 / max(adjusted, 1e-20)
        return self.samples_per_second


class SwarmBalancer:
    """One sender's view of the next stage: virtual busy times, throughput EMAs, bans."""

    __slots__ = ("alpha", "initial_s", "runtime", "tiebreak", "ema", "banned", "rng")

    def __init__(self, rng: _Random, alpha: float = 0.1, initial_s: float = 1.0) -> None:
        """`rng`: anything with `random()` (numpy's Generator, `random.Random`), seeded by the
        caller so that a run can be replayed."""
        self.alpha = alpha
        self.initial_s = initial_s
        self.runtime: dict[str, float] = {}
        self.tiebreak: dict[str, float] = {}
        self.ema: dict[str, PerformanceEMA] = {}
        self.banned: dict[str, float] = {}
        """Banned peers and the time their ban ends."""
        self.rng = rng

    def add(self, peer: str, now: float) -> None:
        """`peer` is a live peer of the next stage (nothing changes if it is known already, or
        banned until after `now`)."""
        if peer in self.runtime:
            return
        until = self.banned.get(peer)
        if until is not None:
            if until > now:
                return
            del self.banned[peer]
        base = min(self.runtime.values(), default=0.0)
        self.runtime[peer] = base
        self.tiebreak[peer] = float(self.rng.random())
        self.ema[peer] = PerformanceEMA(self.alpha, now)

    def forget(self, peer: str) -> None:
        """`peer` is gone (dead, left, or moved to another stage): no ban, no estimate."""
        self.runtime.pop(peer, None)
        self.tiebreak.pop(peer, None)
        self.ema.pop(peer, None)

    def ban(self, peer: str, until: float = math.inf) -> None:
        """A call to `peer` failed: forgotten, and not added again before `until`."""
        self.banned[peer] = until
        self.forget(peer)

    def unban(self, peer: str) -> None:
        self.banned.pop(peer, None)

    def choose(self, exclude: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The peer with the least expected busy time (but those in `exclude`); charges it with
        this task. None when there is no peer."""
        best: str | None = None
        key = (math.inf, 0.0)
        for peer, runtime in self.runtime.items():
            if peer in exclude:
                continue
            candidate = (runtime, self.tiebreak[peer])
            if candidate < key:
                best, key = peer, candidate
        if best is None:
            return None
        self.runtime[best] = key[0] + self.expected_s(best)
        self.tiebreak[best] = float(self.rng.random())
        return best

    def expected_s(self, peer: str) -> float:
        """The seconds a task is expected to take at `peer`: 1 / its estimated throughput, or
        `initial_s` before its first measurement."""
        ema = self.ema[peer]
        return 1.0 / ema.samples_per_second if ema.num_updates else self.initial_s

    def measured(self, peer: str, started: float, now: float) -> None:
        """A task sent to `peer` at `started` ended at `now`."""
        ema = self.ema.get(peer)
        if ema is not None:
            ema.update(1.0, started, now)
