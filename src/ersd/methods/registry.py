"""The registry of verification methods: one stateless object per :data:`CATALOG` entry."""

from __future__ import annotations

from ersd.errors import UnknownMethodError
from ersd.methods.base import Method
from ersd.methods.catalog import CATALOG, WATERMARK_BASELINES
from ersd.methods.ersd import ERSD
from ersd.methods.gls import GumbelListSampling
from ersd.methods.rrs_wor import RRSWithoutReplacement
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.spechub import SpecHub
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr
from ersd.methods.watermark_baselines import BASELINE_CLASSES

_CLASSES: tuple[type[Method], ...] = (
    ERSD,
    SpeculativeSampling,
    SpecInfer,
    RRSWithoutReplacement,
    SpecTr,
    SpecHub,
    GumbelListSampling,
)

#: method name -> method object, in catalog order
METHODS: dict[str, Method] = {
    name: next(cls() for cls in _CLASSES if cls.info is info) for name, info in CATALOG.items()
}

#: the engines' watermark schemes as baselines (:mod:`ersd.methods.watermark_baselines`)
WATERMARK_METHODS: dict[str, Method] = {
    name: next(cls() for cls in BASELINE_CLASSES if cls.info is info)
    for name, info in WATERMARK_BASELINES.items()
}


def get_method(name: str | Method) -> Method:
    """The method registered under ``name`` (a :class:`Method` passes through); the watermark
    baselines (``WATERMARK_METHODS``) are found by name too."""
    if isinstance(name, Method):
        return name
    try:
        return METHODS[name] if name in METHODS else WATERMARK_METHODS[name]
    except (KeyError, TypeError):
        raise UnknownMethodError(
            f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))} (watermark "
            f"baselines: {', '.join(WATERMARK_METHODS)})"
        ) from None
