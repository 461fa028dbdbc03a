"""Fixtures every test folder shares."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test, as the swarms' nodes run (`--threads 1`): a result
    compared with theirs bit for bit must be computed with their thread count (float reductions
    split their work by thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
