"""Drafter specs: one string names a drafter, for the CLI, bench configs and the API.

    lookup                          prompt lookup, default options
    lookup:n=3,k=8,branches=2       prompt lookup with options
    suffix:match=8,corpus=ids.txt   suffix trie with a corpus file
    qwen2.5-coder-0.5b              a draft model (loaded by the caller's ``load_model``)
    lookup+qwen2.5-coder-0.5b       hybrid: lookup and the draft model, mixed per step
    lookup:policy=both+smollm2-135m hybrid with a fixed policy (auto, both, fallback)
    lookup:model_depth=3+smollm2-135m  hybrid whose model drafts only 3 levels of the shape
    lookup:guided=0+smollm2-135m    hybrid whose model is not given the lookup run as a guess

Options of ``lookup``: ``n``, ``min_n``, ``k``, ``depth``, ``branches``; of ``suffix``:
``match``, ``k``, ``depth``, ``branches``, ``corpus`` (a file of token ids, or of text when a
``tokenize`` function is given; see :func:`ersd.drafting.suffix.read_corpus`).  ``policy``,
``model_depth`` and ``guided`` (1, default, or 0) are options of the model-free part of a hybrid
spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ersd.drafting.base import Drafter
from ersd.drafting.free import DrafterConfigError
from ersd.drafting.hybrid import HybridDrafter
from ersd.drafting.lookup import LookupDrafter
from ersd.drafting.model import ModelDrafter
from ersd.drafting.suffix import SuffixDrafter

#: model-free drafter names -> their integer options
FREE_DRAFTERS: dict[str, tuple[str, ...]] = {
    "lookup": ("n", "min_n", "k", "depth", "branches"),
    "suffix": ("match", "k", "depth", "branches"),
}


def is_drafter_spec(spec: str) -> bool:
    """True when ``spec`` names a model-free or hybrid drafter (not just a model)."""
    return any(_name(part) in FREE_DRAFTERS for part in spec.split("+"))


def _name(part: str) -> str:
    return part.split(":", 1)[0].strip().lower()


def _options(part: str) -> dict[str, str]:
    _, _, rest = part.partition(":")
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise DrafterConfigError(
                f"drafter option {item!r} in {part!r} is not key=value; e.g. 'lookup:n=3,k=8'"
            )
        out[key.strip()] = value.strip()
    return out


def _free_drafter(
    part: str, tokenize: Callable[[str], list[int]] | None
) -> tuple[LookupDrafter | SuffixDrafter, dict[str, Any]]:
    name = _name(part)
    opts = _options(part)
    hybrid: dict[str, Any] = {}
    if "policy" in opts:
        hybrid["policy"] = opts.pop("policy")
    if "model_depth" in opts:
        value = opts.pop("model_depth")
        try:
            hybrid["model_depth"] = int(value)
        except ValueError:
            raise DrafterConfigError(
                f"drafter option model_depth must be an integer, got {value!r}"
            ) from None
    if "guided" in opts:
        value = opts.pop("guided")
        if value not in ("0", "1"):
            raise DrafterConfigError(f"drafter option guided must be 0 or 1, got {value!r}")
        hybrid["guided"] = value == "1"
    corpus = opts.pop("corpus", None) if name == "suffix" else None
    known = FREE_DRAFTERS[name]
    ints: dict[str, Any] = {}
    for key, value in opts.items():
        if key not in known:
            extra = ", corpus" if name == "suffix" else ""
            raise DrafterConfigError(
                f"unknown option {key!r} of drafter {name!r}; its options are "
                f"{', '.join(known)}{extra} (and policy, model_depth, guided in a hybrid spec)"
            )
        try:
            ints[key] = int(value)
        except ValueError:
            raise DrafterConfigError(
                f"drafter option {name}:{key} must be an integer, got {value!r}"
            ) from None
    if name == "lookup":
        return LookupDrafter(**ints), hybrid
    if corpus is not None:
        return SuffixDrafter.from_file(corpus, tokenize, **ints), hybrid
    return SuffixDrafter(**ints), hybrid


def parse_drafter(
    spec: str,
    *,
    load_model: Callable[[str], Any] | None = None,
    tokenize: Callable[[str], list[int]] | None = None,
) -> Drafter:
    """The drafter ``spec`` names (see the module docstring).

    ``load_model(name)`` loads a draft model part (e.g. ``lambda n: ersd.load_model(n)``);
    ``tokenize(text)`` turns a text corpus into token ids (the target's tokenizer).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise DrafterConfigError(
            "drafter spec must be a non-empty string, e.g. 'lookup', 'suffix', "
            "'lookup+qwen2.5-coder-0.5b'"
        )
    parts = [p.strip() for p in spec.split("+")]
    if any(not p for p in parts):
        raise DrafterConfigError(f"drafter spec {spec!r} has an empty part around '+'")
    free_parts = [p for p in parts if _name(p) in FREE_DRAFTERS]
    model_parts = [p for p in parts if _name(p) not in FREE_DRAFTERS]
    if len(free_parts) > 1 or len(model_parts) > 1:
        raise DrafterConfigError(
            f"drafter spec {spec!r}: combine at most one model-free drafter (lookup or suffix) "
            "with at most one draft model, e.g. 'lookup+qwen2.5-coder-0.5b'"
        )
    model = None
    if model_parts:
        if load_model is None:
            raise DrafterConfigError(
                f"drafter spec {spec!r} names a draft model ({model_parts[0]!r}) but no "
                "load_model function was given; pass load_model=ersd.load_model"
            )
        model = load_model(model_parts[0])
    if not free_parts:
        return ModelDrafter(model)  # type: ignore[arg-type]
    free, hybrid = _free_drafter(free_parts[0], tokenize)
    if model is None:
        if hybrid:
            raise DrafterConfigError(
                f"option {', '.join(hybrid)} only applies to a hybrid spec such as "
                f"'{free_parts[0]}+qwen2.5-coder-0.5b'"
            )
        return free
    return HybridDrafter(free, model, **hybrid)
