"""The chaos tests drive the same local swarm of real node processes as the integration tests
(tests/integration/cluster.py)."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The in-process reference runs with the nodes' torch thread count (float reductions split
    by thread count, so the bits compare only then)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
