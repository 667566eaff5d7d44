"""llama.cpp models (GGUF weights, CPU) behind the ersd session protocol, via llama-cpp-python.

One :class:`~ersd.models.llamacpp_session.LlamaCppSession` owns one llama.cpp context with a
**unified** KV cache.  A draft tree is scored in **one** ``llama_decode`` with sequence-id tree
attention: sequence 0 holds the committed tokens, every root-to-leaf path of the pending tree gets
its own sequence id, and a batch token belongs to the sequences of all paths through it (llama.cpp
masks a query token to the cells of its first sequence id: the committed cells and the token's
ancestors).  ``commit`` keeps the accepted path with ``llama_memory_seq_cp`` into sequence 0 and
drops the path sequences with ``llama_memory_seq_rm``, so the cache always equals what a plain
decode of the committed sequence would hold.

**Batch policy** (``exact``).  Some of llama.cpp's CPU kernels depend on how many tokens a call
decodes, so a token's logits can differ (by ~0.1-0.8) between a one-token decode (target-only
decoding) and a tree decode: weights *repacked* for the CPU (Q4_K on AVX2) are multiplied in
groups of 4 batch rows by a GEMM and the remaining ``n % 4`` rows by a GEMV, which round
differently; flash attention splits the KV cache across threads for a *lone* query once 512
cells are cached (f16 cache) and tiles queries from 64 on; the K-quant tiled GEMM takes over from
8 rows.  With ``exact=True`` (default) none of these paths is used:

* the weights are **not repacked** (``repack`` defaults to ``not exact``): ``vec_dot`` and
  tinyBLAS then give the same bits for a row in any batch (tests check it, on Q4_K weights too);
* the KV cache is stored as Q8_0 (or bf16, ``kv_cache="bf16"``): flash attention then always runs
  its per-query path (the split and tiled paths need an f16/f32 cache);
* ``GGML_CPU_TILED_MM=0`` (set when this module first loads llama.cpp, unless already set) keeps
  the K-quant tiled GEMM off;
* flash attention sums the cached cells in cache order, so rejected tree nodes lying *before* an
  accepted one in the cache are parked in a junk sequence instead of freed: later tokens never land
  in a hole ahead of older ones.  When parked cells fill the cache, it is rebuilt by decoding the
  committed tokens again (bit-identical by the above).

Each token's logits are then bit-identical however the calls are batched, so ERSD's output equals
target-only decoding exactly.  ``exact=False`` repacks, uses an f16 cache and frees rejected cells
(fastest; right for drafts).  docs/llamacpp.md has the measured cost of both.

llama-cpp-python is an optional extra (``pip install 'ersd[llamacpp]'``), imported lazily.
"""

from __future__ import annotations

import ctypes
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ersd.errors import ErsdError, GenerationInputError, ModelLoadError, VocabularyMismatchError
from ersd.models.llamacpp_session import LlamaCppSession, _Context, _free_model

#: the llama-cpp-python release ersd is built and tested against (the ``llamacpp`` extra pins it)
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
INSTALL_COMMAND = "pip install 'ersd[llamacpp]'"
#: default context window when the GGUF's training context is larger
DEFAULT_CONTEXT = 4096
#: cache cells beyond the context window, for pending tree nodes and parked nodes
EXTRA_CELLS = 512
DEFAULT_MAX_PATHS = 62
#: KV cache storage types by name: ggml type ids (llama-cpp-python 0.3.36 exports no BF16 constant)
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
#: caches that keep flash attention on its per-query path in every call (the exact policy's):
#: llama.cpp's split-KV (one query) and tiled (>= 64 queries) paths need an f16/f32 cache
EXACT_KV_CACHES = ("bf16", "q8_0")
#: the exact policy's default cache (see docs/llamacpp.md, "Batch policy", for the measurements)
DEFAULT_EXACT_KV_CACHE = "q8_0"

