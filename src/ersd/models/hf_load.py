"""Loading Hugging Face causal LMs for the ``hf`` backend of :func:`ersd.load_model`.

A name is a bundled offline model (``ersd models list``; prepared by :mod:`ersd.models.bundled`),
a local folder or a hub id.  Here live the loading concerns the adapter (:mod:`ersd.models.hf`)
does not need: dtype names, the memory hint, config overrides, quieting transformers' load report,
int8 quantization and oneDNN prepacking (:mod:`ersd.models.cpu`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ersd.errors import ModelLoadError
from ersd.models import memory
from ersd.models.hf import HFModel

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

QUANTIZED_DTYPES = ("int8",)


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


def _bundled() -> tuple[dict[str, Any], Any]:
    """(registry, prepare) of the bundled offline models, or ({}, None) if unavailable."""
    try:
        from ersd.models import bundled
    except ImportError:
        return {}, None
    return dict(bundled.BUNDLED), bundled.prepare


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
    have = memory.available_memory()
    if need is None or have is None or need * 1.3 < have:
        return ""
    alt = " or dtype='bfloat16' (half the memory)" if dtype == torch.float32 else ""
    return (
        f"loading {name} in {str(dtype).removeprefix('torch.')} needs about {need / 2**30:.1f} GiB "
        f"but only {have / 2**30:.1f} GiB of memory is available; close other programs{alt}, "
        "or pick a smaller model"
    )


@contextlib.contextmanager
def _transformers_bars(progress: bool) -> Iterator[None]:
    """transformers' progress bars (loading weights) only when ``progress``."""
    from transformers.utils import logging as hf_logging

    on = hf_logging.is_progress_bar_enabled()
    if on and not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if on and not progress:
            hf_logging.enable_progress_bar()


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


try:
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - safetensors comes with the hf extra

    class _SafetensorError(Exception):  # type: ignore[no-redef]
        pass


def _first_line(exc: BaseException) -> str:
    """An exception's message on one line (library messages often run to several)."""
    text = " ".join(str(exc).split("\n\n")[0].split())
    return text or type(exc).__name__


def _weight_files(folder: Path | str) -> str:
    files = (
        sorted(p.name for p in Path(folder).glob("*.safetensors"))
        if isinstance(folder, Path)
        else []
    )
    return ", ".join(files) or "its weight files"


def _resolve(name: str, progress: bool = False) -> Path | str:
    """A bundled name's prepared folder, a local folder, or a hub id (returned as a string);
    ``progress``: the first use's preparation reports on stderr."""
    registry, prepare = _bundled()
    if name in registry:
        return Path(prepare(name, progress=progress))
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if "/" not in name or name.startswith((".", "~")):
        known = ", ".join(sorted(registry)) or "(none: ersd.models.bundled is unavailable)"
        raise ModelLoadError(
            f"unknown model {name!r}: not a bundled model and not a folder. Bundled models: "
            f"{known} (see `ersd models list`). Hugging Face hub ids look like 'org/name' and "
            "need network access to the hub"
        )
    return name  # a hub id


def claims(name_or_path: str) -> bool:
    """The ``hf`` backend is the fallback of ``backend="auto"``: it takes every name."""
    return True


