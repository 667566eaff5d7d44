"""Session of a :class:`ersd.models.llamacpp.LlamaCppModel`: tree scoring with sequence ids.

Cache layout and sequence ids (``P`` = ``max_paths``):

* sequence 0 holds the committed tokens that were decoded;
* sequences ``1..P`` are the root-to-leaf paths of the pending tree: a new node joins the path
  whose deepest node is its parent, or opens a new path (copying the committed cells and its
  already-decoded ancestors into it with ``seq_cp``); in the batch a token lists its own path
  first (llama.cpp masks a query to its first sequence), then every path opened below it;
* ``P + 1`` parks rejected nodes in exact mode (see :mod:`ersd.models.llamacpp`).

A ``score`` call decodes the *uncached tail* (committed tokens never decoded: the prompt, the
bonus token) together with the new nodes, so one target call is one ``llama_decode`` (calls of
more than 512 tokens, long prompts, are split).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ersd.errors import ErsdError, GenerationInputError
from ersd.models.base import check_commit_args, check_tree_args
from ersd.models.checks import check_scored_logits

if TYPE_CHECKING:
    from ersd.models.llamacpp import LlamaCppModel

# one batch entry: [token, position, sequence ids (own first), wants logits]
_Item = list


class LlamaCppSession:
    """One sequence being generated; see the module docstring for the cache layout."""

    def __init__(self, owner: LlamaCppModel, ctx: _Context, prompt: Sequence[int]) -> None:
        self.owner = owner
        self._ctx = ctx
        self._committed: list[int] = [int(t) for t in prompt]
        self._n_cached = 0  # committed tokens decoded into sequence 0 (a prefix)
        self._root: np.ndarray | None = None  # logits after the committed sequence
        self._ptok: list[int] = []  # pending tree, in decode order
        self._ppar: list[int] = []
        self._pdepth: list[int] = []
        self._pseq: list[int] = []  # the path (sequence id) each node was decoded on
        self._prow: list[np.ndarray] = []
        self._leaf: dict[int, int] = {}  # open path -> its deepest node
        self._free = list(range(owner.max_paths, 0, -1))  # unused path ids (pop from the end)
        self._junk_seq = owner.max_paths + 1
        self._junk = 0  # cells parked in the junk sequence
        self._used = 0  # cells holding committed, pending or parked tokens
        self._final = weakref.finalize(self, owner.release, ctx)

    @property
    def committed(self) -> list[int]:
        return self._committed

    def close(self) -> None:
        """Give the context back to the model now (otherwise when the session is collected)."""
        self._final()

    # -- score -------------------------------------------------------------------------------

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        if not self._final.alive:
            raise ErsdError("this session was closed; start a new one with model.start(prompt)")
        tokens = [int(t) for t in tokens]
        parents = [int(p) for p in parents]
        num_pending = len(self._ptok)
        check_tree_args(tokens, parents, num_pending)
        bad = [t for t in tokens if not 0 <= t < self.owner.vocab_size]
        if bad:
            raise GenerationInputError(
                f"score(): token ids {bad[:5]} are outside [0, {self.owner.vocab_size})"
            )
        n = len(tokens)
        if n == 0 and self._root is not None:
            return torch.from_numpy(self._root[None].copy())
        depths: list[int] = []
        for p in parents:
            depths.append(1 if p < 0 else (self._pdepth + depths)[p] + 1)
        length = len(self._committed)
        top = length + max(depths, default=0)
        if top > self.owner.max_length:
            raise GenerationInputError(
                f"the sequence ({length} tokens) plus a draft tree of depth {top - length} exceeds "
                f"the context window of {self.owner.max_length} tokens; lower max_new_tokens, the "
                "tree depth or the prompt length, or load the model with a larger context="
            )
        tail = self._committed[self._n_cached :]
        self._make_room(len(tail) + n)
        items: list[_Item] = [
            [t, self._n_cached + j, [0], j == len(tail) - 1] for j, t in enumerate(tail)
        ]
        leaf, free = dict(self._leaf), list(self._free)
        try:
            node_seq, copies = self._assign_paths(tokens, parents, depths, items, len(tail))
        except ErsdError:
            self._leaf, self._free = leaf, free
            raise
        for src, dst, p0, p1 in copies:
            self._ctx.seq_cp(src, dst, p0, p1)
        # the returned rows in one array, each written once from llama.cpp's buffer: with a
        # tail the rows asked for are its last token (the root) and the n nodes, in that order
        buf = np.empty((1 + n, self.owner.vocab_size), dtype=np.float32)
        if tail:
            rows = self._decode(items, buf)
        else:
            assert self._root is not None
            buf[0] = self._root
            rows = self._decode(items, buf[1:])
        if tail:
            self._root = rows[len(tail) - 1]
            self._n_cached = length
        self._ptok += tokens
        self._ppar += parents
        self._pdepth += depths
        self._pseq += node_seq
        node_rows = [rows[len(tail) + i] for i in range(n)]
        self._prow += node_rows
        out = torch.from_numpy(buf)
        check_scored_logits(out, self.owner.name)
        return out

    def _assign_paths(
        self,
        tokens: list[int],
        parents: list[int],
        depths: list[int],
        items: list[_Item],
        n_tail: int,
    ) -> tuple[list[int], list[tuple[int, int, int, int]]]:
        """Path id of each new node; appends the nodes' batch items and adds each new path to
        the items of the tail and of in-batch ancestors; returns the ``seq_cp`` calls that give a
        new path its already-decoded cells."""
        num_pending = len(self._ptok)
        length = len(self._committed)
        node_seq: list[int] = []
        copies: list[tuple[int, int, int, int]] = []
        for i, par in enumerate(parents):
            seq = next((s for s, leaf in self._leaf.items() if leaf == par and par >= 0), None)
            if seq is None:
                if not self._free:
                    raise GenerationInputError(
                        f"the draft tree has more than {self.owner.max_paths} root-to-leaf paths "
                        "(llama.cpp sequence ids); load the model with a larger max_paths="
                    )
                seq = self._free.pop()
                if self._n_cached:
                    copies.append((0, seq, -1, -1))
                for item in items[:n_tail]:
                    item[2].append(seq)
                anc = par
                while anc >= num_pending:  # ancestors in this batch
                    items[n_tail + anc - num_pending][2].append(seq)
                    anc = parents[anc - num_pending]
                if anc >= 0:  # deepest decoded ancestor: copy its path down to it
                    depth = self._pdepth[anc]
                    copies.append((self._pseq[anc], seq, length, length + depth))
            self._leaf[seq] = num_pending + i
            node_seq.append(seq)
            items.append([tokens[i], length + depths[i] - 1, [seq], True])
        return node_seq, copies

    def _decode(self, items: list[_Item], into: np.ndarray | None = None) -> list[np.ndarray]:
        """Decode ``items`` in calls of at most the batch size; logits per item (empty where
        none were asked for), written in order into the rows of ``into`` (one row per item that
        asks for logits; default: a new array) and returned as views of it."""
        ctx, owner = self._ctx, self.owner
        out: list[np.ndarray] = []
        empty = np.zeros(0, dtype=np.float32)
        if into is None:
            wanted = sum(1 for item in items if item[3])
            into = np.empty((wanted, ctx.vocab_size), dtype=np.float32)
        k = 0
        for start in range(0, len(items), ctx.capacity):
            chunk = [(t, p, s, o) for t, p, s, o in items[start : start + ctx.capacity]]
            rc = ctx.decode(chunk)
            owner.decode_calls += 1
            owner.decoded_rows += len(chunk)
            if rc != 0:
                raise ErsdError(
                    f"llama_decode failed with code {rc} on {len(chunk)} tokens "
                    "(1: no room in the KV cache; negative: invalid batch); set logging for "
                    "'ersd.llamacpp' to DEBUG for llama.cpp's message"
                )
            self._used += len(chunk)
            for i, c in enumerate(chunk):
                if c[3]:
                    ctx.logits_into(i, into[k])
                    out.append(into[k])
                    k += 1
                else:
                    out.append(empty)
        return out

    def _make_room(self, new: int) -> None:
        """Ensure the cache has cells for ``new`` tokens; in exact mode rebuild it from the
        committed tokens when parked cells fill it."""
        ctx = self._ctx
        if self._used + new <= ctx.cells:
            return
        if self._junk and not self._ptok:
            # drop parked cells: clear and decode the committed prefix again, in order (exact
            # mode computes every row the same way in any batch, so the cache comes out equal)
            ctx.clear()
            self._used = self._junk = 0
            prefix = self._committed[: self._n_cached]
            self._decode([[t, j, [0], False] for j, t in enumerate(prefix)])
            if self._used + new <= ctx.cells:
                return
        raise GenerationInputError(
            f"the KV cache ({ctx.cells} cells) cannot hold {new} more tokens; load the model with "
            "a larger context= or use smaller draft trees"
        )

    # -- commit ------------------------------------------------------------------------------

    def commit(self, tokens: Sequence[int], path: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        path = [int(p) for p in path]
        check_commit_args(tokens, path, self._ptok, self._ppar)
        ctx = self._ctx
        length = len(self._committed)
        kept = set(path)
        if path:
            last = path[-1]
            if self.owner.exact:
                # rejected nodes decoded before the last accepted one sit in cells ahead of it:
                # park them so no later token lands in a hole before older ones
                for node in range(last):
                    if node not in kept:
                        pos = length + self._pdepth[node] - 1
                        ctx.seq_cp(self._pseq[node], self._junk_seq, pos, pos + 1)
                        self._junk += 1
            ctx.seq_cp(self._pseq[last], 0, length, length + len(path))
        for seq in self._leaf:
            ctx.seq_rm(seq)
            self._free.append(seq)
        self._leaf.clear()
        self._free.sort(reverse=True)
        parked = sum(1 for node in range(path[-1]) if node not in kept) if path else 0
        freed = len(self._ptok) - len(path) - (parked if self.owner.exact else 0)
        self._used -= freed
        if path:
            self._n_cached = length + len(path)
            self._root = self._prow[path[-1]] if len(path) == len(tokens) else None
        elif tokens:
            self._root = None
        self._committed.extend(tokens)
        self._ptok, self._ppar, self._pdepth, self._pseq, self._prow = [], [], [], [], []


class _Context:
    """A llama.cpp context with its batch buffer and memory handle."""

    def __init__(self, lib: Any, ctx: Any, n_seq_max: int, vocab_size: int) -> None:
        self.lib = lib
        self.ctx = ctx
        self.mem = lib.llama_get_memory(ctx)
        self.capacity = 512
        self.batch = lib.llama_batch_init(self.capacity, 0, n_seq_max)
        self.cells = int(lib.llama_n_ctx(ctx))
        self.vocab_size = vocab_size
        self._final = weakref.finalize(self, _free_context, lib, ctx, self.batch)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.mem, True)

    def free(self) -> None:
        self._final()

    def decode(self, items: Sequence[tuple[int, int, Sequence[int], bool]]) -> int:
        """Decode ``(token, position, seq ids, wants logits)`` items in one call; llama's code."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seqs, out) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            row = b.seq_id[i]
            for j, s in enumerate(seqs):
                row[j] = s
            b.logits[i] = 1 if out else 0
        return int(self.lib.llama_decode(self.ctx, b))

    def logits_into(self, i: int, dst: np.ndarray) -> None:
        """Copy the logits of batch item ``i`` into ``dst`` (one copy, no new array)."""
        ptr = self.lib.llama_get_logits_ith(self.ctx, i)
        np.copyto(dst, np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self.lib.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)


def _free_model(lib: Any, model: Any, contexts: list[_Context]) -> None:
    for ctx in contexts:
        ctx.free()
    contexts.clear()
    lib.llama_model_free(model)


def _free_context(lib: Any, ctx: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
