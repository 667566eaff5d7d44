"""Each 64-token block's largest logit, computed once per forward and kept for the races.

A v2 race (:mod:`ersd.race_v2`) bounds its blocks by each block's largest logit, and the
backends' finiteness check (:mod:`ersd.models.checks`) reads every row a forward returns anyway.
:func:`compute` does both in one reduction over all of a forward's rows: a NaN or ``+inf`` entry
makes its block's maximum NaN or ``+inf``, and a row of only ``-inf`` has only ``-inf`` maxima, so
the maxima decide finiteness; they are then *kept* beside the logits, and
:func:`ersd.race_v2.logit_block_max` finds a row's maxima by :func:`lookup` instead of reading the
row a second time (one pass over a 152k row is ~40-60 us on these cores, and a decode step reads
dozens of rows).  The maxima are widened to float64 and each row's first largest block found once,
as they are computed (:func:`all_finite`: that block's maximum decides the row), and the races read
both (:func:`lookup_top`): right after a forward every distinct NumPy call pays for its caches, so
the work is done once, where it is needed first.

What is kept is keyed by the logits' storage, held by a weak reference (nothing is kept alive
here), and checked against the storage's version counter: a row written in place after its
maxima were computed is never answered from them.  A row that was copied (``torch.cat``) has new
storage and is not found unless :func:`cat` made the copy.  A miss costs the one pass it always
cost.  The maxima are the same bits either way: a maximum is exact in its own dtype.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

#: token ids per block (:data:`ersd.race_v2.V2_BLOCK`)
BLOCK = 64
#: False: nothing is computed or kept (the finiteness check sums every row and each race reads
#: its row for the maxima): the reference ``research/profile_batch.py --compare-kept`` compares
#: with; the same tokens
ENABLED = True
#: forwards whose maxima are kept (the newest; a step reads the rows of its last few forwards)
KEEP = 16
_DTYPES = (torch.float32, torch.float64)


class _Kept:
    __slots__ = ("maxima", "offset", "rows", "storage", "top", "version", "vocab", "wide")

    def __init__(self, logits: torch.Tensor, maxima: torch.Tensor) -> None:
        self.storage = weakref.ref(logits.untyped_storage())
        self.offset = int(logits.storage_offset())
        self.vocab = int(logits.shape[-1])
        self.rows = logits.numel() // self.vocab
        self.version = logits._version
        self.maxima = maxima  # [rows, vocab // BLOCK], the logits' dtype
        # the same, float64 and read-only: what the races read, and what the finiteness check
        # decides by (one conversion for all of a forward's rows, while they are at hand)
        self.wide = maxima.numpy().astype(np.float64)
        self.wide.flags.writeable = False
        #: each row's first block holding its largest entry (the first NaN where it has one)
        self.top = self.wide.argmax(axis=1)

    def finite(self) -> bool:
        """Whether every row's largest entry is finite: no NaN, no +inf, not all -inf."""
        if self.rows == 1:
            return math.isfinite(self.wide[0, self.top[0]])
        return bool(np.isfinite(np.take_along_axis(self.wide, self.top[:, None], 1)).all())


_lock = threading.Lock()
_kept: OrderedDict[tuple[int, int], _Kept] = OrderedDict()  # (storage ptr, offset) -> maxima


def applies(logits: torch.Tensor) -> bool:
    """Whether :func:`compute` handles ``logits``: a contiguous CPU float32 / float64 tensor
    whose last dimension is a positive multiple of :data:`BLOCK`."""
    shape = logits.shape
    v = shape[-1] if shape else 0
    return (
        logits.is_cpu
        and logits.dtype in _DTYPES
        and v > 0
        and v % BLOCK == 0
        and 0 not in shape
        and logits.is_contiguous()
    )