def load(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    tree_attention: str = "auto",
    linear: str = "auto",
    progress: bool = False,
    **config_overrides: Any,
) -> HFModel:
    """Load a causal LM: a bundled offline name (``ersd models list``), a local folder or a hub id.

    ``dtype``: ``"float32"`` (exact; the right target on CPUs without native bfloat16),
    ``"bfloat16"``, ``"float16"``, or ``"int8"``: float32 weights quantized to int8 per output
    channel (dynamic quantization, CPU only), 3-5x cheaper per forward and slightly different
    outputs: meant for drafts, which never change what an exact method samples.

    ``linear`` (CPU, float32 only): ``"onednn"`` stores every linear layer's weight once in
    oneDNN's layout, packed for a draft tree's rows, which makes scoring k tokens far cheaper than
    the stock path (MKL repacks the weights on every multi-row call: a 4-token forward costs ~3x a
    1-token one instead of ~1.3x);
    ``"torch"`` keeps ``nn.Linear``; ``"auto"`` = ``"onednn"`` where available. See
    :mod:`ersd.models.cpu`.

    ``config_overrides`` update the model config before the weights are loaded, e.g.
    ``num_hidden_layers=8`` makes a layer-truncated draft of the same checkpoint.  ``progress``:
    report a bundled model's first-use preparation on stderr (silent by default; the CLI turns
    it on).
    """
    from ersd.models.cpu import LINEAR_MODES

    if linear not in LINEAR_MODES:
        raise ValueError(f"linear must be one of {LINEAR_MODES}, got {linear!r}")
    from ersd.validation import check_device, check_layer_count

    quantize = isinstance(dtype, str) and dtype.lower() in QUANTIZED_DTYPES
    if quantize and device != "cpu":
        raise ModelLoadError(
            f"dtype 'int8' (dynamic quantization) runs on CPU only, not on {device!r}; use "
            "'bfloat16' or 'float16' there"
        )
    check_device(device)
    torch_dtype = torch.float32 if quantize else parse_dtype(dtype)
    name = str(name_or_path)
    folder = _resolve(name, progress)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            "loading Hugging Face models needs transformers; install it with "
            "`pip install 'ersd[hf]'`"
        ) from exc
    if isinstance(folder, Path) and not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{folder} is not a model folder (no config.json); give a bundled name (see `ersd "
            "models list`), a folder saved with save_pretrained, or a hub id"
        )
    try:
        hint = _memory_hint(name, folder, torch_dtype) if isinstance(folder, Path) else ""
        if hint:
            warnings.warn(hint, ResourceWarning, stacklevel=3)
        config, unused = AutoConfig.from_pretrained(
            folder, return_unused_kwargs=True, **config_overrides
        )
        if unused:
            raise ModelLoadError(
                f"unknown config overrides {sorted(unused)} for {name}; overrides must be fields "
                f"of its {type(config).__name__} (e.g. num_hidden_layers=8)"
            )
        if "num_hidden_layers" in config_overrides:
            full = int(getattr(AutoConfig.from_pretrained(folder), "num_hidden_layers", 0))
            check_layer_count(config_overrides["num_hidden_layers"], full)
        # a layer-truncated draft leaves the checkpoint's upper layers unused, as intended: keep
        # transformers' load report (a warning table of every unused weight) quiet then
        quiet = set(config_overrides) == {"num_hidden_layers"}
        tokenizer = AutoTokenizer.from_pretrained(folder)  # cheap: fail before the weights
        with _transformers_verbosity_error(quiet), _transformers_bars(progress):
            model: Any = AutoModelForCausalLM.from_pretrained(
                folder, config=config, dtype=torch_dtype
            )
    except ModelLoadError:
        raise
    except MemoryError as exc:
        raise ModelLoadError(f"out of memory while loading {name}") from exc
    except (ValueError, KeyError) as exc:  # "Unrecognized model", broken config or weights
        raise ModelLoadError(
            f"could not load {name}: {_first_line(exc)}; check that it is a complete causal-LM "
            "checkpoint (config.json, weights, tokenizer files), or prepare a bundled model "
            "again with `ersd models prepare NAME`"
        ) from exc
    except _SafetensorError as exc:  # truncated or corrupt weight files
        raise ModelLoadError(
            f"could not read the weights of {name} ({_weight_files(folder)}): {_first_line(exc)}; "
            "the file is truncated or corrupt: "
            "copy it again (bundled models: `ersd models prepare NAME` repairs the cache)"
        ) from exc
    except OSError as exc:
        where = (
            "a hub id: it needs network access to huggingface.co (or a local copy in the HF cache)"
            if isinstance(folder, str)
            else f"the folder {folder}"
        )
        raise ModelLoadError(f"could not load {name} from {where}: {_first_line(exc)}") from exc
    except Exception as exc:  # any other loader failure naming the tokenizer: one clear error
        if "tokenizer" in str(exc).lower():
            raise ModelLoadError(
                f"could not load the tokenizer of {name}: {_first_line(exc)}; the folder needs "
                "its tokenizer "
                "files (tokenizer.json or the tokenizer's vocabulary files)"
            ) from exc
        raise
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
    return HFModel(model, tokenizer, tree_attention=tree_attention, name=name)


def load_tokenizer(name_or_path: str) -> Any:
    """Only the Hugging Face tokenizer of a bundled name, a folder or a hub id (no weights are
    loaded; a bundled model is prepared first if it is not yet)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            "loading a tokenizer needs transformers; install it with `pip install 'ersd[hf]'`"
        ) from exc
    folder = _resolve(str(name_or_path))
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"could not load the tokenizer of {name_or_path}: {_first_line(exc)}"
        ) from exc
