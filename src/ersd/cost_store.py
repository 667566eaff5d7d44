"""Forward-cost curves and rank profiles measured once per machine, kept in the model cache.

``tree="auto"`` needs each model's forward seconds for 1, 2, 4, 8 and 16 new tokens per row (per
batch size).  Measuring them costs a few seconds of every process that uses ``auto``; a
:class:`CostStore` keeps them in ``$ERSD_CACHE/calibration/costs.json`` (the model cache root,
:func:`ersd.models.bundled.store.cache_root`; ``$ERSD_COST_STORE`` names another directory, or
``off`` disables the store) so that later processes read them instead:

* a **curve** entry is keyed by the model (its ``describe()``: backend, name/path, dtype, layers,
  threads for llama.cpp, ...), the batch size and the forward sizes;
* a **profile** entry (per-depth rank probabilities of a model pair, method and temperature, from
  ``ersd models calibrate``) is keyed by both models' keys, the method and the temperature;
* a **timing** entry (how a pair's real steps ran against the curves' prediction at one batch
  size: ``tree="auto"``'s online correction, :class:`ersd.auto.StepTiming`, of drafting and of
  plain steps) is keyed by both models' keys and the batch size.

Every entry records the **environment** it was measured in (:func:`environment`: the CPU model and
a hash of its feature flags, the core count, the machine, the Python and torch builds, torch's
thread count; a llama.cpp model's key holds its llama-cpp-python version and thread count).
An entry measured in another environment is **stale**: never trusted, it is measured again and
replaced (``CostStore.stale`` counts them).  A model without a stable identity (a
Python-function model, a toy) is never stored.

Writes are atomic (a temporary file renamed over the old one); a store that cannot be written (a
read-only cache) logs one warning and keeps its entries in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("ersd")

#: environment variable: the store's directory, or ``off`` (no store: every process measures)
STORE_ENV = "ERSD_COST_STORE"
#: file name inside the store's directory
STORE_FILE = "costs.json"
#: format tag and version of the file
STORE_FORMAT = "ersd-cost-store"
STORE_VERSION = 1
#: ``describe()`` backends whose models have a stable identity (a path or a hub name)
STORED_BACKENDS = ("hf", "llamacpp")
#: ``describe()`` fields that change as a model is used (``tree_attention`` resolves ``auto`` on
#: the first tree forward): not part of a model's key
VOLATILE_KEYS = ("tree_attention",)


def _cpu() -> tuple[str, str]:
    """The CPU model name and a hash of its feature flags (Linux ``/proc/cpuinfo``)."""
    name, flags = platform.processor() or "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name.strip():
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if name and flags:
                    break
    except OSError:
        pass
    return name, hashlib.sha256(flags.encode()).hexdigest()[:16]


def environment() -> dict[str, Any]:
    """What a measured curve depends on besides the model: CPU, builds, thread count, and how
    the curve was measured (a curve of an older way of measuring is measured again)."""
    import torch

    from ersd.costs import MEASURE_REPEATS

    name, flags = _cpu()
    return {
        "cpu": name,
        "cpu_flags": flags,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "curve_rounds": f"interleaved x{MEASURE_REPEATS}",
    }


def model_key(model: Any) -> str | None:
    """A stable key for ``model``'s curves (its ``describe()``), or None when it has none."""
    describe = getattr(model, "describe", None)
    if not callable(describe):
        return None
    try:
        info = describe()
    except Exception:  # a model that cannot describe itself is simply not stored
        return None
    if not isinstance(info, dict) or info.get("backend") not in STORED_BACKENDS:
        return None
    if not (info.get("name") or info.get("path")):
        return None
    for volatile in VOLATILE_KEYS:
        info.pop(volatile, None)
    return json.dumps(info, sort_keys=True, default=str)


def default_dir() -> Path | None:
    """``$ERSD_COST_STORE`` (``off``: None), else ``<model cache root>/calibration``."""
    env = os.environ.get(STORE_ENV)
    if env is not None and env.strip().lower() in ("off", "0", "none", ""):
        return None
    if env:
        return Path(env).expanduser()
    from ersd.models.bundled.store import cache_root

    return cache_root() / "calibration"


