"""Hugging Face causal language models behind the ersd session protocol (:mod:`ersd.models.base`).

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

transformers is imported lazily: ``import ersd`` does not need it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ersd.errors import GenerationInputError, ModelLoadError, VocabularyMismatchError
from ersd.models.base import check_commit_args, check_tree_args

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

TREE_ATTENTION_MODES = ("auto", "mask", "paths")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or the torch dtype itself) -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ModelLoadError(
        f"unsupported dtype {dtype!r}; use 'float32' (exact, for checks), 'bfloat16' (fast on CPUs "
        "with AVX-512 bf16), 'float16', or 'int8' (CPU drafts: dynamic int8 quantization)"
    )


QUANTIZED_DTYPES = ("int8",)


# ----------------------------------------------------------------------------------------------
# model wrapper


class HFModel:
    """A transformers causal LM with its tokenizer, usable as target or draft in ``ersd.generate``.

    ``tree_attention``: ``"mask"`` scores a tree in one forward with a 4-D attention mask,
    ``"paths"`` scores each root-to-leaf path as a batch row (for architectures that reject
    custom masks), ``"auto"`` probes the model once on first use and picks ``"mask"`` if it works.
    """

    def __init__(
        self, model: PreTrainedModel, tokenizer: Any = None, *, tree_attention: str = "auto"
    ) -> None:
        if tree_attention not in TREE_ATTENTION_MODES:
            raise ValueError(
                f"tree_attention must be one of {TREE_ATTENTION_MODES}, got {tree_attention!r}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        # rows of the output layer (it may be a oneDNN or int8 linear: see ersd.models.cpu)
        rows = getattr(head, "out_features", None)
        if rows is None and isinstance(getattr(head, "weight", None), torch.Tensor):
            rows = head.weight.shape[0]  # type: ignore[union-attr]
        self.vocab_size: int = int(rows) if rows is not None else int(text_config.vocab_size)
        self.max_context: int = int(
            getattr(text_config, "max_position_embeddings", None) or 1 << 30
        )
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.tree_attention = tree_attention
        self._mask_min = torch.finfo(self.dtype).min
        # models mixing full and sliding-window attention layers take a dict of two masks
        layer_types = getattr(text_config, "layer_types", None) or []
        window = getattr(text_config, "sliding_window", None)
        self.sliding_window: int | None = (
            int(window) if window and "sliding_attention" in layer_types else None
        )
        # transformers renamed forward's ``past_key_values`` to ``cache`` (5.2x); use what it takes
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.forward_calls = 0  # scoring forwards (the adapter's own bookkeeping excluded)
        self.forward_seconds = 0.0  # seconds inside those forwards

    @property
    def linear_backend(self) -> str:
        """``"onednn"``, ``"int8"`` or ``"torch"``: the CPU path of the linear layers
        (:mod:`ersd.models.cpu`)."""
        from ersd.models.cpu import linear_backend

        return linear_backend(self.model)

    def __repr__(self) -> str:
        name = getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
        dtype = str(self.dtype).removeprefix("torch.")
        weights = "int8" if self.linear_backend == "int8" else dtype
        extra = ", linear=onednn" if self.linear_backend == "onednn" else ""
        return f"HFModel({name!r}, vocab_size={self.vocab_size}, weights={weights}{extra})"

    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids: the generation config's (chat models often list several), else
        the tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            return []
        return [int(e) for e in eos] if isinstance(eos, list | tuple) else [int(eos)]

    def start(self, prompt: Sequence[int]) -> HFSession:
        """A fresh session whose committed sequence is ``prompt`` (fed on the first ``score``)."""
        if len(prompt) == 0:
            raise GenerationInputError(
                "prompt is empty; give at least one token (e.g. the tokenizer's BOS token)"
            )
        if len(prompt) >= self.max_context:
            raise GenerationInputError(
                f"prompt has {len(prompt)} tokens but the model's context window is "
                f"{self.max_context} tokens (prompt + new tokens must fit); shorten the prompt"
            )
        return HFSession(self, prompt)

    def same_tokenizer(self, other: HFModel) -> None:
        """Raise :class:`VocabularyMismatchError` unless ``other`` tokenizes exactly like ``self``.

        A draft must share the target's tokenizer: the verifier compares the two models'
        probabilities token id by token id.
        """
        if self.vocab_size != other.vocab_size:
            raise VocabularyMismatchError(
                f"the models' logits have {self.vocab_size} and {other.vocab_size} columns; draft "
                "and target must share one tokenizer and vocabulary (pick a draft from the "
                "target's model family, e.g. a smaller Qwen2.5 for a Qwen2.5 target)"
            )
        if self.tokenizer is None or other.tokenizer is None:
            return
        mine, theirs = self.tokenizer.get_vocab(), other.tokenizer.get_vocab()
        if mine != theirs:
            differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
            raise VocabularyMismatchError(
                f"the draft and target tokenizers differ ({len(mine)} vs {len(theirs)} tokens; "
                f"e.g. {differ}); draft and target must share one tokenizer (pick a draft from "
                "the target's model family)"
            )

    # -- forward passes ------------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | dict[str, torch.Tensor] | None,
        keep: int,
    ) -> torch.Tensor:
        """Logits of the last ``keep`` rows, ``[batch, keep, V]``; appends to ``cache``."""
        self.forward_calls += 1
        t0 = time.perf_counter()
        before = cache.get_seq_length()
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_kwarg: cache},
        )
        self.forward_seconds += time.perf_counter() - t0
        if cache.get_seq_length() != before + ids.shape[1]:
            raise RuntimeError(
                f"{type(self.model).__name__} did not extend the KV cache passed as "
                f"{self._cache_kwarg}=; this transformers version is not supported by ersd's "
                "adapter (use transformers >= 5.0)"
            )
        return out.logits

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[q, kv]`` bool (True = may attend) -> ``[1, 1, q, kv]`` additive mask on the device."""
        mask = torch.zeros(1, 1, *allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, self._mask_min)
        return mask.to(self.device)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def resolved_tree_attention(self) -> str:
        """``"mask"`` or ``"paths"``; probes the model on the first call in ``"auto"`` mode."""
        if self.tree_attention == "auto":
            ok, why = self._probe_tree_mask()
            self.tree_attention = "mask" if ok else "paths"
            if not ok:
                warnings.warn(
                    f"{type(self.model).__name__} does not honour custom 4-D attention masks "
                    f"({why}); scoring draft trees one root-to-leaf path per batch row instead "
                    "(correct, but slower for wide trees)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.tree_attention

    def _probe_tree_mask(self) -> tuple[bool, str]:
        """Score two sibling nodes ``b``, ``c`` under ``a`` with a tree mask on a cache and check
        that ``c``'s row equals a plain forward of ``a c`` (and differs from ``a b c``)."""
        a, b, c = (1 % self.vocab_size, 2 % self.vocab_size, 3 % self.vocab_size)
        dev = self.device
        calls = self.forward_calls  # the probe is not a scoring call
        try:
            with torch.no_grad():
                ref = self.model(input_ids=torch.tensor([[a, c]], device=dev)).logits[0, -1]
                wrong = self.model(input_ids=torch.tensor([[a, b, c]], device=dev)).logits[0, -1]
                cache = self.new_cache()
                self._forward(
                    torch.tensor([[a]], device=dev), torch.tensor([[0]], device=dev), cache, None, 1
                )
                allowed = torch.tensor([[[[True, True, False], [True, False, True]]]], device=dev)
                mask = torch.zeros(allowed.shape, dtype=self.dtype, device=dev)
                mask.masked_fill_(~allowed, self._mask_min)
                got = self._forward(
                    torch.tensor([[b, c]], device=dev),
                    torch.tensor([[1, 1]], device=dev),
                    cache,
                    mask,
                    2,
                )[0, -1]
        except Exception as exc:  # any rejection of the mask means: use the fallback
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            self.forward_calls = calls
        err = (got.float() - ref.float()).abs().max().item()
        gap = (wrong.float() - ref.float()).abs().max().item()
        if err <= 0.1 * gap + 1e-6 * (1.0 + ref.float().abs().max().item()):
            return True, ""
        return False, f"masked row differs from the reference by {err:.3g} (gap {gap:.3g})"


# ----------------------------------------------------------------------------------------------
# session


class HFSession:
    """Session of an :class:`HFModel`; see the module docstring for the cache layout."""

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
        self._prow: list[torch.Tensor] = []  # next-token logits of each node
        self._mode = ""  # resolved lazily: "mask" or "paths"

    @property
    def committed(self) -> list[int]:
        return self._committed

    @property
    def cache_length(self) -> int:
        """Entries in the KV cache (committed prefix + cached pending nodes)."""
        return int(self._cache.get_seq_length())

    # -- score ---------------------------------------------------------------------------------

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        n = len(tokens)
        num_pending = len(self._ptok)
        check_tree_args(tokens, parents, num_pending)
        if n == 0 and self._root is not None:
            return self._root.unsqueeze(0)
        depths: list[int] = []
        for p in parents:
            if p < 0:
                depths.append(1)
            elif p < num_pending:
                depths.append(self._pdepth[p] + 1)
            else:
                depths.append(depths[p - num_pending] + 1)
        length = len(self._committed)
        top = length + (max(depths) if n else 0)  # one past the largest position fed
        if top > self.owner.max_context:
            raise GenerationInputError(
                f"the sequence ({length} tokens) plus a draft tree of depth {top - length} exceeds "
                f"the model's context window of {self.owner.max_context} tokens; lower "
                "max_new_tokens, the tree depth or the prompt length"
            )
        if not self._mode:
            self._mode = self.owner.resolved_tree_attention() if n else ""
        with torch.no_grad():
            if self._mode == "paths" and n:
                rows = self._score_paths(tokens, parents, depths)
            else:
                rows = self._score_mask(tokens, parents, depths)
        return rows

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
        self._prow.extend(rows.unbind(0))

    def _score_mask(
        self, tokens: Sequence[int], parents: Sequence[int], depths: list[int]
    ) -> torch.Tensor:
        owner = self.owner
        dev = owner.device
        n = len(tokens)
        num_pending = len(self._ptok)
        length = len(self._committed)
        cached = self._n_cached
        if self._root is None and cached == length:
            # every committed token is cached but its logits are unknown: feed the last one again
            self._crop(cached - 1)
            cached -= 1
        tail = self._committed[cached:]
        t = len(tail)  # t > 0 implies num_pending == 0: score() always feeds the tail
        ancs = self._ancestors(parents)
        ids = torch.tensor([[*tail, *tokens]], dtype=torch.long, device=dev)
        pos = list(range(cached, length))
        pos.extend(length + d - 1 for d in depths)
        positions = torch.tensor([pos], dtype=torch.long, device=dev)
        if n == 0 and num_pending == 0:
            mask: torch.Tensor | dict[str, torch.Tensor] | None = None  # plain causal continuation
        else:
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
            mask = owner._additive(allowed)
            if owner.sliding_window is not None:
                # sliding-window layers see keys less than `window` positions back (transformers'
                # sliding_window_overlay), measured in positions, not cache columns
                kv_pos = torch.tensor(
                    [*range(cached), *(length + d - 1 for d in self._pdepth), *pos]
                )
                near = (torch.tensor(pos)[:, None] - kv_pos[None, :]) < owner.sliding_window
                mask = {
                    "full_attention": mask,
                    "sliding_attention": owner._additive(allowed & near),
                }
        keep = n + (1 if t else 0)
        logits = owner._forward(ids, positions, self._cache, mask, keep)[0].float()
        self._n_cached = length
        if t:
            self._root = logits[0]
            node_rows = logits[1:]
        else:
            assert self._root is not None
            node_rows = logits
        self._add_pending(tokens, parents, depths, ancs, node_rows)
        if t:
            return logits
        return torch.cat([self._root.unsqueeze(0), node_rows], dim=0)

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
        check_commit_args(tokens, path, self._ptok, self._ppar)
        k = len(path)
        if self._ptok and self._mode != "paths":
            base = self._n_cached  # == len(committed): pending nodes exist only after a score
            if any(node != j for j, node in enumerate(path)):
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
            root = self._prow[path[-1]]
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


# ----------------------------------------------------------------------------------------------
# loading


def from_pretrained_model(
    model: PreTrainedModel, tokenizer: Any = None, *, tree_attention: str = "auto"
) -> HFModel:
    """Wrap an already loaded transformers causal LM (and its tokenizer) for ``ersd.generate``."""
    return HFModel(model, tokenizer, tree_attention=tree_attention)


def _bundled() -> tuple[dict[str, Any], Any]:
    """(registry, prepare) of the bundled offline models, or ({}, None) if unavailable."""
    try:
        from ersd.models import bundled
    except ImportError:
        return {}, None
    return dict(bundled.BUNDLED), bundled.prepare


def _available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux /proc/meminfo), or None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _weights_bytes(folder: Path, dtype: torch.dtype) -> int | None:
    """Bytes the weights in ``folder`` take once loaded as ``dtype`` (from safetensors headers)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    numel = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                shape = st.get_slice(name).get_shape()
                size = 1
                for s in shape:
                    size *= int(s)
                numel += size
    return numel * torch.finfo(dtype).bits // 8


def _memory_hint(name: str, folder: Path, dtype: torch.dtype) -> str:
    """A hint (or "") when the weights would not fit in the available memory."""
    need = _weights_bytes(folder, dtype)
    have = _available_memory()
    if need is None or have is None or need * 1.3 < have:
        return ""
    alt = " or dtype='bfloat16' (half the memory)" if dtype == torch.float32 else ""
    return (
        f"loading {name} in {str(dtype).removeprefix('torch.')} needs about {need / 2**30:.1f} GiB "
        f"but only {have / 2**30:.1f} GiB of memory is available; close other programs{alt}, "
        "or pick a smaller model"
    )


@contextlib.contextmanager
def _transformers_verbosity_error(active: bool) -> Iterator[None]:
    """Silence transformers' warnings (not errors) inside the block when ``active``."""
    if not active:
        yield
        return
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    tree_attention: str = "auto",
    linear: str = "auto",
    **config_overrides: Any,
) -> HFModel:
    """Load a causal LM: a bundled offline name (``ersd models list``), a local folder or a hub id.

    ``dtype``: ``"float32"`` (exact; the right target on CPUs without native bfloat16),
    ``"bfloat16"``, ``"float16"``, or ``"int8"``: float32 weights quantized to int8 per output
    channel (dynamic quantization, CPU only), 3-5x cheaper per forward and slightly different
    outputs: meant for drafts, which never change what an exact method samples.

    ``linear`` (CPU, float32 only): ``"onednn"`` stores every linear layer's weight once in
    oneDNN's layout, which makes scoring k tokens far cheaper than the stock path (MKL repacks the
    weights on every multi-row call: a 4-token forward costs ~3x a 1-token one instead of ~1.8x);
    ``"torch"`` keeps ``nn.Linear``; ``"auto"`` = ``"onednn"`` where available. See
    :mod:`ersd.models.cpu`.

    ``config_overrides`` update the model config before the weights are loaded, e.g.
    ``num_hidden_layers=8`` makes a layer-truncated draft of the same checkpoint.
    """
    from ersd.models.cpu import LINEAR_MODES

    if linear not in LINEAR_MODES:
        raise ValueError(f"linear must be one of {LINEAR_MODES}, got {linear!r}")
    quantize = isinstance(dtype, str) and dtype.lower() in QUANTIZED_DTYPES
    if quantize and device != "cpu":
        raise ModelLoadError(
            f"dtype 'int8' (dynamic quantization) runs on CPU only, not on {device!r}; use "
            "'bfloat16' or 'float16' there"
        )
    torch_dtype = torch.float32 if quantize else parse_dtype(dtype)
    registry, prepare = _bundled()
    name = str(name_or_path)
    if name in registry:
        folder: Path | str = Path(prepare(name))
    elif Path(name).expanduser().is_dir():
        folder = Path(name).expanduser()
    elif "/" not in name or name.startswith((".", "~")):
        known = ", ".join(sorted(registry)) or "(none: ersd.models.bundled is unavailable)"
        raise ModelLoadError(
            f"unknown model {name!r}: not a bundled model and not a folder. Bundled models: "
            f"{known} (see `ersd models list`). Hugging Face hub ids look like 'org/name' and "
            "need network access to the hub"
        )
    else:
        folder = name  # a hub id
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            "loading Hugging Face models needs transformers; install it with "
            "`pip install 'ersd[hf]'`"
        ) from exc
    hint = _memory_hint(name, folder, torch_dtype) if isinstance(folder, Path) else ""
    if hint:
        warnings.warn(hint, ResourceWarning, stacklevel=2)
    try:
        config, unused = AutoConfig.from_pretrained(
            folder, return_unused_kwargs=True, **config_overrides
        )
        if unused:
            raise ModelLoadError(
                f"unknown config overrides {sorted(unused)} for {name}; overrides must be fields "
                f"of its {type(config).__name__} (e.g. num_hidden_layers=8)"
            )
        # a layer-truncated draft leaves the checkpoint's upper layers unused, as intended: keep
        # transformers' load report (a warning table of every unused weight) quiet then
        quiet = set(config_overrides) == {"num_hidden_layers"} and int(
            config_overrides["num_hidden_layers"]
        ) <= int(getattr(AutoConfig.from_pretrained(folder), "num_hidden_layers", 0))
        with _transformers_verbosity_error(quiet):
            model: Any = AutoModelForCausalLM.from_pretrained(
                folder, config=config, dtype=torch_dtype
            )
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except ModelLoadError:
        raise
    except MemoryError as exc:
        raise ModelLoadError(hint or f"out of memory while loading {name}") from exc
    except OSError as exc:
        where = (
            "a hub id: it needs network access to huggingface.co (or a local copy in the HF cache)"
            if isinstance(folder, str)
            else f"the folder {folder}"
        )
        raise ModelLoadError(f"could not load {name} from {where}: {exc}") from exc
    if device != "cpu":
        model.to(device)
    from ersd.models import cpu

    if quantize:
        # dynamic int8 quantizes activations with one scale per call, so tree rows are no longer
        # independent to the last bit and the 4-D mask probe would misread that as "masks are
        # ignored": probe the float model (the architecture), then quantize
        if tree_attention == "auto":
            tree_attention = HFModel(model, tokenizer).resolved_tree_attention()
        cpu.quantize_int8(model)
    elif linear == "onednn" or (linear == "auto" and device == "cpu"):
        prepacked = cpu.prepack_linears(model)
        if not prepacked and linear == "onednn":
            raise ModelLoadError(
                "linear='onednn' needs a float32 model on CPU and a torch build with oneDNN "
                f"(got {torch_dtype} on {device}); use linear='torch' or 'auto'"
            )
    return HFModel(model, tokenizer, tree_attention=tree_attention)
