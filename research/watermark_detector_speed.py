"""The model-free detector's throughput before -> after issue 52 item 4, in one process.

"Before" is the first releases' path, still in the package as the reference the fast path is
tested against: one ``hashlib.blake2b`` call per window (``ErsdPRF.uniform_at_reference``) and a
row-wise ``np.unique`` dedupe (``scored_windows_reference``), swapped into :func:`detect` for the
timed call; "after" is :func:`detect` as it is.  The two run interleaved on the same random text
(token ids uniform over Qwen's 151,936, as ``ersd bench watermark``'s detector line), ``repeats``
times each, and the report gives medians, their ratio, and whether every p-value, score and salt
matched bit for bit (``p_values_identical``).

Modes: ``one salt`` (the salt known, ``detect(..., salt=0)``) on ``--tokens`` tokens; ``all
salts`` (a key with 8 and one with 256 salts, every salt tried) on ``--tokens // 8``.

Run alone, on one core::

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python -m research.watermark_detector_speed \\
        --tokens 1000000 --repeats 5 --out watermark-detector-speed.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ersd.watermark import Watermark, detect
from ersd.watermark.prf import ErsdPRF

# the module (``ersd.watermark.detect`` the attribute is the function)
det = importlib.import_module("ersd.watermark.detect")
KEY = bytes(range(32))
VOCAB = 151_936


@contextmanager
def reference_path() -> Iterator[None]:
    """:func:`detect` with the first releases' hashing and dedupe swapped in."""

    def scored(ids: np.ndarray, h: int, initial: Any, start: int) -> tuple[np.ndarray, ...]:
        windows, tokens, positions = det.scored_windows_reference(ids, h, initial, start)
        return windows, np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64)

    saved = det._scored_arrays, ErsdPRF.uniform_at
    det._scored_arrays = scored  # type: ignore[assignment]
    ErsdPRF.uniform_at = ErsdPRF.uniform_at_reference  # type: ignore[method-assign]
    try:
        yield
    finally:
        det._scored_arrays, ErsdPRF.uniform_at = saved  # type: ignore[method-assign]


def _timed(fn: Callable[[], det.Detection]) -> tuple[float, det.Detection]:
    t0 = time.perf_counter()
    d = fn()
    return time.perf_counter() - t0, d


def compare(toks: list[int], wm: Watermark, salt: int | None, repeats: int) -> dict[str, Any]:
    """Old and new :func:`detect` on ``toks``, interleaved ``repeats`` times (order alternating)."""
    old_s: list[float] = []
    new_s: list[float] = []
    same = True
    scored = 0
    for r in range(repeats):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        res = {}
        for which in order:
            if which == "old":
                with reference_path():
                    res["old"] = _timed(lambda: detect(toks, wm, salt=salt))
            else:
                res["new"] = _timed(lambda: detect(toks, wm, salt=salt))
        (to, do), (tn, dn) = res["old"], res["new"]
        old_s.append(to)
        new_s.append(tn)
        scored = dn.scored
        keys = ("p_value", "score", "salt", "scored")
        same &= all(getattr(do, k) == getattr(dn, k) for k in keys)
    mo, mn = statistics.median(old_s), statistics.median(new_s)
    return {
        "tokens": len(toks),
        "scored": scored,
        "salts_tried": 1 if salt is not None else wm.num_salts,
        "old_s_median": mo,
        "new_s_median": mn,
        "old_tokens_per_s": scored / mo,
        "new_tokens_per_s": scored / mn,
        "speedup": mo / mn,
        "p_values_identical": bool(same),
        "old_s": old_s,
        "new_s": new_s,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the JSON report here too")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    toks = rng.integers(0, VOCAB, args.tokens).tolist()
    report = {
        "one_salt": compare(toks, Watermark(key=KEY), 0, args.repeats),
        "all_8_salts": compare(
            toks[: args.tokens // 8], Watermark(key=KEY, num_salts=8), None, args.repeats
        ),
        "all_256_salts": compare(toks[: args.tokens // 8], Watermark(key=KEY), None, args.repeats),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return report


if __name__ == "__main__":
    main()
