"""Empirical rank profiles: ``P_R`` estimated from recorded ERSD ranks, and their JSON files.

The generation loop records, for every verified context that had drafted children, the 1-based
rank of the target's race winner in the drafter's race (``StepRecord.ranks``, root-down within a
step; ``GenerationResult.ranks`` concatenates them).  The rank is observed in full whatever the
number of children (it is computed from the race, not from the tree), so the histogram of ranks
is an unbiased estimate of ``P_R`` under the i.i.d.-rank model (Kobus & Gündüz 2025, §3: "P_R is
estimated from data ... it can depend on depth").  A rank of ``V + 1`` means the drafter gave the
target's token no mass (never drafted).

File format (JSON, ``format = "ersd-rank-profile"``, ``version = 1``)::

    {"format": "ersd-rank-profile", "version": 1,
     "vocab_size": 49152,                 # or null when unknown
     "counts": [812, 140, 51, ...],       # counts[r - 1] = observations of rank r
     "depth_counts": [[...], [...]],      # optional: the same per depth (depth 1 first), or null
     "meta": {"target": "...", "draft": "...", "temperature": 1.0},
     "margin": {"edges": [...], "counts": [[[...]]]}}   # optional: ranks by margin bucket

``margin`` (optional) is a :class:`ersd.theory.margin.MarginTable`: the same ranks counted per
depth and per bucket of the draft race's margin, the data of the dynamic-tree policy's acceptance
predictor (:mod:`ersd.drafting.dynamic`).

The tree spec ``optimal:K@file`` (:func:`ersd.parse_tree`) loads such a file, or a calibration
file of ``ersd bench calibrate`` (one profile per temperature), with :func:`load_profiles` — the
one reader of both formats — and builds :func:`ersd.theory.optimal_tree_by_depth` from
:func:`tree_depth_probs`.  :func:`nearest_temperature` is the one rule that picks a per-temperature
value (profile, tree choice) for another temperature.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ersd.errors import ErsdError
from ersd.theory.margin import MarginTable

PROFILE_FORMAT = "ersd-rank-profile"
PROFILE_VERSION = 1
#: the calibration file of ``ersd bench calibrate``: one rank profile per temperature, plus the
#: benchmark's cost curves and tree choices
CALIBRATION_FORMAT = "ersd-bench-calibration"
#: building a tree from a profile, per-depth estimates with fewer observations than this fall
#: back to the pooled profile
TREE_MIN_DEPTH_COUNT = 50
_MAKE_ONE = "write one with `ersd bench calibrate CONFIG --out FILE` or RankProfile.save"


class RankProfileError(ErsdError):
    """A rank profile (ranks, counts or JSON file) is malformed."""


def _counts_from_ranks(ranks: Iterable[int]) -> np.ndarray:
    vals = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int | np.integer) or r < 1:
            raise RankProfileError(
                f"ranks must be 1-based integers (1 = the drafter's own sample), got {r!r}"
            )
        vals.append(int(r))
    if not vals:
        return np.zeros(0, dtype=np.int64)
    return np.bincount(np.asarray(vals) - 1).astype(np.int64)


def _check_counts(values: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise RankProfileError(f"{name} must be a list of non-negative integers") from None
    if arr.ndim != 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr % 1 != 0):
        raise RankProfileError(
            f"{name} must be a 1-D list of non-negative integers, got {values!r}"
        )
    return arr.astype(np.int64)


def _pad(a: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([a, np.zeros(n - a.size, dtype=a.dtype)]) if a.size < n else a


@dataclass
class RankProfile:
    """A histogram of ERSD ranks, optionally per depth (``depth_counts[d]`` for depth ``d + 1``)."""

    counts: np.ndarray
    vocab_size: int | None = None
    depth_counts: list[np.ndarray] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: optional :class:`~ersd.theory.margin.MarginTable` (ranks by depth and draft-race margin)
    margin: MarginTable | None = None

    def __post_init__(self) -> None:
        self.counts = _check_counts(self.counts, "counts")
        if self.margin is not None and not isinstance(self.margin, MarginTable):
            self.margin = MarginTable.from_dict(self.margin)
        if self.depth_counts is not None:
            self.depth_counts = [
                _check_counts(c, f"depth_counts[{d}]") for d, c in enumerate(self.depth_counts)
            ]
        if self.vocab_size is not None and (
            isinstance(self.vocab_size, bool) or int(self.vocab_size) < 1
        ):
            raise RankProfileError(f"vocab_size must be a positive integer, got {self.vocab_size}")

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_ranks(
        cls, ranks: Iterable[int], vocab_size: int | None = None, **meta: Any
    ) -> RankProfile:
        """Profile of a flat list of 1-based ranks (e.g. ``GenerationResult.ranks``)."""
        return cls(_counts_from_ranks(ranks), vocab_size=vocab_size, meta=dict(meta))

    @classmethod
    def from_step_ranks(
        cls, step_ranks: Iterable[Sequence[int]], vocab_size: int | None = None, **meta: Any
    ) -> RankProfile:
        """Profile with per-depth counts from each step's root-down rank list."""
        by_depth: list[list[int]] = []
        flat: list[int] = []
        for ranks in step_ranks:
            for d, r in enumerate(ranks):
                while len(by_depth) <= d:
                    by_depth.append([])
                by_depth[d].append(r)
                flat.append(r)
        depth_counts = [_counts_from_ranks(rs) for rs in by_depth]
        return cls(
            _counts_from_ranks(flat),
            vocab_size=vocab_size,
            depth_counts=depth_counts,
            meta=dict(meta),
        )

    @classmethod
    def from_results(cls, results: Any, vocab_size: int | None = None, **meta: Any) -> RankProfile:
        """Profile (with per-depth counts) of one or several ``GenerationResult`` objects.

        Also accepts ``StepRecord`` objects or any object with a ``.steps`` list of objects with a
        ``.ranks`` list (duck-typed: nothing is imported from the generation loop).
        """
        items = [results] if hasattr(results, "steps") or hasattr(results, "ranks") else results
        step_ranks: list[Sequence[int]] = []
        for item in items:
            steps = item.steps if hasattr(item, "steps") else [item]
            step_ranks.extend(list(s.ranks) for s in steps)
        return cls.from_step_ranks(step_ranks, vocab_size=vocab_size, **meta)

    # --- estimates ------------------------------------------------------------------------------

    @property
    def num_observations(self) -> int:
        return int(self.counts.sum())

    @property
    def num_depths(self) -> int:
        return len(self.depth_counts) if self.depth_counts else 0

    def _probs(self, counts: np.ndarray, what: str) -> np.ndarray:
        total = counts.sum()
        if total == 0:
            raise RankProfileError(
                f"{what} has no observations; record ranks with method='ersd' at temperature > 0"
            )
        probs = counts / total
        if self.vocab_size is not None:
            # rank V + 1 (never drafted) is left out: the vector becomes a sub-probability
            probs = probs[: self.vocab_size]
        return np.asarray(probs, dtype=np.float64)

    def rank_probs(self) -> np.ndarray:
        """Empirical ``P(R = r)`` (element ``r − 1``), pooled over depths."""
        return self._probs(self.counts, "the rank profile")

    def depth_rank_probs(self, min_count: int = 1) -> list[np.ndarray]:
        """Per-depth empirical ``P_R``, depth 1 first; depths with < ``min_count`` counts dropped
        from the end (deeper contexts are reached less often, so their estimates are noisier)."""
        if not self.depth_counts:
            return [self.rank_probs()]
        out = []
        for d, c in enumerate(self.depth_counts):
            if c.sum() < max(min_count, 1):
                break
            out.append(self._probs(c, f"depth {d + 1}"))
        return out or [self.rank_probs()]

    # --- files ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "vocab_size": self.vocab_size,
            "num_observations": self.num_observations,
            "counts": [int(c) for c in self.counts],
            "depth_counts": (
                None
                if self.depth_counts is None
                else [[int(c) for c in dc] for dc in self.depth_counts]
            ),
            "meta": self.meta,
        }
        if self.margin is not None:
            out["margin"] = self.margin.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RankProfile:
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise RankProfileError(
                f'not a rank profile: expected a JSON object with "format": '
                f'"{PROFILE_FORMAT}" (write one with RankProfile.save)'
            )
        if data.get("version") != PROFILE_VERSION:
            raise RankProfileError(
                f"rank profile version {data.get('version')!r} is not supported (this ersd "
                f"reads version {PROFILE_VERSION})"
            )
        if "counts" not in data:
            raise RankProfileError('rank profile has no "counts" list')
        fields = (
            ("depth_counts", list, "list"),
            ("meta", dict, "object"),
            ("margin", dict, "object"),
        )
        for name, kind, label in fields:
            if data.get(name) is not None and not isinstance(data[name], kind):
                raise RankProfileError(
                    f'rank profile field "{name}" must be a JSON {label} or absent, got '
                    f"{type(data[name]).__name__} {data[name]!r:.40}; {_MAKE_ONE}"
                )
        try:
            return cls(
                counts=data["counts"],
                vocab_size=data.get("vocab_size"),
                depth_counts=data.get("depth_counts"),
                meta=dict(data.get("meta") or {}),
                margin=data.get("margin"),
            )
        except RankProfileError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise RankProfileError(
                f"rank profile has a malformed field ({type(exc).__name__}: {exc}); {_MAKE_ONE}"
            ) from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RankProfile:
        return cls.from_dict(_read_json(path, "rank profile"))


