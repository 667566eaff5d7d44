"""Persistent batched KV storage for the sessions of one :class:`~ersd.models.hf.HFModel`.

A :class:`SlotStore` holds the KV cache of every session that has been scored in a batch, in one
tensor ``kv[layer, key/value, slot, kv_head, column, head_dim]``: each such session owns one *slot*
(a row of the batch dimension) and its cache entries are the columns ``[0, length)`` of that slot,
laid out exactly like its own ``DynamicCache`` was (committed tokens, then pending tree nodes).
A batched forward (:mod:`ersd.models.hf_batch`) then needs no copy of any row's past: the rows of
the call occupy a contiguous range of slots, :class:`SlotCache` (a transformers ``Cache`` whose
layers are :class:`SlotLayer` s) writes each row's new keys and values at that row's own columns
``[past_i, past_i + q_i)`` and hands the attention a view of the used columns, and the 4-D mask
lets each row see only its own columns.  A commit moves the accepted path's columns next to the
committed ones inside the slot (RoPE is already applied to cached keys, so columns move freely).

Slots are assigned when a session joins its first batched forward (its ``DynamicCache``, filled by
a solo prefill, is copied in once) and freed when the session is closed or collected.  When the
last slot is freed the storage is kept for the next batch (as an engine keeps its preallocated KV
cache) if it is at most :data:`KEEP_BYTES`, else released; a kept storage is zeroed when it is used
again (a memset, ~15x cheaper than a fresh allocation's page faults: 26 ms for the Qwen pair's two
stores at batch 8), and :meth:`SlotStore.trim` frees it.  The store grows geometrically (slots and
columns) and never shrinks while a slot is held.  Columns past a row's length hold stale or zero
values that the mask never exposes.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

if TYPE_CHECKING:
    from ersd.models.hf import HFModel
    from ersd.models.hf_session import HFSession

_ALIGN = 64  # columns are allocated in multiples of this

#: the largest storage (bytes) a store keeps, zeroed, for the next batch once its last slot is
#: freed; a larger one is released then
KEEP_BYTES = 256 * 2**20


class SlotRef:
    """A session's handle on its slot: the slot index (moved by :meth:`SlotStore.arrange`) and the
    number of cache entries it holds.  Has the two ``DynamicCache`` methods the session uses."""

    def __init__(self, store: SlotStore, slot: int, length: int) -> None:
        self.store = store
        self.slot = slot
        self.length = length

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """``DynamicCache.crop`` with a negative count: drop the last entries."""
        self.length = max(self.length + min(tokens_to_remove, 0), 0)

    def compact(self, base: int, columns: list[int]) -> None:
        """Move the entries at ``columns`` (ascending, all ``>= base``) to ``[base, base + k)``."""
        kv = self.store.kv
        assert kv is not None and self.slot >= 0
        own = kv[:, :, self.slot]  # [layers, 2, heads, capacity, head_dim]
        idx = torch.tensor(columns, device=kv.device)
        own[:, :, :, base : base + len(columns)] = own.index_select(3, idx)


class SlotStore:
    """The batched KV storage of one model (see the module docstring)."""

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype, device: Any):
        self.shape = (layers, heads, head_dim)
        self.dtype, self.device = dtype, device
        self.kv: torch.Tensor | None = None  # [layers, 2, slots, heads, capacity, head_dim]
        self.owners: list[SlotRef | None] = []
        self.moved = 0  # rows copied between slots by arrange() (composition changes)

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else int(self.kv.shape[4])

    @property
    def used(self) -> int:
        """Slots held by sessions."""
        return sum(o is not None for o in self.owners)

    def reserve(self, slots: int, columns: int, planned: int = 0) -> None:
        """Grow (geometrically, zero-filled) to at least ``slots`` slots of ``columns`` columns.

        ``planned``: the columns the rows are expected to need in all (their sessions'
        ``expected_length``); a store that must grow anyway, or that is narrower than that,
        grows to it at once.  Nothing is ever copied from a row's past except here (a regrowth)
        and in a compaction."""
        if self.kv is not None and not self.owners:  # kept from the last batch: reuse or drop it
            kept = self.kv
            if slots <= kept.shape[2] and max(columns, planned) <= kept.shape[4]:
                kept.zero_()
                self.owners = [None] * kept.shape[2]
                return
            self.kv = None
        have_s, have_c = len(self.owners), self.capacity
        need = max(columns, planned)
        if slots <= have_s and need <= have_c:
            return
        new_s = have_s if slots <= have_s else max(slots, have_s + have_s // 2)
        if need <= have_c:
            new_c = have_c
        elif planned >= columns:  # the rows' own plan: no headroom on top of it
            new_c = max(planned, have_c + have_c // 2)
        else:  # a quarter of headroom: rows grow a few columns a step, a regrowth copies all
            new_c = max(columns + columns // 4, have_c + have_c // 2)
        new_c = -(-new_c // _ALIGN) * _ALIGN
        layers, heads, head_dim = self.shape
        kv = torch.zeros(
            layers, 2, new_s, heads, new_c, head_dim, dtype=self.dtype, device=self.device
        )
        if self.kv is not None:
            kv[:, :, :have_s, :, :have_c] = self.kv
        self.kv = kv
        self.owners.extend([None] * (new_s - have_s))

    def release(self, ref: SlotRef) -> None:
        """Free ``ref``'s slot; when no slot is held the storage is kept for the next batch (at
        most :data:`KEEP_BYTES`, zeroed when reused) or released."""
        if 0 <= ref.slot < len(self.owners) and self.owners[ref.slot] is ref:
            self.owners[ref.slot] = None
        ref.slot = -1
        if not any(self.owners):
            self.owners = []
            if self.kv is not None and self.kv.nbytes > KEEP_BYTES:
                self.kv = None

    def trim(self) -> None:
        """Free the storage kept after the last batch (nothing while a slot is held)."""
        if not any(self.owners):
            self.kv, self.owners = None, []

    def arrange(self, sessions: list[HFSession], columns: int) -> int:
        """Give every session a slot and make their slots one contiguous range ``[lo, lo + n)``
        of a store at least ``columns`` wide; returns ``lo``.

        Sessions without a slot have their ``DynamicCache`` copied in.  If the sessions' slots are
        not contiguous they are compacted into ``[0, n)``: sessions already there stay, the others
        move in (one copy of their used columns) and other sessions holding slots there move out.
        """
        n = len(sessions)
        refs = [s._slot for s in sessions]
        held = sorted(r.slot for r in refs if r is not None)
        if len(held) == n and held[-1] - held[0] == n - 1:
            self.reserve(len(self.owners), columns)
            return held[0]
        joining = [s for s, r in zip(sessions, refs, strict=True) if r is None]
        widest = max([columns, *(s._cache.get_seq_length() for s in joining)])
        # the rows' plan, but never more than twice what they hold now: a request allowed 4096
        # new tokens that stops at 100 must not hold 4096 columns in every slot
        planned = min(max([0, *(s.expected_length for s in joining)]), 2 * widest)
        self.reserve(max(n, self.used + len(joining)), widest, planned)
        mine = {id(r) for r in refs if r is not None}
        holes = [s for s in range(n) if self.owners[s] is None or id(self.owners[s]) not in mine]
        outside = [r for r in refs if r is not None and r.slot >= n]
        evicted = [o for s in holes if (o := self.owners[s]) is not None]
        spare = [s for s in range(n, len(self.owners)) if self.owners[s] is None]
        spare += [r.slot for r in outside]  # free once their rows have moved
        moves: list[tuple[SlotRef, int]] = list(zip(outside, holes, strict=False))
        moves += list(zip(evicted, spare, strict=False))
        assert len(moves) == len(outside) + len(evicted)
        if moves:
            kv = self.kv
            assert kv is not None
            width = max(r.length for r, _ in moves)
            src = torch.tensor([r.slot for r, _ in moves], device=kv.device)
            dst = torch.tensor([d for _, d in moves], device=kv.device)
            kv[:, :, dst, :, :width] = kv[:, :, src, :, :width]
            self.moved += len(moves)
            for r, _ in moves:
                self.owners[r.slot] = None
            for r, d in moves:
                r.slot = d
                self.owners[d] = r
        for sess, slot in zip(joining, holes[len(outside) :], strict=True):
            self._admit(sess, slot)
        return 0

    def _admit(self, sess: HFSession, slot: int) -> None:
        """Copy ``sess``'s ``DynamicCache`` into the free ``slot``; the session uses the slot from
        now on (and frees it when closed or collected)."""
        kv = self.kv
        assert kv is not None and self.owners[slot] is None
        cache = sess._cache
        length = int(cache.get_seq_length())
        if length:
            for i, layer in enumerate(cache.layers):
                kv[i, 0, slot, :, :length] = layer.keys[0]
                kv[i, 1, slot, :, :length] = layer.values[0]
        ref = SlotRef(self, slot, length)
        self.owners[slot] = ref
        sess._attach_slot(ref, weakref.finalize(sess, self.release, ref))


def slot_store(model: HFModel) -> SlotStore | None:
    """The model's store, made on first use; ``None`` when its cache layout does not fit one
    tensor (layers without states, or with different head counts or sizes): such models score
    every row on its own."""
    store = getattr(model, "_slot_store", False)
    if store is False:
        store = _probe_store(model)
        model._slot_store = store  # type: ignore[attr-defined]
    return store  # type: ignore[return-value]


def _probe_store(model: HFModel) -> SlotStore | None:
    """Feed one token into a fresh ``DynamicCache`` and read the layout of its layers."""
    cache = model.new_cache()
    with torch.no_grad():
        model.hf_module(
            input_ids=torch.tensor([[0]], device=model.device),
            use_cache=True,
            **{model._cache_kwarg: cache},
        )
    shapes = set()
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            return None
        if keys.shape != values.shape or keys.dim() != 4 or keys.shape[2] != 1:
            return None
        shapes.add((tuple(keys.shape), keys.dtype))
    if len(shapes) != 1:
        return None
    (shape, dtype) = shapes.pop()
    return SlotStore(len(cache.layers), shape[1], shape[3], dtype, model.device)


class SlotCache(Cache):
    """The cache of one batched forward over the slots ``[lo, lo + n)``: layer ``l`` writes the new
    key/value of fed token ``qs[j]`` of row ``rows[j]`` at column ``cols[j]`` and returns the
    columns ``[0, width)`` of the rows (a view; nothing of the past is copied)."""

    def __init__(
        self,
        store: SlotStore,
        lo: int,
        n: int,
        rows: torch.Tensor,
        cols: torch.Tensor,
        qs: torch.Tensor,
        past: int,
        fed: int,
        width: int,
    ) -> None:
        self.store, self.lo, self.n = store, lo, n
        self.rows, self.cols, self.qs = rows, cols, qs
        self.past, self.fed, self.width = past, fed, width
        super().__init__(layers=[SlotLayer(self, i) for i in range(store.shape[0])])


class SlotLayer(CacheLayerMixin):
    """One layer of a :class:`SlotCache`."""

    is_compileable = False
    is_sliding = False

    def __init__(self, cache: SlotCache, index: int) -> None:
        super().__init__()
        self.cache, self.index = cache, index
        self.is_initialized = True
        self.updated = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cache
        kv = c.store.kv
        assert kv is not None
        keys = kv[self.index, 0, c.lo : c.lo + c.n]  # [n, heads, capacity, head_dim]
        values = kv[self.index, 1, c.lo : c.lo + c.n]
        keys[c.rows, :, c.cols] = key_states[c.rows, :, c.qs]
        values[c.rows, :, c.cols] = value_states[c.rows, :, c.qs]
        self.updated = True
        return keys[:, :, : c.width], values[:, :, : c.width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.width, 0

    def get_seq_length(self) -> int:
        """Columns before the forward (the widest past) plus the fed columns once written."""
        return self.cache.past + (self.cache.fed if self.updated else 0)

    def get_max_length(self) -> int:
        return self.cache.store.capacity
