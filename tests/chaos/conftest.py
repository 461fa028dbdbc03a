"""The chaos tests drive the same local swarm of real node processes as the integration tests
(tests/integration/cluster.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


@pytest.fixture(autouse=True)
def _nodes_thread_count(one_thread: None) -> None:
    """The in-process reference runs with the nodes' torch thread count (tests/conftest.py)."""
