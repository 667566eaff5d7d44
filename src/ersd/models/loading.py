"""``ersd.load_model``: the one place that picks a backend for a model name.

:data:`BACKENDS` maps a backend name to the module that implements it.  Each such module has

* ``claims(name_or_path) -> bool``: cheap and import-free (no heavy library imported): does this
  backend recognise the name (a toy name, a ``.gguf`` file, ...)?
* ``load(name_or_path, **options) -> TextModel``: the loaded model (:class:`ersd.TextModel`).

``backend="auto"`` asks the backends in table order and loads with the first that claims the
name; ``hf`` comes last and claims everything (bundled names, folders, hub ids).  A new backend is
its own module plus one line in :data:`BACKENDS` (see ``docs/backends.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ersd.errors import ModelLoadError

if TYPE_CHECKING:
    from ersd.models.base import TextModel

#: backend name -> implementing module, in the order ``backend="auto"`` asks them
BACKENDS: dict[str, str] = {
    "toy": "ersd.models.toy",  # weight-free stand-ins: toy, toy-draft, tiny-qwen2, ...
    "llamacpp": "ersd.models.llamacpp",  # llama.cpp: .gguf files (bundled names with backend=)
    "hf": "ersd.models.hf_load",  # transformers: bundled names, folders, hub ids (claims all)
}


def backend_for(name_or_path: str) -> str:
    """The backend ``backend="auto"`` picks for ``name_or_path``."""
    for backend, module in BACKENDS.items():
        if importlib.import_module(module).claims(str(name_or_path)):
            return backend
    raise ModelLoadError(
        f"no backend recognises the model {name_or_path!r}; backends: {', '.join(BACKENDS)}"
    )


def load_model(name_or_path: str, *, backend: str = "auto", **options: Any) -> TextModel:
    """Load a model for :func:`ersd.generate` (as target or draft) with the backend that fits.

    ``backend``: ``"auto"`` (by name: ``toy`` / ``toy-draft`` / ``tiny-qwen2`` / ... are
    weight-free stand-ins, everything else goes to Hugging Face transformers) or a key of
    :data:`BACKENDS`.  ``options`` go to that backend's loader; for ``hf``
    (:func:`ersd.models.hf_load.load`): ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``,
    ``"int8"``), ``device``, ``linear`` (``"auto"`` / ``"onednn"`` / ``"torch"``),
    ``tree_attention`` and config overrides such as ``num_hidden_layers=K`` (a layer-truncated
    draft).  Silent unless asked: ``progress=True`` reports a bundled model's first-use
    preparation on stderr (the CLI turns it on).  Returns an :class:`ersd.TextModel`
    (``.tokenizer``, ``.eos_token_ids``, ...).
    """
    if backend == "auto":
        backend = backend_for(name_or_path)
    module = BACKENDS.get(backend)
    if module is None:
        raise ModelLoadError(
            f"unknown backend {backend!r}; use 'auto' or one of: {', '.join(BACKENDS)}"
        )
    model: TextModel = importlib.import_module(module).load(str(name_or_path), **options)
    return model
