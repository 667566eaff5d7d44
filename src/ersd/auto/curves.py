"""The cost curves ``tree="auto"`` predicts step times from: measured once per model and batch
size into a :class:`CurveCache` the caller owns, read from the cost store it names (the default
one, which ``ersd models calibrate`` fills) and written back to it only when the caller asks
(``CurveCache(learn=True)``, ``ersd serve --auto-learn``)."""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ersd.cost_store import STORE_FILE, CostStore, default_dir
from ersd.costs import DEFAULT_SIZES, MEASURE_REPEATS, CostModel, measure_curve
from ersd.tree import AutoTree

#: at most this many of the context's last tokens prefill the cost-measurement sessions
MEASURE_PROMPT_TOKENS = 64


class CurveCache:
    """Measured forward-cost curves per model and batch size, owned by whoever shares them: a
    batch engine (every row's chooser), a benchmark run or one CLI call (pass it as
    ``AutoTree(costs=cache)``), else one chooser.  Nothing is stored on the models.

    ``measurements`` counts the curves measured so far: a step during which one was measured is
    not learned from (its time includes the measurement)."""

    def __init__(self, store: CostStore | bool | None = True, learn: bool = False) -> None:
        #: (a reference to the model, its curves)
        self._curves: list[tuple[Callable[[], Any], dict[Any, list[float]]]] = []
        self.measurements = 0
        #: seconds spent measuring curves (not read from the store)
        self.measure_seconds = 0.0
        #: where curves persist across processes (:mod:`ersd.cost_store`; ``True``: the default
        #: store in the model cache, ``None``/``False``: none)
        self.store: CostStore | None = (
            CostStore.default() if store is True else (store if store else None)
        )
        #: whether what is measured or learned is written to :attr:`store`: the curves measured
        #: here, and each run's rank observations and timing corrections (the chooser's
        #: ``keep_profile``).  Off by default: a run reads the store, and two identical calls
        #: draft identically, whatever ran before them
        self.learn = learn

    def _of(self, model: Any) -> dict[Any, list[float]]:
        for held, curves in self._curves:
            if held() is model:
                return curves
        # weakly held, so a cache kept for the process never keeps a model alive
        self._curves = [(r, c) for r, c in self._curves if r() is not None]
        try:
            ref: Callable[[], Any] = weakref.ref(model)
        except TypeError:  # a model class without weak references: held for the cache's life
            ref = _Strong(model)
        self._curves.append((ref, {}))
        return self._curves[-1][1]

    def curve(self, model: Any, context: list[int], batch: int) -> list[float]:
        """Forward seconds of ``model`` for :data:`ersd.costs.DEFAULT_SIZES` new tokens in each
        of ``batch`` rows: measured once (fresh sessions of the context's last tokens)."""
        curves = self._of(model)
        key = (batch, DEFAULT_SIZES)
        if key not in curves:
            stored = self.store.get_curve(model, batch, DEFAULT_SIZES) if self.store else None
            if stored is not None:
                curves[key] = stored
                return stored
            self.measurements += 1
            t0 = time.perf_counter()
            curves[key] = measure_curve(
                model, measure_prompt(model, context), DEFAULT_SIZES, batch=batch
            )
            self.measure_seconds += time.perf_counter() - t0
            if self.store is not None and self.learn:
                self.store.put_curve(model, batch, DEFAULT_SIZES, curves[key])
        return curves[key]


class _Strong:
    """A reference that holds its object (for models that cannot be weakly referenced)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


_PROCESS_LOCK = threading.Lock()
_PROCESS: tuple[Any, CurveCache] | None = None


def process_curves() -> CurveCache:
    """The curves ``tree="auto"`` measures when its caller shares no :class:`CurveCache`
    (``ersd.generate`` without ``AutoTree(costs=...)``, a new batch engine): kept in memory for
    this process, so a curve is measured once per model and batch size, not at every call (on
    the Qwen pair that was ~9 s of each llama.cpp call); never written to a file.  It reads the
    default cost store and starts afresh when that store changes (another ``ERSD_CACHE``, or
    ``ersd models calibrate`` writing it)."""
    global _PROCESS
    directory = default_dir()
    path = directory / STORE_FILE if directory is not None else None
    try:
        mtime = path.stat().st_mtime_ns if path is not None else None
    except OSError:
        mtime = None
    stamp = (directory, mtime)
    with _PROCESS_LOCK:
        if _PROCESS is None or _PROCESS[0] != stamp:
            _PROCESS = (stamp, CurveCache())
        return _PROCESS[1]


def measure_prompt(model: Any, context: list[int]) -> list[int]:
    """The tokens a curve of ``model`` is measured on: ``context``'s last
    :data:`MEASURE_PROMPT_TOKENS`, fewer if the model's window would not hold them and the
    timed forwards (:func:`~ersd.costs.measure_curve`)."""
    keep = MEASURE_PROMPT_TOKENS
    window = getattr(model, "max_length", None)
    # committed timings + the largest call
    room = len(DEFAULT_SIZES) * (MEASURE_REPEATS + 1) + max(DEFAULT_SIZES) + 2
    if window is not None:
        keep = min(keep, window - room)
    return context[-max(keep, 1) :]


def measured_costs(
    target: Any, draft: Any, context: list[int], batch: int, curves: CurveCache
) -> CostModel:
    """A :class:`CostModel` measured (into ``curves``) at batch 1 and the powers of two around
    ``batch`` (``draft=None``: a model-free drafter, no draft cost)."""
    lo = 1 << math.floor(math.log2(batch))
    hi = 1 << math.ceil(math.log2(batch))
    sizes = sorted({1, lo, hi})
    zero = [0.0] * len(DEFAULT_SIZES)
    tgt = [curves.curve(target, context, b) for b in sizes]
    drf = [curves.curve(draft, context, b) if draft is not None else zero for b in sizes]
    return CostModel(
        sizes=list(DEFAULT_SIZES),
        target=tgt[0],
        draft=drf[0],
        meta={"source": "measured by tree='auto'"},
        batch_sizes=sizes,
        target_batch=tgt,
        draft_batch=drf,
    )


def prepare_costs(
    target: Any, draft: Any, context: list[int], max_batch: int, curves: CurveCache
) -> None:
    """Measure into ``curves`` the cost curves ``tree="auto"`` uses for every batch size up to
    ``max_batch``, so that no later generation given ``AutoTree(costs=curves)`` pays for the
    measurement inside its own time (benchmarks call this before timing)."""
    sizes = {1}
    b = 1
    while b < max_batch:
        b *= 2
        sizes.add(b)
    for b in sorted(sizes):
        curves.curve(target, context, b)
        if draft is not None:
            curves.curve(draft, context, b)


def sharing(auto: AutoTree, curves: CurveCache) -> AutoTree:
    """``auto`` measuring its cost curves into ``curves`` (unless it names its costs), so that
    generations given it share one measurement (a benchmark's runs, a CLI call's warm-up)."""
    return auto if auto.costs is not None else replace(auto, costs=curves)


def draft_model_of(drafter: Any) -> Any:
    """The draft language model behind a drafter (a model drafter, a hybrid's model part), or
    None for a model-free drafter."""
    from ersd.drafting import ModelDrafter
    from ersd.models.base import LanguageModel

    model = getattr(drafter, "model", None)
    if isinstance(model, ModelDrafter):
        model = model.model
    return model if isinstance(model, LanguageModel) else None


__all__ = [
    "MEASURE_PROMPT_TOKENS",
    "CurveCache",
    "draft_model_of",
    "measure_prompt",
    "measured_costs",
    "prepare_costs",
    "sharing",
]
