"""Precise validation of the inputs of ersd's entry points.

Every function here either returns the value in a plain, normalised form (Python ``int``,
``float``, ``str``, :class:`pathlib.Path`) or raises a subclass of :class:`ersd.ErsdError` whose
message says what was wrong and how to fix it.  None of them coerces silently: a float seed, a
``bool`` token id or a string of EOS ids is an error, never truncated, cast or split.

What counts as an integer: a Python ``int`` (not ``bool``), a NumPy integer scalar, or a 0-d
PyTorch tensor of an integer dtype.  Sequences of token ids may also be 1-d NumPy arrays or
PyTorch tensors of an integer dtype.

=================== ==================================================== ==========================
input               accepted                                             error class
=================== ==================================================== ==========================
seed                integer in ``[0, 2**64)`` (:data:`SEED_LIMIT`)        GenerationInputError
token ids (prompt)  non-empty sequence / 1-d array of integers in [0, V) GenerationInputError
eos ids             ``None``, an integer or a sequence of integers in    GenerationInputError
                    [0, V) (a ``str`` is an error)
max_new_tokens      integer >= 1                                         GenerationInputError
temperature         finite real: 0 (greedy) or >= :data:`MIN_TEMPERATURE` SamplingParamsError
top_k               ``None`` or integer >= 1                             SamplingParamsError
top_p               ``None`` or real in (0, 1]                           SamplingParamsError
min_p               ``None`` or real in [0, 1)                           SamplingParamsError
layer count         integer in [1, layers of the checkpoint]             ModelLoadError
device              ``cpu``; ``cuda``/``cuda:N`` and ``mps`` where the   ModelLoadError
                    installed torch can use them
input file path     an existing regular file                             InputFileError
=================== ==================================================== ==========================
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ersd.errors import (
    GenerationInputError,
    InputFileError,
    ModelLoadError,
    SamplingParamsError,
)

#: seeds are integers in ``[0, SEED_LIMIT)`` (the race keys are 64-bit)
SEED_LIMIT = 2**64
#: the smallest positive temperature; below it ``logits / T`` overflows or is greedy in all but
#: name (and a subnormal T emitted token 0 forever): use 0 for greedy decoding
MIN_TEMPERATURE = 1e-4


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def as_integer(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (see the module docstring), else ``None``."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, np.integer):
        return int(value)
    if _is_torch(value):
        import torch

        if (
            isinstance(value, torch.Tensor)
            and value.dim() == 0
            and not value.dtype.is_floating_point
            and not value.dtype.is_complex
            and value.dtype != torch.bool
        ):
            return int(value.item())
    return None


def _as_real(value: Any) -> float | None:
    """``value`` as a float if it is a real number (ints included, bools not), else ``None``."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------- generation


def check_seed(seed: Any) -> int:
    """The seed as an int in ``[0, 2**64)``; anything else is a :class:`GenerationInputError`."""
    value = as_integer(seed)
    if value is None:
        raise GenerationInputError(
            f"seed must be an integer in [0, 2**64), got {_show(seed)} "
            f"({type(seed).__name__}); pass a whole number such as seed=0 (floats, strings and "
            "bools are not rounded or parsed)",
            param="seed",
        )
    if not 0 <= value < SEED_LIMIT:
        raise GenerationInputError(
            f"seed must lie in [0, 2**64), got {value}; seeds are not reduced modulo 2**64 "
            "(that would make two seeds give the same text): pass seed % 2**64 yourself if "
            "that is what you want",
            param="seed",
        )
    return value