class CostStore:
    """Persisted cost curves and rank profiles (module docstring).

    ``directory``: where ``costs.json`` lives (default :func:`default_dir`; None with the store
    off: entries then live in memory only).  ``env``: a function giving the current environment
    (default :func:`environment`; tests pass their own to simulate another machine or build).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        env: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._env_fn = env or environment
        self._env: dict[str, Any] | None = None
        self._data: dict[str, Any] | None = None
        self.stale = 0  # entries found measured in another environment (re-measured)
        self.hits = 0  # curves read from the store
        self._warned = False

    @classmethod
    def default(cls) -> CostStore:
        return cls(default_dir())

    @property
    def path(self) -> Path | None:
        return self.directory / STORE_FILE if self.directory is not None else None

    def env(self) -> dict[str, Any]:
        if self._env is None:
            self._env = self._env_fn()
        return self._env

    def _load(self) -> dict[str, Any]:
        if self._data is not None:
            return self._data
        data: dict[str, Any] = {"format": STORE_FORMAT, "version": STORE_VERSION}
        path = self.path
        if path is not None and path.exists():
            try:
                read = json.loads(path.read_text())
                if read.get("format") == STORE_FORMAT and read.get("version") == STORE_VERSION:
                    data = read
                else:
                    logger.warning("cost store %s has another format; it will be rewritten", path)
            except (OSError, ValueError, AttributeError) as exc:
                logger.warning("cost store %s is unreadable (%s); it will be rewritten", path, exc)
        data.setdefault("curves", {})
        data.setdefault("profiles", {})
        data.setdefault("timing", {})
        self._data = data
        return data

    def _save(self) -> None:
        path = self.path
        if path is None or self._data is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".costs-", suffix=".json")
            os.chmod(tmp, 0o644)  # a shared model cache: readable like the models beside it
            with os.fdopen(fd, "w") as f:
                json.dump(self._data, f, indent=1)
                f.write("\n")
            os.replace(tmp, path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cost store %s cannot be written (%s): measured curves are kept for this "
                    "process only; set $%s to a writable directory (or 'off')",
                    path,
                    exc,
                    STORE_ENV,
                )

    def _fresh(self, entry: Any) -> bool:
        if not isinstance(entry, dict):
            return False
        if entry.get("env") != self.env():
            self.stale += 1
            return False
        return True

    # --- curves --------------------------------------------------------------------------

    @staticmethod
    def _curve_key(key: str, batch: int, sizes: Sequence[int]) -> str:
        return json.dumps([key, int(batch), [int(s) for s in sizes]])

    def get_curve(self, model: Any, batch: int, sizes: Sequence[int]) -> list[float] | None:
        """The stored curve of ``model`` at ``batch`` rows, or None (missing, stale, unkeyed)."""
        key = model_key(model)
        if key is None:
            return None
        entry = self._load()["curves"].get(self._curve_key(key, batch, sizes))
        if entry is None or not self._fresh(entry):
            return None
        curve = entry.get("seconds")
        if not isinstance(curve, list) or len(curve) != len(sizes):
            return None
        self.hits += 1
        return [float(v) for v in curve]

    def put_curve(self, model: Any, batch: int, sizes: Sequence[int], seconds: list[float]) -> None:
        key = model_key(model)
        if key is None:
            return
        self._load()["curves"][self._curve_key(key, batch, sizes)] = {
            "seconds": [float(v) for v in seconds],
            "env": self.env(),
        }
        self._save()

    # --- step timing corrections -----------------------------------------------------------

    @staticmethod
    def _timing_key(tkey: str, dkey: str, batch: int) -> str:
        return json.dumps([tkey, dkey, int(batch)])

    def get_timing(self, target: Any, draft: Any, batch: int) -> dict[str, list[float]]:
        """The stored step-timing corrections of the pair at ``batch`` rows: ``{kind: [target
        ratio, draft ratio, overhead seconds per row]}`` for ``kind`` "plain" and/or "spec",
        and ``"rows": [spread of the rows' acceptance factors, rows behind it]`` (empty: none,
        stale or unkeyed)."""
        tkey, dkey = model_key(target), model_key(draft)
        if tkey is None or dkey is None:
            return {}
        entry = self._load()["timing"].get(self._timing_key(tkey, dkey, batch))
        if entry is None or not self._fresh(entry):
            return {}
        out: dict[str, list[float]] = {}
        for kind, n in (("plain", 3), ("spec", 3), ("rows", 2)):
            v = entry.get(kind)
            ok = isinstance(v, list) and len(v) == n
            ok = ok and all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in v)
            if ok and (kind == "rows" or (v[0] > 0 and v[1] > 0)):
                out[kind] = [float(x) for x in v]
        return out

    def put_timing(
        self, target: Any, draft: Any, batch: int, timing: dict[str, list[float]]
    ) -> None:
        """Keep the pair's step-timing corrections at ``batch`` rows (the kinds given replace
        the stored ones; the file is read again first)."""
        tkey, dkey = model_key(target), model_key(draft)
        if tkey is None or dkey is None or not timing:
            return
        self._data = None  # re-read: another process may have written since
        key = self._timing_key(tkey, dkey, batch)
        entries = self._load()["timing"]
        old = entries.get(key)
        entry = dict(old) if isinstance(old, dict) and old.get("env") == self.env() else {}
        entry.update({k: [float(x) for x in v] for k, v in timing.items()})
        entry["env"] = self.env()
        entries[key] = entry
        self._save()

    # --- rank profiles -------------------------------------------------------------------

    @staticmethod
    def _profile_key(tkey: str, dkey: str, method: str) -> str:
        return json.dumps([tkey, dkey, method])

    def get_profile(
        self, target: Any, draft: Any, method: str, temperature: float
    ) -> list[list[float]] | None:
        """Per-depth rank probabilities stored for the pair, ``method`` and the temperature
        nearest ``temperature`` (within 0.25), or None."""
        entry = self.profile_entry(target, draft, method, temperature)
        return entry[0] if entry is not None else None

    def profile_entry(
        self, target: Any, draft: Any, method: str, temperature: float, *, exact: bool = False
    ) -> tuple[list[list[float]], list[int]] | None:
        """``(depth_probs, trials)`` stored for the pair, ``method`` and the temperature
        nearest ``temperature`` (within 0.25; ``exact``: that temperature only), or None;
        ``trials[d]``: the observations behind depth ``d`` (an entry without them spreads its
        ``observations`` evenly over its depths)."""
        tkey, dkey = model_key(target), model_key(draft)
        if tkey is None or dkey is None:
            return None
        by_temp = self._load()["profiles"].get(self._profile_key(tkey, dkey, method))
        if not isinstance(by_temp, dict) or not by_temp:
            return None
        nearest = min(by_temp, key=lambda t: abs(float(t) - temperature))
        if abs(float(nearest) - temperature) > (0.0 if exact else 0.25):
            return None
        entry = by_temp[nearest]
        if not self._fresh(entry):
            return None
        probs = entry.get("depth_probs")
        if not isinstance(probs, list) or not probs:
            return None
        trials = entry.get("trials")
        if not (isinstance(trials, list) and len(trials) == len(probs)):
            trials = [int(entry.get("observations") or 0) // len(probs)] * len(probs)
        return probs, [int(n) for n in trials]

    def merge_profile(
        self,
        target: Any,
        draft: Any,
        method: str,
        temperature: float,
        counts: list[list[float]],
        trials: list[int],
        *,
        max_weight: int = 4096,
    ) -> None:
        """Fold a run's rank observations (per depth: ``counts[d][r - 1]`` of ``trials[d]``
        observations) into the stored profile at exactly
        ``temperature``: depth ``d`` becomes ``(w_d · stored_d + counts_d) / (w_d + trials_d)``,
        ``w_d`` the stored observations of that depth (at most ``max_weight``, so the profile
        keeps following the pair's recent runs).  The file is read again first, so a run in
        another process that wrote meanwhile is kept."""
        self._data = None  # re-read: another process may have written since
        old = self.profile_entry(target, draft, method, temperature, exact=True)
        stored, weights = old if old is not None else ([], [])
        depth_probs: list[list[float]] = []
        depth_trials: list[int] = []
        for d in range(max(len(stored), len(counts))):
            w = min(weights[d], max_weight) if d < len(stored) else 0
            n = trials[d] if d < len(counts) else 0
            s = [float(x) for x in stored[d]] if d < len(stored) else []
            c = [float(x) for x in counts[d]] if n > 0 else []
            width = max(len(s), len(c))
            s += [0.0] * (width - len(s))
            c += [0.0] * (width - len(c))
            if w + n == 0:  # nothing behind this depth either way: keep what is stored
                depth_probs.append(s)
            else:
                depth_probs.append([(w * a + b) / (w + n) for a, b in zip(s, c, strict=True)])
            depth_trials.append(w + n)
        self.put_profile(
            target,
            draft,
            method,
            temperature,
            depth_probs,
            sum(depth_trials),
            trials=depth_trials,
        )

    def put_profile(
        self,
        target: Any,
        draft: Any,
        method: str,
        temperature: float,
        depth_probs: list[list[float]],
        observations: int,
        *,
        trials: list[int] | None = None,
    ) -> None:
        """Keep a pair's per-depth rank probabilities for ``method`` at ``temperature``
        (``observations`` behind them; ``trials``: per depth, when known)."""
        tkey, dkey = model_key(target), model_key(draft)
        if tkey is None or dkey is None:
            return
        profiles = self._load()["profiles"]
        entry = profiles.setdefault(self._profile_key(tkey, dkey, method), {})
        entry[repr(float(temperature))] = {
            "depth_probs": [[float(p) for p in row] for row in depth_probs],
            "observations": int(observations),
            **({"trials": [int(n) for n in trials]} if trials is not None else {}),
            "env": self.env(),
        }
        self._save()


__all__ = [
    "STORE_ENV",
    "CostStore",
    "default_dir",
    "environment",
    "model_key",
]