#: larger profile files are refused unread (a real one is a few kB; /dev/zero never ends)
MAX_PROFILE_BYTES = 64 * 1024 * 1024


def _read_json(path: str | Path, what: str) -> Any:
    p = Path(path)
    try:
        if p.exists() and not p.is_dir() and not p.is_file():
            raise RankProfileError(
                f"{what} file {str(p)!r} is not a regular file (a device, a pipe or a socket); "
                "give the JSON file itself"
            )
        with open(p, "rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise RankProfileError(
                f"{what} file {str(p)!r} is larger than {MAX_PROFILE_BYTES:,} bytes, far beyond "
                f"a rank profile; {_MAKE_ONE}"
            )
        return json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise RankProfileError(f"{what} file {str(p)!r} does not exist; {_MAKE_ONE}") from None
    except json.JSONDecodeError as exc:
        raise RankProfileError(f"{what} file {str(p)!r} is not valid JSON: {exc}") from None
    except IsADirectoryError:
        raise RankProfileError(
            f"{what} file {str(p)!r} is a directory, not a file; give the JSON file itself"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RankProfileError(f"cannot read {what} file {str(p)!r}: {exc}") from None
    except RecursionError:
        raise RankProfileError(
            f"{what} file {str(p)!r}: JSON nested too deeply to read; {_MAKE_ONE}"
        ) from None
    except ValueError as exc:  # an integer past Python's digit limit
        why = str(exc).split(":")[0][:100]
        raise RankProfileError(
            f"{what} file {str(p)!r}: unreadable JSON value ({why}); {_MAKE_ONE}"
        ) from None


@dataclass
class ProfileFile:
    """A rank-profile or calibration file: its profiles by temperature and its other fields.

    ``data`` holds a calibration file's remaining top-level fields (``costs``, ``choices``,
    ``meta``, read by the benchmark); it is empty for a plain rank profile, whose one profile is
    filed under ``meta["temperature"]`` (1.0 when not recorded).
    """

    profiles: dict[float, RankProfile]
    data: dict[str, Any] = field(default_factory=dict)


def load_profiles(path: str | Path) -> ProfileFile:
    """Read a rank profile (:meth:`RankProfile.save`) or a calibration file (``ersd bench
    calibrate``): the one reader of both formats."""
    data = _read_json(path, "profile")
    if isinstance(data, dict) and data.get("format") == CALIBRATION_FORMAT:
        by_temp = data.get("profiles")
        if not isinstance(by_temp, dict) or not by_temp:
            raise RankProfileError(
                f'calibration file {str(path)!r} has no "profiles" object (temperature -> rank '
                f"profile); {_MAKE_ONE}"
            )
        profiles = {}
        for t, d in by_temp.items():
            try:
                temp = float(t)
            except ValueError:
                raise RankProfileError(
                    f"calibration file {str(path)!r}: profile key {t!r} is not a temperature "
                    f'(e.g. "0.7"); {_MAKE_ONE}'
                ) from None
            try:
                profiles[temp] = RankProfile.from_dict(d)
            except RankProfileError as exc:
                raise RankProfileError(
                    f"calibration file {str(path)!r}, temperature {t}: {exc}"
                ) from None
        rest = {k: v for k, v in data.items() if k not in ("format", "version", "profiles")}
        return ProfileFile(profiles, rest)
    try:
        prof = RankProfile.from_dict(data)
        return ProfileFile({float(prof.meta.get("temperature", 1.0)): prof})
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RankProfileError):
            raise RankProfileError(f"profile file {str(path)!r}: {exc}") from None
        raise RankProfileError(
            f'profile file {str(path)!r}: meta "temperature" is not a number ({exc})'
        ) from None


