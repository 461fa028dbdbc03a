"""A joiner's catch-up (docs/design.md 3.8): the steps it missed instead of the whole state again.

A joiner downloads its stage's state of iteration `held`. If the stage stepped while the bytes
travelled, the coordinator is at `now > held` and does not admit it. Fetching the whole state
again fails the same way whenever a download outlasts an iteration (a slow donor uplink, a large
stage): the joiner never enters, the stage stays thin, and the next wave wipes it. So every
replica keeps the mean gradients of its last `kept` steps, and a joiner `now - held <= kept`
steps behind fetches those and applies them with the same optimizer step the replicas took: the
same bits, for `now - held` gradients (4 bytes a parameter in float32) where the state is
weights and two AdamW moments (12). Each catch-up is shorter than the last, so the joiner
converges on the iteration in progress unless one step's gradient takes longer to download than
an iteration takes to train.

`kept` is a job setting (`catch_up_steps`, default CATCH_UP_STEPS), its cost memory on every
replica: `kept` gradients of the stage, on the CPU. Three is what catching up can use: it
converges only where one step's gradient downloads faster than an iteration trains, and there a
state (three times a step's bytes) downloads in under three iterations, so it misses fewer
than three steps, unless the download was slowed by more than the link (a busy donor, a retry).
"""

from __future__ import annotations

__all__ = ["CATCH_UP_STEPS", "catches_up"]

CATCH_UP_STEPS = 3
"""Mean gradients of the last steps every replica keeps for joiners to catch up with."""


def catches_up(held: int, now: int, kept: int) -> bool:
    """Whether a joiner whose state is of iteration `held`, with the job at iteration `now`,
    fetches the `now - held` steps it missed rather than the whole state (0 < now - held <=
    kept; a state of a later iteration, after a rollback, is fetched again)."""
    return 0 < now - held <= kept
