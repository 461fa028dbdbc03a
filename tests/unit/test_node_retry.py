"""The node's one retry policy (gwtf.node.rpc.retry, docs/design.md 3.10): the waits each of its
loops had before are the policy's to the bit, which failures are retried, and the ban list."""

from __future__ import annotations

import random

import grpc
import numpy as np
import pytest
from grpc import aio

from gwtf.node.config import NodeConfig
from gwtf.node.errors import Busy, NotParticipant, NotReady
from gwtf.node.jobs.wire import CALL_BACKOFF, REPORT_ATTEMPTS, REPORT_BACKOFF
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.node.rpc.retry import FINAL, TRANSIENT, Backoff, BanList, code_of, is_final, is_transient
from gwtf.node.worker.stage import FINAL_CODES, WorkerConfig

Code = grpc.StatusCode


def _rpc_error(code: grpc.StatusCode) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), "details")


def test_the_loops_wait_what_they_waited_before_the_policy() -> None:
    """Each loop's own formula before it used the policy, against the policy's delay."""
    cfg, worker = NodeConfig(), WorkerConfig()
    flow = Backoff(cfg.retry_min_s, cfg.retry_max_s)
    last = cfg.retry_min_s / 2  # gwtf.node.control.peers kept the last delay and doubled it
    send = Backoff(worker.retry_s, worker.retry_max_s)
    for retry in range(12):
        last = min(2 * last, cfg.retry_max_s)
        assert flow.delay(retry) == last
        assert send.delay(retry) == min(worker.retry_max_s, worker.retry_s * 2**retry)
        attempt = retry + 1  # the job wire's loops counted their tries from 0, waiting from 1
        assert CALL_BACKOFF.delay(retry) == 0.2 * 2**attempt
        assert REPORT_BACKOFF.delay(retry) == min(1.0, 0.1 * 2**attempt)
    assert REPORT_ATTEMPTS == 12
    assert Backoff(0.0, 1.0).delay(3) == 0.0  # a test's retry_s=0: no waits


def test_a_long_run_of_failures_stays_at_the_cap() -> None:
    assert Backoff(0.05, 1.0).delay(5000) == 1.0
    assert Backoff(0.4).delay(5000) == float("inf")


def test_jitter_only_shortens_a_wait_by_up_to_its_fraction() -> None:
    backoff = Backoff(0.1, 1.0, jitter=0.5)
    rng = np.random.default_rng(7)
    waits = [backoff.delay(3, rng) for _ in range(200)]
    assert all(0.4 <= w <= 0.8 for w in waits)
    assert max(waits) - min(waits) > 0.3  # drawn, not fixed
    assert [backoff.delay(3, np.random.default_rng(7)) for _ in range(2)] == [waits[0]] * 2
    # The same seed, the same waits: a random.Random seeded by the caller does as well.
    assert [backoff.delay(3, random.Random(7)) for _ in range(2)] == [
        backoff.delay(3, random.Random(7))
    ] * 2


def test_jitter_draws_only_from_the_callers_generator() -> None:
    """No hidden generator: a jittered wait without one is refused, a plain one needs none."""
    with pytest.raises(ValueError, match="seeded generator"):
        Backoff(0.1, 1.0, jitter=0.5).delay(3)
    with pytest.raises(ValueError, match="seeded generator"):
        BanList(Backoff(0.1, 1.0, jitter=0.5), lambda: 0.0)
    bans = BanList(Backoff(0.1, 1.0, jitter=0.5), lambda: 0.0, np.random.default_rng(3))
    again = BanList(Backoff(0.1, 1.0, jitter=0.5), lambda: 0.0, np.random.default_rng(3))
    waits = [bans.ban("a1") for _ in range(5)]
    assert waits == [again.ban("a1") for _ in range(5)]
    assert all(0.5 * min(1.0, 0.1 * 2**i) <= w <= min(1.0, 0.1 * 2**i) for i, w in enumerate(waits))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"first_s": -1.0}, "first_s"), ({"first_s": 1.0, "factor": 0.5}, "factor"),
     ({"first_s": 1.0, "jitter": 1.0}, "jitter")],
)
def test_a_backoff_that_cannot_be_is_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)


def test_which_failures_are_retried() -> None:
    assert frozenset(FINAL_CODES) == FINAL
    assert is_transient(_rpc_error(Code.UNAVAILABLE))
    assert is_transient(_rpc_error(Code.DEADLINE_EXCEEDED))
    assert not is_transient(_rpc_error(Code.RESOURCE_EXHAUSTED))
    assert is_final(_rpc_error(Code.FAILED_PRECONDITION))
    assert not is_final(_rpc_error(Code.INTERNAL))  # the data plane resends on INTERNAL
    # A local call this node refused reads the code the edge would have sent.
    assert is_transient(NotReady("job j has not started here"))
    assert is_final(NotParticipant("a1 does not take part in job 'j'"))
    assert is_final(InvalidMessage("sender is empty"))
    assert code_of(Busy("no memory slot")) == Code.RESOURCE_EXHAUSTED
    assert code_of(RuntimeError("boom")) is None
    assert not TRANSIENT & FINAL


def test_a_ban_doubles_while_calls_fail_expires_and_a_success_lifts_it() -> None:
    now = [100.0]
    bans = BanList(Backoff(0.05, 1.0), lambda: now[0])
    assert not bans.banned("a1")
    assert [bans.ban("a1") for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert bans.banned("a1") and "a1" in bans
    assert not bans.banned("b1")
    assert not bans.banned("a1", now[0] + 1.0)  # the last ban, 1 s, is over then
    now[0] += 1.5
    assert not bans.banned("a1")
    assert bans.ban("a1") == 1.0  # failures in a row go on from where they were
    bans.lift("a1")
    assert not bans.banned("a1")
    assert bans.ban("a1") == 0.05
    bans.ban("b1")
    bans.clear()
    assert not bans.banned("a1") and not bans.banned("b1")