def check_token_ids(ids: Any, vocab_size: int | None, *, name: str = "prompt") -> list[int]:
    """Token ids as a list of ints in ``[0, vocab_size)`` (``None``: any id >= 0; the range of a
    model's vocabulary is checked when the model is known).

    Accepts a list or tuple of integers, or a 1-d NumPy array / PyTorch tensor of an integer
    dtype.  A string, a float or bool element, a 2-d batch or an empty sequence is an error.
    """
    if isinstance(ids, str | bytes):
        raise GenerationInputError(
            f"{name} must be a sequence of token ids, not a {type(ids).__name__}; tokenize it "
            "first (e.g. model.tokenizer.encode(text))",
            param=name,
        )
    if isinstance(ids, np.ndarray) or _is_torch(ids):
        dims = int(ids.ndim)
        if dims != 1:
            raise GenerationInputError(
                f"{name} must be 1-d (one sequence of token ids), got an array of shape "
                f"{tuple(ids.shape)}; pass one row, e.g. ids[0]",
                param=name,
            )
        kind = str(ids.dtype)
        if "int" not in kind or "bool" in kind:
            raise GenerationInputError(
                f"{name} must hold integer token ids, got an array of dtype {kind}; convert "
                "with .astype(int) / .long() only if the values are whole numbers",
                param=name,
            )
        values = [int(v) for v in ids.tolist()]
    elif isinstance(ids, Sequence):
        values = []
        for i, tok in enumerate(ids):
            value = as_integer(tok)
            if value is None:
                raise GenerationInputError(
                    f"{name}[{i}] is {_show(tok)} ({type(tok).__name__}), not an integer token "
                    "id; token ids are ints (bools and floats are not accepted)",
                    param=name,
                )
            values.append(value)
    else:
        raise GenerationInputError(
            f"{name} must be a list of token ids (or a 1-d integer array), got "
            f"{type(ids).__name__}",
            param=name,
        )
    if not values:
        raise GenerationInputError(
            f"{name} is empty; give at least one token (e.g. the tokenizer's BOS token)",
            param=name,
        )
    bad = [v for v in values if v < 0 or (vocab_size is not None and v >= vocab_size)]
    if bad:
        raise GenerationInputError(
            f"{name} holds token ids outside [0, {vocab_size or 'vocab_size'}): {bad[:5]}; check "
            "that the tokenizer matches the model",
            param=name,
        )
    return values


def check_eos_ids(eos: Any, vocab_size: int | None) -> frozenset[int]:
    """EOS ids as a set of ints in ``[0, vocab_size)`` (``None``: no EOS, the empty set).

    A string is an error (``"12"`` is not the set ``{1, 2}``); an empty sequence means no EOS.
    """
    if eos is None:
        return frozenset()
    single = as_integer(eos)
    if single is not None:
        values = [single]
    elif isinstance(eos, str | bytes):
        raise GenerationInputError(
            f"eos_token_id must be an integer or a list of integers, not the string {eos!r}; "
            "pass the token id itself (e.g. tokenizer.eos_token_id), not its text",
            param="eos_token_id",
        )
    elif isinstance(eos, np.ndarray | Sequence | set | frozenset) or _is_torch(eos):
        if len(eos) == 0:
            return frozenset()
        items = eos if isinstance(eos, np.ndarray | Sequence) or _is_torch(eos) else sorted(eos)
        return frozenset(check_token_ids(items, vocab_size, name="eos_token_id"))
    else:
        raise GenerationInputError(
            f"eos_token_id must be None, an integer or a list of integers, got "
            f"{_show(eos)} ({type(eos).__name__})",
            param="eos_token_id",
        )
    if values[0] < 0 or (vocab_size is not None and values[0] >= vocab_size):
        raise GenerationInputError(
            f"eos_token_id {values[0]} is outside [0, {vocab_size or 'vocab_size'}); check that "
            "the tokenizer matches the model",
            param="eos_token_id",
        )
    return frozenset(values)


def check_max_new_tokens(max_new_tokens: Any) -> int:
    value = as_integer(max_new_tokens)
    if value is None or value < 1:
        raise GenerationInputError(
            f"max_new_tokens must be an integer >= 1, got {_show(max_new_tokens)}; "
            "e.g. max_new_tokens=128",
            param="max_new_tokens",
        )
    return value


def check_prompt_fits(prompt_len: int, max_length: int | None) -> None:
    """The prompt alone must leave room for at least one new token in the context window."""
    if max_length is not None and prompt_len >= max_length:
        raise GenerationInputError(
            f"the prompt has {prompt_len} tokens but the model's context window is {max_length} "
            f"tokens, leaving no room for a new token; shorten the prompt to at most "
            f"{max_length - 1} tokens",
            param="prompt",
        )


# ----------------------------------------------------------------------------- sampling


def check_temperature(temperature: Any) -> float:
    value = _as_real(temperature)
    if value is None or not math.isfinite(value) or value < 0:
        raise SamplingParamsError(
            f"temperature must be a finite number >= 0 (0 = greedy), got "
            f"{_show(temperature)}; use e.g. temperature=0.7",
            param="temperature",
        )
    if 0 < value < MIN_TEMPERATURE:
        raise SamplingParamsError(
            f"temperature {value!r} is below the smallest supported {MIN_TEMPERATURE} (logits "
            "divided by it overflow); use temperature=0 for greedy decoding",
            param="temperature",
        )
    return value


