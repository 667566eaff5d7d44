"""Issue 52's measurements of the new detectors: null calibration on held-out human text, TPR vs
length (SmolLM2 and the Qwen coder model), and localized detection in mixed documents.

Parts (``python -m research.watermark_detection_field OUT_DIR PART ... [--flags]``; each part
writes ``OUT_DIR/PART.json``, ``render`` writes ``OUT_DIR/tables.md`` from what is there):

* ``fpr`` -- false positives on human text no part of the project used (man pages past the
  first 400, which ``ersd bench watermark fpr`` could read, and the docstrings of installed PyPI
  packages: numpy, scipy, sympy, matplotlib, networkx; never the stdlib, which that benchmark
  used).  The text is cut into chunks of 32 + 8 x 128 tokens: each chunk gives 8 windows of 128
  tokens (the 32 before a window, and every earlier window of its chunk, are its prompt) and one
  1,024-token document for the localized scan.  Per window, watermark version 2 with 256 salts
  (the default, none known) and the same key as research/watermark_v2.py:

  - model-free (:func:`ersd.watermark.detect`), with the prompt and without it;
  - model-weighted (:func:`ersd.watermark.weighted.detect_weighted`) with SmolLM2-135M's
    probabilities, at T = 1 with the prompt (the model conditioned on everything before the
    window), at T = 0.7 with the prompt, and at T = 1 without it (the model sees the window alone);
  - the same, salt known (salt 0, no Šidák correction), and the **broken** variant with the salt
    known: weights that peek at the key (x 4 where ``E_t = -log r_t < 0.7``);
  - per 1,024-token document, the localized scan (:func:`ersd.watermark.localize.scan`, no
    prompt) and the **broken** scan: the same best window not corrected for the windows tested.

  The PRF is evaluated once per chunk (every salt) and each statistic computed from those
  uniforms exactly as the library does; the first ``--check`` chunks also run the library's
  ``detect`` / ``detect_weighted`` / ``scan`` / ``model_token_probs`` and the script stops unless
  every p-value agrees (relative 1e-9) and the batched model probabilities agree with
  ``model_token_probs`` (absolute 2e-4).  Rates with Clopper-Pearson 95% intervals, and the KS test
  of the p-values against U(0, 1).
* ``tpr-smollm`` / ``tpr-qwen`` -- watermarked texts of 256 tokens (target-only watermarked
  sampling, batched, no end-of-text stop) for code (HumanEval) and chat (MT-Bench) prompts at
  T = 0.7 and 1; at 16 / 32 / 64 / 128 / 256 tokens, p <= 0.01 (TPR at 1% FPR: both nulls are
  exact, part ``fpr``) for the model-free and the model-weighted detector (the generator's
  probabilities at the generation's temperature), with the prompt and without it.
  ``--model qwen2.5-coder-1.5b --name tpr-qwen-1.5b`` writes the Qwen pair's target to its own
  file (its texts are the pair's ERSD texts: target-only and ERSD sampling give the same text
  under the same seed and key in float32).
* ``localize`` -- the ``tpr-smollm`` T = 0.7 texts' first 64 / 128 / 256 tokens pasted (token level)
  between held-out human text (1,000 to 4,000 tokens in all, the split at random): the scan's
  verdict and best span (IoU with the true span) against testing the whole document.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m research.watermark_detection_field
docs/results/watermark-detection-2026-12-06 fpr tpr-smollm localize render``.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.util
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import gammaincc

from ersd.watermark import Watermark, detect
from ersd.watermark.detect import encode_text, sidak
from ersd.watermark.localize import DEFAULT_LENGTHS, scan, scan_windows
from ersd.watermark.weighted import (
    DEFAULT_MAX_WEIGHT,
    DEFAULT_WEIGHT_RATIO,
    detect_weighted,
    hypoexp_log_cdf,
    model_token_probs,
    weights_from_probs,
)
from research.watermark_v2 import KEY

PREFIX = 32  # prompt tokens before a chunk's first window
WINDOW = 128
PER_CHUNK = 8
LENGTHS = (16, 32, 64, 128, 256)
PYPI = ("numpy", "scipy", "sympy", "matplotlib", "networkx")
MODES = (
    "model_free_prompt",
    "model_free_no_prompt",
    "weighted_T1_prompt",
    "weighted_T0.7_prompt",
    "weighted_T1_no_prompt",
    "model_free_salt_known",
    "weighted_T1_salt_known",
    "BROKEN_weighted_peeking_salt_known",
)
DOC_MODES = ("scan_no_prompt", "BROKEN_scan_uncorrected")
PARTS = ("fpr", "fpr-profile", "fpr-distinct", "tpr-smollm", "tpr-qwen", "localize", "render")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def watermark() -> Watermark:
    return Watermark(key=KEY, version=2, num_salts=256)


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> list[float]:
    a = (1 - conf) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return [lo, hi]


def rate(k: int, n: int) -> dict[str, Any]:
    return {
        "k": int(k),
        "n": int(n),
        "rate": k / n if n else math.nan,
        "ci95": clopper_pearson(k, n),
    }


# --- held-out human text --------------------------------------------------------------------


def man_pages() -> Iterator[str]:
    """Man pages of section 1 past the first 400 (``ersd bench watermark``'s corpus could read
    those), every third, troff requests stripped as that benchmark does."""
    for path in sorted(Path("/usr/share/man/man1").glob("*.gz"))[400::3]:
        try:
            raw = gzip.decompress(path.read_bytes()).decode("utf-8", errors="ignore")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        text = re.sub(r"^\.\S*\s?", "", raw, flags=re.MULTILINE)
        text = re.sub(r"\\f[BIRP]|\\-|\\\(..|\\&", "", text)
        if len(text) > 500:
            yield text


def pypi_docstrings() -> Iterator[str]:
    """Docstrings of installed PyPI packages' modules (not their tests), the packages in turn."""
    files: list[list[Path]] = []
    for pkg in PYPI:
        spec = importlib.util.find_spec(pkg)
        if spec is None or spec.origin is None:
            continue
        root = Path(spec.origin).parent
        files.append([p for p in sorted(root.rglob("*.py")) if "tests" not in p.parts])
    for i in range(max(len(f) for f in files)):
        for group in files:
            if i >= len(group):
                continue
            try:
                tree = ast.parse(group[i].read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            docs = [
                ast.get_docstring(n)
                for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            text = "\n\n".join(d for d in docs if d)
            if len(text) > 500:
                yield text


SOURCES: dict[str, Callable[[], Iterator[str]]] = {
    "man-pages": man_pages,
    "pypi-docstrings": pypi_docstrings,
}


def human_tokens(tok: Any, source: str, count: int, skip: int = 0) -> list[int]:
    """``count`` tokens of held-out human text from ``source`` after its first ``skip``."""
    out: list[int] = []
    sep = encode_text(tok, "\n\n")
    for text in SOURCES[source]():
        out += encode_text(tok, text) + sep
        if len(out) >= skip + count:
            break
    if len(out) < skip + count:
        raise SystemExit(f"{source}: only {len(out)} tokens, {skip + count} needed")
    return out[skip : skip + count]


# --- model probabilities, batched -----------------------------------------------------------


def batch_probs(
    model: Any, seqs: np.ndarray, temps: tuple[float, ...], *, no_grad: bool = False
) -> dict[float, np.ndarray]:
    """``[B, L]`` probability of each token given the ones before it in its row (column 0:
    nan), at each temperature: one forward of the model's Hugging Face module (no autograd
    state: :func:`torch.inference_mode`; ``no_grad``: ``torch.no_grad`` as before, for
    ``fpr-profile``), every temperature from the same logits."""
    import torch

    hf = model.hf_module
    out = {t: np.full(seqs.shape, np.nan) for t in temps}
    with torch.no_grad() if no_grad else torch.inference_mode():
        logits = hf(input_ids=torch.as_tensor(seqs, dtype=torch.long), use_cache=False).logits
        nxt = torch.as_tensor(seqs[:, 1:], dtype=torch.long).unsqueeze(-1)
        for t in temps:
            lp = torch.log_softmax(logits[:, :-1].float() / t, dim=-1).gather(-1, nxt)
            out[t][:, 1:] = lp.squeeze(-1).exp().double().numpy()
    return out


class ProbCache:
    """Per-chunk model probabilities on disk (``DIR/SOURCE-CHUNK.npz``: the chunk's token ids,
    ``p1`` / ``p07`` -- the text's probabilities at T = 1 / 0.7 after everything before it --
    and, where computed, ``alone`` ``[8, 128]``), so that a resumed run does not run the model
    again.  :func:`batch_probs` computes in float32 and widens to float64, so storing float32
    is lossless (checked on every save).  A file whose token ids differ from the chunk's is an
    error, never silently reused."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, source: str, c: int) -> Path:
        return self.root / f"{source}-{c:04d}.npz"

    def load(
        self, source: str, c: int, ids: np.ndarray, need_alone: bool
    ) -> tuple[dict[float, np.ndarray], np.ndarray | None] | None:
        f = self.path(source, c)
        if not f.exists():
            return None
        with np.load(f) as z:
            if not np.array_equal(z["ids"], ids):
                raise SystemExit(
                    f"{f}: cached for other token ids (corpus or tokenizer changed): delete "
                    f"{self.root} and run again"
                )
            p_prompt = {1.0: z["p1"].astype(np.float64), 0.7: z["p07"].astype(np.float64)}
            # None where the windows-alone forward was not run for this chunk: the caller runs it
            alone = z["alone"].astype(np.float64) if need_alone and "alone" in z else None
        return p_prompt, alone

    def save(
        self, source: str, c: int, ids: np.ndarray, p_prompt: dict[float, np.ndarray],
        alone: np.ndarray | None,
    ) -> None:  # fmt: skip
        arrays = {"ids": ids, "p1": p_prompt[1.0], "p07": p_prompt[0.7]}
        if alone is not None:
            arrays["alone"] = alone
        packed = {k: v if k == "ids" else v.astype(np.float32) for k, v in arrays.items()}
        for k, v in arrays.items():
            if k != "ids" and not np.array_equal(packed[k].astype(np.float64), v, equal_nan=True):
                raise SystemExit(f"probabilities of {source} chunk {c} are not float32 values")
        tmp = self.path(source, c).with_suffix(".tmp.npz")
        np.savez(tmp, **packed)
        tmp.replace(self.path(source, c))


# --- the statistics, from one evaluation of the PRF ------------------------------------------


def first_occurrences(rows: np.ndarray) -> np.ndarray:
    _, first = np.unique(rows, axis=0, return_index=True)
    return np.sort(first)


def weighted_p(e: np.ndarray, p: np.ndarray, salts: int) -> float:
    """``detect_weighted``'s p-value from ``E = -log r`` ``[salts, n]`` and probabilities ``[n]``
    of the scored positions (its defaults: ``max_weight``, ``weight_ratio``)."""
    w = weights_from_probs(p, DEFAULT_MAX_WEIGHT)
    keep = w >= (w.max() / DEFAULT_WEIGHT_RATIO if w.max() > 0 else math.inf)
    if not keep.any():
        return 1.0
    wk = w[keep]
    s = e[:, keep] @ wk
    i = int(np.argmin(s))
    return sidak(math.exp(hypoexp_log_cdf(float(s[i]), wk)), salts)


def broken_weighted_p(e0: np.ndarray, p: np.ndarray) -> float:
    """The broken variant (salt known): weights x 4 where the key's ``E_t < 0.7``."""
    w = weights_from_probs(p, DEFAULT_MAX_WEIGHT)
    keep = w >= (w.max() / DEFAULT_WEIGHT_RATIO if w.max() > 0 else math.inf)
    if not keep.any():
        return 1.0
    wk = w[keep] * np.where(e0[keep] < 0.7, 4.0, 1.0)
    return math.exp(hypoexp_log_cdf(float(e0[keep] @ wk), wk))


def model_free_p(g: np.ndarray, salts: int) -> float:
    """``detect``'s p-value from ``-log(1 - r)`` ``[salts, n]``."""
    tot = g.sum(axis=1)
    return sidak(float(gammaincc(g.shape[1], max(float(tot.max()), 0.0))), salts)


def scan_p(g: np.ndarray, salts: int) -> tuple[float, float]:
    """``scan``'s p-value (Bonferroni over its windows, Šidák over salts) and the broken one
    (not corrected for the windows) from ``-log(1 - r)`` ``[salts, n]``."""
    n = g.shape[1]
    wins = scan_windows(n, DEFAULT_LENGTHS)
    cum = np.concatenate([np.zeros((g.shape[0], 1)), np.cumsum(g, axis=1)], axis=1)
    a = np.array([w[0] for w in wins])
    b = np.array([w[1] for w in wins])
    wp = gammaincc((b - a).astype(np.float64)[None, :], np.maximum(cum[:, b] - cum[:, a], 0.0))
    best = float(wp.min())
    return sidak(min(1.0, len(wins) * best), salts), sidak(best, salts)


def chunk_rows(wm: Watermark, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(text, rows)`` of a chunk: its tokens after the prompt, and each one's keyed context
    (the ``h`` tokens before it, the key's initial window in front of the prompt's end)."""
    text = ids[PREFIX:]
    padded = np.concatenate([np.asarray(wm.initial_window(ids[:PREFIX].tolist())), text])
    return text, np.lib.stride_tricks.sliding_window_view(padded, wm.context_width)[: len(text)]


def chunk_stats(
    wm: Watermark,
    ids: np.ndarray,
    p_prompt: dict[float, np.ndarray] | None,
    p_alone: np.ndarray | None,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Every window's and the document's p-values of one chunk (module doc).  ``p_prompt[T]``:
    ``[1024]`` probabilities of the chunk's text after everything before it; ``p_alone``
    ``[8, 128]`` each window's own, the window alone (``None``: those modes left out)."""
    h = wm.context_width
    text, rows = chunk_rows(wm, ids)
    salts = list(range(wm.num_salts))
    u = wm.prf(0).uniform_at(rows, text, salts=salts)  # [salts, 1024], every position
    e_all, g_all = -np.log(u), -np.log1p(-u)
    k = len(salts)
    windows = []
    for j in range(PER_CHUNK):
        o = j * WINDOW
        pos_p = o + first_occurrences(rows[o : o + WINDOW])  # with the prompt
        pos_n = o + h + first_occurrences(rows[o + h : o + WINDOW])  # without: from h on
        row = {
            "model_free_prompt": model_free_p(g_all[:, pos_p], k),
            "model_free_no_prompt": model_free_p(g_all[:, pos_n], k),
            "model_free_salt_known": model_free_p(g_all[:1, pos_p], 1),
        }
        if p_prompt is not None:
            p1 = p_prompt[1.0][pos_p]
            row["weighted_T1_prompt"] = weighted_p(e_all[:, pos_p], p1, k)
            row["weighted_T0.7_prompt"] = weighted_p(e_all[:, pos_p], p_prompt[0.7][pos_p], k)
            row["weighted_T1_salt_known"] = weighted_p(e_all[:1, pos_p], p1, 1)
            row["BROKEN_weighted_peeking_salt_known"] = broken_weighted_p(e_all[0, pos_p], p1)
        if p_alone is not None:
            row["weighted_T1_no_prompt"] = weighted_p(e_all[:, pos_n], p_alone[j][pos_n - o], k)
        windows.append(row)
    # the document: the chunk's 1,024 tokens, no prompt (scored from h on)
    pos_d = h + first_occurrences(rows[h:])
    scan_ok, scan_broken = scan_p(g_all[:, pos_d], k)
    return windows, {"scan_no_prompt": scan_ok, "BROKEN_scan_uncorrected": scan_broken}


def library_check(
    wm: Watermark,
    ids: np.ndarray,
    p_prompt: dict[float, np.ndarray],
    p_alone: np.ndarray | None,
    windows: list[dict[str, float]],
    doc: dict[str, float],
    model: Any = None,
) -> None:
    """The same p-values through the library's own functions; stops on any disagreement (and,
    given ``model``, the batched probabilities against :func:`model_token_probs`)."""
    text = ids[PREFIX:].tolist()

    def same(a: float, b: float, what: str) -> None:
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300):
            raise SystemExit(f"library check failed: {what}: {a!r} vs library {b!r}")

    for j, row in enumerate(windows):
        o = j * WINDOW
        win = text[o : o + WINDOW]
        prompt = ids[: PREFIX + o].tolist()
        same(row["model_free_prompt"], detect(win, wm, prompt=prompt, min_tokens=1).p_value, "mf")
        same(row["model_free_no_prompt"], detect(win, wm, min_tokens=1).p_value, "mf np")
        same(
            row["model_free_salt_known"],
            detect(win, wm, prompt=prompt, salt=0, min_tokens=1).p_value,
            "mf salt",
        )
        if "weighted_T1_prompt" not in row:
            continue
        for key, temp in (("weighted_T1_prompt", 1.0), ("weighted_T0.7_prompt", 0.7)):
            lib = detect_weighted(
                win, wm, p_prompt[temp][o : o + WINDOW], prompt=prompt, min_tokens=1,
                expected=False,
            )  # fmt: skip
            same(row[key], lib.p_value, key)
        if p_alone is not None:
            lib = detect_weighted(win, wm, p_alone[j], min_tokens=1, expected=False)
            same(row["weighted_T1_no_prompt"], lib.p_value, "weighted no prompt")
        lib = detect_weighted(
            win, wm, p_prompt[1.0][o : o + WINDOW], prompt=prompt, salt=0, min_tokens=1,
            expected=False,
        )  # fmt: skip
        same(row["weighted_T1_salt_known"], lib.p_value, "weighted salt known")
    same(doc["scan_no_prompt"], scan(text, wm, min_tokens=1).p_value, "scan")
    if model is None:
        return
    # the batched probabilities against the library's (one forward through the ersd session)
    lib_p = model_token_probs(model, text[:WINDOW], prompt=ids[:PREFIX].tolist())
    err = float(np.nanmax(np.abs(lib_p - p_prompt[1.0][:WINDOW])))
    if p_alone is not None:
        lib_a = model_token_probs(model, text[WINDOW : 2 * WINDOW])
        err = max(err, float(np.nanmax(np.abs(lib_a - p_alone[1]))))
    if not err < 2e-4:
        raise SystemExit(f"library check failed: batched probabilities differ by {err}")


def flat(by_source: dict[str, list[float]]) -> list[float]:
    return [p for ps in by_source.values() for p in ps]


def summarise(ps: list[float]) -> dict[str, Any]:
    arr = np.asarray(ps)
    return {
        "n": len(arr),
        "fpr_1pct": rate(int((arr <= 0.01).sum()), len(arr)),
        "fpr_0.1pct": rate(int((arr <= 0.001).sum()), len(arr)),
        "ks_pvalue": float(stats.kstest(arr, "uniform").pvalue),
    }


def fpr_order(per_source: int) -> list[tuple[str, int]]:
    """The chunks in the order ``fpr`` scores them: the sources alternate, so that a run
    stopped early (``--model-seconds``) has both in its model-weighted modes."""
    return [(src, c) for c in range(per_source) for src in SOURCES]


def fpr_aggregate(
    res: dict[str, Any], records: dict[tuple[str, int], dict[str, Any]], per_source: int
) -> dict[str, Any]:
    """``fpr.json`` from the per-chunk records: each mode's p-values by source in chunk order,
    with the chunks each mode covers (``fpr-distinct`` maps them back through those)."""
    out = dict(res)
    pvals: dict[str, dict[str, list[float]]] = {}
    chunks: dict[str, dict[str, list[int]]] = {}
    for source in SOURCES:
        for c in range(per_source):
            rec = records.get((source, c))
            if rec is None:
                continue
            for key in [*MODES, *DOC_MODES]:
                got = [w[key] for w in rec["windows"] if key in w] if key in MODES else []
                if key in DOC_MODES:
                    got = [rec["doc"][key]]
                if not got:
                    continue
                pvals.setdefault(key, {}).setdefault(source, []).extend(got)
                chunks.setdefault(key, {}).setdefault(source, []).append(c)
    weighted = [r for r in records.values() if r["weighted"]]
    out["chunks_done"] = len(records)
    out["model_chunks"] = len(weighted)
    out["model_alone_chunks"] = sum(r["alone"] for r in weighted)
    out["modes"] = {}
    for key in [*MODES, *DOC_MODES]:
        if key not in pvals:
            continue
        allp = flat(pvals[key])
        out["modes"][key] = {
            **summarise(allp),
            "by_source": {s: summarise(v) for s, v in pvals[key].items()},
            "chunks": chunks[key],
            "p_values": [float(f"{p:.4g}") for p in allp],
        }
    return out


def part_fpr(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """The null run, resumable: every chunk's p-values are appended to ``CACHE/chunks.jsonl``
    as soon as they are known and its model probabilities saved (:class:`ProbCache`), and
    ``fpr.json`` is rewritten from the records every ``--checkpoint`` chunks, so a run stopped
    at any point keeps what it did and the same command resumes it.  Chunks in ``fpr_order``:
    with the model while ``--model-seconds`` last (one forward per chunk with the prompt -- the
    1,056 tokens -- giving every T = 1 / 0.7 mode, plus the 8 windows alone on every
    ``--alone-every``-th chunk of each source), then the rest model-free only (one PRF
    evaluation per chunk)."""
    import ersd

    model = ersd.load_model("smollm2-135m", dtype=args.dtype)
    tok = model.tokenizer
    wm = watermark()
    chunk_len = PREFIX + PER_CHUNK * WINDOW
    per_source = args.chunks // len(SOURCES)
    res: dict[str, Any] = {
        "model": f"smollm2-135m {args.dtype}, CPU, OMP_NUM_THREADS=1",
        "key_fingerprint": wm.fingerprint,
        "version": 2,
        "salts": wm.num_salts,
        "window_tokens": WINDOW,
        "chunk": f"{PREFIX} prompt tokens + {PER_CHUNK} windows of {WINDOW}",
        "scan_lengths": list(DEFAULT_LENGTHS),
        "alone_every": args.alone_every,
        "sources": {},
    }
    chunks = {}
    for source in SOURCES:
        ids_all = np.asarray(human_tokens(tok, source, per_source * chunk_len), dtype=np.int64)
        res["sources"][source] = {"chunks": per_source, "tokens": len(ids_all)}
        chunks[source] = ids_all.reshape(per_source, chunk_len)
    root = (
        args.cache
        or Path("out/watermark-fpr-cache") / f"smollm2-135m-{args.dtype}-{wm.fingerprint}"
    )
    cache = ProbCache(root)
    journal = root / "chunks.jsonl"
    records: dict[tuple[str, int], dict[str, Any]] = {}
    if journal.exists():
        lines = journal.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if i < len(lines) - 1:
                    raise SystemExit(f"{journal}: line {i + 1} is not JSON: delete it") from None
                log(f"[fpr] {journal}: the last line was cut by a stop; that chunk is redone")
                journal.write_text("".join(x + "\n" for x in lines[:-1]))
                continue
            records[(r["source"], r["chunk"])] = r  # a later record replaces an earlier
    order = fpr_order(per_source)
    t0 = time.perf_counter()
    res["resumed_chunks"] = len(records)
    stats_s = model_s = 0.0
    fresh = 0

    def checkpoint(what: str) -> None:
        res["seconds_this_run"] = time.perf_counter() - t0
        res["model_seconds_this_run"] = model_s
        res["stats_seconds_this_run"] = stats_s
        res["library_checked_chunks"] = min(args.check, len(records))
        agg = fpr_aggregate(res, records, per_source)
        agg["complete"] = len(records) == len(order) and all(
            r["weighted"] for r in records.values()
        )
        agg["command"] = "python -m research.watermark_detection_field " + " ".join(sys.argv[1:])
        (out_dir / "fpr.json").write_text(json.dumps(agg, indent=1))
        m = agg["modes"].get("weighted_T1_prompt", {"n": 0})
        log(
            f"[fpr] {what}: {len(records)} chunks, {agg['model_chunks']} with the model "
            f"(weighted windows {m['n']}), {time.perf_counter() - t0:.0f}s "
            f"(model {model_s:.0f}s, statistics {stats_s:.0f}s)"
        )

    with journal.open("a") as jf:
        for done, (source, c) in enumerate(order):
            want_alone = c % args.alone_every == 0  # every source alike
            old = records.get((source, c))
            if old is not None and old["weighted"] and (old["alone"] or not want_alone):
                continue
            ids = chunks[source][c]
            use_model = time.perf_counter() - t0 < args.model_seconds
            if not use_model and old is not None:
                continue  # model-free already recorded
            p_prompt, p_alone = None, None
            if use_model:
                t1 = time.perf_counter()
                got = cache.load(source, c, ids, want_alone)
                if got is not None:
                    p_prompt, p_alone = got
                else:
                    pp = batch_probs(model, ids[None, :], (1.0, 0.7))
                    p_prompt = {t: v[0, PREFIX:] for t, v in pp.items()}
                if want_alone and p_alone is None:  # not cached: the one forward still missing
                    p_alone = batch_probs(model, ids[PREFIX:].reshape(PER_CHUNK, WINDOW), (1.0,))[
                        1.0
                    ]
                if got is None or (want_alone and got[1] is None):
                    cache.save(source, c, ids, p_prompt, p_alone)
                model_s += time.perf_counter() - t1
            t1 = time.perf_counter()
            windows, doc = chunk_stats(wm, ids, p_prompt, p_alone)
            stats_s += time.perf_counter() - t1
            if use_model and done < args.check:
                assert p_prompt is not None
                library_check(wm, ids, p_prompt, p_alone, windows, doc, model)
            rec = {
                "source": source, "chunk": c, "weighted": use_model,
                "alone": p_alone is not None, "windows": windows, "doc": doc,
            }  # fmt: skip
            records[(source, c)] = rec
            jf.write(json.dumps(rec) + "\n")
            jf.flush()
            fresh += 1
            if fresh % args.checkpoint == 0:
                checkpoint(f"chunk {done + 1}/{len(order)}")
    checkpoint("done")
    res = json.loads((out_dir / "fpr.json").read_text())
    for key, m in res["modes"].items():
        log(
            f"[fpr] {key}: n={m['n']} FPR@1% {m['fpr_1pct']['rate']:.4f} "
            f"@0.1% {m['fpr_0.1pct']['rate']:.4f} KS p {m['ks_pvalue']:.3g}"
        )
    return res


def part_fpr_profile(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Where the model-weighted null run spends its time, per 1,056-token chunk: the forward
    with the prompt (no_grad vs inference_mode; one chunk vs two batched -- and whether the
    probabilities are bit-identical), the windows-alone forward, the log-softmax at each
    temperature, the PRF, and the statistics (the hypoexponential p-values counted and timed).
    Medians of ``--repeats`` interleaved repeats; timings on a shared machine are ratios only."""
    import torch

    import ersd

    model = ersd.load_model("smollm2-135m", dtype=args.dtype)
    wm = watermark()
    chunk_len = PREFIX + PER_CHUNK * WINDOW
    ids2 = np.stack(
        [np.asarray(human_tokens(model.tokenizer, s, chunk_len), dtype=np.int64) for s in SOURCES]
    )
    hf = model.hf_module
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        got = fn()
        times.setdefault(name, []).append(time.perf_counter() - t)
        return got

    def logits_only() -> Any:
        with torch.inference_mode():
            return hf(input_ids=torch.as_tensor(ids2[:1]), use_cache=False).logits

    same: dict[str, bool] = {}
    for _ in range(args.repeats):
        a = timed(
            "prompt_forward_no_grad", lambda: batch_probs(model, ids2[:1], (1.0, 0.7), no_grad=True)
        )
        b = timed("prompt_forward_inference_mode", lambda: batch_probs(model, ids2[:1], (1.0, 0.7)))
        two = timed("two_chunks_batched", lambda: batch_probs(model, ids2, (1.0, 0.7)))
        one = [batch_probs(model, ids2[i : i + 1], (1.0, 0.7)) for i in range(2)]
        lg = timed("logits_only", logits_only)
        timed(
            "log_softmax_two_temperatures",
            lambda lg=lg: [torch.log_softmax(lg[:, :-1].float() / t, dim=-1) for t in (1.0, 0.7)],
        )
        timed(
            "alone_forward_8x128",
            lambda: batch_probs(model, ids2[0, PREFIX:].reshape(PER_CHUNK, WINDOW), (1.0,)),
        )
        same["inference_mode_bit_identical"] = all(
            np.array_equal(a[t], b[t], equal_nan=True) for t in a
        )
        same["batched_bit_identical"] = all(
            np.array_equal(two[t][i], one[i][t][0], equal_nan=True) for t in a for i in range(2)
        )
        same["batched_max_abs_diff"] = max(
            float(np.nanmax(np.abs(two[t][i] - one[i][t][0]))) for t in a for i in range(2)
        )
    pp = batch_probs(model, ids2[:1], (1.0, 0.7))
    p_prompt = {t: v[0, PREFIX:] for t, v in pp.items()}
    p_alone = batch_probs(model, ids2[0, PREFIX:].reshape(PER_CHUNK, WINDOW), (1.0,))[1.0]
    calls = {"n": 0, "s": 0.0}
    real = hypoexp_log_cdf

    def counted(s: float, w: Any) -> float:
        t = time.perf_counter()
        try:
            return real(s, w)
        finally:
            calls["n"] += 1
            calls["s"] += time.perf_counter() - t

    text, rows = chunk_rows(wm, ids2[0])
    for _ in range(args.repeats):
        timed(
            "prf_256_salts_1024_positions",
            lambda: wm.prf(0).uniform_at(rows, text, salts=list(range(wm.num_salts))),
        )
        timed("statistics_model_free_only", lambda: chunk_stats(wm, ids2[0], None, None))
        calls.update(n=0, s=0.0)
        globals()["hypoexp_log_cdf"] = counted
        try:
            timed("statistics_all_modes", lambda: chunk_stats(wm, ids2[0], p_prompt, p_alone))
        finally:
            globals()["hypoexp_log_cdf"] = real
        times.setdefault("hypoexp_in_statistics", []).append(calls["s"])
    med = {k: float(np.median(v)) for k, v in times.items()}
    res = {
        "model": f"smollm2-135m {args.dtype}, CPU, OMP_NUM_THREADS=1",
        "chunk_tokens": chunk_len,
        "repeats": args.repeats,
        "median_seconds": med,
        "hypoexp_calls_per_chunk": calls["n"],
        "checks": same,
        "all_seconds": times,
    }
    for k, v in med.items():
        log(f"[fpr-profile] {k}: {v:.3f} s")
    log(f"[fpr-profile] hypoexp calls per chunk {calls['n']}; {json.dumps(same)}")
    return res


def pair_keys(wm: Watermark, ids: np.ndarray) -> list[np.ndarray]:
    """Per window of a chunk, a 64-bit hash of each scored (window, token) pair (with the
    prompt: a superset of the pairs without it)."""
    text, rows = chunk_rows(wm, ids)
    cols = np.concatenate([rows, text[:, None]], axis=1).astype(np.uint64)
    key = np.zeros(len(text), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(cols.shape[1]):
            key = key * np.uint64(0x100000001B3) + cols[:, j] + np.uint64(2)
    out = []
    for j in range(PER_CHUNK):
        o = j * WINDOW
        out.append(key[o + first_occurrences(rows[o : o + WINDOW])])
    return out


#: fpr-distinct: a window is kept when at most this fraction of its pairs occurred before
MAX_SHARED = 0.1


def part_fpr_distinct(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """The ``fpr`` p-values again on the windows (documents) of which at most ``MAX_SHARED`` of
    the scored (window, token) pairs occurred in an earlier window (document) of the same
    source: with one key, a pair that recurs (boilerplate repeated across pages) gives the same
    uniform, so such windows' p-values are dependent, and a KS test of all of them tests the
    corpus's repetition as well as the detector."""
    import ersd

    d = json.loads((out_dir / "fpr.json").read_text())
    tok = ersd.load_model("smollm2-135m", dtype="float32").tokenizer
    wm = watermark()
    chunk_len = PREFIX + PER_CHUNK * WINDOW
    res: dict[str, Any] = {"max_shared": MAX_SHARED, "modes": {}, "sources": {}}
    sources = list(d["sources"])
    keep_w: dict[str, list[bool]] = {}
    keep_d: dict[str, list[bool]] = {}
    for source in sources:
        n_chunks = d["sources"][source]["chunks"]
        ids_all = np.asarray(human_tokens(tok, source, n_chunks * chunk_len), dtype=np.int64)
        seen: set[int] = set()
        seen_docs: set[int] = set()
        kw, kd = [], []
        for c in range(n_chunks):
            wins = pair_keys(wm, ids_all[c * chunk_len : (c + 1) * chunk_len])
            for k in wins:
                keys = [int(x) for x in k]
                kw.append(sum(x in seen for x in keys) <= MAX_SHARED * len(keys))
                seen.update(keys)
            doc = {int(x) for k in wins for x in k}
            kd.append(sum(x in seen_docs for x in doc) <= MAX_SHARED * len(doc))
            seen_docs |= doc
        keep_w[source], keep_d[source] = kw, kd
        res["sources"][source] = {
            "windows": len(kw), "distinct_windows": int(sum(kw)),
            "documents": len(kd), "distinct_documents": int(sum(kd)),
        }  # fmt: skip
        log(f"[fpr-distinct] {source}: {json.dumps(res['sources'][source])}")
    order = [(src, c) for c in range(d["sources"][sources[0]]["chunks"]) for src in sources]
    for key, m in d["modes"].items():
        # which (source, chunk) each p-value came from: recorded by fpr (``chunks``), or (a
        # fpr.json written before it recorded them) rebuilt in the order fpr added them
        if "chunks" in m:
            idx = {
                s: [(c, None if key in DOC_MODES else j) for c in m["chunks"].get(s, [])
                    for j in ([0] if key in DOC_MODES else range(PER_CHUNK))]
                for s in sources
            }  # fmt: skip
        elif key in DOC_MODES:
            idx = {s: [(c, None) for c in range(d["sources"][s]["chunks"])] for s in sources}
        else:
            chunks_of: dict[str, list[int]] = {s: [] for s in sources}
            for done, (src, c) in enumerate(
                order[: d["model_chunks"]] if "weighted" in key else order
            ):
                if key == "weighted_T1_no_prompt" and done % d.get("alone_every", 3) != 0:
                    continue
                chunks_of[src].append(c)
            idx = {s: [(c, j) for c in chunks_of[s] for j in range(PER_CHUNK)] for s in sources}
        by_src, at = {}, 0  # p_values: the sources' lists one after the other
        for s in m["by_source"]:
            by_src[s] = m["p_values"][at : at + m["by_source"][s]["n"]]
            at += m["by_source"][s]["n"]
        kept: list[float] = []
        for s in sources:
            got = by_src.get(s, [])
            if len(idx[s]) != len(got):
                raise SystemExit(f"{key} {s}: {len(got)} p-values, {len(idx[s])} expected")
            for (c, j), p in zip(idx[s], got, strict=True):
                if keep_d[s][c] if j is None else keep_w[s][c * PER_CHUNK + j]:
                    kept.append(p)
        res["modes"][key] = summarise(kept)
        r = res["modes"][key]
        log(
            f"[fpr-distinct] {key}: n={r['n']} FPR@1% {r['fpr_1pct']['rate']:.4f} "
            f"@0.1% {r['fpr_0.1pct']['rate']:.4f} KS p {r['ks_pvalue']:.3g}"
        )
    return res


# --- TPR vs length ----------------------------------------------------------------------------


def prompts_for(tok: Any, domain: str, n: int) -> list[list[int]]:
    from ersd.bench.prompts import encode_prompt, load_prompts

    sets = {"code": "humaneval", "chat": "mtbench"}[domain]
    ps = load_prompts([sets], "eval", 100)
    ids = [encode_prompt(tok, p, "auto", 1024) for p in ps]
    return [ids[i % len(ids)] for i in range(n)]


def part_tpr(args: argparse.Namespace, out_dir: Path, name: str) -> dict[str, Any]:
    import ersd

    model = ersd.load_model(args.model, dtype=args.dtype) if args.dtype else None
    if model is None:
        model = ersd.load_model(args.model)
    tok = model.tokenizer
    wm = watermark()
    res: dict[str, Any] = {
        "model": f"{args.model} {args.dtype or 'default dtype'}, CPU, OMP_NUM_THREADS=1",
        "texts_per_cell": args.texts,
        "tokens": max(LENGTHS),
        "cells": {},
        "texts": [],
    }
    # cells of an earlier run (other temperatures / domains, same model and size) are kept
    old = out_dir / f"{name}.json"
    if old.exists():
        prev = json.loads(old.read_text())
        if prev["model"] == res["model"] and prev["texts_per_cell"] == args.texts:
            redo = {f"T={t} {d}" for t in args.temperatures for d in args.domains}
            res["cells"] = {k: v for k, v in prev["cells"].items() if k not in redo}
            res["texts"] = [t for t in prev["texts"] if f"T={t['T']} {t['domain']}" not in redo]
            res["kept_from_earlier_run"] = sorted(res["cells"])
    t0 = time.perf_counter()
    for ti_, temp in enumerate(args.temperatures):
        # the seeds of the default --temperatures 0.7 1.0, whichever subset runs
        ti = {0.7: 0, 1.0: 1}.get(temp, 2 + ti_)
        for di, domain in enumerate(args.domains):
            prompts = prompts_for(tok, domain, args.texts)
            seeds = [100_000 * ti + 1000 * di + i for i in range(args.texts)]
            texts: list[list[int]] = []
            for b in range(0, args.texts, args.batch):
                out = ersd.generate_batch(
                    model, None, prompts[b : b + args.batch], seeds=seeds[b : b + args.batch],
                    max_new_tokens=max(LENGTHS), temperature=temp, watermark=wm,
                )  # fmt: skip
                texts += [list(r.tokens) for r in out]
            log(f"[{name}] T={temp} {domain}: {len(texts)} texts, {time.perf_counter() - t0:.0f}s")
            cell: dict[str, dict[str, list[float]]] = {}
            for prompt, text, seed in zip(prompts, texts, seeds, strict=True):
                p_gen = model_token_probs(model, text, prompt=prompt, temperature=temp)
                p_np = model_token_probs(model, text, temperature=temp)
                res["texts"].append({"T": temp, "domain": domain, "seed": seed, "tokens": text})
                for n in LENGTHS:
                    sub = text[:n]
                    row = cell.setdefault(str(n), {})
                    row.setdefault("model_free", []).append(
                        detect(sub, wm, prompt=prompt, min_tokens=1).p_value
                    )
                    row.setdefault("weighted", []).append(
                        detect_weighted(
                            sub, wm, p_gen[:n], prompt=prompt, min_tokens=1, expected=False
                        ).p_value
                    )
                    row.setdefault("model_free_no_prompt", []).append(
                        detect(sub, wm, min_tokens=1).p_value
                    )
                    row.setdefault("weighted_no_prompt", []).append(
                        detect_weighted(sub, wm, p_np[:n], min_tokens=1, expected=False).p_value
                    )
            res["cells"][f"T={temp} {domain}"] = {
                n: {
                    k: {
                        **rate(sum(p <= 0.01 for p in ps), len(ps)),
                        "median_p": float(np.median(ps)),
                    }
                    for k, ps in row.items()
                }
                for n, row in cell.items()
            }
            log(
                f"[{name}] T={temp} {domain}: "
                + ", ".join(
                    f"{n}: {r['model_free']['rate']:.2f}/{r['weighted']['rate']:.2f}"
                    for n, r in res["cells"][f"T={temp} {domain}"].items()
                )
            )
            (out_dir / f"{name}.json").write_text(json.dumps(res, indent=1))
    res["seconds"] = time.perf_counter() - t0
    return res


# --- localized detection ----------------------------------------------------------------------


def iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    return inter / (max(a[1], b[1]) - min(a[0], b[0]))


def part_localize(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import ersd

    src = json.loads((out_dir / "tpr-smollm.json").read_text())
    tok = ersd.load_model("smollm2-135m", dtype="float32").tokenizer
    wm = watermark()
    # human text the fpr part did not read: the man pages after its chunks
    chunk_len = PREFIX + PER_CHUNK * WINDOW
    skip = (args.chunks // len(SOURCES)) * chunk_len
    human = human_tokens(tok, "man-pages", 400_000, skip=skip)
    rng = np.random.default_rng(52)
    rows = []
    t0 = time.perf_counter()
    texts = [t for t in src["texts"] if t["T"] == 0.7]  # the T = 0.7 texts, as first run
    spans = (64, 128, 256)
    jobs = [(t, span) for t in texts for span in spans]
    for i, (t, span) in enumerate(jobs):
        total = int(rng.integers(1000, 4001))
        left = int(rng.integers(0, total + 1))
        at = int(rng.integers(0, len(human) - total))
        marked = t["tokens"][:span]
        doc = human[at : at + left] + marked + human[at + left : at + total]
        true = (left, left + span)
        sc = scan(doc, wm, min_tokens=1)
        whole = detect(doc, wm, min_tokens=1)
        best = min(sc.spans, key=lambda s: s.p_value) if sc.spans else None
        rows.append(
            {
                "T": t["T"], "domain": t["domain"], "span": span, "doc_tokens": len(doc),
                "scan_p": sc.p_value, "whole_p": whole.p_value,
                "spans": [[s.start, s.end] for s in sc.spans],
                "best_iou": iou((best.start, best.end), true) if best else 0.0,
                "spurious": sum(iou((s.start, s.end), true) == 0 for s in sc.spans),
            }
        )  # fmt: skip
        if (i + 1) % 20 == 0:
            log(f"[localize] {i + 1}/{len(jobs)} documents, {time.perf_counter() - t0:.0f}s")
    cells: dict[str, Any] = {}
    for temp in sorted({r["T"] for r in rows}):
        for span in spans:
            sel = [r for r in rows if r["T"] == temp and r["span"] == span]
            hit = [r for r in sel if r["scan_p"] <= 0.01]
            cells[f"T={temp} span={span}"] = {
                "documents": len(sel),
                "scan_detected": rate(len(hit), len(sel)),
                "whole_detected": rate(sum(r["whole_p"] <= 0.01 for r in sel), len(sel)),
                "median_best_iou_detected": float(np.median([r["best_iou"] for r in hit]))
                if hit
                else math.nan,
                "best_iou_over_half": rate(sum(r["best_iou"] > 0.5 for r in hit), len(hit)),
                "spurious_spans": int(sum(r["spurious"] for r in sel)),
            }
            log(f"[localize] T={temp} span={span}: {json.dumps(cells[f'T={temp} span={span}'])}")
    return {"cells": cells, "documents": rows, "seconds": time.perf_counter() - t0}


# --- tables -----------------------------------------------------------------------------------


def fmt_rate(r: dict[str, Any], digits: int = 4) -> str:
    lo, hi = r["ci95"]
    return f"{r['rate']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] ({r['k']}/{r['n']})"


def render(out_dir: Path) -> str:
    lines: list[str] = []
    f = out_dir / "fpr.json"
    if f.exists():
        d = json.loads(f.read_text())
        lines += [
            "| detector, mode | windows | FPR at 1% | FPR at 0.1% | KS p |",
            "|---|---|---|---|---|",
        ]
        for key, m in d["modes"].items():
            lines.append(
                f"| {key} | {m['n']} | {fmt_rate(m['fpr_1pct'])} | "
                f"{fmt_rate(m['fpr_0.1pct'])} | {m['ks_pvalue']:.3g} |"
            )
        lines.append("")
        lines += ["| detector, mode | " + " | ".join(d["sources"]) + " |", "|---|---|---|"]
        for key, m in d["modes"].items():
            lines.append(
                f"| {key} | "
                + " | ".join(
                    f"{v['fpr_1pct']['rate']:.4f} (n {v['n']}, KS p {v['ks_pvalue']:.2g})"
                    for v in m["by_source"].values()
                )
                + " |"
            )
        lines.append("")
    f = out_dir / "fpr-distinct.json"
    if f.exists():
        d = json.loads(f.read_text())
        lines += [
            f"Windows (documents) with at most {d['max_shared']:.0%} of their scored pairs seen "
            "before: " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in d["sources"].items()),
            "",
            "| detector, mode (distinct windows) | windows | FPR at 1% | FPR at 0.1% | KS p |",
            "|---|---|---|---|---|",
        ]
        for key, m in d["modes"].items():
            lines.append(
                f"| {key} | {m['n']} | {fmt_rate(m['fpr_1pct'])} | "
                f"{fmt_rate(m['fpr_0.1pct'])} | {m['ks_pvalue']:.3g} |"
            )
        lines.append("")
    for name in ("tpr-smollm", "tpr-qwen", "tpr-qwen-1.5b"):
        f = out_dir / f"{name}.json"
        if not f.exists():
            continue
        d = json.loads(f.read_text())
        lines.append(f"**{name}** ({d['model']}, {d['texts_per_cell']} texts per cell)")
        lines.append("")
        for cell, rows in d["cells"].items():
            lines += [
                f"| {cell}, tokens | " + " | ".join(rows) + " |",
                "|---|" + "---|" * len(rows),
            ]
            for k in ("model_free", "weighted", "model_free_no_prompt", "weighted_no_prompt"):
                lines.append(
                    f"| {k} | "
                    + " | ".join(
                        f"{r[k]['rate']:.2f} [{r[k]['ci95'][0]:.2f}, {r[k]['ci95'][1]:.2f}]"
                        for r in rows.values()
                    )
                    + " |"
                )
            lines.append("")
        # pooled over the domains at each temperature (the tables of the study's README)
        for temp in sorted({c.split()[0] for c in d["cells"]}):
            cells = [c for name_, c in d["cells"].items() if name_.split()[0] == temp]
            if len(cells) < 2:
                continue
            lengths = list(cells[0])
            lines += [
                f"| {temp}, pooled over {len(cells)} domains, tokens | "
                + " | ".join(lengths)
                + " |",
                "|---|" + "---|" * len(lengths),
            ]
            for k in ("model_free", "weighted", "model_free_no_prompt", "weighted_no_prompt"):
                pooled = [
                    rate(sum(c[n][k]["k"] for c in cells), sum(c[n][k]["n"] for c in cells))
                    for n in lengths
                ]
                lines.append(
                    f"| {k} | "
                    + " | ".join(
                        f"{r['rate']:.3f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" for r in pooled
                    )
                    + " |"
                )
            lines.append("")
    f = out_dir / "localize.json"
    if f.exists():
        d = json.loads(f.read_text())
        lines += [
            "| cell | documents | scan detects | whole document detects | median IoU (detected) "
            "| IoU > 0.5 | spurious spans |",
            "|---|---|---|---|---|---|---|",
        ]
        for cell, c in d["cells"].items():
            lines.append(
                f"| {cell} | {c['documents']} | {fmt_rate(c['scan_detected'], 2)} | "
                f"{fmt_rate(c['whole_detected'], 2)} | {c['median_best_iou_detected']:.2f} | "
                f"{fmt_rate(c['best_iou_over_half'], 2)} | {c['spurious_spans']} |"
            )
    text = "\n".join(lines) + "\n"
    (out_dir / "tables.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument(
        "parts",
        nargs="+",
        choices=PARTS,
    )
    ap.add_argument(
        "--chunks", type=int, default=1250, help="fpr: chunks of 8 windows (all sources)"
    )
    ap.add_argument("--check", type=int, default=3, help="fpr: chunks checked against the library")
    ap.add_argument(
        "--model-seconds",
        type=float,
        default=math.inf,
        help="fpr: score chunks with the model while this many seconds have not passed",
    )
    ap.add_argument(
        "--alone-every", type=int, default=1, help="fpr: the window-alone forward every Nth chunk"
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="fpr: folder of the per-chunk records and model probabilities (resume from it); "
        "default out/watermark-fpr-cache/smollm2-135m-DTYPE-KEY",
    )
    ap.add_argument(
        "--checkpoint", type=int, default=10, help="fpr: rewrite fpr.json every N chunks"
    )
    ap.add_argument("--dtype", default="float32", help="model dtype")
    ap.add_argument("--repeats", type=int, default=3, help="fpr-profile: interleaved repeats")
    ap.add_argument("--texts", type=int, default=40, help="tpr: texts per (T, domain) cell")
    ap.add_argument("--batch", type=int, default=20, help="tpr: generation batch size")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    ap.add_argument("--domains", nargs="+", default=["code", "chat"], help="tpr: prompt domains")
    ap.add_argument("--model", default=None, help="tpr-qwen: the generating/scoring model")
    ap.add_argument(
        "--name", default=None, help="tpr: the output's name (default: the part's: tpr-qwen-1.5b)"
    )
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        if part == "render":
            print(render(args.out_dir))
            continue
        if part == "fpr":
            res = part_fpr(args, args.out_dir)
        elif part == "fpr-profile":
            res = part_fpr_profile(args, args.out_dir)
        elif part == "fpr-distinct":
            res = part_fpr_distinct(args, args.out_dir)
        elif part == "localize":
            res = part_localize(args, args.out_dir)
        else:
            if args.model is None:
                args.model = "smollm2-135m" if part == "tpr-smollm" else "qwen2.5-coder-0.5b"
            res = part_tpr(args, args.out_dir, args.name or part)
        res["command"] = "python -m research.watermark_detection_field " + " ".join(sys.argv[1:])
        name = args.name if part.startswith("tpr") and args.name else part
        (args.out_dir / f"{name}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
