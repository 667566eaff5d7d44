"""Verification methods, one module each, behind one interface (:mod:`ersd.methods.base`).

``METHODS`` maps a method name to its (stateless) method object; :func:`get_method` looks one up
with an error that lists the known names.
"""

from __future__ import annotations

from ersd.errors import UnknownMethodError
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
from ersd.methods.ersd import ERSD
from ersd.methods.gls import GumbelListSampling
from ersd.methods.rrs_wor import RRSWithoutReplacement
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.spechub import SpecHub
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        ERSD(),
        SpeculativeSampling(),
        SpecInfer(),
        RRSWithoutReplacement(),
        SpecTr(),
        SpecHub(),
        GumbelListSampling(),
    )
}


def get_method(name: str | Method) -> Method:
    """The method registered under ``name`` (a :class:`Method` passes through)."""
    if isinstance(name, Method):
        return name
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}"
        ) from None


__all__ = [
    "GREEDY",
    "METHODS",
    "DraftTree",
    "GreedyRule",
    "Method",
    "NodeDecision",
    "NodeNoise",
    "TreeVerification",
    "get_method",
    "rule_for",
    "verify_tree",
]