logger = logging.getLogger("ersd.llamacpp")
_LIB: Any = None
_LOG_CALLBACK: Any = None  # keeps the C callback alive


def llama_lib() -> Any:
    """The ``llama_cpp`` module, initialised once; a missing extra raises ModelLoadError."""
    global _LIB, _LOG_CALLBACK
    if _LIB is not None:
        return _LIB
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")  # read once by ggml, at the first matmul
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelLoadError(
            f"the llama.cpp backend needs llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} ({exc}). "
            f"Install it with:\n    {INSTALL_COMMAND}\n(it compiles llama.cpp from source, "
            "~7 minutes on 2 cores; scripts/setup.sh --llamacpp does it with the native CPU flags)"
        ) from exc

    def forward(level: int, text: bytes, _user: Any) -> None:
        logger.debug("%s", text.decode("utf-8", "replace").rstrip())

    _LOG_CALLBACK = llama_cpp.llama_log_callback(forward)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _LIB = llama_cpp
    return llama_cpp


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def resolve_gguf(
    name_or_path: str | os.PathLike[str], cache_dir: Any = None, progress: bool = False
) -> Path:
    """The GGUF file of a bundled model name (assembled and verified; ``progress``: reported on
    stderr) or a ``.gguf`` path."""
    from ersd.models import bundled

    text = str(name_or_path)
    if text in bundled.BUNDLED:
        # kept in the cache and checksum-verified (prepare never deletes it)
        return bundled.gguf_path(text, cache_dir, ensure=True, progress=progress)
    path = Path(text).expanduser()
    if not path.is_file():
        raise ModelLoadError(
            f"{text!r} is neither a bundled model ({', '.join(bundled.BUNDLED)}) nor a "
            "GGUF file; the llama.cpp backend loads bundled names or paths to .gguf files"
        )
    if not is_gguf(path):
        raise ModelLoadError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes); the "
            "llama.cpp backend needs a GGUF model file (convert with llama.cpp's "
            "convert_hf_to_gguf.py, or use backend='hf' for a Hugging Face folder)"
        )
    return path


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    context: int | None = None,
    exact: bool = True,
    max_paths: int = DEFAULT_MAX_PATHS,
    repack: bool | None = None,
    kv_cache: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **unknown: Any,
) -> LlamaCppModel:
    """Load a bundled model name or a ``.gguf`` file with llama.cpp (see :class:`LlamaCppModel`).

    Raises:
        ModelLoadError: the extra is missing (with the install command), the file is not a GGUF
            model, or an option of another backend was passed.
    """
    if unknown:
        raise ModelLoadError(
            f"option(s) {sorted(unknown)} do not apply to the llama.cpp backend; it takes "
            "threads=, context=, exact=, max_paths=, repack=, kv_cache= and cache_dir="
        )
    llama_lib()
    path = resolve_gguf(name_or_path, cache_dir, progress)
    from ersd.models import bundled

    name = str(name_or_path) if str(name_or_path) in bundled.BUNDLED else path.name
    return LlamaCppModel(
        path,
        name=name,
        threads=threads,
        context=context,
        exact=exact,
        max_paths=max_paths,
        repack=repack,
        kv_cache=kv_cache,
    )


