"""Noise of the measured target cost curve: the curve as auto measured it (each size timed in
its own block, two timed repeats) against sizes timed in interleaved rounds (one forward of
every size per round, more rounds), alternating, on the bf16 Qwen 1.5B target.  Run alone:

    OMP_NUM_THREADS=2 python curves.py [ROUNDS] > curves.log   # ~3 min
"""

import json
import statistics
import sys
import time

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.costs import DEFAULT_SIZES
from ersd.models.batch import score_many


def blocked(model, prompt, repeats):
    s = model.start(list(prompt))
    score_many(model, [s], [([], [])])
    tok = prompt[-1]
    s.commit([tok], [])
    out = []
    for size in DEFAULT_SIZES:
        call = ([tok] * (size - 1), list(range(-1, size - 2)))
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            score_many(model, [s], [call])
            times.append(time.perf_counter() - t0)
            s.commit([tok], [])
        out.append(statistics.median(times[1:]))
    return out


def interleaved(model, prompt, repeats):
    s = model.start(list(prompt))
    score_many(model, [s], [([], [])])
    tok = prompt[-1]
    s.commit([tok], [])
    times = {size: [] for size in DEFAULT_SIZES}
    for _ in range(repeats + 1):
        for size in DEFAULT_SIZES:
            call = ([tok] * (size - 1), list(range(-1, size - 2)))
            t0 = time.perf_counter()
            score_many(model, [s], [call])
            times[size].append(time.perf_counter() - t0)
            s.commit([tok], [])
    return [statistics.median(times[size][1:]) for size in DEFAULT_SIZES]


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
target = ersd.load_model("qwen2.5-coder-1.5b", dtype="bfloat16")
prompt = encode_prompt(target.tokenizer, load_prompts(["math"], "eval", 1)[0], "auto", 384)[-64:]
blocked(target, prompt, 1)
for i in range(5):
    for name, fn, reps in (
        ("blocked-2", blocked, 2),
        (f"interleaved-{rounds}", interleaved, rounds),
    ):
        t0 = time.perf_counter()
        curve = fn(target, prompt, reps)
        print(
            json.dumps({"method": name, "curve": curve, "seconds": time.perf_counter() - t0}),
            flush=True,
        )
