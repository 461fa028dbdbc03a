"""The load benchmark's microbatch account: what counts as acknowledged, what does not."""

from __future__ import annotations

from benchmarks.load import reconcile


def test_every_returned_send_taken_once_intact_is_verified() -> None:
    expected = {("s0", 1): 11, ("s0", 2): 12, ("s1", 1): 21}
    account = reconcile(expected, set(expected), {k: [c] for k, c in expected.items()})
    assert (account.taken, account.verified, account.unverified) == (3, 3, 0)
    assert account.duplicated == account.corrupt == account.unacknowledged == account.unknown == 0


def test_missing_duplicated_corrupt_and_strays_are_not_verified() -> None:
    expected = {("s0", 1): 11, ("s0", 2): 12, ("s0", 3): 13, ("s0", 4): 14, ("s1", 1): 21}
    returned = {("s0", 1), ("s0", 2), ("s0", 3), ("s0", 4)}  # s1's send ended with an error
    taken = {
        ("s0", 1): [11],  # fine
        ("s0", 2): [12, 12],  # taken twice
        ("s0", 3): [99],  # other bytes than were sent
        # ("s0", 4) never taken
        ("s1", 1): [21],  # taken although its send failed
        ("s9", 1): [1],  # never sent
    }
    account = reconcile(expected, returned, taken)
    assert account.verified == 1
    assert account.missing == 1
    assert account.returned_bad == 2
    assert account.unverified == 3  # counted failed, so sent = acknowledged + failed + lost
    assert account.duplicated == 1
    assert account.corrupt == 1
    assert account.unacknowledged == 1
    assert account.unknown == 1
    assert account.taken == 6
