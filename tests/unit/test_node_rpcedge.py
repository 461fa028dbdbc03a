"""The RPC edge's one table (docs/design.md 3.2): every refusal class has its status code there,
the domain modules name no status code, and a refused call ends with the table's code and the
refusal's own message."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import grpc
import pytest

from gwtf.node import errors
from gwtf.node.errors import (
    Busy,
    CannotRun,
    IdTaken,
    InvalidOrder,
    Mismatch,
    NotHeld,
    NotParticipant,
    NotReady,
    Refusal,
    StaleIteration,
    Stranger,
    Superseded,
    UnknownJob,
    WrongState,
)
from gwtf.node.rpc.codec import InvalidMessage
from gwtf.node.rpc.edge import STATUS, status

NODE = Path(__file__).resolve().parents[2] / "gwtf" / "node"

Code = grpc.StatusCode


def test_every_refusal_class_has_its_status_in_the_table() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, Refusal) and c is not Refusal
    ]
    assert len(classes) == 13
    missing = [c.__name__ for c in classes if c not in STATUS]
    assert not missing, f"refusal classes with no status code at the edge: {missing}"


@pytest.mark.parametrize(
    ("refusal", "code"),
    [
        (NotReady, Code.UNAVAILABLE),
        (Busy, Code.RESOURCE_EXHAUSTED),
        (NotParticipant, Code.FAILED_PRECONDITION),
        (WrongState, Code.FAILED_PRECONDITION),
        (NotHeld, Code.FAILED_PRECONDITION),
        (StaleIteration, Code.FAILED_PRECONDITION),
        (Mismatch, Code.FAILED_PRECONDITION),
        (Stranger, Code.FAILED_PRECONDITION),
        (CannotRun, Code.FAILED_PRECONDITION),
        (InvalidOrder, Code.INVALID_ARGUMENT),
        (InvalidMessage, Code.INVALID_ARGUMENT),
        (UnknownJob, Code.NOT_FOUND),
        (IdTaken, Code.ALREADY_EXISTS),
        (Superseded, Code.ABORTED),
    ],
)
def test_a_refusal_ends_its_call_with_the_tables_code_and_its_own_message(
    refusal: type[Exception], code: grpc.StatusCode
) -> None:
    assert status(refusal("node a1 says no")) == (code, "node a1 says no")


def test_other_failures_that_reach_the_edge_are_invalid() -> None:
    class ContributionLike(ValueError):
        pass

    assert status(ContributionLike("bad header")) == (Code.INVALID_ARGUMENT, "bad header")


def test_a_refusal_is_a_message_and_names_no_status_code() -> None:
    """The raiser says what happened; only the edge's table says which status that is."""
    assert list(inspect.signature(Refusal).parameters) == ["message"]
    assert NotReady("job j has not started here").message == "job j has not started here"
    tree = ast.parse((NODE / "errors.py").read_text())
    imported = {
        alias.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
        for alias in n.names
    } | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.startswith("grpc") for name in imported)
