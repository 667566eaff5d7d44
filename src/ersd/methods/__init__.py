"""Verification methods, one module each, behind one interface (:mod:`ersd.methods.base`).

:mod:`ersd.methods.catalog` describes every method as plain data (name, shape limits, natural
shapes, report order, colour; no torch); ``METHODS`` (:mod:`ersd.methods.registry`) maps a
method name to its stateless method object and :func:`get_method` looks one up with an error that
lists the known names.  Names are imported lazily (PEP 562) so that reading the catalog (theory,
CLI help) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ersd.methods.base import (
        GREEDY,
        DraftTree,
        GreedyRule,
        Method,
        NodeDecision,
        NodeNoise,
        TreeVerification,
        rule_for,
        verify_tree,
    )
    from ersd.methods.catalog import CATALOG, METHOD_NAMES, MethodInfo
    from ersd.methods.registry import METHODS, get_method

_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "DraftTree",
            "GreedyRule",
            "Method",
            "NodeDecision",
            "NodeNoise",
            "TreeVerification",
            "GREEDY",
            "rule_for",
            "verify_tree",
        ),
        "ersd.methods.base",
    ),
    **dict.fromkeys(("CATALOG", "METHOD_NAMES", "MethodInfo"), "ersd.methods.catalog"),
    **dict.fromkeys(("METHODS", "get_method"), "ersd.methods.registry"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ersd.methods' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CATALOG",
    "GREEDY",
    "METHODS",
    "METHOD_NAMES",
    "DraftTree",
    "GreedyRule",
    "Method",
    "MethodInfo",
    "NodeDecision",
    "NodeNoise",
    "TreeVerification",
    "get_method",
    "rule_for",
    "verify_tree",
]