class LlamaCppTokenizer:
    """llama.cpp's own tokenizer of a GGUF model, with the GGUF's chat template (jinja2)."""

    def __init__(self, owner: LlamaCppModel) -> None:
        self._lib = owner.lib
        self._vocab = owner.vocab
        raw = self._lib.llama_model_chat_template(owner.model, None)
        self.chat_template: str | None = raw.decode("utf-8") if raw else None
        self.vocab_size = int(self._lib.llama_vocab_n_tokens(self._vocab))

    def _piece(self, token: int) -> str:
        return self.decode([token], skip_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS added where the model wants one; special tokens parsed)."""
        data = text.encode("utf-8")
        size = len(data) + 8
        for _ in range(2):
            buf = (self._lib.llama_token * size)()
            n = self._lib.llama_tokenize(
                self._vocab, data, len(data), buf, size, add_special_tokens, True
            )
            if n >= 0:
                return [int(t) for t in buf[:n]]
            size = -n
        raise ErsdError(f"llama.cpp could not tokenize {text[:40]!r}")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens are rendered unless ``skip_special_tokens``."""
        ids = [int(t) for t in ids]
        if not ids:
            return ""
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise GenerationInputError(
                f"token ids {bad[:5]} are outside this model's vocabulary [0, {self.vocab_size})"
            )
        arr = (self._lib.llama_token * len(ids))(*ids)
        size = 16 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_detokenize(
                self._vocab, arr, len(ids), buf, size, False, not skip_special_tokens
            )
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n + 1
        raise ErsdError("llama.cpp could not detokenize the ids")

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
    ) -> Any:
        """Token ids of ``messages`` rendered with the GGUF's chat template (as transformers does:
        the template supplies BOS and special tokens, the text is tokenized without adding any);
        the rendered text with ``tokenize=False``."""
        if not self.chat_template:
            raise GenerationInputError(
                "this GGUF model has no chat template (tokenizer.chat_template); pass plain text "
                "instead of chat messages"
            )
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        eos = self._lib.llama_vocab_eos(self._vocab)
        bos = self._lib.llama_vocab_bos(self._vocab)
        formatter = Jinja2ChatFormatter(
            self.chat_template,
            eos_token=self._piece(eos) if eos >= 0 else "",
            bos_token=self._piece(bos) if bos >= 0 else "",
            add_generation_prompt=add_generation_prompt,
        )
        text = formatter(messages=list(messages)).prompt  # type: ignore[arg-type]
        return self.encode(text, add_special_tokens=False) if tokenize else text


