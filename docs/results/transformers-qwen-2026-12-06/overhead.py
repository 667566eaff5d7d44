"""Issue 51, item 1: where one step of ``ersd.generate`` spends its time against transformers'
assisted generation at T = 0, with the draft length equal and assisted generation's confidence
stop off (``assistant_confidence_threshold = 0``), so both verify the same greedy chains and
accept the same tokens: any gap is per-step work.

For each system, per prompt, interleaved with the order rotating: wall time, and for each model
the forwards it made, the tokens they fed and the seconds inside them (forward hooks on the two
``transformers`` modules, the same hooks for both systems); for ersd also the time of each phase
(``propose`` = drafting incl. the draft forwards, ``score`` = the target call incl. its forward,
``verify``, ``commit``) and inside them the mask building, the cache commits and the drafting
rule; for assisted generation ``get_candidates`` (the draft's own ``generate`` call incl. its
forwards).  ``ersd-mask`` is ersd with a chain call scored through an explicit 4-D mask (before
the causal-chain shortcut of ``HFSession.plan_mask``), for the before/after ratio.

    OMP_NUM_THREADS=1 python docs/results/transformers-qwen-2026-12-06/overhead.py \\
        --pair smollm2 --tokens 64 --prompts 4 --repeats 3
    python docs/results/transformers-qwen-2026-12-06/overhead.py --pair qwen --tokens 128

Prints a JSON summary (per-system medians over prompts of per-step milliseconds) on stdout, and
the ratios of interest (medians of per-prompt ratios of tokens/s, interleaved) with a Student-t
95% interval on the log ratios.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import torch
import transformers

# the same prompts and model pairs as the speed run (measure.py, beside this script)
from measure import PAIRS, PROMPTS
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

import ersd
import ersd.generation as gen
from ersd.integrations.transformers import wrap_module
from ersd.methods.base import GreedyRule
from ersd.models.bundled.cache import prepare
from ersd.models.hf import HFModel
from ersd.models.hf_session import HFSession


class Forwards:
    """Forward hooks on one module: calls, tokens fed per call, seconds inside."""

    def __init__(self, module: Any) -> None:
        self.calls = 0
        self.tokens = 0
        self.seconds = 0.0
        self.widths: Counter[int] = Counter()
        self._t0 = 0.0
        module.register_forward_pre_hook(self._pre, with_kwargs=True)
        module.register_forward_hook(self._post)

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        n = int(ids.shape[-1]) if ids is not None else 0
        self.calls += 1
        self.tokens += n
        self.widths[n] += 1
        self._t0 = time.perf_counter()

    def _post(self, module: Any, args: Any, out: Any) -> None:
        self.seconds += time.perf_counter() - self._t0

    def take(self) -> dict[str, Any]:
        out = {"calls": self.calls, "tokens": self.tokens, "seconds": self.seconds}
        self.calls, self.tokens, self.seconds = 0, 0, 0.0
        self.widths.clear()
        return out


class Phases:
    """Seconds and calls of patched functions (nested phases are timed separately)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def patch(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        setattr(owner, attr, timed)

    def take(self) -> dict[str, Any]:
        out = {k: {"seconds": v, "calls": self.calls[k]} for k, v in self.seconds.items()}
        self.seconds.clear()
        self.calls.clear()
        return out


def interval(ratios: list[float]) -> dict[str, float]:
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    m = statistics.fmean(logs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else 0.0
    return {"gmean": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half), "n": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", choices=sorted(PAIRS), default="smollm2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--systems", nargs="+", default=["ersd", "ersd-mask", "assisted0"])
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    tname, dname, layers = PAIRS[args.pair]
    tfolder, dfolder = prepare(tname), prepare(dname)
    model = AutoModelForCausalLM.from_pretrained(tfolder, dtype=torch.float32).eval()
    extra = {"num_hidden_layers": layers} if layers else {}
    draft = AutoModelForCausalLM.from_pretrained(dfolder, dtype=torch.float32, **extra).eval()
    tok = AutoTokenizer.from_pretrained(tfolder)
    eos = model.generation_config.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    tw, dw = wrap_module(model), wrap_module(draft)
    K, N = args.depth, args.tokens
    tree = f"chain:{K}"
    fw = {"target": Forwards(model), "draft": Forwards(draft)}
    ph = Phases()
    for owner, attr, name in [
        (gen, "propose", "ersd.propose"),
        (gen, "score", "ersd.score"),
        (gen, "verify", "ersd.verify"),
        (gen, "commit", "ersd.commit"),
        (HFSession, "plan_mask", "ersd.plan_mask"),
        (HFSession, "commit", "ersd.session_commit"),
        (HFModel, "_additive", "ersd.additive_mask"),
        (HFModel, "check_logits", "ersd.check_logits"),
        (GreedyRule, "draft_children", "ersd.draft_children"),
        (
            transformers.generation.candidate_generator.AssistedCandidateGenerator,
            "get_candidates",
            "assisted.get_candidates",
        ),
    ]:
        ph.patch(owner, attr, name)

    def run(what: str, enc: Any, ids: list[int]) -> list[int]:
        with torch.no_grad():
            if what.startswith("ersd"):
                HFModel.causal_chains = what == "ersd"
                try:
                    o = ersd.generate(
                        tw,
                        dw,
                        ids,
                        tree=tree,
                        seed=0,
                        max_new_tokens=N,
                        eos_token_id=eos_ids,
                        temperature=0,
                    )
                finally:
                    HFModel.causal_chains = True
                return list(o.tokens)
            draft.generation_config.num_assistant_tokens = K
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            o = model.generate(**enc, assistant_model=draft, max_new_tokens=N, do_sample=False)
            return o[0, enc.input_ids.shape[1] :].tolist()

    systems = args.systems
    prompts = PROMPTS[: args.prompts]
    # warm-up (the adapter's mask probe, first-call allocations), not recorded
    enc0 = tok(prompts[0], return_tensors="pt")
    for s in systems:
        run(s, enc0, enc0.input_ids[0].tolist())
    for f in fw.values():
        f.take()
    ph.take()
    rec: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    same: list[bool] = []
    for i, p in enumerate(prompts):
        enc = tok(p, return_tensors="pt")
        ids = enc.input_ids[0].tolist()
        per: dict[str, dict[str, Any]] = {}
        for r in range(args.repeats):
            rot = (r + i) % len(systems)
            for what in systems[rot:] + systems[:rot]:
                t0 = time.perf_counter()
                toks = run(what, enc, ids)
                wall = time.perf_counter() - t0
                row = per.setdefault(what, {"wall": [], "tokens": toks, "fw": [], "ph": []})
                row["wall"].append(wall)
                row["fw"].append({k: f.take() for k, f in fw.items()})
                row["ph"].append(ph.take())
                if toks != row["tokens"]:
                    raise SystemExit(f"{what} gave other tokens on a repeat of prompt {i}")
        same.append(len({tuple(v["tokens"]) for v in per.values()}) == 1)
        for what, row in per.items():
            best = min(range(args.repeats), key=lambda j: row["wall"][j])
            med = statistics.median(row["wall"])
            fwr, phr = row["fw"][best], row["ph"][best]
            steps = fwr["target"]["calls"]
            n = len(row["tokens"])
            out = {
                "prompt": i,
                "tokens": n,
                "wall_median_s": med,
                "tok_per_s": n / med,
                "target_calls": steps,
                "target_tokens_per_call": fwr["target"]["tokens"] / max(steps, 1),
                "draft_calls": fwr["draft"]["calls"],
                "draft_tokens_per_call": fwr["draft"]["tokens"] / max(fwr["draft"]["calls"], 1),
                "ms_per_step": {
                    "wall": 1e3 * row["wall"][best] / steps,
                    "target_forward": 1e3 * fwr["target"]["seconds"] / steps,
                    "draft_forward": 1e3 * fwr["draft"]["seconds"] / steps,
                    **{k: 1e3 * v["seconds"] / steps for k, v in phr.items()},
                },
            }
            ms = out["ms_per_step"]
            ms["outside_forwards"] = ms["wall"] - ms["target_forward"] - ms["draft_forward"]
            if "ersd.propose" in ms:  # drafting and the target call outside their forwards
                ms["draft_outside_forwards"] = ms["ersd.propose"] - ms["draft_forward"]
                ms["target_outside_forward"] = ms["ersd.score"] - ms["target_forward"]
                ms["rest_of_step"] = ms["wall"] - sum(
                    ms[k] for k in ("ersd.propose", "ersd.score", "ersd.verify", "ersd.commit")
                )
            if "assisted.get_candidates" in ms:
                ms["draft_outside_forwards"] = ms["assisted.get_candidates"] - ms["draft_forward"]
                ms["rest_of_step"] = (
                    ms["wall"] - ms["assisted.get_candidates"] - ms["target_forward"]
                )
            rec[what].append(out)
            print(json.dumps({what: out}), file=sys.stderr, flush=True)
    summary: dict[str, Any] = {
        "pair": args.pair,
        "tree": tree,
        "tokens": N,
        "threads": torch.get_num_threads(),
        "same_tokens_every_prompt": all(same),
    }
    for what, rows in rec.items():
        keys = sorted(set.intersection(*(set(r["ms_per_step"]) for r in rows)))
        summary[what] = {
            "tok_per_s_median": statistics.median(r["tok_per_s"] for r in rows),
            "target_calls": sum(r["target_calls"] for r in rows),
            "draft_calls": sum(r["draft_calls"] for r in rows),
            "target_tokens_per_call": statistics.fmean(r["target_tokens_per_call"] for r in rows),
            "draft_tokens_per_call": statistics.fmean(r["draft_tokens_per_call"] for r in rows),
            "ms_per_step_median": {
                k: statistics.median(r["ms_per_step"][k] for r in rows) for k in keys
            },
        }
    for a, b in (("ersd", "assisted0"), ("ersd", "ersd-mask"), ("ersd-mask", "assisted0")):
        if a in rec and b in rec:
            summary[f"{a}/{b} tok/s"] = interval(
                [x["tok_per_s"] / y["tok_per_s"] for x, y in zip(rec[a], rec[b], strict=True)]
            )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
