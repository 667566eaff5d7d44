"""``tree="auto"`` against plain decoding and fixed trees on one backend (issue 30).

One process, one model pair, configurations interleaved (rotated per prompt) so that machine
drift hits them alike.  Cost curves come from the cost store (:mod:`ersd.cost_store`) or are
measured once before any timed run -- what a process pays on a machine it has not seen, reported
as ``measure_s`` -- and every timed ``auto`` run reports the time it spent finding out
(:attr:`ersd.GenerationResult.auto_finding_out`: measuring, exploring, a draft prefilled for an
exploring step).  Per category and temperature: ``auto ÷ plain`` and ``auto ÷ best fixed tree``
(the fixed tree with the highest mean rate in that category; and the harsher per-prompt best) as
means over prompts with Student-t 95% intervals.

``--control`` adds a second, identical plain configuration (``plain-b``) to the rotation: its
ratio to ``plain`` is what two runs of the same work differ by on this machine, the yardstick
for ``auto ÷ plain`` where auto drafts nothing.  Each cell also splits the difference between
auto and plain per token into the target's forwards (``target_ms/token``: the same forwards when
auto drafts nothing) and everything else a step does (``loop_ms/token``: choosing, verifying,
committing, drafting) -- auto's own cost, apart from the machine's noise in the forwards.

    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 \\
        --temperatures 0 1 --per-set 2 --fixed --out llamacpp.json
    python -m research.auto_check --backend hf --draft-dtype int8 --tokens 48 \\
        --temperatures 0 1 --per-set 2 --fixed chain:4 chain:6 --out hf.json
    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 --repeats 3 \\
        --temperatures 0 1 --per-set 2 --control --out llamacpp-control.json
    python -m research.auto_check --backend llamacpp --threads 2 --tokens 96 --batch 8 \\
        --repeats 3 --temperatures 0 1 --per-set 2 --out llamacpp-b8.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SETS = ("humaneval", "mtbench", "math", "grounded")


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    import ersd

    if args.backend == "llamacpp":
        opts: dict[str, Any] = {"backend": "llamacpp", "threads": args.threads}
        return ersd.load_model(args.target, **opts), ersd.load_model(args.draft, **opts)
    target = ersd.load_model(args.target, dtype=args.dtype)
    return target, ersd.load_model(args.draft, dtype=args.draft_dtype or args.dtype)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ersd
    from ersd.auto import CurveCache, prepare_costs
    from ersd.bench.prompts import encode_prompt, load_prompts
    from ersd.tree import AutoTree

    target, draft = load(args)
    prompts = [p for s in args.sets for p in load_prompts([s], "eval", args.per_set)]
    encoded = [encode_prompt(target.tokenizer, p, "auto", 384) for p in prompts]
    curves = CurveCache()
    t0 = time.perf_counter()
    prepare_costs(target, draft, encoded[0], args.batch, curves)
    setup: dict[str, Any] = {
        "measure_s": time.perf_counter() - t0,
        "measured": curves.measurements,
        "from_store": curves.store.hits if curves.store is not None else 0,
        "stale": curves.store.stale if curves.store is not None else 0,
    }
    if args.profile_tokens > 0 and curves.store is not None:
        # what `ersd models calibrate` stores: the pair's rank profiles (calibration prompts)
        from ersd.commands.models import _calibration_prompts, _rank_profile

        t1 = time.perf_counter()
        calib = _calibration_prompts(target, args.profile_prompts)
        for temp in args.temperatures:
            probs, trials = _rank_profile(target, draft, calib, temp, args.profile_tokens)
            curves.store.put_profile(target, draft, "ersd", temp, probs, sum(trials), trials=trials)
            setup[f"profile_T={temp:g}"] = [round(row[0], 3) for row in probs]
        setup["profile_s"] = time.perf_counter() - t1
    auto = AutoTree(costs=curves)
    configs = config_list(args, draft, auto)
    eos = target.eos_token_ids or None
    for _, d, tree in configs:  # warm-up: every configuration once, untimed
        ersd.generate(target, d, encoded[0], max_new_tokens=4, tree=tree, temperature=1.0)
        if args.batch > 1:
            group = encoded[: args.batch]
            ersd.generate_batch(target, d, group, max_new_tokens=4, tree=tree, temperature=1.0)
    if args.batch > 1:
        rows = run_batches(args, target, configs, encoded, eos)
    else:
        rows = []
        for i, temp, rep, (name, d, tree) in rotations(len(prompts), args, configs):
            p = prompts[i]
            res = ersd.generate(
                target,
                d,
                encoded[i],
                max_new_tokens=args.tokens,
                tree=tree,
                temperature=temp,
                seed=i,
                eos_token_id=eos if args.eos else None,
            )
            row = {
                "prompt": p.id,
                "set": p.set,
                "domain": p.domain,
                "temperature": temp,
                "repeat": rep,
                "config": name,
                "tokens": len(res.tokens),
                "seconds": res.wall_time,
                "rate": res.tokens_per_second,
                "target_s": res.target_time,
                "loop_s": res.wall_time - res.target_time,
                "target_calls": res.target_calls,
                "draft_forwards": res.draft_forwards,
                "auto_choices": res.auto_choices or None,
                "finding_out": res.auto_finding_out,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {
        "args": vars(args),
        "setup": setup,
        "target": target.describe(),
        "draft": draft.describe(),
        "rows": rows,
        "summary": summarise(rows, list(args.fixed)),
    }


def config_list(args: argparse.Namespace, draft: Any, auto: Any) -> list[tuple[str, Any, Any]]:
    """The compared configurations (name, draft, tree): plain, auto, the control (a second
    plain, with ``--control``) and the fixed trees."""
    configs: list[tuple[str, Any, Any]] = [("plain", None, "chain:1"), ("auto", draft, auto)]
    if getattr(args, "control", False):
        configs.append(("plain-b", None, "chain:1"))
    return configs + [(f, draft, f) for f in args.fixed]


def rotations(
    units: int, args: argparse.Namespace, configs: list[tuple[str, Any, Any]]
) -> Iterator[tuple[int, float, int, tuple[str, Any, Any]]]:
    """(unit, temperature, repeat, configuration) in run order: every configuration once per
    unit (a prompt, or a batch), temperature and repeat, the order rotated each time so that
    machine drift hits the configurations alike."""
    k = 0
    for i in range(units):
        for temp in args.temperatures:
            for rep in range(args.repeats):
                shift = k % len(configs)
                k += 1
                for config in configs[shift:] + configs[:shift]:
                    yield i, temp, rep, config


def run_batches(
    args: argparse.Namespace,
    target: Any,
    configs: list[tuple[str, Any, Any]],
    encoded: list[list[int]],
    eos: Any,
) -> list[dict[str, Any]]:
    """``--batch B``: the prompts in batches of B rows (every category in one batch when B
    covers them), each batch generated whole per configuration, rotated per repeat; a row of
    the output is one batch's run, its rate the batch's tokens over the call's wall time.  The
    repeats are the replicates of the summary's interval (machine noise, not prompts)."""
    import ersd

    rows: list[dict[str, Any]] = []
    batches = [encoded[j : j + args.batch] for j in range(0, len(encoded), args.batch)]
    for j, temp, rep, (name, d, tree) in rotations(len(batches), args, configs):
        group = batches[j]
        t0 = time.perf_counter()
        out = ersd.generate_batch(
            target,
            d,
            group,
            max_new_tokens=args.tokens,
            tree=tree,
            temperature=temp,
            seeds=list(range(len(group))),
            eos_token_id=eos if args.eos else None,
        )
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.tokens) for r in out)
        shares = [r.auto_finding_out for r in out if r.auto_finding_out]
        choices: dict[str, int] = defaultdict(int)
        for r in out:
            for c, n in (r.auto_choices or {}).items():
                choices[c] += n
        row = {
            "prompt": f"batch{j}/r{rep}",
            "set": f"batch{args.batch}",
            "domain": "mixed",
            "temperature": temp,
            "repeat": rep,
            "config": name,
            "rows": len(group),
            "tokens": tokens,
            "seconds": seconds,
            "rate": tokens / seconds,
            "target_calls": max(r.target_calls for r in out),
            "draft_forwards": sum(r.draft_forwards for r in out),
            "auto_choices": dict(choices) or None,
            "finding_out": max(shares, key=lambda f: f.get("share", 0.0)) if shares else None,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's repeats on one prompt: the median rate, the mean finding-out share,
    the mean draft forwards, and 'cannot pay' if any repeat said so."""
    import statistics

    out = dict(runs[0])
    out["rate"] = statistics.median(r["rate"] for r in runs)
    for k in ("target_s", "loop_s"):
        if all(k in r for r in runs):
            out[k] = statistics.median(r[k] for r in runs)
    out["draft_forwards"] = sum(r["draft_forwards"] for r in runs) / len(runs)
    found = [r["finding_out"] for r in runs if r.get("finding_out")]
    if found:
        out["finding_out"] = {
            "share": sum(float(f.get("share", 0.0)) for f in found) / len(found),
            "can_pay": all(f.get("can_pay", True) for f in found),
        }
        if all("lost_share" in f for f in found):  # rows of runs before it was reported lack it
            out["finding_out"]["lost_share"] = sum(f["lost_share"] for f in found) / len(found)
    return out


def add(c: dict[str, list[float]], cfg: dict[str, dict[str, Any]], fixed: list[str]) -> None:
    """One prompt's runs into a summary cell."""
    a = cfg["auto"]
    c["auto/plain"].append(a["rate"] / cfg["plain"]["rate"])
    f = a["finding_out"] or {}
    c["finding_out_share"].append(float(f.get("share", 0.0)))
    if "lost_share" in f:
        c["finding_out_lost"].append(float(f["lost_share"]))
    c["cannot_pay"].append(0.0 if f.get("can_pay", True) else 1.0)
    c["draft_forwards"].append(float(a["draft_forwards"]))
    for name in fixed:
        c[f"rate:{name}"].append(cfg[name]["rate"])
    if fixed:
        c["auto/best-fixed(prompt)"].append(a["rate"] / max(cfg[n]["rate"] for n in fixed))
    c["rate:auto"].append(a["rate"])
    p = cfg["plain"]
    if "plain-b" in cfg:
        c["control/plain"].append(cfg["plain-b"]["rate"] / p["rate"])
    for k in ("target_s", "loop_s"):  # auto - plain, milliseconds per token
        if k in a and k in p:
            c[k].append(1e3 * (a[k] / a["tokens"] - p[k] / p["tokens"]))
    c["rate:plain"].append(p["rate"])


def summarise(rows: list[dict[str, Any]], fixed: list[str]) -> dict[str, Any]:
    from ersd.bench.stats import t_interval

    runs: dict[tuple[str, float, str], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rows:  # a prompt's repeats of one configuration: merged (median rate)
        runs[(r["set"], r["temperature"], r["prompt"])][r["config"]].append(r)
    by = {key: {c: merged(rs) for c, rs in cfg.items()} for key, cfg in runs.items()}
    cells: dict[tuple[str, float], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (s, temp, _), cfg in by.items():
        for c in (cells[(s, temp)], cells[("all", temp)]):
            add(c, cfg, fixed)
    out: dict[str, Any] = {}
    for (s, temp), c in sorted(cells.items()):
        cell: dict[str, Any] = {
            "n": len(c["auto/plain"]),
            "auto/plain": t_interval(c["auto/plain"]).format(3),
            "auto/plain_min": min(c["auto/plain"]),
            "finding_out_share_mean": sum(c["finding_out_share"]) / len(c["finding_out_share"]),
            **(
                {"finding_out_lost_mean": sum(c["finding_out_lost"]) / len(c["finding_out_lost"])}
                if c["finding_out_lost"]
                else {}
            ),
            "cannot_pay_prompts": int(sum(c["cannot_pay"])),
            "auto_draft_forwards": int(sum(c["draft_forwards"])),
        }
        if c["control/plain"]:
            cell["control/plain"] = t_interval(c["control/plain"]).format(3)
            cell["control/plain_min"] = min(c["control/plain"])
        for k in ("target_s", "loop_s"):
            if c[k]:
                name = k.removesuffix("_s")
                cell[f"auto-plain {name}_ms/token"] = t_interval(c[k]).format(3)
        if fixed:
            means = {n: sum(c[f"rate:{n}"]) / len(c[f"rate:{n}"]) for n in fixed}
            best = max(means, key=lambda n: means[n])
            ratios = [a / b for a, b in zip(c["rate:auto"], c[f"rate:{best}"], strict=True)]
            cell["best_fixed"] = best
            cell["auto/best-fixed"] = t_interval(ratios).format(3)
            cell["auto/best-fixed(prompt)"] = t_interval(c["auto/best-fixed(prompt)"]).format(3)
        out[f"{s} T={temp:g}"] = cell
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["hf", "llamacpp"], default="hf")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-dtype", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sets", nargs="+", default=list(SETS))
    ap.add_argument("--per-set", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--fixed", nargs="*", default=[], help="fixed trees to compare (e.g. chain:4)")
    ap.add_argument("--eos", action="store_true", help="stop at EOS (default: full length)")
    ap.add_argument(
        "--control",
        action="store_true",
        help="add a second plain configuration (plain-b) to the rotation: plain-b ÷ plain is "
        "the machine's noise on identical work, the yardstick for auto ÷ plain",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each configuration per prompt and temperature (rotated; a prompt's "
        "rate is the median of its repeats)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=1,
        help="rows per batch (> 1: the prompts run as batches through ersd.generate_batch; "
        "the interval is then over --repeats, not prompts)",
    )
    ap.add_argument(
        "--profile-tokens",
        type=int,
        default=0,
        help="first store the pair's rank profiles (as `ersd models calibrate`) from this many "
        "tokens of each calibration prompt per temperature (0: use what the store holds; "
        "`ersd models calibrate` takes 48)",
    )
    ap.add_argument(
        "--profile-prompts",
        type=int,
        default=2,
        help="calibration prompts of the stored profile (as `ersd models calibrate --prompts`, "
        "whose default this is: code, then chat, then maths; runs before 2026-12-05 took 1)",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--from-log",
        type=Path,
        default=None,
        help="summarise the rows a (cut) run printed instead of running",
    )
    args = ap.parse_args()
    if args.from_log is not None:
        rows = []
        for line in args.from_log.read_text().splitlines():
            if line.startswith('{"prompt"'):
                rows.append(json.loads(line))
        done = {(r["prompt"], r["temperature"]) for r in rows if r["config"] == "auto"}
        complete = [
            r
            for r in rows
            if (r["prompt"], r["temperature"]) in done
            and sum(
                1
                for q in rows
                if (q["prompt"], q["temperature"]) == (r["prompt"], r["temperature"])
            )
            == len(config_list(args, None, None)) * args.repeats
        ]
        summary = {"rows": complete, "summary": summarise(complete, list(args.fixed))}
        args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(json.dumps(summary["summary"], indent=1))
        return
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({"setup": result["setup"], "summary": result["summary"]}, indent=1))


if __name__ == "__main__":
    main()
