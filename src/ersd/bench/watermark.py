"""The watermark's benchmark: false positives, detection, robustness and speed (docs/watermark.md).

``ersd bench watermark PART... --out DIR`` runs the parts asked for and writes ``DIR/<part>.json``
records and ``DIR/report.md`` (with figures):

* ``fpr`` — the detector on human-written text nobody watermarked (the Python standard library's
  docstrings and comments, ``/usr/share/common-licenses``, man pages: on every machine, no
  network), cut into texts of 64 and 128 tokens: empirical FPR at nominal 1% and 0.1% with
  Clopper-Pearson intervals, a Kolmogorov-Smirnov test of the p-values against U(0, 1) and a QQ
  plot;
* ``detect`` — watermarked and unwatermarked texts from the target on every prompt of our sets
  (x seeds) at each temperature: TPR at p <= 1% (the exact p-value *is* the FPR under the null,
  checked on the unwatermarked texts) and median p-value at 16/32/64/128 generated tokens, by
  prompt domain; on a subset, watermarked ERSD with the draft against watermarked target-only
  sampling (identical texts);
* ``robust`` — the watermarked texts after replacing, inserting or deleting 10/20/30% of tokens
  at random: TPR;
* ``speed`` — watermarked and unwatermarked ERSD side by side on the same prompts (order
  alternated): tokens per target call and tokens/s, paired ratios with t-intervals; the keyed
  PRF's cost per drafted context against the unkeyed race's; detector throughput;
* ``compare`` — watermarked ERSD side by side with the engines' schemes in our loop (target-only
  watermarking, dual-key SD, watermarked autoregressive sampling) and unwatermarked ERSD / SD:
  tokens per call, tokens/s, detection (:mod:`ersd.bench.watermark_compare`).
* ``attacks`` — the attack suite: random replace / insert / delete of 10-50% of tokens,
  cut-and-paste of a marked span into 1-4k tokens of human text, paraphrase by a local instruct
  model; each against the model-free, the model-weighted and (cut-paste) the localized detector,
  TPR at 1% FPR with intervals, one JSON line per scored text in ``attacks.jsonl``
  (:mod:`ersd.bench.watermark_attacks`).

The benchmark key is a fixed, public derivation (``sha256("ersd-bench-watermark")``), never a
real secret; records show its fingerprint.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import hashlib
import json
import math
import re
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ersd.bench.stats import interval_record, rate
from ersd.watermark import Watermark, detect
from ersd.watermark.detect import encode_text

PARTS = ("fpr", "detect", "robust", "speed", "compare", "attacks")
LENGTHS = (16, 32, 64, 128)
EDIT_RATES = (0.1, 0.2, 0.3)
BENCH_KEY = hashlib.sha256(b"ersd-bench-watermark").digest()


def _write_json(path: Path, record: Any) -> None:
    path.write_text(json.dumps(record))


def bench_watermark(context_width: int = 4) -> Watermark:
    return Watermark(key=BENCH_KEY, context_width=context_width)


# --- human text ---------------------------------------------------------------------------------


def human_documents(max_chars: int = 3_000_000) -> Iterator[tuple[str, str]]:
    """(source, text) of human-written text found on this machine: stdlib docstrings and
    comments, licence texts, man pages (in that order, up to ``max_chars``)."""
    total = 0
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" in path.parts[-2:][0] or "site-packages" in str(path):
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docs = [
            ast.get_docstring(n)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        comments = " ".join(
            m.group(1) for m in re.finditer(r"^\s*#\s?(.*)$", src, flags=re.MULTILINE)
        )
        text = "\n\n".join(d for d in docs if d) + "\n\n" + comments
        if len(text) > 200:
            total += len(text)
            yield "python-stdlib", text
        if total > max_chars:
            return
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8", errors="ignore")
            except OSError:
                continue
            total += len(text)
            yield "common-licenses", text
    for path in sorted(Path("/usr/share/man/man1").glob("*.gz"))[:400]:
        try:
            raw = gzip.decompress(path.read_bytes()).decode("utf-8", errors="ignore")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        text = re.sub(r"^\.\S*\s?", "", raw, flags=re.MULTILINE)  # troff requests
        text = re.sub(r"\\f[BIRP]|\\-|\\\(..|\\&", "", text)
        total += len(text)
        yield "man-pages", text
        if total > max_chars * 1.5:
            return


def human_texts(tokenizer: Any, length: int, max_texts: int) -> list[tuple[str, list[int]]]:
    """Up to ``max_texts`` token chunks of ``length`` cut from :func:`human_documents`."""
    out: list[tuple[str, list[int]]] = []
    for source, text in human_documents():
        ids = encode_text(tokenizer, text)
        for i in range(0, len(ids) - length + 1, length):
            out.append((source, [int(t) for t in ids[i : i + length]]))
            if len(out) >= max_texts:
                return out
    return out


def fpr_part(tokenizer: Any, wm: Watermark, max_texts: int, log: Callable[[str], None]) -> dict:
    res: dict[str, Any] = {"key": wm.fingerprint, "context_width": wm.context_width, "lengths": {}}
    for length in (64, 128):
        texts = human_texts(tokenizer, length, max_texts)
        t0 = time.perf_counter()
        dets = [detect(ids, wm, min_tokens=1) for _, ids in texts]
        secs = time.perf_counter() - t0
        ps = np.array([d.p_value for d in dets])
        windows = int(sum(d.scored for d in dets))
        by_source: dict[str, list[float]] = {}
        for (src, _), p in zip(texts, ps, strict=True):
            by_source.setdefault(src, []).append(float(p))
        res["lengths"][str(length)] = {
            "texts": len(texts),
            "scored_windows": windows,
            "fpr_1pct": rate(int((ps <= 0.01).sum()), len(ps)),
            "fpr_0.1pct": rate(int((ps <= 0.001).sum()), len(ps)),
            "ks_pvalue": float(stats.kstest(ps, "uniform").pvalue),
            "by_source": {k: len(v) for k, v in by_source.items()},
            "p_values": ps.tolist(),
            "detector_tokens_per_second": windows / secs,
        }
        log(
            f"[fpr] {len(texts)} human texts x {length} tokens ({windows} scored windows): FPR "
            f"{(ps <= 0.01).mean():.4f} at 1%, KS p {res['lengths'][str(length)]['ks_pvalue']:.3g}"
        )
    return res


# --- detection and robustness --------------------------------------------------------------


def _prompts(tokenizer: Any, count: int) -> list[tuple[str, str, list[int]]]:
    from ersd.bench.prompts import encode_prompt, load_prompts

    out = []
    for p in load_prompts(["humaneval", "mtbench", "math", "grounded"], "eval", count):
        out.append((p.id, p.domain, encode_prompt(tokenizer, p, "auto", 1024)))
    return out


def generate_texts(
    target: Any,
    draft: Any,
    prompts: list[tuple[str, str, list[int]]],
    seeds: Sequence[int],
    temperature: float,
    max_new_tokens: int,
    wm: Watermark | None,
    batch_size: int,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One text per (prompt, seed), target-only sampling (batched), watermarked or not."""
    import ersd

    rows = [(pid, dom, ids, s) for pid, dom, ids in prompts for s in seeds]
    out: list[dict[str, Any]] = []
    eos = getattr(target, "eos_token_ids", None)
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        res = ersd.generate_batch(
            target,
            None,
            [r[2] for r in chunk],
            seeds=[r[3] for r in chunk],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            eos_token_id=eos,
            watermark=wm,
        )
        for (pid, dom, _, s), r in zip(chunk, res, strict=True):
            out.append({"id": pid, "domain": dom, "seed": s, "tokens": r.tokens})
        log(f"  {min(i + batch_size, len(rows))}/{len(rows)} texts")
    return out


