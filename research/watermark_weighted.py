"""Issue 52's model-weighted detection on SmolLM2-135M (float32, CPU, one thread).

40 prompts (research/watermark_v2.py's) x 64 tokens at T = 0.7 and at T = 1, watermark version 2
with 256 salts (the default), detected with the prompt: the model-free detector
(:func:`ersd.watermark.detect`) vs the model-weighted one
(:func:`ersd.watermark.weighted.detect_with_model`, the target itself, at the generation's
temperature and at T = 1 when the temperature is unknown), TPR at nominal 1% (p <= 0.01; both
detectors' nulls are exact) at 16/32/48/64 tokens; and the same 40 prompts generated WITHOUT the
watermark (T = 0.7, other seeds) scored by both, for the false-positive count and the
"not enough signal" verdicts.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python research/watermark_weighted.py OUT.json [T ...]``
(temperatures, default 0.7 and 1; ~8 minutes each and 3 for the unwatermarked texts on 2
shared cores).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import ersd
from ersd.watermark import Watermark, detect
from ersd.watermark.weighted import detect_weighted, model_token_probs
from research.watermark_v2 import KEY, PROMPTS

LENGTHS = (16, 32, 48, 64)


def main() -> None:
    model = ersd.load_model("smollm2-135m", dtype="float32")
    tok = model.tokenizer
    wm = Watermark(key=KEY, version=2, num_salts=256)
    out: dict[str, object] = {"model": "smollm2-135m float32, CPU, OMP_NUM_THREADS=1"}
    t0 = time.perf_counter()
    for temp in [float(t) for t in sys.argv[2:]] or [0.7, 1.0]:
        rows: dict[str, dict[str, list[float]]] = {}
        for i, prompt in enumerate(PROMPTS):
            ids = tok.encode(prompt)
            text = ersd.generate(
                model, None, ids, max_new_tokens=64, seed=i, watermark=wm, temperature=temp
            ).tokens
            p_gen = model_token_probs(model, text, prompt=ids, temperature=temp)
            p_one = model_token_probs(model, text, prompt=ids, temperature=1.0)
            for n in LENGTHS:
                cell = rows.setdefault(str(n), {})
                sub = text[:n]
                cell.setdefault("model_free", []).append(
                    detect(sub, wm, prompt=ids, min_tokens=1).p_value
                )
                w = detect_weighted(sub, wm, p_gen[:n], prompt=ids, min_tokens=1)
                cell.setdefault("weighted_gen_T", []).append(w.p_value)
                cell.setdefault("expected_power", []).append(w.expected_power)
                cell.setdefault("weighted_T1", []).append(
                    detect_weighted(sub, wm, p_one[:n], prompt=ids, min_tokens=1).p_value
                )
        out[f"T={temp}"] = {
            n: {
                name: (
                    float(np.mean(ps))
                    if name == "expected_power"
                    else float(np.mean([p <= 0.01 for p in ps]))
                )
                for name, ps in cell.items()
            }
            for n, cell in rows.items()
        }
        print(temp, f"{time.perf_counter() - t0:.0f}s", json.dumps(out[f"T={temp}"]), flush=True)
    # unwatermarked text of the same prompts: false positives and verdicts
    verdicts: dict[str, int] = {}
    fp_free = fp_w = 0
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt)
        text = ersd.generate(
            model, None, ids, max_new_tokens=64, seed=1000 + i, temperature=0.7
        ).tokens
        p_gen = model_token_probs(model, text, prompt=ids, temperature=0.7)
        w = detect_weighted(text, wm, p_gen, prompt=ids, min_tokens=1)
        verdicts[w.verdict] = verdicts.get(w.verdict, 0) + 1
        fp_w += w.watermarked
        fp_free += detect(text, wm, prompt=ids, min_tokens=1).watermarked
    out["unwatermarked_T=0.7_64_tokens"] = {
        "texts": len(PROMPTS),
        "false_positives_model_free": fp_free,
        "false_positives_weighted": fp_w,
        "weighted_verdicts": verdicts,
    }
    print(json.dumps(out["unwatermarked_T=0.7_64_tokens"]), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
