"""Journals of a job's coordinator and of a participant's ledger, and their replay
(docs/design.md 4.10), pure: no I/O.

A driver may attach a journal to its `IterationCoordinator` (`attach`): every input then comes
out as a `JournalEntry` (the call, its arguments, what the coordinator decided). `to_record`
turns one into a JSON-ready dict, tagged so that `from_record` gives back the same values
(tuples, sets, maps with tuple keys, the enums and dataclasses of the job and recovery cores).
`replay` feeds the inputs of a journal into a fresh coordinator, built as the journal's "start"
entry says, and returns its decisions; `decisions` returns those the journal recorded. The
coordinator being deterministic, the two agree unless the driver changed its state by some other
way than its inputs, or decided something the journal does not show.

A participant's `Ledger` is journaled the same way (`JournaledLedger`: its records, and the
answers the node reads from it, among them the evidence it reports about a dead neighbour), so
that the evidence a coordinator planned from can be traced to the ledger records it came from.

Decisions are compared in a canonical form (`canonical`: JSON with maps and sets sorted), in
which a NaN loss equals itself.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from gwtf.job.iterations import (
    INPUTS,
    CommitOrder,
    CommittedReport,
    IterationCoordinator,
    IterationOutcome,
    Journal,
    JournalEntry,
    Outliers,
    PreparedReport,
    RecoveryOrders,
    StepOrder,
)
from gwtf.recovery import CrashPlan, Evidence, Ledger, Mode, NeighbourReport, Recovery, Rule

__all__ = [
    "LEDGER_CALLS",
    "Decision",
    "JournaledLedger",
    "JournalError",
    "canonical",
    "decisions",
    "from_record",
    "replay",
    "to_record",
]

_TYPES: dict[str, type[Any]] = {cls.__name__: cls for cls in (
    CommitOrder, CommittedReport, CrashPlan, IterationOutcome, NeighbourReport, Outliers,
    PreparedReport, Recovery, RecoveryOrders, StepOrder,
)}
_ENUMS: dict[str, type[IntEnum]] = {cls.__name__: cls for cls in (Evidence, Mode, Rule)}


class JournalError(ValueError):
    """A journal record that cannot be read back (one sentence)."""


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, IntEnum):
        if type(value).__name__ not in _ENUMS:
            raise JournalError(f"a {type(value).__name__} cannot go into a journal")
        return {"enum": type(value).__name__, "value": int(value)}
    if isinstance(value, int):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in _TYPES:
            raise JournalError(f"a {name} cannot go into a journal")
        return {"type": name, "fields": {
            f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)
        }}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        items = [_encode(v) for v in value]
        return {"set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {"map": [[_encode(k), _encode(v)] for k, v in value.items()]}
    raise JournalError(f"a {type(value).__name__} cannot go into a journal")


def _decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict) or not value:
        raise JournalError(f"a journal value {str(value)[:60]!r} is not one this code writes")
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "set" in value:
        return frozenset(_decode(v) for v in value["set"])
    if "map" in value:
        return {_decode(k): _decode(v) for k, v in value["map"]}
    if "enum" in value and value["enum"] in _ENUMS:
        return _ENUMS[value["enum"]](value["value"])
    if "type" in value and value["type"] in _TYPES:
        fields = {k: _decode(v) for k, v in value["fields"].items()}
        try:
            return _TYPES[value["type"]](**fields)
        except TypeError as err:
            raise JournalError(f"a journal's {value['type']} does not fit: {err}") from None
    raise JournalError(f"a journal value {str(value)[:60]!r} is not one this code writes")


LEDGER_CALLS = (
    "activation_sent", "activation_received", "gradient_target", "gradient_sent",
    "gradient_received", "accumulated", "shipped", "keeper_lost", "kept", "drop_kept", "adopt",
    "contribution_moved", "reset", "contributions", "unshipped", "activation_receiver",
    "gradient_receiver", "has_gradient_back", "held_for", "report_about",
)
"""A ledger's records and the answers the node reads from it (what a participant decides
on: the evidence it reports, its contributions, where a microbatch went)."""


def _journaled(name: str) -> Any:
    base = getattr(Ledger, name)

    def method(self: JournaledLedger, *args: Any, **kwargs: Any) -> Any:
        result = base(self, *args, **kwargs)
        self._journal(JournalEntry(name, args, kwargs, result))
        return result

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


class JournaledLedger(Ledger):
    """A `Ledger` that enters each of its `LEDGER_CALLS`, and what it answered, in `journal`
    (after a "start" entry with its construction)."""

    __slots__ = ("_journal",)

    def __init__(self, node: str, stage: int, iteration: int, journal: Journal) -> None:
        super().__init__(node, stage, iteration)
        self._journal = journal
        journal(JournalEntry("start", ("ledger",),
                             {"node": node, "stage": stage, "iteration": iteration}))


for _name in LEDGER_CALLS:
    setattr(JournaledLedger, _name, _journaled(_name))


def to_record(entry: JournalEntry) -> dict[str, Any]:
    """One entry as a JSON-ready dict (the driver adds its clock, `t`, and who it is)."""
    record: dict[str, Any] = {
        "call": entry.call,
        "args": [_encode(a) for a in entry.args],
        "kwargs": {k: _encode(v) for k, v in entry.kwargs.items()},
        "result": _encode(entry.result),
    }
    if entry.error:
        record["error"] = entry.error
    return record


def from_record(record: Mapping[str, Any]) -> JournalEntry:
    """The entry a `to_record` dict (read back from JSON) stands for."""
    call = record.get("call")
    if call != "start" and call not in INPUTS and call not in LEDGER_CALLS:
        raise JournalError(f"a journal record names no input of the coordinator ({call!r})")
    try:
        args = tuple(_decode(a) for a in record["args"])
        kwargs = {str(k): _decode(v) for k, v in record["kwargs"].items()}
        result = _decode(record.get("result"))
    except (KeyError, AttributeError, TypeError) as err:
        raise JournalError(f"a journal record of {call} is malformed: {err!r}") from None
    return JournalEntry(str(call), args, kwargs, result, str(record.get("error", "")))


def _canonical(value: Any) -> Any:
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"map"}:
            entries = [[_canonical(k), _canonical(v)] for k, v in value["map"]]
            return {"map": sorted(entries, key=lambda e: json.dumps(e[0], sort_keys=True))}
        return {k: _canonical(v) for k, v in value.items()}
    return value


def canonical(value: Any) -> str:
    """A value as a string that two equal values share (maps in key order, NaN as NaN)."""
    return json.dumps(_canonical(_encode(value)), sort_keys=True)


@dataclass(frozen=True)
class Decision:
    """What the coordinator decided on the journal's input `index` (`call`): its `result` in
    canonical form, or the `error` it raised."""

    index: int
    call: str
    result: str
    error: str = ""


def _entries(records: Iterable[Mapping[str, Any]]) -> list[JournalEntry]:
    entries = [from_record(r) for r in records]
    if not entries or entries[0].call != "start":
        raise JournalError("a journal starts with the coordinator's construction")
    if any(e.call == "start" for e in entries[1:]):
        raise JournalError("a journal holds one coordinator: it starts once")
    return entries


def decisions(records: Iterable[Mapping[str, Any]]) -> list[Decision]:
    """The decisions a journal recorded, input by input."""
    return [Decision(i, e.call, canonical(e.result), e.error)
            for i, e in enumerate(_entries(records)[1:], 1)]


def replay(records: Iterable[Mapping[str, Any]]) -> list[Decision]:
    """The decisions of a fresh coordinator (or ledger) fed the journal's inputs, input by
    input."""
    entries = _entries(records)
    start = entries[0]
    ledger = start.args == ("ledger",)
    calls = LEDGER_CALLS if ledger else INPUTS
    core: Ledger | IterationCoordinator
    try:
        core = Ledger(**start.kwargs) if ledger else IterationCoordinator(**start.kwargs)
    except (TypeError, ValueError) as err:
        raise JournalError(f"the journal's coordinator cannot be built again: {err}") from None
    out = []
    for i, entry in enumerate(entries[1:], 1):
        if entry.call not in calls:
            raise JournalError(f"{entry.call} is not an input of the journal's "
                               f"{'ledger' if ledger else 'coordinator'}")
        method = getattr(core, entry.call)
        try:
            result = method(*entry.args, **entry.kwargs)
        except ValueError as err:
            out.append(Decision(i, entry.call, canonical(None), str(err)))
            continue
        out.append(Decision(i, entry.call, canonical(result)))
    return out
