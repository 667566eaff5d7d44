"""One forward for the score calls of several :class:`~ersd.models.hf_session.HFSession` s.

A session scored in a batch keeps its KV cache in a slot of the model's persistent batched storage
(:mod:`ersd.models.hf_slots`), so a forward copies only the new tokens' keys and values, never a
row's past:

* the rows of the call occupy the contiguous slots ``[lo, lo + n)`` (sorted by slot; compacted
  only when the composition changed);
* row ``i`` feeds its ``q_i`` tokens (uncached committed tail, then the new tree nodes), right-
  padded to ``Q = max q_i``, with its own position ids; their keys and values are written at its
  columns ``[past_i, past_i + q_i)``, exactly where its own ``DynamicCache`` would put them;
* attention sees the columns ``[0, W)``, ``W = max (past_i + q_i)``; the 4-D mask of row ``i`` is
  its own tree mask (:meth:`HFSession.plan_mask`) over its columns ``[0, past_i + q_i)`` and hides
  every other column; padding query rows see column 0 only (their outputs are dropped).

Each row therefore computes exactly its own attention over its own columns; the only numerical
difference from a one-row forward is the kernels' blocking for another number of rows and columns
(float32 sums in another order), see ``docs/batching.md``.

Rows that would not pay or are not supported go through :meth:`HFSession.score` one by one: a
session without a slot feeding a long uncached tail (a prompt being prefilled, which would pad
every other row to its length; it joins the storage at its next batched call), a lone session
without a slot, and every row when the model uses sliding-window layers, the ``"paths"`` fallback
or a cache layout the storage cannot hold.  A session with a slot is always scored on its slot
(alone if its tail is long, or if it is scored on its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ersd.models.base import check_tree_args
from ersd.models.hf_session import HFSession, MaskPlan
from ersd.models.hf_slots import SlotCache, slot_store

if TYPE_CHECKING:
    from ersd.models.hf import HFModel

# rows feeding more uncached committed tokens than this (prefill) are scored on their own
MAX_BATCHED_TAIL = 8


def batchable(model: HFModel) -> bool:
    """Whether ``model``'s sessions can share forwards on the slot storage."""
    return (
        model.sliding_window is None
        and model.resolved_tree_attention() == "mask"
        and slot_store(model) is not None
    )


def score_batch(
    model: HFModel,
    sessions: Sequence[Any],
    calls: Sequence[tuple[Sequence[int], Sequence[int]]],
    root: bool = True,
) -> list[torch.Tensor]:
    """``[s.score(*c) for s, c in zip(sessions, calls)]``, one forward for the batchable rows
    (``root=False``: :meth:`HFSession.score`'s, without a known root row's copy)."""
    out: list[torch.Tensor | None] = [None] * len(sessions)
    group: list[tuple[int, HFSession, MaskPlan]] = []
    alone: list[tuple[int, HFSession, MaskPlan]] = []
    ok = batchable(model)
    for i, (sess, (tokens, parents)) in enumerate(zip(sessions, calls, strict=True)):
        if not (ok and isinstance(sess, HFSession) and sess.owner is model):
            continue
        sess._check_open()
        check_tree_args(tokens, parents, len(sess._ptok))
        if len(tokens) == 0 and sess._root is not None:
            continue  # answered without a forward
        long = len(sess.committed) - sess._n_cached > MAX_BATCHED_TAIL
        if long and sess._slot is None:
            continue  # prefilled on its own DynamicCache
        depths = sess.depths_of(parents)
        sess._check_window(depths)
        sess._mode = "mask"
        (alone if long else group).append((i, sess, sess.plan_mask(tokens, parents, depths)))
    if len(group) == 1 and group[0][1]._slot is None:
        group = []  # a lone fresh row: its own plain forward (the plan is rebuilt, nothing changed)
    parts = [group] if group else []
    parts += [[row] for row in alone]
    for part in parts:
        for (i, _, _), logits in zip(part, forward_slots(model, part, root), strict=True):
            out[i] = logits  # checked by forward_slots, once over the forward's new rows
    for i, (sess, call) in enumerate(zip(sessions, calls, strict=True)):
        if out[i] is None:
            out[i] = sess.score(*call, root=root)
    return [o for o in out if o is not None]


def forward_slots(
    model: HFModel, rows: list[tuple[int, HFSession, MaskPlan]], root: bool = True
) -> list[torch.Tensor]:
    """One forward for the planned rows on the slot storage; returns what each row's
    :meth:`HFSession.score` returns, in the order of ``rows``."""
    store = slot_store(model)
    assert store is not None
    sessions = [sess for _, sess, _ in rows]
    plans = [plan for _, _, plan in rows]
    ends = [plan.past + len(plan.ids) for plan in plans]
    lo = store.arrange(sessions, max(ends))
    refs = [sess._slot for sess in sessions]
    assert all(r is not None for r in refs)
    order = sorted(range(len(rows)), key=lambda j: refs[j].slot)  # type: ignore[union-attr]
    n = len(rows)
    q_len = max(len(plan.ids) for plan in plans)
    width = max(ends)
    ids = torch.zeros(n, q_len, dtype=torch.long)
    positions = torch.zeros(n, q_len, dtype=torch.long)
    allowed = torch.zeros(n, 1, q_len, width, dtype=torch.bool)
    rr: list[int] = []
    cc: list[int] = []
    qq: list[int] = []
    for r, j in enumerate(order):
        plan = plans[j]
        q, past = len(plan.ids), plan.past
        assert refs[j].slot == lo + r and refs[j].length == past  # type: ignore[union-attr]
        ids[r, :q] = torch.tensor(plan.ids)
        positions[r, :q] = torch.tensor(plan.positions)
        positions[r, q:] = plan.positions[-1]
        if plan.allowed is None:  # plain causal continuation
            allowed[r, 0, :q, :past] = True
            allowed[r, 0, :q, past : past + q] = torch.ones(q, q, dtype=torch.bool).tril_()
        else:
            allowed[r, 0, :q, : past + q] = plan.allowed
        allowed[r, 0, q:, 0] = True  # padding queries see column 0 only
        rr.extend([r] * q)
        cc.extend(range(past, past + q))
        qq.extend(range(q))
    mask = torch.zeros(allowed.shape, dtype=model.dtype)
    mask.masked_fill_(~allowed, model._mask_min)
    dev = model.device
    cache = SlotCache(
        store,
        lo,
        n,
        torch.tensor(rr, device=dev),
        torch.tensor(cc, device=dev),
        torch.tensor(qq, device=dev),
        past=max(plan.past for plan in plans),
        fed=q_len,
        width=width,
    )
    with torch.no_grad():
        logits = model._forward(ids.to(dev), positions.to(dev), cache, mask.to(dev), q_len)
    logits = logits.float()
    model.check_logits(logits)  # every new row once (a root prepended below was checked before)
    out: list[torch.Tensor] = [logits[0]] * n
    for r, j in enumerate(order):
        sess, plan = sessions[j], plans[j]
        q = len(plan.ids)
        refs[j].length = plan.past + q  # type: ignore[union-attr]
        out[j] = sess.finish_mask(plan, logits[r, q - plan.keep : q], root)
    return out