def _score(texts: list[dict[str, Any]], wm: Watermark, length: int) -> list[float]:
    ps = []
    for t in texts:
        toks = t["tokens"][:length]
        if not toks:
            ps.append(1.0)
            continue
        ps.append(detect(toks, wm, min_tokens=1).p_value)
    return ps


def detection_table(
    marked: list[dict[str, Any]], plain: list[dict[str, Any]], wm: Watermark
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    domains = [*sorted({t["domain"] for t in marked}), "all"]
    for length in LENGTHS:
        row: dict[str, Any] = {}
        for dom in domains:
            mk = [t for t in marked if dom in ("all", t["domain"])]
            pl = [t for t in plain if dom in ("all", t["domain"])]
            pm, pp = _score(mk, wm, length), _score(pl, wm, length)
            row[dom] = {
                "tpr_1pct": rate(sum(p <= 0.01 for p in pm), len(pm)),
                "median_p": float(np.median(pm)),
                "fpr_1pct_unwatermarked": rate(sum(p <= 0.01 for p in pp), len(pp)),
                "mean_tokens": float(np.mean([min(len(t["tokens"]), length) for t in mk])),
            }
        out[str(length)] = row
    return out


def edit(
    tokens: list[int], frac: float, kind: str, vocab: int, rng: np.random.Generator
) -> list[int]:
    """``tokens`` with ``round(frac * len)`` random replacements, insertions or deletions."""
    out = list(tokens)
    n = round(frac * len(tokens))
    for _ in range(n):
        if kind == "replace":
            out[int(rng.integers(len(out)))] = int(rng.integers(vocab))
        elif kind == "insert":
            out.insert(int(rng.integers(len(out) + 1)), int(rng.integers(vocab)))
        elif len(out) > 1:
            del out[int(rng.integers(len(out)))]
    return out


def robust_table(marked: list[dict[str, Any]], wm: Watermark, vocab: int) -> dict[str, Any]:
    rng = np.random.default_rng(20261203)
    out: dict[str, Any] = {}
    for kind in ("replace", "insert", "delete"):
        for frac in EDIT_RATES:
            ps = [
                detect(edit(t["tokens"], frac, kind, vocab, rng), wm, min_tokens=1).p_value
                for t in marked
                if len(t["tokens"]) >= 8
            ]
            out[f"{kind}-{int(frac * 100)}"] = {
                "tpr_1pct": rate(sum(p <= 0.01 for p in ps), len(ps)),
                "median_p": float(np.median(ps)),
            }
    ps = [detect(t["tokens"], wm, min_tokens=1).p_value for t in marked if len(t["tokens"]) >= 8]
    out["none-0"] = {
        "tpr_1pct": rate(sum(p <= 0.01 for p in ps), len(ps)),
        "median_p": float(np.median(ps)),
    }
    return out


def identity_check(
    target: Any,
    draft: Any,
    prompts: list[tuple[str, str, list[int]]],
    wm: Watermark,
    temperature: float,
    max_new_tokens: int,
    tree: str,
) -> dict[str, Any]:
    import ersd

    eos = getattr(target, "eos_token_ids", None)
    same = 0
    for _, _, ids in prompts:
        kw = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=0,
            eos_token_id=eos,
            watermark=wm,
        )
        a = ersd.generate(target, draft, ids, tree=tree, **kw).tokens  # type: ignore[arg-type]
        b = ersd.generate(target, None, ids, **kw).tokens  # type: ignore[arg-type]
        same += a == b
    return {"identical": same, "of": len(prompts), "tree": tree, "temperature": temperature}


