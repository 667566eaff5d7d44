"""The model-free detector's throughput before -> after issue 52 item 4, in one process.

"Before" is the first releases' path, still in the package as the reference the fast path is
tested against: one ``hashlib.blake2b`` call per window (``ErsdPRF.uniform_at_reference``) and a
row-wise ``np.unique`` dedupe (``scored_windows_reference``), swapped into :func:`detect` for the
timed call; "after" is :func:`detect` as it is.  The two run interleaved on the same random text
(token ids uniform over Qwen's 151,936, as ``ersd bench watermark``'s detector line), ``repeats``
times each, and the report gives medians of wall and of process CPU time, their ratios, and
whether every p-value, score and salt matched bit for bit (``p_values_identical``).

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


def _timed(fn: Callable[[], det.Detection]) -> tuple[float, float, det.Detection]:
    """(wall seconds, this process's CPU seconds, result) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    d = fn()
    return time.perf_counter() - w0, time.process_time() - c0, d


def compare(toks: list[int], wm: Watermark, salt: int | None, repeats: int) -> dict[str, Any]:
    """Old and new :func:`detect` on ``toks``, interleaved ``repeats`` times (order alternating).

    Both clocks are kept: wall time (what a user waits, on an idle core) and the process's CPU
    time (on a shared machine, the time it actually held a core: the one-core throughput)."""
    times: dict[str, dict[str, list[float]]] = {w: {"wall": [], "cpu": []} for w in ("old", "new")}
    same = True
    scored = 0
    for r in range(repeats):
        res = {}
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            if which == "old":
                with reference_path():
                    res["old"] = _timed(lambda: detect(toks, wm, salt=salt))
            else:
                res["new"] = _timed(lambda: detect(toks, wm, salt=salt))
        for which, (wall, cpu, _) in res.items():
            times[which]["wall"].append(wall)
            times[which]["cpu"].append(cpu)
        do, dn = res["old"][2], res["new"][2]
        scored = dn.scored
        keys = ("p_value", "score", "salt", "salt_p_value", "scored", "skipped")
        same &= all(getattr(do, k) == getattr(dn, k) for k in keys)
    out: dict[str, Any] = {
        "tokens": len(toks),
        "scored": scored,
        "salts_tried": 1 if salt is not None else wm.num_salts,
        "p_values_identical": bool(same),
    }
    for clock in ("wall", "cpu"):
        mo = statistics.median(times["old"][clock])
        mn = statistics.median(times["new"][clock])
        out[clock] = {
            "old_s_median": mo,
            "new_s_median": mn,
            "old_tokens_per_s": scored / mo,
            "new_tokens_per_s": scored / mn,
            "speedup": mo / mn,
            "old_s": times["old"][clock],
            "new_s": times["new"][clock],
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument(
        "--all-salts-tokens", type=int, help="text length when every salt is tried (tokens / 8)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the JSON report here too")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    toks = rng.integers(0, VOCAB, args.tokens).tolist()
    n_all = args.all_salts_tokens or args.tokens // 8
    report = {
        "one_salt": compare(toks, Watermark(key=KEY), 0, args.repeats),
        "all_8_salts": compare(toks[:n_all], Watermark(key=KEY, num_salts=8), None, args.repeats),
        "all_256_salts": compare(toks[:n_all], Watermark(key=KEY), None, args.repeats),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return report


if __name__ == "__main__":
    main()