V = TypeVar("V")


def nearest_temperature(by_temp: Mapping[float, V], temperature: float | None) -> V:
    """The value filed at the temperature nearest ``temperature`` (ties: the lower one; None:
    the lowest temperature)."""
    if not by_temp:
        raise RankProfileError("no rank profile available; run `ersd bench calibrate` first")
    temps = sorted(by_temp)
    if temperature is None:
        return by_temp[temps[0]]
    return by_temp[min(temps, key=lambda t: (abs(t - temperature), t))]


def tree_depth_probs(profile: Any, temperature: float | None = None) -> list[np.ndarray]:
    """Per-depth rank probabilities (depth 1 first) to build a tree from: of a
    :class:`RankProfile`, a profile or calibration file (the profile nearest ``temperature``), a
    ``{temperature: RankProfile}`` mapping, one pooled rank vector or a list of per-depth ones."""
    if isinstance(profile, str | Path):
        profile = load_profiles(profile).profiles
    if isinstance(profile, Mapping):
        profile = nearest_temperature(profile, temperature)
    if isinstance(profile, RankProfile):
        return profile.depth_rank_probs(min_count=TREE_MIN_DEPTH_COUNT)
    arr = list(profile)
    if arr and np.ndim(arr[0]) == 0:  # one pooled vector
        return [np.asarray(arr, dtype=np.float64)]
    return [np.asarray(a, dtype=np.float64) for a in arr]


