"""Issue 48's watermark numbers on SmolLM2-135M (float32, CPU, one thread), before -> after.

* openings: 40 unrelated prompts at one salt, 3 tokens each: distinct first tokens and first
  three tokens, unwatermarked vs version 1 vs version 2;
* distinct texts per prompt: 100 seeds of one prompt, 12 tokens: 8 salts (before) vs 256;
* detection power at 16/32/64 tokens: 40 prompts x 64 tokens, version 1 with 8 salts (before)
  vs version 2 with 256 salts (after: without the prompt, as a server's /detect, and with it);
* the detector's cost for 8 vs 256 salts (interleaved, medians of repeats, one process);
* the audit of 24 watermarked 48-token texts from their text: old id audit vs audit_text;
* the false-positive rate at p <= 0.01 of templated text, per key (20 keys x 300 texts).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python research/watermark_v2.py OUT.json [PART...]`` (all
parts: ~15 minutes on 2 shared cores; parts already in OUT.json are kept).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time

import numpy as np

import ersd
from ersd.watermark import Watermark, audit, detect
from ersd.watermark.audit import audit_text
from ersd.watermark.detect import encode_text, sidak

PROMPTS = [
    "The lighthouse keeper",
    "Once upon a time",
    "The recipe for bread needs",
    "In quantum mechanics, the",
    "My favourite football team",
    "To install the package, run",
    "The stock market today",
    "Dear hiring manager,",
    "The capital of France is",
    "def fibonacci(n):",
    "The mitochondria is",
    "Yesterday I went to the",
    "The best way to learn piano",
    "Climate change affects",
    "SELECT name FROM users WHERE",
    "The poem begins with",
    "A good night's sleep",
    "The history of the Roman Empire",
    "Photosynthesis converts",
    "My cat likes to",
    "The meeting is scheduled for",
    "Electric cars are",
    "The theory of relativity",
    "In the year 2050,",
    "The ingredients of a pizza",
    "How to fix a flat tyre:",
    "The museum opens at",
    "Birds migrate because",
    "The password must contain",
    "Our quarterly results show",
    "The dragon flew over",
    "A haiku about autumn:",
    "The train to London",
    "Machine learning models",
    "The patient reported",
    "My grandmother used to say",
    "The rules of chess",
    "The volcano erupted",
    "Welcome to our hotel,",
    "The first step in debugging",
]
KEY = bytes.fromhex("5c" * 16 + "a3" * 16)


def openings(model, tok) -> dict:  # type: ignore[no-untyped-def]
    out = {}
    for name, wm in (
        ("unwatermarked", None),
        ("v1", Watermark(key=KEY, version=1, salt=0)),
        ("v2", Watermark(key=KEY, version=2, salt=0)),
    ):
        texts = []
        for p in PROMPTS:
            ids = tok.encode(p)
            texts.append(
                ersd.generate(model, None, ids, max_new_tokens=3, seed=0, watermark=wm).tokens
            )
        firsts = [t[0] for t in texts]
        out[name] = {
            "distinct_first_token": len(set(firsts)),
            "distinct_first_3": len({tuple(t) for t in texts}),
            "most_common_first": max(firsts.count(f) for f in set(firsts)),
            "of": len(texts),
        }
    return out


def distinct_texts(model, tok) -> dict:  # type: ignore[no-untyped-def]
    ids = tok.encode("Once upon a time")
    out = {}
    for name, wm in (
        ("v1_8_salts", Watermark(key=KEY, version=1, num_salts=8)),
        ("v2_256_salts", Watermark(key=KEY, version=2, num_salts=256)),
    ):
        texts = {
            tuple(ersd.generate(model, None, ids, max_new_tokens=12, seed=s, watermark=wm).tokens)
            for s in range(100)
        }
        out[name] = {"distinct": len(texts), "seeds": 100}
    return out


def power(model, tok) -> dict:  # type: ignore[no-untyped-def]
    v1 = Watermark(key=KEY, version=1, num_salts=8)
    v2 = Watermark(key=KEY, version=2, num_salts=256)
    rows: dict[str, dict[str, list[float]]] = {}
    for i, p in enumerate(PROMPTS):
        ids = tok.encode(p)
        t1 = ersd.generate(model, None, ids, max_new_tokens=64, seed=i, watermark=v1).tokens
        t2 = ersd.generate(model, None, ids, max_new_tokens=64, seed=i, watermark=v2).tokens
        for n in (16, 32, 64):
            cell = rows.setdefault(str(n), {})
            before = detect(t1[:n], v1, min_tokens=1)
            blind = detect(t2[:n], v2, min_tokens=1)
            full = detect(t2[:n], v2, min_tokens=1, prompt=ids)
            cell.setdefault("before_v1_8salts", []).append(before.p_value)
            cell.setdefault("after_v2_256salts_no_prompt", []).append(blind.p_value)
            cell.setdefault("after_v2_256salts_with_prompt", []).append(full.p_value)
            # the same texts' best-salt p-value Sidak-corrected for 8 salts: the penalty alone
            cell.setdefault("v2_8salts_no_prompt", []).append(sidak(blind.salt_p_value, 8))
    out = {}
    for n, cell in rows.items():
        out[n] = {
            name: {
                "tpr_at_0.01": float(np.mean([p <= 0.01 for p in ps])),
                "median_p": float(np.median(ps)),
                "texts": len(ps),
            }
            for name, ps in cell.items()
        }
    return out


def detector_cost() -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for n in (64, 1000):
        toks = rng.integers(0, 49152, n).tolist()
        a, b = Watermark(key=KEY, num_salts=8), Watermark(key=KEY, num_salts=256)
        ta, tb = [], []
        for _ in range(15):
            t0 = time.perf_counter()
            detect(toks, a)
            t1 = time.perf_counter()
            detect(toks, b)
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        out[str(n)] = {
            "ms_8_salts": statistics.median(ta) * 1e3,
            "ms_256_salts": statistics.median(tb) * 1e3,
            "ratio": statistics.median(tb) / statistics.median(ta),
        }
    return out


def audits(model, tok) -> dict:  # type: ignore[no-untyped-def]
    wm = Watermark(key=KEY)
    counts = {"texts": 0, "roundtrip_differs": 0, "old_id_audit_forgery": 0}
    status: dict[str, int] = {}
    for i, p in enumerate(PROMPTS[:24]):
        ids = tok.encode(p)
        res = ersd.generate(model, None, ids, max_new_tokens=48, seed=100 + i, watermark=wm)
        text = tok.decode(res.tokens, skip_special_tokens=True)
        re_ids = encode_text(tok, text)
        counts["texts"] += 1
        counts["roundtrip_differs"] += re_ids != res.tokens
        old = audit(model, ids, re_ids, seed=100 + i, watermark=wm)
        counts["old_id_audit_forgery"] += not old.verified
        new = audit_text(model, tok, ids, text, seed=100 + i, watermark=wm)
        status[new.status] = status.get(new.status, 0) + 1
    return {**counts, "audit_text_status": status}


def templated_fpr(tok) -> dict:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    names = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"]
    texts = []
    for _ in range(300):
        rows = [
            f"| {rng.choice(names)} | {int(rng.integers(0, 100))} | {rng.choice(['yes', 'no'])} |"
            for _ in range(6)
        ]
        texts.append(encode_text(tok, "| name | score | passed |\n" + "\n".join(rows)))
    per_key = []
    for k in range(20):
        wm = Watermark(key=hashlib.sha256(b"fpr" + bytes([k])).digest())
        ps = [detect(t, wm, min_tokens=1).p_value for t in texts]
        per_key.append(float(np.mean([p <= 0.01 for p in ps])))
    return {
        "keys": 20,
        "texts": 300,
        "fpr_at_0.01_per_key": per_key,
        "max": max(per_key),
        "mean": float(np.mean(per_key)),
    }


def main() -> None:
    model = ersd.load_model("smollm2-135m", dtype="float32")
    tok = model.tokenizer
    out: dict[str, object] = {"model": "smollm2-135m float32, CPU, OMP_NUM_THREADS=1"}
    try:  # parts already measured are kept; name parts on the command line to (re)run them
        with open(sys.argv[1]) as f:
            out.update(json.load(f))
    except OSError:
        pass
    parts = set(sys.argv[2:])
    for name, fn in (
        ("openings", lambda: openings(model, tok)),
        ("detector_cost", detector_cost),
        ("templated_fpr", lambda: templated_fpr(tok)),
        ("distinct_texts", lambda: distinct_texts(model, tok)),
        ("audit_text", lambda: audits(model, tok)),
        ("power", lambda: power(model, tok)),
    ):
        if parts and name not in parts:
            continue
        t0 = time.perf_counter()
        out[name] = fn()
        print(name, f"{time.perf_counter() - t0:.0f}s", json.dumps(out[name]), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
