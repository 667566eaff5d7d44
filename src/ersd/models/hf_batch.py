"""One forward for the score calls of several :class:`~ersd.models.hf_session.HFSession` s.

Each session keeps its own ``DynamicCache`` (so a sequence joins or leaves the batch between steps
and a finished one frees its cache by being dropped).  :func:`score_batch` stacks the sessions'
caches into one temporary batch cache, feeds every row's call in one forward and hands each row its
new cache entries back:

* past columns ``[0, P)`` hold row ``i``'s ``past_i`` cached entries right-padded to
  ``P = max past_i``; new columns ``[P, P + Q)`` hold its ``q_i`` fed tokens right-padded to
  ``Q = max q_i``;
* the 4-D mask of row ``i`` is the row's own tree mask (:meth:`HFSession.plan_mask`) with its past
  part placed at columns ``[0, past_i)`` and its new part at ``[P, P + q_i)``; padding columns are
  never attended, padding query rows attend only to themselves (their outputs are dropped);
* position ids are per row, so rows of different lengths and tree depths share the forward.

Each row therefore computes exactly its own attention; the only numerical difference from a
one-row forward is the matrix kernels' blocking for a different number of rows (float32 sums in
another order), see ``docs/batching.md``.

Rows that would not pay or are not supported go through :meth:`HFSession.score` one by one: rows
feeding a long uncached tail (a prompt being prefilled, which would pad every other row to its
length), and every row when the model uses sliding-window layers or the ``"paths"`` fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ersd.models.base import check_tree_args
from ersd.models.hf_session import HFSession, MaskPlan

if TYPE_CHECKING:
    from ersd.models.hf import HFModel

# rows feeding more uncached committed tokens than this (prefill) are scored on their own
MAX_BATCHED_TAIL = 8


def score_batch(
    model: HFModel, sessions: Sequence[Any], calls: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> list[torch.Tensor]:
    """``[s.score(*c) for s, c in zip(sessions, calls)]``, one forward for the batchable rows."""
    out: list[torch.Tensor | None] = [None] * len(sessions)
    batch: list[tuple[int, HFSession, MaskPlan]] = []
    batchable = model.sliding_window is None and model.resolved_tree_attention() == "mask"
    for i, (sess, (tokens, parents)) in enumerate(zip(sessions, calls, strict=True)):
        if not (batchable and isinstance(sess, HFSession) and sess.owner is model):
            continue
        check_tree_args(tokens, parents, len(sess._ptok))
        if len(tokens) == 0 and sess._root is not None:
            continue  # answered without a forward
        if len(sess.committed) - sess._n_cached > MAX_BATCHED_TAIL:
            continue
        sess._check_window(sess.depths_of(parents))
        if not sess._mode:
            sess._mode = "mask"
        batch.append((i, sess, sess.plan_mask(tokens, parents, sess.depths_of(parents))))
    if len(batch) >= 2:
        with torch.no_grad():
            rows = _forward_rows(model, batch)
        for (i, sess, plan), logits in zip(batch, rows, strict=True):
            out[i] = sess.finish_mask(plan, logits)
    elif batch:  # a single row: its own plain forward (the plan is rebuilt, nothing changed yet)
        i, sess, _ = batch[0]
        out[i] = sess.score(*calls[i])
    for i, (sess, call) in enumerate(zip(sessions, calls, strict=True)):
        if out[i] is None:
            out[i] = sess.score(*call)
    return [o for o in out if o is not None]


def _forward_rows(
    model: HFModel, batch: list[tuple[int, HFSession, MaskPlan]]
) -> list[torch.Tensor]:
    """One forward for the planned rows; returns each row's kept logits (float32)."""
    dev = model.device
    b = len(batch)
    plans = [plan for _, _, plan in batch]
    caches = [sess._cache for _, sess, _ in batch]
    p_len = max(plan.past for plan in plans)
    q_len = max(len(plan.ids) for plan in plans)
    ids = torch.zeros(b, q_len, dtype=torch.long)
    positions = torch.zeros(b, q_len, dtype=torch.long)
    allowed = torch.zeros(b, 1, q_len, p_len + q_len, dtype=torch.bool)
    for r, plan in enumerate(plans):
        q, past = len(plan.ids), plan.past
        ids[r, :q] = torch.tensor(plan.ids)
        positions[r, :q] = torch.tensor(plan.positions)
        positions[r, q:] = plan.positions[-1]
        if plan.allowed is None:  # plain causal continuation
            allowed[r, 0, :q, :past] = True
            allowed[r, 0, :q, p_len : p_len + q] = torch.ones(q, q, dtype=torch.bool).tril_()
        else:
            allowed[r, 0, :q, :past] = plan.allowed[:, :past]
            allowed[r, 0, :q, p_len : p_len + q] = plan.allowed[:, past:]
        pad = torch.arange(q, q_len)
        allowed[r, 0, pad, p_len + pad] = True  # padding queries see themselves only
    mask = torch.zeros(allowed.shape, dtype=model.dtype)
    mask.masked_fill_(~allowed, model._mask_min)
    stacked = model.new_cache()
    if p_len:
        _stack_into(stacked, caches, plans, p_len)
    logits = model._forward(ids.to(dev), positions.to(dev), stacked, mask.to(dev), q_len).float()
    # hand each row its new entries: the columns [P, P + q_i) of its batch row
    for r, (cache, plan) in enumerate(zip(caches, plans, strict=True)):
        q = len(plan.ids)
        for idx, layer in enumerate(stacked.layers):
            keys = layer.keys[r : r + 1, :, p_len : p_len + q]
            values = layer.values[r : r + 1, :, p_len : p_len + q]
            cache.update(keys.contiguous(), values.contiguous(), idx)
    return [logits[r, len(plan.ids) - plan.keep : len(plan.ids)] for r, plan in enumerate(plans)]


def _stack_into(stacked: Any, caches: list[Any], plans: list[MaskPlan], p_len: int) -> None:
    """Fill the empty batch cache ``stacked`` with each row's cache, right-padded to ``p_len``."""
    ref = next(c for c, plan in zip(caches, plans, strict=True) if plan.past)
    for idx, ref_layer in enumerate(ref.layers):
        k0, v0 = ref_layer.keys, ref_layer.values
        keys = k0.new_zeros(len(caches), k0.shape[1], p_len, k0.shape[3])
        values = v0.new_zeros(len(caches), v0.shape[1], p_len, v0.shape[3])
        for r, (cache, plan) in enumerate(zip(caches, plans, strict=True)):
            if plan.past:
                layer = cache.layers[idx]
                keys[r, :, : plan.past] = layer.keys[0, :, : plan.past]
                values[r, :, : plan.past] = layer.values[0, :, : plan.past]
        stacked.update(keys, values, idx)
