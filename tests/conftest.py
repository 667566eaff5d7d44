"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny matrices: intra-op threads only add synchronisation (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
