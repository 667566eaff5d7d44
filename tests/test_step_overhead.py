"""The per-step work outside the forwards (issue 47 item 4): the cheaper paths give the same
values as their references, and a broken variant is rejected by the same checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ersd.race_v2 import V2_BLOCK, logit_block_max


def _reference_block_max(row: torch.Tensor) -> np.ndarray:
    """Each 64-token block's largest logit, widened to float64 entry by entry (NaN wins)."""
    x = row.to(torch.float64).numpy()
    out = []
    for b in range(0, x.shape[0], V2_BLOCK):
        block = x[b : b + V2_BLOCK]
        out.append(np.nan if np.isnan(block).any() else block.max())
    return np.array(out)


def _rows(vocab: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(vocab)
    plain = (torch.randn(vocab, generator=g) * 8).to(dtype)
    masked = plain.clone()
    masked[: vocab // 2] = float("-inf")
    nan = plain.clone()
    nan[vocab // 3] = float("nan")
    strided = (torch.randn(2 * vocab, generator=g) * 8).to(dtype)[::2]
    return [plain, masked, nan, strided, plain.clone().fill_(-3.25)]


@pytest.mark.parametrize("vocab", [64, 640, 151936, 1000, 151937])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_logit_block_max_equals_the_blockwise_maximum(vocab: int, dtype: torch.dtype) -> None:
    for row in _rows(vocab, dtype):
        got = logit_block_max(row)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, _reference_block_max(row))


def test_logit_block_max_check_rejects_a_broken_variant() -> None:
    """Maxima read from the wrong blocks (a transposed reshape) fail the same comparison."""
    row = _rows(151936, torch.float32)[0]

    def transposed(x: torch.Tensor) -> np.ndarray:
        return x.reshape(V2_BLOCK, -1).amax(0).numpy().astype(np.float64)

    assert not np.array_equal(transposed(row), _reference_block_max(row))