def merge_profiles(profiles: Sequence[RankProfile]) -> RankProfile:
    """Sum the counts of several profiles (same vocabulary)."""
    if not profiles:
        raise RankProfileError("merge_profiles needs at least one profile")
    vocab = {p.vocab_size for p in profiles}
    if len(vocab) > 1:
        raise RankProfileError(f"cannot merge rank profiles of different vocab sizes {vocab}")
    n = max(p.counts.size for p in profiles)
    counts = sum((_pad(p.counts, n) for p in profiles), np.zeros(n, dtype=np.int64))
    depth_counts = None
    if all(p.depth_counts is not None for p in profiles):
        nd = max(p.num_depths for p in profiles)
        depth_counts = []
        for d in range(nd):
            cols = [
                p.depth_counts[d] for p in profiles if p.depth_counts and d < len(p.depth_counts)
            ]
            w = max(c.size for c in cols)
            depth_counts.append(sum((_pad(c, w) for c in cols), np.zeros(w, dtype=np.int64)))
    margin = None
    tables = [p.margin for p in profiles if p.margin is not None]
    if len(tables) == len(profiles):
        margin = tables[0]
        for t in tables[1:]:
            margin = margin.merge(t)
    return RankProfile(
        counts, vocab_size=profiles[0].vocab_size, depth_counts=depth_counts, margin=margin
    )
