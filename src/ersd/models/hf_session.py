"""The session of an :class:`ersd.models.hf.HFModel`: KV-cache layout, tree masks, commit surgery.

One session keeps a transformers ``DynamicCache`` laid out as

    [committed tokens that were fed] [pending tree nodes, in the order they were scored]

followed, logically, by an *uncached tail* of committed tokens that were never fed (the bonus token
of the last step, accepted draft leaves).  ``score(tokens, parents)`` feeds the tail and the new
tree nodes in **one** forward pass with explicit position ids (a node at depth ``d`` sits at
position ``len(committed) + d - 1``) and a custom 4-D additive attention mask: a node sees the
committed sequence and its own ancestors among the pending nodes — tree attention as in
SpecInfer (Miao et al., 2024) and Medusa (Cai et al., 2024), built only on transformers' public
extension points (4-D masks, ``position_ids``, the cache's ``layers``), without forked modeling
files.
``commit(tokens, path)`` moves the accepted path's cache entries next to the committed ones and
drops every other pending entry, so the cache always equals what a plain forward over the committed
sequence would have produced.

If an architecture rejects custom 4-D masks (detected once per model by a tiny probe), sessions fall
back to scoring every root-to-leaf path of the new nodes as one row of a batch, with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ersd import blockmax
from ersd.errors import ErsdError, GenerationInputError
from ersd.models.base import check_commit_args, check_tree_args

if TYPE_CHECKING:
    from ersd.models.hf import HFModel
    from ersd.models.hf_slots import SlotRef


@dataclass
class MaskPlan:
    """One session's share of a tree-mask forward (see :meth:`HFSession.plan_mask`)."""

    ids: list[int]  # uncached committed tail, then the new nodes
    positions: list[int]
    allowed: torch.Tensor | None  # [q, past + q] bool, None = plain causal
    past: int  # cache entries before the forward
    tail: int  # committed tokens fed (the first `tail` ids)
    keep: int  # logits rows the session needs (the last `keep` of the q rows)
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ancestors: list[list[int]]
    #: the first kept row is the one before the root (:meth:`HFSession.score_previous`)
    previous: bool = False