def compute(logits: torch.Tensor) -> torch.Tensor | None:
    """Each block's largest entry of every row of ``logits`` (``[..., V]``), as ``[rows, V //
    BLOCK]`` in its dtype (NaN where a block holds a NaN), kept for :func:`lookup`; None where
    :func:`applies` is false (nothing kept)."""
    if not ENABLED or not applies(logits):
        return None
    if logits.requires_grad:
        logits = logits.detach()
    v = logits.shape[-1]
    maxima = logits.view(-1, v // BLOCK, BLOCK).amax(-1)
    _remember(logits, maxima)
    return maxima


def all_finite(logits: torch.Tensor) -> bool | None:
    """Whether every row of ``logits`` is finite (no NaN or +inf entry, not only -inf), decided
    from its block maxima (:func:`compute`, which keeps them); None where :func:`applies` is
    false.  A row's largest block maximum is NaN or +inf where the row holds one, and -inf where
    the row is all -inf: its first largest (``argmax`` finds the first NaN) decides."""
    maxima = compute(logits)
    if maxima is None:
        return None
    kept = _last
    if kept is None or kept.maxima is not maxima:  # not what compute kept: decide from maxima
        kept = _Kept(maxima, maxima)
    return kept.finite()


_last: _Kept | None = None  # the newest kept (all_finite reads it right after compute)


def _remember(logits: torch.Tensor, maxima: torch.Tensor) -> None:
    global _last
    key = (logits.untyped_storage().data_ptr(), int(logits.storage_offset()))
    kept = _Kept(logits, maxima)
    with _lock:
        _kept[key] = kept
        _kept.move_to_end(key)
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
        _last = kept


def _find(logits: torch.Tensor) -> tuple[_Kept, int, int] | None:
    """``(kept, first, k)``: the rows ``[first, first + k)`` of what is kept hold the maxima of
    ``logits`` (a contiguous ``[V]`` or ``[k, V]`` view of a tensor :func:`compute` or
    :func:`cat` saw, unmodified since); None when nothing kept does."""
    if logits.dim() not in (1, 2) or not applies(logits):
        return None
    storage = logits.untyped_storage()
    ptr, off, v = storage.data_ptr(), int(logits.storage_offset()), int(logits.shape[-1])
    k = 1 if logits.dim() == 1 else int(logits.shape[0])
    with _lock:
        kept = _kept.get((ptr, off))  # the first row of a forward's output (no search)
        if (
            kept is not None
            and kept.storage() is storage
            and kept.vocab == v
            and k <= kept.rows
            and logits._version == kept.version
        ):
            return kept, 0, k
        for (p, base), kept in reversed(_kept.items()):
            if p != ptr or kept.storage() is not storage or kept.vocab != v:
                continue
            first, rem = divmod(off - base, v)
            if rem or first < 0 or first + k > kept.rows or logits._version != kept.version:
                continue
            return kept, first, k
    return None


def _rows_of(logits: torch.Tensor) -> torch.Tensor | None:
    """The kept maxima of the rows of ``logits`` (:func:`_find`), ``[k, V // BLOCK]``."""
    found = _find(logits)
    if found is None:
        return None
    kept, first, k = found
    return kept.maxima[first : first + k]


def lookup(row: torch.Tensor) -> np.ndarray | None:
    """The kept block maxima of a 1-D row (float64, exact; a read-only view), or None when they
    are not known."""
    found = lookup_top(row)
    return None if found is None else found[0]


def lookup_top(row: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """:func:`lookup`'s maxima and the first block holding the largest of them (``argmax``: the
    first NaN where there is one), or None when they are not known."""
    found = _find(row) if ENABLED and row.dim() == 1 else None
    if found is None:
        return None
    kept, first, _ = found
    return kept.wide[first], int(kept.top[first])


def cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` of ``[k_i, V]`` rows, with the copy's block maxima kept when every
    part's are known (a session's root row in front of a forward's new rows)."""
    out = torch.cat(list(parts), dim=0)
    if ENABLED and applies(out):
        found = [_rows_of(p) for p in parts]
        if all(f is not None for f in found):
            _remember(out, torch.cat(found, dim=0))  # type: ignore[arg-type]
    return out


def clear() -> None:
    """Forget every kept maximum (tests)."""
    global _last
    with _lock:
        _kept.clear()
        _last = None