class LlamaCppModel:
    """A GGUF model run by llama.cpp, usable as target or draft in :func:`ersd.generate`.

    Args:
        path: the GGUF file.
        name: display name (default: the file name).
        threads: CPU threads (default: all cores).
        context: context window in tokens (default: the GGUF's, at most 4096).
        exact: batch policy, see the module docstring (default True: bit-exact).
        max_paths: most root-to-leaf paths a draft tree may have (llama.cpp sequence ids).
        repack: let llama.cpp repack quantized weights for the CPU (faster batches; default
            ``not exact``: the repacked GEMM rounds a row differently in a group of 4 than alone,
            so ``exact=True`` with ``repack=True`` is refused).
        kv_cache: the KV cache's storage type, one of :data:`KV_CACHE_TYPES` (default
            :data:`DEFAULT_EXACT_KV_CACHE` with ``exact=True``, ``"f16"`` otherwise); the exact
            policy takes only :data:`EXACT_KV_CACHES`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        threads: int | None = None,
        context: int | None = None,
        exact: bool = True,
        max_paths: int = DEFAULT_MAX_PATHS,
        repack: bool | None = None,
        kv_cache: str | None = None,
    ) -> None:
        lib = llama_lib()
        self.lib = lib
        self.path = Path(path)
        if not is_gguf(self.path):
            raise ModelLoadError(f"{self.path} is not a GGUF file")
        if repack and exact:
            raise ModelLoadError(
                "repack=True cannot be combined with exact=True: repacked weights (Q4_K on AVX2) "
                "make a token's logits depend on the call's batch size (GEMM for rows in groups "
                "of 4, GEMV for the rest); drop repack= or pass exact=False"
            )
        if kv_cache is None:
            kv_cache = DEFAULT_EXACT_KV_CACHE if exact else "f16"
        if kv_cache not in KV_CACHE_TYPES:
            raise ModelLoadError(
                f"kv_cache={kv_cache!r} is not a KV cache type this backend offers; pass one of "
                f"{', '.join(map(repr, KV_CACHE_TYPES))}"
            )
        if exact and kv_cache not in EXACT_KV_CACHES:
            raise ModelLoadError(
                f"kv_cache={kv_cache!r} cannot be combined with exact=True: with an f16/f32 cache "
                "llama.cpp's flash attention splits a lone query's cells across threads and tiles "
                "calls of >= 64 tokens, so a token's logits depend on the call; pass kv_cache="
                f"{' or '.join(map(repr, EXACT_KV_CACHES))}, or exact=False"
            )
        if not 1 <= max_paths <= 250:
            raise ModelLoadError(f"max_paths must be in [1, 250], got {max_paths}")
        self.name = name or self.path.name
        self.threads = int(threads or os.cpu_count() or 1)
        self.exact = bool(exact)
        self.max_paths = int(max_paths)
        self.repack = (not self.exact) if repack is None else bool(repack)
        self.kv_cache: str = kv_cache
        self._flash_attn = True  # studies only: the non-FA path is not exact (docs/llamacpp.md)
        params = lib.llama_model_default_params()
        params.use_extra_bufts = self.repack
        model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise ModelLoadError(
                f"llama.cpp could not load {self.path} as a model: the file is a GGUF but not a "
                "language model llama.cpp supports (e.g. a vocabulary-only or adapter GGUF, or an "
                "unknown architecture). Set logging for 'ersd.llamacpp' to DEBUG to see why."
            )
        self.model = model
        self._contexts: list[_Context] = []  # idle contexts, reused by start()
        # contexts first, then the model (a context must not outlive its model)
        self._finalizer = weakref.finalize(self, _free_model, lib, model, self._contexts)
        self.vocab = lib.llama_model_get_vocab(model)
        self.vocab_size: int = int(lib.llama_vocab_n_tokens(self.vocab))
        n_embd_out = int(lib.llama_model_n_embd(model))
        if self.vocab_size <= 0 or n_embd_out <= 0:
            raise ModelLoadError(f"{self.path} has no vocabulary or no embeddings")
        train = int(lib.llama_model_n_ctx_train(model))
        self.max_length: int = int(context or min(train, DEFAULT_CONTEXT))
        if self.max_length < 8:
            raise ModelLoadError(f"context must be at least 8 tokens, got {self.max_length}")
        self.tokenizer = LlamaCppTokenizer(self)
        self.decode_calls = 0
        self.decoded_rows = 0  # tokens decoded

    def __repr__(self) -> str:
        mode = "exact" if self.exact else "fast"
        return (
            f"LlamaCppModel({self.name!r}, vocab_size={self.vocab_size}, threads={self.threads}, "
            f"{mode})"
        )

    # -- metadata --------------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, 512)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def eos_token_ids(self) -> list[int]:
        """The vocabulary's end-of-generation tokens (EOS, EOT, ``<|im_end|>``...)."""
        if not hasattr(self, "_eos"):
            lib, vocab = self.lib, self.vocab
            self._eos = [t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(vocab, t)]
        return list(self._eos)

    def describe(self) -> dict[str, Any]:
        """JSON-ready metadata for benchmarks and the CLI."""
        buf = ctypes.create_string_buffer(256)
        self.lib.llama_model_desc(self.model, buf, 256)
        return {
            "backend": "llamacpp",
            "name": self.name,
            "path": str(self.path),
            "model": buf.value.decode("utf-8", "replace"),
            "architecture": self._meta("general.architecture"),
            "parameters": int(self.lib.llama_model_n_params(self.model)),
            "layers": int(self.lib.llama_model_n_layer(self.model)),
            "vocab_size": self.vocab_size,
            "context": self.max_length,
            "threads": self.threads,
            "batch_policy": "exact" if self.exact else "fast",
            "repack": self.repack,
            "kv_cache": self.kv_cache,
            "device": "cpu",
            "dtype": "gguf",
            "llama_cpp_python": getattr(self.lib, "__version__", "?"),
        }

    def check_compatible(self, other: Any) -> None:
        """Raise :class:`VocabularyMismatchError` unless ``other`` tokenizes like this model.

        Works across backends: compares vocabulary sizes, the ids of a few probe texts and the
        text of a spread of ids (a draft must share the target's token ids exactly)."""
        theirs = getattr(other, "vocab_size", None)
        if theirs != self.vocab_size:
            raise VocabularyMismatchError(
                f"the models' vocabularies have {self.vocab_size} and {theirs} entries; draft and "
                "target must share one tokenizer (pick a draft from the target's model family)"
            )
        tok = getattr(other, "tokenizer", None)
        if tok is None:
            return
        probes = ["Hello, world!", "def f(x):\n    return x * 2  # ok", " naïve café 東京 ✓"]
        for text in probes:
            mine, got = self.tokenizer.encode(text, False), _encode_plain(tok, text)
            if mine != got:
                raise VocabularyMismatchError(
                    f"the tokenizers disagree on {text!r}: {mine[:8]} vs {got[:8]}; draft and "
                    "target must share one tokenizer (pick a draft from the target's model family)"
                )

    # -- sessions --------------------------------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        return self.max_paths + 2  # 0 = committed, 1..max_paths = paths, then the junk sequence

    def _new_context(self) -> Any:
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = self.max_length + EXTRA_CELLS
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = self.n_seq_max
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self._flash_attn
            else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        # exact policy: a bf16 or Q8_0 cache keeps flash attention on its per-query path
        params.type_k = params.type_v = KV_CACHE_TYPES[self.kv_cache]
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens with a "
                f"{self.kv_cache} KV cache for {self.name} (out of memory, or a cache type this "
                "build does not support?); pass a smaller context= or another kv_cache="
            )
        return _Context(lib, ctx, self.n_seq_max, self.vocab_size)

    def start(self, prompt: Sequence[int]) -> LlamaCppSession:
        """A fresh session whose committed sequence is ``prompt`` (decoded on the first score)."""
        if len(prompt) == 0:
            raise GenerationInputError(
                "prompt is empty; give at least one token (e.g. the tokenizer's BOS token)"
            )
        if len(prompt) >= self.max_length:
            raise GenerationInputError(
                f"prompt has {len(prompt)} tokens but the context window is {self.max_length} "
                "tokens (prompt + new tokens must fit); shorten the prompt or pass context="
            )
        bad = [t for t in prompt if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise GenerationInputError(
                f"prompt holds token ids outside [0, {self.vocab_size}): {bad[:5]}"
            )
        ctx = self._contexts.pop() if self._contexts else self._new_context()
        ctx.clear()
        return LlamaCppSession(self, ctx, prompt)

    def release(self, ctx: _Context) -> None:
        """Take back a session's context for reuse (called when the session is collected)."""
        if len(self._contexts) < 2:
            self._contexts.append(ctx)
        else:
            ctx.free()


def _encode_plain(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer``'s ids of ``text`` without special tokens (HF or llama.cpp tokenizer)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return [int(t) for t in ids]


# --- the loader table's interface (ersd.models.loading) ----------------------------------------

_HF_ONLY = {"dtype": "float32", "device": "cpu", "linear": "auto"}


def claims(name_or_path: str) -> bool:
    """``backend="auto"`` sends ``.gguf`` files here (bundled names need ``backend="llamacpp"``)."""
    return str(name_or_path).lower().endswith(".gguf")


def load(name_or_path: str, **options: Any) -> Any:
    """:func:`load_model`, refusing the PyTorch backend's options with the fix in the message."""
    wrong = [k for k, default in _HF_ONLY.items() if k in options and options[k] != default]
    if wrong:
        raise ModelLoadError(
            f"option(s) {wrong} do not apply to the llama.cpp backend (it runs the GGUF's own "
            "quantized weights on the CPU); it takes threads=, context=, exact=, max_paths=, "
            "repack=, kv_cache= and cache_dir="
        )
    for k in _HF_ONLY:
        options.pop(k, None)
    return load_model(name_or_path, **options)