class HFSession:
    """Session of an :class:`HFModel`; see the module docstring for the cache layout."""

    #: ``score(..., root=False)`` may return only the new nodes' rows
    #: (:func:`ersd.models.batch.score_many`)
    rootless_rows = True

    def __init__(self, owner: HFModel, prompt: Sequence[int]) -> None:
        self.owner = owner
        self._committed: list[int] = [int(t) for t in prompt]
        self._cache = owner.new_cache()
        self._n_cached = 0  # committed tokens held by the cache (a prefix of _committed)
        self._root: torch.Tensor | None = None  # logits after the committed sequence
        # pending tree (all nodes scored since the last commit)
        self._ptok: list[int] = []
        self._ppar: list[int] = []
        self._pdepth: list[int] = []
        self._panc: list[list[int]] = []  # ancestors of each node, itself included, root first
        # next-token logits of each node: (a forward's rows, the node's row in them), the row's
        # view made only for the node a commit keeps (one view a step, not one a node)
        self._prow: list[tuple[torch.Tensor, int]] = []
        self._mode = ""  # resolved lazily: "mask" or "paths"
        # set once scored in a batch: the cache then lives in the model's slot storage
        self._slot: SlotRef | None = None
        self._final: Any = None  # frees the slot (on close() or when collected)
        self._closed = False
        #: tokens this session is expected to hold at most (0: unknown), see expect_length
        self.expected_length = 0
        self._want_previous = False  # score_previous: keep the row before the root too
        self._previous: torch.Tensor | None = None

    def expect_length(self, tokens: int) -> None:
        """A hint: this session will hold at most ``tokens`` tokens (prompt, generated tokens and
        one step's draft tree).  When it joins the model's batched storage, its slot is made that
        wide at once instead of being regrown as it grows (each regrowth copies every slot; on a
        machine where fresh memory is slow to touch, ~0.4 s for a 1.5B model's 8 slots).  Exceeding
        the hint is allowed: the storage then grows as it would without one."""
        self.expected_length = max(int(tokens), 0)

    def _attach_slot(self, ref: SlotRef, final: Any) -> None:
        """The cache now lives in ``ref``'s slot (:meth:`SlotStore.arrange` copied it there)."""
        self._slot = self._cache = ref
        self._final = final

    def close(self) -> None:
        """Free the KV cache now (its slot of the batched storage, or its own cache) instead of
        when the session is collected; the session cannot be scored afterwards."""
        if self._final is not None:
            self._final()
        self._slot = self._final = None
        self._cache = self.owner.new_cache()
        self._n_cached = 0
        self._root = None
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ErsdError("this session was closed; start a new one with model.start(prompt)")

    @property
    def committed(self) -> list[int]:
        return self._committed

    @property
    def cache_length(self) -> int:
        """Entries in the KV cache (committed prefix + cached pending nodes)."""
        return int(self._cache.get_seq_length())

    # -- score ---------------------------------------------------------------------------------

    def score(
        self, tokens: Sequence[int], parents: Sequence[int], root: bool = True
    ) -> torch.Tensor:
        """The logits rows of the root and the new nodes, ``[1 + n, V]`` (``root=False``: only
        the new nodes' ``[n, V]`` where the root is already known, so no copy of it is made; see
        :func:`ersd.models.batch.score_many`)."""
        self._check_open()
        n = len(tokens)
        num_pending = len(self._ptok)
        check_tree_args(tokens, parents, num_pending)
        if n == 0 and self._root is not None:
            return self._root.unsqueeze(0)
        depths = self.depths_of(parents)
        self._check_window(depths)
        if not self._mode:
            self._mode = self.owner.resolved_tree_attention() if n else ""
        with torch.no_grad():
            if self._mode == "paths" and n:
                rows = self._score_paths(tokens, parents, depths)
            else:
                rows = self._score_mask(tokens, parents, depths, root)
        self.owner.check_logits(rows)
        return rows

    def score_previous(
        self, tokens: Sequence[int], parents: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`score`, and the logits row before the root -- the next-token logits after
        ``committed[:-1]`` -- where this call feeds that row anyway (two or more committed tokens
        not yet fed: a fully accepted chain's last token and its bonus); None otherwise.  The
        row costs one more row of the output layer, nothing else.  A drafter learns from it
        whether it would have drafted the bonus token (:mod:`ersd.drafting.model`)."""
        self._want_previous, self._previous = True, None
        try:
            rows = self.score(tokens, parents)
        finally:
            self._want_previous = False
        return rows, self._previous

    def _check_window(self, depths: list[int]) -> None:
        length = len(self._committed)
        top = length + (max(depths) if depths else 0)  # one past the largest position fed
        window = self.owner.max_length
        if window is not None and top > window:
            raise GenerationInputError(
                f"the sequence ({length} tokens) plus a draft tree of depth {top - length} exceeds "
                f"the model's context window of {window} tokens; lower "
                "max_new_tokens, the tree depth or the prompt length"
            )

    def _ancestors(self, parents: Sequence[int]) -> list[list[int]]:
        """Pending indices of each new node's ancestors, itself included, root side first."""
        first = len(self._ptok)
        ancs: list[list[int]] = []
        for i, par in enumerate(parents):
            if par < 0:
                ancs.append([first + i])
            elif par < first:
                ancs.append([*self._panc[par], first + i])
            else:
                ancs.append([*ancs[par - first], first + i])
        return ancs

    def _add_pending(
        self,
        tokens: Sequence[int],
        parents: Sequence[int],
        depths: list[int],
        ancs: list[list[int]],
        rows: torch.Tensor,
    ) -> None:
        self._ptok.extend(int(x) for x in tokens)
        self._ppar.extend(int(x) for x in parents)
        self._pdepth.extend(depths)
        self._panc.extend(ancs)
        self._prow.extend((rows, i) for i in range(rows.shape[0]))

    def _score_mask(
        self, tokens: Sequence[int], parents: Sequence[int], depths: list[int], root: bool = True
    ) -> torch.Tensor:
        owner = self.owner
        plan = self.plan_mask(tokens, parents, depths)
        if self._slot is not None:  # scored on its slot of the batched storage, alone
            return owner.forward_slots([(0, self, plan)], root)[0]
        mask: torch.Tensor | dict[str, torch.Tensor] | None = None  # plain causal continuation
        if plan.allowed is not None:
            mask = owner._additive(plan.allowed)
            if owner.sliding_window is not None:
                mask = {
                    "full_attention": mask,
                    "sliding_attention": owner._additive(plan.allowed & self._near(plan)),
                }
        ids = torch.tensor([plan.ids], dtype=torch.long, device=owner.device)
        positions = torch.tensor([plan.positions], dtype=torch.long, device=owner.device)
        logits = owner._forward(ids, positions, self._cache, mask, plan.keep)[0].float()
        return self.finish_mask(plan, logits, root)

    def plan_mask(
        self, tokens: Sequence[int], parents: Sequence[int], depths: list[int]
    ) -> MaskPlan:
        """What one tree-mask forward of this call feeds: ids, positions, the ``[q, past + q]``
        attention pattern (None = plain causal) over ``past`` cache entries, logits rows kept."""
        n = len(tokens)
        num_pending = len(self._ptok)
        length = len(self._committed)
        cached = self._n_cached
        if self._root is None and cached == length:
            # every committed token is cached but its logits are unknown: feed the last one again
            self._crop(cached - 1)
            self._n_cached = cached = cached - 1
        tail = self._committed[cached:]
        t = len(tail)  # t > 0 implies num_pending == 0: score() always feeds the tail
        previous = self._want_previous and t >= 2
        ancs = self._ancestors(parents)
        pos = list(range(cached, length))
        pos.extend(length + d - 1 for d in depths)
        allowed: torch.Tensor | None = None
        if (n or num_pending) and not (
            self.owner.causal_chains and self._is_chain([*self._ppar, *parents])
        ):
            q = t + n
            kv = cached + num_pending + q
            allowed = torch.zeros(q, kv, dtype=torch.bool)
            allowed[:, :cached] = True
            if t:
                allowed[:t, cached : cached + t] = torch.ones(t, t, dtype=torch.bool).tril_()
                allowed[t:, cached : cached + t] = True
            rr: list[int] = []
            cc: list[int] = []
            off = cached + t
            for i, anc in enumerate(ancs):
                rr.extend([t + i] * len(anc))
                cc.extend(off + a for a in anc)
            allowed[rr, cc] = True
        return MaskPlan(
            ids=[*tail, *(int(x) for x in tokens)],
            positions=pos,
            allowed=allowed,
            past=cached + num_pending,
            tail=t,
            keep=n + (1 if t else 0) + (1 if previous else 0),
            tokens=list(tokens),
            parents=list(parents),
            depths=depths,
            ancestors=ancs,
            previous=previous,
        )

    @staticmethod
    def _is_chain(parents: Sequence[int]) -> bool:
        """Whether the pending nodes and the new ones (``parents``: all of them, in pending
        order) form one chain below the committed sequence, in order: then the cache holds the
        committed tokens and the chain at consecutive columns and positions, every row sees
        exactly the columns before it, and the forward's mask is the plain causal one
        (``allowed = None``: transformers builds it, or skips it for one query row, as it does in
        its own decoding loop) -- the shape of every call of a chain tree and of a chain
        drafter."""
        return all(p == j - 1 for j, p in enumerate(parents))

    def _near(self, plan: MaskPlan) -> torch.Tensor:
        """Sliding-window layers see keys less than ``window`` positions back (transformers'
        sliding_window_overlay), measured in positions, not cache columns."""
        cached, length = self._n_cached, len(self._committed)
        kv_pos = torch.tensor(
            [*range(cached), *(length + d - 1 for d in self._pdepth), *plan.positions]
        )
        window = self.owner.sliding_window
        assert window is not None
        return (torch.tensor(plan.positions)[:, None] - kv_pos[None, :]) < window

    def finish_mask(self, plan: MaskPlan, logits: torch.Tensor, root: bool = True) -> torch.Tensor:
        """Record the forward of ``plan`` (its last ``plan.keep`` logits rows, float32) and return
        what :meth:`score` returns (``root=False``: the new nodes' rows alone where no tail was
        fed, a view of the forward's output)."""
        self._n_cached = len(self._committed)
        if plan.previous:
            self._previous, logits = logits[0], logits[1:]
        if plan.tail:
            self._root = logits[0]
            node_rows = logits[1:]
        else:
            assert self._root is not None
            node_rows = logits
        self._add_pending(plan.tokens, plan.parents, plan.depths, plan.ancestors, node_rows)
        if plan.tail:
            return logits
        if not root and len(node_rows):
            return node_rows
        return blockmax.cat([self._root.unsqueeze(0), node_rows])

    def depths_of(self, parents: Sequence[int]) -> list[int]:
        """Depth of each new node (1 = child of the committed sequence)."""
        num_pending = len(self._ptok)
        depths: list[int] = []
        for p in parents:
            if p < 0:
                depths.append(1)
            elif p < num_pending:
                depths.append(self._pdepth[p] + 1)
            else:
                depths.append(depths[p - num_pending] + 1)
        return depths

    def _score_paths(
        self, tokens: Sequence[int], parents: Sequence[int], depths: list[int]
    ) -> torch.Tensor:
        """Fallback: feed the tail, then every root-to-leaf path of the new nodes as a batch row
        (right-padded; causal attention ignores the padding).  Pending nodes are not cached."""
        owner = self.owner
        dev = owner.device
        if self._root is None or self._n_cached < len(self._committed):
            self._score_mask([], [], [])  # feeds the tail (plain causal), sets the root row
        first = len(self._ptok)
        length = len(self._committed)
        n = len(tokens)
        ancs = self._ancestors(parents)
        is_parent = {p - first for p in parents if p >= first}
        leaves = [i for i in range(n) if i not in is_parent]
        width = max(len(ancs[i]) for i in leaves)
        all_tok = [*self._ptok, *(int(x) for x in tokens)]
        ids = torch.zeros(len(leaves), width, dtype=torch.long)
        where: dict[int, tuple[int, int]] = {}
        for b, leaf in enumerate(leaves):
            path = ancs[leaf]
            ids[b, : len(path)] = torch.tensor([all_tok[g] for g in path])
            for j, g in enumerate(path):
                if g >= first:
                    where.setdefault(g - first, (b, j))
        positions = (torch.arange(width) + length).expand(len(leaves), width)
        cache = self._cache
        cache.batch_repeat_interleave(len(leaves))
        try:
            logits = owner._forward(ids.to(dev), positions.to(dev), cache, None, width)
        finally:
            cache.crop(-width)
            cache.batch_select_indices(torch.tensor([0], device=dev))
        rows = torch.stack([logits[b, j] for b, j in (where[i] for i in range(n))]).float()
        self._add_pending(tokens, parents, depths, ancs, rows)
        assert self._root is not None
        return torch.cat([self._root.unsqueeze(0), rows], dim=0)

    # -- commit --------------------------------------------------------------------------------

    def commit(self, tokens: Sequence[int], path: Sequence[int]) -> None:
        self._check_open()
        check_commit_args(tokens, path, self._ptok, self._ppar)
        k = len(path)
        if self._ptok and self._mode != "paths":
            base = self._n_cached  # == len(committed): pending nodes exist only after a score
            if self._slot is not None and any(node != j for j, node in enumerate(path)):
                with torch.no_grad():
                    self._slot.compact(base, [base + node for node in path])
            elif any(node != j for j, node in enumerate(path)):
                with torch.no_grad():
                    idx = torch.tensor([base + node for node in path], device=self.owner.device)
                    for layer in self._cache.layers:
                        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                            continue  # a layer holding no states (e.g. KV shared with another)
                        layer.keys[..., base : base + k, :] = layer.keys.index_select(-2, idx)
                        layer.values[..., base : base + k, :] = layer.values.index_select(-2, idx)
            self._crop(base + k)
            self._n_cached = base + k
        if len(tokens) == 0:
            root = self._root if not self._ptok else None
        elif k == len(tokens):
            rows, i = self._prow[path[-1]]
            root = rows[i]
        else:
            root = None
        self._committed.extend(int(t) for t in tokens)
        self._root = root
        self._ptok, self._ppar, self._pdepth, self._panc, self._prow = [], [], [], [], []

    def _crop(self, length: int) -> None:
        """Keep the first ``length`` cache entries."""
        drop = self._cache.get_seq_length() - length
        if drop > 0:
            self._cache.crop(-drop)
