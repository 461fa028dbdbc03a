"""`python -m benchmarks flow-relax`: the epsilon-relaxation against the oracle (see flow.py)."""

from __future__ import annotations

from benchmarks.flow import run_relax


def run(quick: bool = False) -> str:
    return run_relax(quick)
