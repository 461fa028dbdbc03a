"""A node's pace (gwtf.flow.pace, docs/design.md 2.13): measured on every microbatch, robust to
outliers, told to the routing past a hysteresis, and held back when it flaps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtf.flow.pace import PACE_WINDOW, Pace, PaceConfig, PaceWindow

AT_ONCE = PaceConfig(persist_s=0.0)
"""No persistence: what the window and the band do alone."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def feed(pace: Pace, seconds: float, n: int) -> None:
    """`n` microbatches of `seconds` each: a third forward, two thirds backward."""
    for _ in range(n):
        pace.observe("forward", seconds / 3)
        pace.observe("backward", 2 * seconds / 3)


def test_no_estimate_before_a_majority_of_the_window() -> None:
    pace = Pace(0.08, Clock(), AT_ONCE)
    feed(pace, 0.08, PACE_WINDOW // 2)
    assert pace.estimate() is None and pace.due() is None and pace.live_s() == 0.08
    feed(pace, 0.08, 1)
    assert pace.estimate() == pytest.approx(0.08)


def test_a_node_four_times_slower_is_told_after_five_microbatches() -> None:
    clock = Clock()
    pace = Pace(0.08, clock, AT_ONCE)
    feed(pace, 0.08, 20)
    assert pace.due() is None  # steady: nothing to tell
    feed(pace, 0.32, 4)
    assert pace.due() is None  # four of nine: the median has not moved
    feed(pace, 0.32, 1)
    assert pace.due() == pytest.approx(0.32)
    pace.publish(0.32)
    assert pace.published_s == 0.32 and pace.declared_s == 0.08
    clock.now += 10
    feed(pace, 0.08, 5)
    assert pace.due() == pytest.approx(0.08)  # and back


@given(st.lists(st.floats(0.5, 100.0), min_size=1, max_size=(PACE_WINDOW - 1) // 2))
def test_fewer_outliers_than_half_the_window_never_move_the_estimate(
    outliers: list[float],
) -> None:
    pace = Pace(0.08, Clock(), AT_ONCE)
    feed(pace, 0.08, PACE_WINDOW)
    for seconds in outliers:
        pace.observe("forward", seconds)
        pace.observe("backward", seconds)
    assert pace.estimate() == pytest.approx(0.08) and pace.due() is None


def test_changes_inside_the_band_are_not_told() -> None:
    pace = Pace(0.1, Clock(), AT_ONCE)
    feed(pace, 0.14, PACE_WINDOW)  # 1.4x: inside the 1.5 band
    assert pace.due() is None and pace.live_s() == pytest.approx(0.14)
    feed(pace, 0.07, PACE_WINDOW)  # 1/1.43: inside too
    assert pace.due() is None


def test_a_flapping_node_is_held_off_ever_longer_and_released_when_quiet() -> None:
    clock = Clock()
    config = PaceConfig(hold_s=5.0, max_hold_s=40.0, persist_s=0.0)
    pace = Pace(0.1, clock, config)
    told = []
    for step in range(200):  # slow and fast in turns of 2 s, for 400 s
        clock.now = 2.0 * step
        feed(pace, 0.4 if step % 2 else 0.1, PACE_WINDOW)
        due = pace.due()
        if due is not None:
            pace.publish(due)
            told.append(clock.now)
    gaps = [b - a for a, b in zip(told, told[1:], strict=False)]
    holds = [5.0, 10.0, 20.0] + [40.0] * (len(gaps) - 3)
    assert len(gaps) > 5 and all(g >= h for g, h in zip(gaps, holds, strict=True))
    assert all(g < h + 4.0 for g, h in zip(gaps, holds, strict=True))  # told once allowed
    assert pace.hold_s == 40.0
    clock.now += 80.0  # quiet for twice the longest hold
    feed(pace, 0.4 if pace.published_s < 0.2 else 0.1, PACE_WINDOW)
    due = pace.due()
    assert due is not None
    pace.publish(due)
    assert pace.hold_s == 5.0


def test_a_change_is_told_once_it_has_lasted_the_persistence() -> None:
    clock = Clock()
    pace = Pace(0.08, clock, PaceConfig(persist_s=2.0))
    feed(pace, 0.32, PACE_WINDOW)
    assert pace.due() is None  # out of the band since now
    clock.now += 1.0
    feed(pace, 0.08, PACE_WINDOW)
    assert pace.due() is None  # back in: a burst, not a slower node
    clock.now += 1.5
    feed(pace, 0.32, PACE_WINDOW)
    assert pace.due() is None  # out again: the clock starts over
    clock.now += 2.0
    assert pace.due() == pytest.approx(0.32)


def test_a_slowdown_told_while_it_deepened_is_told_again_without_the_hold() -> None:
    """0.08 s, then 0.14 s told while the slowdown began, then its full 0.32 s: the second
    publication goes the same way, so it waits for the persistence only; going back does wait
    for the hold."""
    clock = Clock()
    pace = Pace(0.08, clock, PaceConfig(hold_s=5.0, persist_s=2.0))
    feed(pace, 0.14, PACE_WINDOW)
    assert pace.due() is None  # out of the band since now
    clock.now += 2.0
    due = pace.due()
    assert due == pytest.approx(0.14)
    pace.publish(due)
    feed(pace, 0.32, PACE_WINDOW)
    assert pace.due() is None  # out of the band since now
    clock.now += 1.0
    assert pace.due() is None  # for 1 s of the 2 s persistence
    clock.now += 1.0
    due = pace.due()
    assert due == pytest.approx(0.32)  # 2 s after the last publication, not 5
    pace.publish(due)
    feed(pace, 0.08, PACE_WINDOW)
    assert pace.due() is None
    clock.now += 2.0
    assert pace.due() is None  # the recovery reverses it: the hold applies
    clock.now += 3.0
    assert pace.due() == pytest.approx(0.08)


def test_the_spread_says_how_noisy_the_machine_is() -> None:
    window = PaceWindow(5)
    for s in (1.0, 1.0, 1.0, 1.0, 1.0):
        window.add(s)
    assert window.spread() == 0.0
    for s in (0.8, 1.2, 1.0, 0.9, 1.1):
        window.add(s)
    assert window.spread() == pytest.approx(0.1)
    window.add(float("nan"))  # not a sample
    assert len(window) == 5


def test_a_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        PaceConfig(factor=1.0)
    with pytest.raises(ValueError, match="window"):
        PaceConfig(window=0)
    with pytest.raises(ValueError, match="positive"):
        Pace(0.0, Clock())
    with pytest.raises(ValueError, match="persistence"):
        PaceConfig(persist_s=-1.0)