def check_top_k(top_k: Any) -> int | None:
    if top_k is None:
        return None
    value = as_integer(top_k)
    if value is None or value < 1:
        raise SamplingParamsError(
            f"top_k must be an integer >= 1 or None (no top-k filter), got {_show(top_k)}; "
            "use e.g. top_k=50",
            param="top_k",
        )
    return value


def check_top_p(top_p: Any) -> float | None:
    if top_p is None:
        return None
    value = _as_real(top_p)
    if value is None or not 0.0 < value <= 1.0:  # NaN fails the comparison too
        raise SamplingParamsError(
            f"top_p must lie in (0, 1] or be None (no nucleus filter), got {_show(top_p)}; "
            "use e.g. top_p=0.9",
            param="top_p",
        )
    return value


def check_min_p(min_p: Any) -> float | None:
    if min_p is None:
        return None
    value = _as_real(min_p)
    if value is None or not 0.0 <= value < 1.0:
        raise SamplingParamsError(
            f"min_p must lie in [0, 1) or be None (no min-p filter), got {_show(min_p)}; "
            "use e.g. min_p=0.05",
            param="min_p",
        )
    return value


def check_sampling(
    temperature: Any = 1.0, top_k: Any = None, top_p: Any = None, min_p: Any = None
) -> tuple[float, int | None, float | None, float | None]:
    """``(temperature, top_k, top_p, min_p)`` checked and normalised (see the check_* above)."""
    return (
        check_temperature(temperature),
        check_top_k(top_k),
        check_top_p(top_p),
        check_min_p(min_p),
    )


# ----------------------------------------------------------------------------- models


def check_layer_count(count: Any, num_layers: int, *, what: str = "draft layers") -> int:
    """A number of layers to keep: an integer in ``[1, num_layers]`` of the checkpoint.

    0 is not "all layers" and a count above the checkpoint's would add randomly initialised
    layers; both are errors.
    """
    value = as_integer(count)
    if value is None or not 1 <= value <= num_layers:
        raise ModelLoadError(
            f"{what} must be an integer from 1 to {num_layers} (the checkpoint has "
            f"{num_layers} layers), got {_show(count)}; omit it to use every layer"
        )
    return value


def check_device(device: Any) -> str:
    """A device string the installed torch can use: ``cpu``, ``cuda[:N]``, ``mps``."""
    if not isinstance(device, str):
        raise ModelLoadError(
            f"device must be a string such as 'cpu' or 'cuda:0', got {_show(device)}"
        )
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(
            f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' (an NVIDIA GPU) or 'mps' "
            "(Apple silicon)"
        )
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(
                f"device {device!r}: this torch build ({torch.__version__}) sees no CUDA GPU; "
                "use --device cpu, or install a CUDA build of torch on a machine with a GPU"
            )
        if parsed.index is not None and parsed.index >= count:
            raise ModelLoadError(
                f"device {device!r}: only {count} CUDA GPU(s) visible (cuda:0 .. "
                f"cuda:{count - 1}); pick one of those"
            )
    if parsed.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(
                f"device {device!r}: MPS (Apple silicon) is not available in this torch build; "
                "use --device cpu"
            )
    if parsed.type == "cpu" and parsed.index not in (None, 0):
        raise ModelLoadError(f"device {device!r}: the CPU has no index; use 'cpu'")
    return device


# ----------------------------------------------------------------------------- files


def check_input_file(path: Any, *, what: str = "file") -> Path:
    """An existing, readable regular file (a rank profile, calibration, config ...)."""
    if not isinstance(path, str | os.PathLike) or str(path) == "":
        raise InputFileError(f"{what} path must be a non-empty path, got {_show(path)}")
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputFileError(
            f"{what} {str(p)!r} is a directory, not a file; give the path of the file itself"
        )
    if not p.exists():
        raise InputFileError(f"{what} {str(p)!r} does not exist; check the path")
    if not p.is_file():
        raise InputFileError(f"{what} {str(p)!r} is not a regular file")
    if not os.access(p, os.R_OK):
        raise InputFileError(f"{what} {str(p)!r} is not readable; check its permissions")
    return p
