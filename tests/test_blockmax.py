"""A forward's block maxima, computed once by the finiteness check and kept for the races
(:mod:`ersd.blockmax`, issue 47 item 4).

* The kept maxima of every row (views, slices, :func:`ersd.blockmax.cat` copies) are the
  blockwise reference's; a row written in place afterwards, a plain copy and a new tensor are never
  answered from them (a lookup returns None and the race reads the row itself).
* The finiteness check decided by the maxima refuses NaN, +inf and all -inf rows with the same
  messages, accepts a masked vocabulary, and a variant whose maxima skip NaN (``fmax``-like)
  misses the NaN row the same check catches.
* A batched engine on a tiny HF pair under race scheme v2 finds its rows' maxima kept (hits) and
  gives the same tokens and ranks as with the lookup turned off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ersd import blockmax
from ersd.batch import BatchEngine
from ersd.models.checks import check_scored_logits
from ersd.race_v2 import logit_block_max
from tests.hf_tiny import tiny_pair
from tests.test_invalid_logits import assert_refusals
from tests.test_step_overhead import _reference_block_max


@pytest.fixture(autouse=True)
def _fresh() -> None:
    blockmax.clear()


def _logits(shape: tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 6).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kept_maxima_are_the_blockwise_reference(dtype: torch.dtype) -> None:
    x = _logits((3, 4, 640), dtype=dtype)
    x[1, 2, 70] = float("-inf")
    maxima = blockmax.compute(x)
    assert maxima is not None and maxima.shape == (12, 10)
    rows = x.reshape(12, 640)
    for r in range(12):
        kept = blockmax.lookup(rows[r])
        assert kept is not None and kept.dtype == np.float64
        np.testing.assert_array_equal(kept, _reference_block_max(rows[r]))
        assert not kept.flags.writeable  # shared by every reader: never written
        np.testing.assert_array_equal(logit_block_max(rows[r]), kept)
        top = blockmax.lookup_top(rows[r])
        assert top is not None and top[1] == int(np.argmax(_reference_block_max(rows[r])))
    # a slice of rows (a forward's new nodes) and a view through another path
    np.testing.assert_array_equal(blockmax.lookup(x[2, 1]), _reference_block_max(x[2, 1]))
    part = x[1, 1:3]
    assert blockmax._rows_of(part) is not None


def test_the_kept_top_block_is_the_first_largest_and_the_first_nan() -> None:
    """Each row's kept top block is the first holding its largest entry (what the races start
    from), and the first holding a NaN where the row has one (what makes the row refused)."""
    x = _logits((3, 640))
    x[0, 130] = x[0, 5] = x[0].max() + 1.0  # a tie: blocks 0 and 2 hold the largest
    x[1, 400] = x[1, 70] = float("nan")  # NaN in blocks 1 and 6: the first is 1
    x[2, :] = float("-inf")
    assert blockmax.all_finite(x) is False
    got = [blockmax.lookup_top(x[r]) for r in range(3)]
    assert [g[1] for g in got if g is not None] == [0, 1, 0]
    assert blockmax.all_finite(x[:1]) is True and blockmax.all_finite(x[1:2]) is False


def test_nothing_stale_or_foreign_is_answered() -> None:
    x = _logits((4, 128))
    blockmax.compute(x)
    row = x[2]
    assert blockmax.lookup(row) is not None
    assert blockmax.lookup(row.clone()) is None  # a copy: new storage
    assert blockmax.lookup(_logits((4, 128))[2]) is None  # another tensor, the same values
    assert blockmax.lookup(x[1:3].reshape(-1)[:128]) is not None  # row 1 through a reshape
    assert blockmax.lookup(x.reshape(-1)[64:192]) is None  # not a row: straddles two
    x[0, 5] = 1e9  # written in place (another row): every row of it is now unknown
    assert blockmax.lookup(row) is None
    np.testing.assert_array_equal(logit_block_max(row), _reference_block_max(row))
    y = _logits((2, 128), seed=1)
    blockmax.compute(y)
    y[1].mul_(2.0)  # a row scaled in place after the check
    assert blockmax.lookup(y[1]) is None
    np.testing.assert_array_equal(logit_block_max(y[1]), _reference_block_max(y[1]))
    # not applicable: not a multiple of 64, bfloat16, strided
    for t in (
        _logits((2, 100)),
        _logits((2, 128), dtype=torch.bfloat16),
        _logits((2, 256))[:, ::2],
    ):
        assert blockmax.compute(t) is None
        assert blockmax.lookup(t[0]) is None


def test_cat_keeps_the_maxima_only_when_every_part_is_known() -> None:
    a, b = _logits((3, 192), seed=2), _logits((5, 192), seed=3)
    blockmax.compute(a)
    blockmax.compute(b)
    out = blockmax.cat([a[1].unsqueeze(0), b[2:5]])
    torch.testing.assert_close(out, torch.cat([a[1:2], b[2:5]]), rtol=0, atol=0)
    for r in range(4):
        np.testing.assert_array_equal(blockmax.lookup(out[r]), _reference_block_max(out[r]))
    c = _logits((2, 192), seed=4)  # never checked
    mixed = blockmax.cat([a[0].unsqueeze(0), c])
    assert all(blockmax.lookup(mixed[r]) is None for r in range(3))


def test_only_the_newest_forwards_are_kept() -> None:
    first = _logits((1, 64))
    blockmax.compute(first)
    others = [_logits((1, 64), seed=s) for s in range(1, blockmax.KEEP + 1)]
    for t in others:
        blockmax.compute(t)
    assert blockmax.lookup(first[0]) is None  # evicted: the race reads the row itself
    assert blockmax.lookup(others[-1][0]) is not None


def test_the_check_from_maxima_refuses_what_the_sum_refused(monkeypatch) -> None:
    ok = _logits((3, 256))
    ok[0, :64] = float("-inf")  # a masked block: a valid distribution
    ok[1, 7] = float("-inf")
    assert_refusals(ok)  # the sum path's own test, on rows the maxima decide
    # the broken variant: maxima that skip NaN let the NaN row through the same check
    nan_row = ok.clone()
    nan_row[2, 200] = float("nan")

    def skip_nan(logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        clean = torch.nan_to_num(logits, nan=float("-inf"))
        return clean.reshape(-1, v // blockmax.BLOCK, blockmax.BLOCK).amax(-1)

    monkeypatch.setattr(blockmax, "compute", skip_nan)
    check_scored_logits(nan_row, "m")  # no error: the variant is what the test above rejects


def _engine(pair, lookups: bool, monkeypatch) -> tuple[list, int]:
    target, draft = pair
    hits = 0
    real = blockmax._find

    def counted(logits: torch.Tensor):
        nonlocal hits
        found = real(logits) if lookups else None
        hits += found is not None
        return found

    monkeypatch.setattr(blockmax, "_find", counted)
    engine = BatchEngine(target, draft)
    for i in range(4):
        engine.add([3 + i, 17, 40 + i], max_new_tokens=20, seed=i, tree="chain:3", race_scheme="v2")
    out: dict[int, list] = {}
    while len(engine):
        for rid, rec, _ in engine.step():
            out.setdefault(rid, []).append((list(rec.tokens), rec.num_accepted, list(rec.ranks)))
    return [out[k] for k in sorted(out)], hits


def test_engine_rows_use_the_kept_maxima_and_give_the_same_tokens(monkeypatch) -> None:
    pair = tiny_pair()
    with_kept, hits = _engine(pair, True, monkeypatch)
    blockmax.clear()
    without, none = _engine(pair, False, monkeypatch)
    assert none == 0 and hits > 50  # the drafter's and the target's rows were found
    assert with_kept == without
