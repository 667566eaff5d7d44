"""Issue 51's measurement on the bundled Qwen pair: tokens/s of
``model.generate(custom_generate=ersd.transformers.generate)`` against ``ersd.generate`` (same tree,
same modules) and against transformers' assisted generation (same draft, ``num_assistant_tokens``
= the chain's depth, constant schedule), at T = 1 and T = 0, interleaved per prompt with the
order rotating, run alone. Both models are float32 ``AutoModelForCausalLM`` modules loaded from
the prepared bundled folders. Intervals: geometric mean of the per-prompt ratios with a Student-t
95% interval on the log ratios (prompts are the unit; each prompt's rate is over all its rounds).

    python docs/results/transformers-qwen-2026-12-06/measure.py --tokens 128 --rounds 1 > out.json

Systems (``--systems``; the order rotates per prompt over all of them):

* ``custom``: ``model.generate(custom_generate=ersd.transformers.generate, tree="chain:K")``;
* ``ersd``: ``ersd.generate`` with ``tree="chain:K"``;
* ``ersd-auto``: ``ersd.generate`` with ``tree="auto"`` (each step's tree, or none, from the
  measured costs and the acceptance it learns; the curves are measured in the warm-up);
* ``ersd-dynamic``: ``ersd.generate`` with ``tree="dynamic:K"`` (grown from the draft's races;
  at T = 0 it is the greedy chain of K, i.e. ``ersd``);
* ``ersd-stop``: ``ersd.generate`` with ``tree="chain:K"`` and the draft's confidence stop
  (``ModelDrafter(draft, stop=--stop)``, default 0.4: a drafted token whose draft probability is
  below it ends the chain, kept, as assisted generation's ``assistant_confidence_threshold``;
  the like-for-like counterpart of ``assisted``);
* ``assisted``: assisted generation, ``num_assistant_tokens = K`` (constant schedule) on the
  draft's generation config, its confidence stop at transformers' default (0.4);
* ``assisted0``: the same with ``assistant_confidence_threshold = 0`` (no confidence stop: at
  T = 0 it verifies exactly ``ersd``'s chains);
* ``assisted-default``: assisted generation with transformers' defaults (20 tokens, constant
  schedule, confidence stop 0.4; the draft's generation config reset to unset).

Every system runs once, untimed, on a short prompt first (``--warmup-tokens``), so one-off work
(the adapter's mask probe, ``tree="auto"``'s cost curves) is not in any prompt's time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

import ersd
from ersd.drafting import ModelDrafter
from ersd.integrations.transformers import wrap_module
from ersd.models.bundled.cache import prepare

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "def merge_sort(items):\n    ",
    "Explain what a hash map is in two sentences.",
    "import json\n\ndef load_config(path):\n    ",
    "Write a SQL query that returns the ten most recent orders.",
    "What is the difference between a list and a tuple in Python?",
    "class LRUCache:\n    def __init__(self, capacity):\n        ",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
]


#: --pair: (target, draft, draft layers) of the bundled models; "smollm2" (the 135M model and an
#: 8-layer truncated copy as its draft) is for trying the script out, not for the issue's numbers
PAIRS = {
    "qwen": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", None),
    "smollm2": ("smollm2-135m", "smollm2-135m", 8),
}

SYSTEMS = [
    "custom",
    "ersd",
    "ersd-auto",
    "ersd-dynamic",
    "ersd-stop",
    "assisted",
    "assisted0",
    "assisted-default",
]

#: the draft's generation-config settings of each assisted-generation system (None: unset, so
#: transformers fills in its default); transformers reads them from the *assistant's* config
ASSISTED = {
    "assisted": lambda k: (k, "constant", None),
    "assisted0": lambda k: (k, "constant", 0.0),
    "assisted-default": lambda k: (None, None, None),
}


def interval(ratios: list[float]) -> dict[str, float]:
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    m = statistics.fmean(logs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    return {"gmean": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half), "n": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--systems", nargs="+", default=["custom", "ersd", "assisted"], choices=SYSTEMS)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    ap.add_argument("--warmup-tokens", type=int, default=16)
    ap.add_argument("--pair", choices=sorted(PAIRS), default="qwen")
    ap.add_argument("--stop", type=float, default=0.4, help="ersd-stop's draft confidence stop")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    tname, dname, layers = PAIRS[args.pair]
    tfolder, dfolder = prepare(tname), prepare(dname)
    model = AutoModelForCausalLM.from_pretrained(tfolder, dtype=torch.float32).eval()
    extra = {"num_hidden_layers": layers} if layers else {}
    draft = AutoModelForCausalLM.from_pretrained(dfolder, dtype=torch.float32, **extra).eval()
    # forwards each system makes (calls, tokens fed): the same hooks on both modules for all
    calls = {"target": [0, 0], "draft": [0, 0]}
    for name, module in (("target", model), ("draft", draft)):
        module.register_forward_pre_hook(
            lambda mod, a, kw, c=calls[name]: c.__setitem__(
                slice(0, 2),
                [
                    c[0] + 1,
                    c[1]
                    + int(
                        (kw.get("input_ids") if kw.get("input_ids") is not None else a[0]).shape[-1]
                    ),
                ],
            ),
            with_kwargs=True,
        )
    tok = AutoTokenizer.from_pretrained(tfolder)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    tw, dw = wrap_module(model), wrap_module(draft)
    K, N = args.depth, args.tokens
    tree = f"chain:{K}"
    systems = args.systems
    out: dict[str, object] = {
        "pair": args.pair,
        "cpu": Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(": "),
        "threads": torch.get_num_threads(),
        "tokens": N,
        "tree": tree,
        "stop": args.stop,
    }
    ersd_trees = {
        "ersd": tree,
        "ersd-auto": "auto",
        "ersd-dynamic": f"dynamic:{K}",
        "ersd-stop": tree,
    }
    drafters = {"ersd-stop": ModelDrafter(dw, stop=args.stop)}

    def run(
        what: str, enc: Any, ids: list[int], samp: dict[str, Any], T: float, seed: int, n_new: int
    ) -> int:
        with torch.no_grad():
            if what == "custom":
                o = model.generate(
                    **enc,
                    custom_generate=ersd.transformers.generate,
                    draft_model=draft,
                    tree=tree,
                    seed=seed,
                    max_new_tokens=n_new,
                    **samp,
                )
                return int(o.shape[1] - enc.input_ids.shape[1])
            if what in ersd_trees:
                res = ersd.generate(
                    tw,
                    drafters.get(what, dw),
                    ids,
                    tree=ersd_trees[what],
                    seed=seed,
                    max_new_tokens=n_new,
                    eos_token_id=eos_ids,
                    temperature=T,
                )
                return len(res.tokens)
            # transformers reads these from the *assistant's* generation config (its default
            # drafts 20 tokens); set on the target they do nothing
            gc = draft.generation_config
            (
                gc.num_assistant_tokens,
                gc.num_assistant_tokens_schedule,
                gc.assistant_confidence_threshold,
            ) = ASSISTED[what](K)
            o = model.generate(**enc, assistant_model=draft, max_new_tokens=n_new, **samp)
            return int(o.shape[1] - enc.input_ids.shape[1])

    if args.warmup_tokens > 0:
        enc = tok(PROMPTS[0], return_tensors="pt")
        for T in args.temperatures:
            samp = (
                dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
                if T > 0
                else dict(do_sample=False)
            )
            for what in systems:
                t0 = time.perf_counter()
                run(what, enc, enc.input_ids[0].tolist(), samp, T, 12345, args.warmup_tokens)
                print(
                    f"warm-up T={T} {what}: {time.perf_counter() - t0:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    for T in args.temperatures:
        toks = {s: [0] * args.prompts for s in systems}
        secs = {s: [0.0] * args.prompts for s in systems}
        fwd = {s: {"target": [0, 0], "draft": [0, 0]} for s in systems}
        for r in range(args.rounds):
            for i, p in enumerate(PROMPTS[: args.prompts]):
                enc = tok(p, return_tensors="pt")
                ids = enc.input_ids[0].tolist()
                samp = (
                    dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
                    if T > 0
                    else dict(do_sample=False)
                )
                rot = (r * len(PROMPTS) + i) % len(systems)
                order = systems[rot:] + systems[:rot]
                seed = r * 100 + i
                for what in order:
                    for c in calls.values():
                        c[:] = [0, 0]
                    t0 = time.perf_counter()
                    n = run(what, enc, ids, samp, T, seed, N)
                    secs[what][i] += time.perf_counter() - t0
                    for m, c in calls.items():
                        fwd[what][m] = [x + y for x, y in zip(fwd[what][m], c, strict=True)]
                    toks[what][i] += n
                    rate_now = n / (time.perf_counter() - t0)
                    print(
                        f"T={T} r={r} prompt={i} {what}: {n} tokens, {rate_now:.2f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
        rate = {s: [toks[s][i] / secs[s][i] for i in range(args.prompts)] for s in systems}
        cell: dict[str, object] = {
            "tok/s median": {s: statistics.median(v) for s, v in rate.items()},
            "tokens": toks,
            # per system: target forwards, tokens fed per target forward, draft forwards per
            # target forward (all prompts and rounds)
            "forwards": {
                s: {
                    "target": f["target"][0],
                    "target tokens/forward": f["target"][1] / max(f["target"][0], 1),
                    "draft/target forwards": f["draft"][0] / max(f["target"][0], 1),
                    "new tokens/target forward": sum(toks[s]) / max(f["target"][0], 1),
                }
                for s, f in fwd.items()
            },
        }
        mine = [s for s in systems if not s.startswith("assisted")]
        theirs = [s for s in systems if s.startswith("assisted")]
        pairs = [("custom", "ersd")] + [(a, b) for a in mine for b in theirs]
        for a, b in pairs:
            if a in rate and b in rate:
                cell[f"{a}/{b}"] = interval([x / y for x, y in zip(rate[a], rate[b], strict=True)])
        out[f"T={T}"] = cell
        print(json.dumps({f"T={T}": cell}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
