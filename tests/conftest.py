"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import torch

# tree="auto" persists measured cost curves in the model cache (ersd.cost_store); tests keep
# theirs in a directory of their own, so they neither read nor leave this machine's real curves
os.environ.setdefault("ERSD_COST_STORE", tempfile.mkdtemp(prefix="ersd-test-costs-"))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny matrices: intra-op threads only add synchronisation (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
