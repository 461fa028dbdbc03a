"""`PhaseClock`: a scaling phase ends `after` seconds past the last quiet moment, if nothing
happened since (docs/design.md 2.7), for the simulator's control plane and relaxation routing."""

from __future__ import annotations

from gwtf.flow.relax.swarm import PhaseClock


def clock() -> tuple[PhaseClock, list[float]]:
    timers: list[float] = []
    return PhaseClock(2.0, timers.append), timers


def test_a_phase_ends_after_a_quiet_spell_with_nothing_done() -> None:
    phase, timers = clock()
    phase.quiet(1.0, settled=False)
    assert timers == [3.0]
    assert phase.fire(3.0, settled=False)


def test_no_timer_while_messages_are_in_flight_or_when_every_machine_is_final() -> None:
    phase, timers = clock()
    phase.in_flight = 1
    phase.quiet(1.0, settled=False)
    phase.in_flight = 0
    phase.quiet(1.0, settled=True)
    assert timers == []


def test_a_later_quiet_moment_supersedes_the_pending_timer() -> None:
    phase, timers = clock()
    phase.quiet(1.0, settled=False)
    phase.in_flight += 1  # a message goes out and lands
    phase.in_flight -= 1
    phase.activity += 1
    phase.quiet(1.5, settled=False)
    assert timers == [3.0, 3.5]
    assert not phase.fire(3.0, settled=False)  # superseded: nothing set again
    assert timers == [3.0, 3.5]
    assert phase.fire(3.5, settled=False)


def test_activity_without_a_quiet_moment_after_it_sets_the_timer_again_from_the_firing() -> None:
    phase, timers = clock()
    phase.quiet(1.0, settled=False)
    phase.activity += 1  # a change that sent nothing (a machine noticed a death)
    assert not phase.fire(3.0, settled=False)
    assert timers == [3.0, 5.0]
    assert phase.fire(5.0, settled=False)


def test_an_earlier_quiet_moment_does_not_move_the_timer_back() -> None:
    phase, timers = clock()
    phase.quiet(4.0, settled=False)
    phase.quiet(3.0, settled=False)
    assert timers == [6.0]
    assert not phase.fire(5.0, settled=False)
    assert phase.fire(6.0, settled=False)