# --- speed ------------------------------------------------------------------------------------


def prf_cost(vocab: int, wm: Watermark, repeats: int = 200) -> dict[str, Any]:
    """Median seconds to draw one race's noise: keyed PRF vs the unkeyed race (no cache)."""
    from ersd.race import RaceNoise, root_key
    from ersd.watermark.keyed import WatermarkKey, WatermarkNoise

    plain, keyed = RaceNoise(vocab, cache_size=0), WatermarkNoise(vocab, wm, cache_size=0)
    base = root_key(0, [1, 2, 3])
    key = WatermarkKey.root(base, wm, 0)
    tp, tk = [], []
    for i in range(repeats):
        k = key.extend(i)
        t0 = time.perf_counter()
        plain._draw(int(k), 0)
        t1 = time.perf_counter()
        keyed._draw(k, 0)
        tk.append(time.perf_counter() - t1)
        tp.append(t1 - t0)
    return {
        "vocab": vocab,
        "unkeyed_ms": statistics.median(tp) * 1e3,
        "keyed_ms": statistics.median(tk) * 1e3,
    }


def detector_throughput(wm: Watermark, n: int = 1_000_000) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 151_936, n).tolist()
    t0 = time.perf_counter()
    d = detect(toks, wm, salt=0)
    secs = time.perf_counter() - t0
    t0 = time.perf_counter()
    d8 = detect(toks[: n // 8], wm)
    secs8 = time.perf_counter() - t0
    return {
        "tokens": n,
        "tokens_per_second_one_salt": d.scored / secs,
        "tokens_per_second_all_salts": d8.scored / secs8,
        "salts": wm.num_salts,
    }


def speed_part(
    target: Any,
    draft: Any,
    prompts: list[tuple[str, str, list[int]]],
    wm: Watermark,
    trees: Sequence[str],
    temperatures: Sequence[float],
    max_new_tokens: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import ersd

    eos = getattr(target, "eos_token_ids", None)
    out: dict[str, Any] = {"runs": []}
    ersd.generate(target, draft, prompts[0][2], max_new_tokens=4, tree=trees[0])  # warm-up
    for temp in temperatures:
        for tree in trees:
            for j, (pid, _, ids) in enumerate(prompts):
                order = [None, wm] if j % 2 == 0 else [wm, None]
                for w in order:
                    r = ersd.generate(
                        target,
                        draft,
                        ids,
                        max_new_tokens=max_new_tokens,
                        tree=tree,
                        temperature=temp,
                        seed=j,
                        eos_token_id=eos,
                        watermark=w,
                    )
                    out["runs"].append(
                        {
                            "id": pid,
                            "tree": tree,
                            "temperature": temp,
                            "watermarked": w is not None,
                            "tokens": len(r.tokens),
                            "target_calls": r.target_calls,
                            "block_efficiency": r.block_efficiency,
                            "tokens_per_second": r.tokens_per_second,
                            "draft_time": r.draft_time,
                            "target_time": r.target_time,
                            "wall_time": r.wall_time,
                        }
                    )
                log(f"[speed] T={temp} {tree} {pid}")
    out["summary"] = speed_summary(out["runs"])
    return out


def speed_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    keys = sorted({(r["tree"], r["temperature"]) for r in runs})
    for tree, temp in keys:
        sel = [r for r in runs if r["tree"] == tree and r["temperature"] == temp]
        ids = sorted({r["id"] for r in sel})
        pair = {(r["id"], r["watermarked"]): r for r in sel}
        be_w = [pair[(i, True)]["block_efficiency"] for i in ids]
        be_p = [pair[(i, False)]["block_efficiency"] for i in ids]
        ts_ratio = [
            pair[(i, True)]["tokens_per_second"] / pair[(i, False)]["tokens_per_second"]
            for i in ids
        ]
        summary[f"{tree} T={temp}"] = {
            "prompts": len(ids),
            "block_efficiency_watermarked": interval_record(be_w),
            "block_efficiency_plain": interval_record(be_p),
            "block_efficiency_diff": interval_record(
                [a - b for a, b in zip(be_w, be_p, strict=True)]
            ),
            "tokens_per_second_ratio": interval_record(ts_ratio),
            "welch_pvalue_block_efficiency": float(
                stats.ttest_ind(be_w, be_p, equal_var=False).pvalue
            )
            if len(ids) > 1
            else math.nan,
        }
    return summary


# --- report -----------------------------------------------------------------------------------


def _ci(r: dict[str, Any], digits: int = 3) -> str:
    lo, hi = r["ci95"]
    return f"{r['rate']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _tci(r: dict[str, Any], digits: int = 3) -> str:
    lo, hi = r["ci95"]
    return f"{r['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def write_report(out_dir: Path) -> Path:
    """``report.md`` (and figures) from the part records found in ``out_dir``."""
    parts = {
        p: json.loads((out_dir / f"{p}.json").read_text())
        for p in PARTS
        if (out_dir / f"{p}.json").is_file()
    }
    lines = ["# Watermark benchmark", ""]
    meta = (
        parts.get("meta") or json.loads((out_dir / "meta.json").read_text())
        if (out_dir / "meta.json").is_file()
        else {}
    )
    if meta:
        lines += [
            f"Command: `{meta.get('command', '')}`",
            "",
            f"Setup: {meta.get('setup', '')}",
            "",
        ]
    if "fpr" in parts:
        f = parts["fpr"]
        lines += [
            "## False positives on human-written text",
            "",
            "| text length | texts | scored windows | FPR at 1% | FPR at 0.1% | KS p (uniform) "
            "| detector tokens/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for length, r in f["lengths"].items():
            lines.append(
                f"| {length} | {r['texts']} | {r['scored_windows']} | {_ci(r['fpr_1pct'], 4)} | "
                f"{_ci(r['fpr_0.1pct'], 4)} | {r['ks_pvalue']:.3g} | "
                f"{r['detector_tokens_per_second']:.0f} |"
            )
        lines += [
            "",
            "Sources: "
            + ", ".join(
                f"{k} ({v})" for k, v in next(iter(f["lengths"].values()))["by_source"].items()
            ),
            "",
        ]
    if "detect" in parts:
        d = parts["detect"]
        for temp, block in d["by_temperature"].items():
            lines += [
                f"## Detection at T = {temp} ({block['texts']} watermarked texts, "
                f"{len(block['unwatermarked_p_values'])} unwatermarked)",
                "",
                "| tokens | domain | TPR at p <= 1% | median p | FPR of unwatermarked text at 1% |",
                "|---|---|---|---|---|",
            ]
            for length, row in block["table"].items():
                for dom, r in row.items():
                    lines.append(
                        f"| {length} | {dom} | {_ci(r['tpr_1pct'])} | {r['median_p']:.2g} | "
                        f"{_ci(r['fpr_1pct_unwatermarked'])} |"
                    )
            ident = block.get("identity")
            if ident:
                lines += [
                    "",
                    f"Watermarked ERSD ({ident['tree']}) vs watermarked target-only: "
                    f"{ident['identical']}/{ident['of']} texts identical.",
                ]
            lines.append("")
        lines += ["![TPR vs length](tpr_vs_length.png)", ""]
    if "robust" in parts:
        r = parts["robust"]
        for temp, table in r["by_temperature"].items():
            lines += [
                f"## Robustness to random edits (T = {temp}, whole texts)",
                "",
                "| edit | TPR at p <= 1% | median p |",
                "|---|---|---|",
            ]
            for name, v in table.items():
                lines.append(f"| {name}% | {_ci(v['tpr_1pct'])} | {v['median_p']:.2g} |")
            lines.append("")
    if "speed" in parts:
        s = parts["speed"]
        lines += [
            "## Speed: watermarked vs unwatermarked ERSD (paired by prompt)",
            "",
            "| tree, T | prompts | tokens/call watermarked | tokens/call plain | difference "
            "| Welch p | tokens/s ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in s["summary"].items():
            lines.append(
                f"| {name} | {v['prompts']} | {_tci(v['block_efficiency_watermarked'], 2)} | "
                f"{_tci(v['block_efficiency_plain'], 2)} | {_tci(v['block_efficiency_diff'], 2)} | "
                f"{v['welch_pvalue_block_efficiency']:.2f} | {_tci(v['tokens_per_second_ratio'])} |"
            )
        c = s.get("prf_cost")
        if c:
            lines += [
                "",
                f"Noise of one race over {c['vocab']} tokens (median): keyed PRF "
                f"{c['keyed_ms']:.2f} ms, unkeyed race {c['unkeyed_ms']:.2f} ms.",
            ]
        if "prf_share" in s:
            shares = ", ".join(f"{k} {v:.2%}" for k, v in s["prf_share"].items())
            lines += [
                "Keyed PRF time (one race per node and root per step, an upper bound) as a share "
                f"of the watermarked runs' time: {shares}. The keyed race replaces the unkeyed "
                "one, so the watermark's net cost is the difference of the two draws."
            ]
        t = s.get("detector")
        if t:
            lines += [
                f"Detector: {t['tokens_per_second_one_salt']:,.0f} tokens/s with the salt known, "
                f"{t['tokens_per_second_all_salts']:,.0f} tokens/s trying all {t['salts']} salts "
                "(one core)."
            ]
        lines.append("")
    if "compare" in parts:
        from ersd.bench.watermark_compare import report_lines

        lines += report_lines(parts["compare"])
    if (out_dir / "attacks.jsonl").is_file():
        from ersd.bench.watermark_attacks import read_records, summarize
        from ersd.bench.watermark_attacks import report_lines as attack_lines

        lines += attack_lines(summarize(read_records(out_dir / "attacks.jsonl")))
    if "fpr" in parts or "detect" in parts:
        lines += ["![p-value QQ plot](qq.png)", ""]
    _figures(out_dir, parts)
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _figures(out_dir: Path, parts: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "detect" in parts:
        fig, ax = plt.subplots(figsize=(6, 4))
        for temp, block in parts["detect"]["by_temperature"].items():
            for dom in ("code", "chat", "math", "all"):
                xs = [int(k) for k in block["table"]]
                ys = [
                    block["table"][k].get(dom, {}).get("tpr_1pct", {}).get("rate", math.nan)
                    for k in block["table"]
                ]
                if not all(math.isnan(y) for y in ys):
                    ax.plot(
                        xs,
                        ys,
                        marker="o",
                        label=f"T={temp} {dom}",
                        linestyle="-" if dom == "all" else ":",
                    )
        ax.axhline(0.01, color="k", linestyle="--", label="FPR 1% (nominal)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("TPR at p <= 1%")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "tpr_vs_length.png", dpi=120)
        plt.close(fig)
    series: list[tuple[str, list[float]]] = []
    if "fpr" in parts:
        for length, r in parts["fpr"]["lengths"].items():
            series.append((f"human text, {length} tokens", r["p_values"]))
    if "detect" in parts:
        for temp, block in parts["detect"]["by_temperature"].items():
            series.append((f"unwatermarked model text, T={temp}", block["unwatermarked_p_values"]))
    if series:
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        for name, ps in series:
            ps_sorted = np.sort(np.asarray(ps))
            q = (np.arange(1, len(ps_sorted) + 1) - 0.5) / len(ps_sorted)
            ax.plot(q, ps_sorted, label=f"{name} (n={len(ps_sorted)})")
        ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="uniform")
        ax.set_xlabel("uniform quantile")
        ax.set_ylabel("p-value quantile")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "qq.png", dpi=120)
        plt.close(fig)


# --- attacks ------------------------------------------------------------------------------------


def interleave_prompts(
    prompts: list[tuple[str, str, list[int]]], count: int
) -> list[tuple[str, str, list[int]]]:
    """The first ``count`` of ``prompts`` taken round-robin over their prompt sets (the id's
    prefix before ``/``), so a small count still spans code, chat and maths."""
    by_set: dict[str, list[tuple[str, str, list[int]]]] = {}
    for p in prompts:
        by_set.setdefault(p[0].split("/")[0], []).append(p)
    out: list[tuple[str, str, list[int]]] = []
    for i in range(max((len(v) for v in by_set.values()), default=0)):
        out += [v[i] for v in by_set.values() if i < len(v)]
    return out[:count]


def attacks_setup(
    settings: Any, target: Any, paraphraser: Any, log: Callable[[str], None]
) -> tuple[Any, Any]:
    """The attack part's settings, checked (default ones for ``None``), and its paraphraser:
    ``paraphraser`` when given, the target when the settings name it, else loaded (float32)."""
    from ersd.bench.watermark_attacks import AttackSettings

    settings = (settings or AttackSettings()).checked()
    if "paraphrase" in settings.attacks and paraphraser is None:
        if settings.paraphraser == getattr(target, "name", None):
            paraphraser = target
        else:
            import ersd

            log(f"[attacks] loading the paraphraser {settings.paraphraser}")
            paraphraser = ersd.load_model(settings.paraphraser, dtype="float32")
    return settings, paraphraser


def attacks_run(
    target: Any,
    tok: Any,
    wm: Watermark,
    out_dir: Path,
    settings: Any,
    paraphraser: Any,
    temperatures: Sequence[float],
    max_new_tokens: int,
    batch_size: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The ``attacks`` part: texts and human chunks, then
    :func:`ersd.bench.watermark_attacks.attacks_part`; writes ``attacks.jsonl`` (as it goes),
    ``attacks.json`` (the summary) and ``attacks.md`` (the tables)."""
    from ersd.bench.errors import BenchConfigError
    from ersd.bench.watermark_attacks import attacks_part, report_lines

    settings, paraphraser = attacks_setup(settings, target, paraphraser, log)
    plist = interleave_prompts(_prompts(tok, math.ceil(settings.texts / 4)), settings.texts)
    human: dict[int, list[list[int]]] = {}
    if "cut-paste" in settings.attacks:
        for h in settings.human_tokens:
            human[h] = [ids for _, ids in human_texts(tok, h, len(plist))]
            if not human[h]:
                raise BenchConfigError(f"no human text of {h} tokens found on this machine")
    # long enough for the longest pasted span; the edits and the paraphrase see max_new_tokens
    length = max([max_new_tokens, *settings.span_tokens] if "cut-paste" in settings.attacks
                 else [max_new_tokens])  # fmt: skip
    marked: dict[float, list[dict[str, Any]]] = {}
    for temp in temperatures:
        log(f"[attacks] T={temp}: {len(plist)} watermarked texts of up to {length} tokens")
        marked[float(temp)] = generate_texts(
            target, None, plist, (0,), temp, length, wm, batch_size, log
        )
    summary = attacks_part(
        marked, human, target, tok, wm, settings, out_dir / "attacks.jsonl",
        paraphraser=paraphraser, max_tokens=max_new_tokens, log=log,
    )  # fmt: skip
    summary["settings"] = {**dataclasses.asdict(settings), "max_new_tokens": max_new_tokens}
    _write_json(out_dir / "attacks.json", summary)
    table = ["# Watermark attacks", "", *report_lines(summary)]
    (out_dir / "attacks.md").write_text("\n".join(table))
    return summary


# --- driver -------------------------------------------------------------------------------------


def run(
    parts: Sequence[str],
    out_dir: Path,
    *,
    target: Any = None,
    draft: Any = None,
    tokenizer: Any = None,
    prompts: int = 40,
    seeds: Sequence[int] = (0, 1),
    temperatures: Sequence[float] = (0.7, 1.0),
    max_new_tokens: int = 128,
    batch_size: int = 8,
    human_texts_max: int = 2000,
    identity_prompts: int = 4,
    speed_prompts: int = 8,
    speed_tokens: int = 64,
    trees: Sequence[str] = ("chain:6", "multi:2x3"),
    compare_prompts: int = 12,
    compare_batch: int = 1,
    attacks: Any = None,
    paraphraser: Any = None,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> Path:
    """Run ``parts`` into ``out_dir`` and write the report.  ``attacks``: the attack part's
    :class:`~ersd.bench.watermark_attacks.AttackSettings` (default ones when ``None``);
    ``paraphraser``: its loaded paraphrasing model (else loaded by the settings' name)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wm = bench_watermark()
    tok = tokenizer if tokenizer is not None else getattr(target, "tokenizer", None)
    if "attacks" in parts:  # its settings and paraphraser first: they fail fast, not after hours
        attacks, paraphraser = attacks_setup(attacks, target, paraphraser, log)
    if "fpr" in parts:
        (out_dir / "fpr.json").write_text(json.dumps(fpr_part(tok, wm, human_texts_max, log)))
    if "detect" in parts or "robust" in parts:
        plist = _prompts(tok, prompts)
        det: dict[str, Any] = {"key": wm.fingerprint, "by_temperature": {}}
        rob: dict[str, Any] = {"by_temperature": {}}
        for temp in temperatures:
            log(f"[detect] T={temp}: watermarked texts")
            marked = generate_texts(
                target, None, plist, seeds, temp, max_new_tokens, wm, batch_size, log
            )
            log(f"[detect] T={temp}: unwatermarked texts")
            # the null needs fewer texts: unwatermarked ones with the first seed only
            plain = generate_texts(
                target, None, plist, seeds[:1], temp, max_new_tokens, None, batch_size, log
            )
            block: dict[str, Any] = {
                "texts": len(marked),
                "table": detection_table(marked, plain, wm),
                "unwatermarked_p_values": _score(plain, wm, max_new_tokens),
                "marked": marked,
            }
            if draft is not None and identity_prompts:
                block["identity"] = identity_check(
                    target,
                    draft,
                    plist[:: max(1, len(plist) // identity_prompts)][:identity_prompts],
                    wm,
                    temp,
                    min(max_new_tokens, 64),
                    trees[0],
                )
            det["by_temperature"][str(temp)] = block
            if "robust" in parts:
                rob["by_temperature"][str(temp)] = robust_table(marked, wm, int(target.vocab_size))
        if "detect" in parts:
            (out_dir / "detect.json").write_text(json.dumps(det))
        if "robust" in parts:
            (out_dir / "robust.json").write_text(json.dumps(rob))
    if "speed" in parts:
        plist = _prompts(tok, speed_prompts)
        plist = plist[:: max(1, len(plist) // speed_prompts)][:speed_prompts]
        sp = speed_part(target, draft, plist, wm, trees, temperatures, speed_tokens, log)
        sp["prf_cost"] = prf_cost(int(target.vocab_size), wm)
        sp["detector"] = detector_throughput(wm)
        from ersd.tree import parse_tree

        # a step draws at most one race per tree node plus the root (drafter and target share
        # it): the keyed PRF's time at that bound, as a share of the watermarked runs' time
        keyed_s = sp["prf_cost"]["keyed_ms"] / 1e3
        shares = {}
        for tree in trees:
            w_runs = [r for r in sp["runs"] if r["watermarked"] and r["tree"] == tree]
            steps = sum(r["target_calls"] for r in w_runs)
            wall = sum(r["wall_time"] for r in w_runs)
            races = parse_tree(tree).num_nodes + 1
            shares[tree] = keyed_s * steps * races / wall if wall else math.nan
        sp["prf_share"] = shares
        (out_dir / "speed.json").write_text(json.dumps(sp))
    if "compare" in parts:
        from ersd.bench.watermark_compare import compare_part

        plist = _prompts(tok, compare_prompts)
        plist = plist[:: max(1, len(plist) // compare_prompts)][:compare_prompts]
        cp = compare_part(
            target,
            draft,
            plist,
            wm,
            trees,
            temperatures,
            max_new_tokens,
            log,
            batch_size=compare_batch,
            checkpoint=lambda part: _write_json(out_dir / "compare.json", part),
        )
        (out_dir / "compare.json").write_text(json.dumps(cp))
    if "attacks" in parts:
        attacks_run(
            target, tok, wm, out_dir, attacks, paraphraser, temperatures, max_new_tokens,
            batch_size, log,
        )  # fmt: skip
    return write_report(out_dir)
