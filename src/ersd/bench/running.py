"""``ersd bench run``: records, not summaries.

For every prompt × temperature × seed, every planned configuration (:mod:`ersd.bench.planning`)
runs back to back in one process.  The order of configurations rotates from prompt to prompt, so
slow drift of the machine spreads over all of them.  Every configuration is warmed up once before
timing.  One JSON line per run is written (and flushed) as it finishes; the first line is a
``meta`` record (versions, dtype, threads, CPU, date, config, calibration summary).  Progress goes
to a ``log`` callback (default: the ``ersd.bench`` logger) and an optional tqdm bar.

With ``run.batch_sizes`` beyond ``[1]`` the same plan runs as batches instead
(:mod:`ersd.bench.batching`; ``kind = "batch"`` records).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

import ersd
from ersd.bench import batching
from ersd.bench import dynamic as dynamic_trees
from ersd.bench.baselines import hf_assisted, hf_generate, target_only_two_token
from ersd.bench.calibration import Calibration, calibrate, eos_ids, progress_bar
from ersd.bench.config import BenchConfig, BenchConfigError
from ersd.bench.costs import choose_trees, measure_costs
from ersd.bench.drafters import drafter_fields, hf_prompt_lookup, make_drafter
from ersd.bench.models import ModelPair, load_pair
from ersd.bench.planning import (
    Entry,
    entry_fields,
    entry_meta,
    estimate_seconds,
    is_batched,
    needs_profile,
    plan,
)
from ersd.bench.prompts import Prompt, encode_prompt, load_prompts
from ersd.methods.ersd import with_sharpness

RECORD_VERSION = 1

logger = logging.getLogger("ersd.bench")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def run_metadata(cfg: BenchConfig, pair: ModelPair) -> dict[str, Any]:
    """Versions, dtype, threads and machine: what every speed number must be reported with."""
    return {
        "ersd": ersd.__version__,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "dtype": cfg.models.dtype,
        "draft_dtype": cfg.models.draft_dtype or cfg.models.dtype,
        "device": cfg.models.device,
        "torch_threads": torch.get_num_threads(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "models": pair.description,
        "target": cfg.models.target,
        "draft": cfg.models.draft,
        "batch_size": 1 if cfg.run.batch_sizes == [1] else None,
        "batch_sizes": list(cfg.run.batch_sizes),
        "sampling": "temperature only (no top-k / top-p)",
        "draft_sharpness": cfg.run.draft_sharpness,
    }


def _result_fields(res: ersd.GenerationResult, method: str) -> dict[str, Any]:
    d = res.stats()
    d.pop("tree", None)
    d["accepted_per_call"] = [s.num_accepted for s in res.steps]
    d["tokens_per_call"] = [len(s.tokens) for s in res.steps]
    d["tokens"] = list(res.tokens)
    if method == "ersd":
        d["ranks"] = [list(s.ranks) for s in res.steps]
    elif any(s.num_draft_tokens for s in res.steps):
        d["acceptance_events"] = [[s.num_draft_tokens, s.num_accepted] for s in res.steps]
    return d


def run_entry(
    entry: Entry,
    pair: ModelPair,
    ids: list[int],
    temperature: float,
    seed: int,
    max_new_tokens: int,
    eos: list[int] | None,
    draft_sharpness: float = 1.0,
) -> dict[str, Any]:
    """Run one configuration on one prompt; the measured fields of its record (ERSD's drafter
    races ``q**draft_sharpness``: :func:`ersd.methods.ersd.with_sharpness`)."""
    if entry.method == "target-only":
        res = ersd.generate(
            pair.target,
            None,
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            eos_token_id=eos,
        )
        return _result_fields(res, entry.method)
    if entry.method == "target-only-2tok":
        res = target_only_two_token(
            pair.target,
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            eos_token_id=eos,
        )
        return _result_fields(res, entry.method)
    if entry.method == "hf-generate":
        d = hf_generate(
            pair.target,
            [ids],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            eos_token_id=eos,
        )
        tokens, finish = d.pop("tokens")[0], d.pop("finish_reasons")[0]
        target_time, draft_time = d.pop("target_forward_time"), d.pop("draft_forward_time")
        return {
            **d,
            "tokens": tokens,
            "finish_reason": finish,
            "target_time": target_time,
            "draft_time": draft_time,
        }
    if entry.method == "hf-assisted":
        assert entry.k is not None
        return hf_assisted(
            pair.target,
            pair.draft,
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            num_assistant_tokens=entry.k,
            eos_token_id=eos,
        )
    if entry.method == "hf-prompt-lookup":
        assert entry.k is not None
        return hf_prompt_lookup(
            pair.target,
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            num_tokens=entry.k,
            eos_token_id=eos,
        )
    if entry.dynamic is not None:
        res, extra = dynamic_trees.run_dynamic(
            entry.dynamic,
            pair.target,
            pair.draft,
            ids,
            temperature=temperature,
            seed=seed,
            max_new_tokens=max_new_tokens,
            eos=eos,
            draft_sharpness=draft_sharpness,
        )
        return {**_result_fields(res, entry.method), **extra}
    assert entry.shape is not None or entry.tree == "auto"
    # a fresh drafter per run: its per-source stats are this run's alone
    drafter = make_drafter(entry.drafter, pair.draft) if entry.drafter else pair.draft
    res = ersd.generate(
        pair.target,
        drafter,
        ids,
        max_new_tokens=max_new_tokens,
        method=with_sharpness(entry.method, draft_sharpness),
        tree=entry.shape if entry.shape is not None else pair.tree("auto"),
        temperature=temperature,
        seed=seed,
        eos_token_id=eos,
    )
    return {
        **_result_fields(res, entry.method),
        **drafter_fields(drafter if entry.drafter else None),
    }


def run_bench(
    cfg: BenchConfig,
    out: str | Path,
    *,
    calibration: Calibration | None = None,
    pair: ModelPair | None = None,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
) -> Path:
    """Run the benchmark of ``cfg`` and write JSONL records to ``out``; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if cfg.models.threads > 0:
        torch.set_num_threads(cfg.models.threads)
    t_load = time.perf_counter()
    pair = pair or load_pair(cfg.models)
    hf_names = ("hf-assisted", "hf-prompt-lookup", "hf-generate")
    hf_baselines = [b for b in hf_names if b in cfg.run.baselines]
    if pair.is_hf is False and hf_baselines:
        raise BenchConfigError(
            f"run.baselines lists {hf_baselines[0]!r} but {cfg.models.target!r} is not a "
            f"Hugging Face model; remove {hf_baselines[0]!r} from run.baselines or use HF models"
        )
    log(f"[bench] {cfg.name}: {pair.description}, loaded in {time.perf_counter() - t_load:.1f}s")
    if calibration is None and needs_profile(cfg):
        if cfg.run.profile:
            calibration = Calibration.load(cfg.run.profile)
        else:
            calibration = calibrate(cfg, pair, log=log, progress=progress)
            cal_path = out.with_name(out.stem + ".calibration.json")
            calibration.save(cal_path)
            log(f"[bench] calibration saved to {cal_path}")
    if calibration is not None and calibration.costs is None and cfg.run.cost_aware:
        log("[bench] the profile file has no cost curves: measuring them now")
        prompts = load_prompts(cfg.prompts.sets, "calib", 1, cfg.prompts.file)
        ids0 = encode_prompt(
            pair.tokenizer, prompts[0], cfg.prompts.template, cfg.prompts.max_prompt_tokens
        )
        calibration.costs = measure_costs(
            pair.target, pair.draft, ids0, cfg.calibrate.cost_sizes, cfg.calibrate.cost_repeats
        )
        for temp in calibration.profiles:
            calibration.choices[temp] = choose_trees(
                calibration.depth_probs(temp),
                calibration.costs,
                cfg.run.budgets,
                cfg.calibrate.max_candidate_nodes,
            )
    prompts = load_prompts(cfg.prompts.sets, "eval", cfg.prompts.count, cfg.prompts.file)
    encoded = [
        encode_prompt(pair.tokenizer, p, cfg.prompts.template, cfg.prompts.max_prompt_tokens)
        for p in prompts
    ]
    plans = {t: plan(cfg, t, calibration) for t in cfg.run.temperatures}
    eos = eos_ids(cfg, pair)
    r = cfg.run
    batched = is_batched(cfg)
    total = sum(len(v) for v in plans.values()) * len(prompts) * len(r.seeds)
    if batched:
        total = batching.count_runs(plans, len(prompts), r.batch_sizes, len(r.seeds))
    log(
        f"[bench] {len(prompts)} prompts x {len(r.seeds)} seeds; per temperature: "
        + "; ".join(f"T={t}: {len(v)} configurations" for t, v in plans.items())
        + (f"; batch sizes {r.batch_sizes}" if batched else "")
        + f"; {total} runs of {r.max_new_tokens} tokens"
        + (" per row" if batched else "")
    )
    if calibration is not None and calibration.costs is not None and not batched:
        est = sum(
            estimate_seconds(e, calibration, t, r.max_new_tokens)
            for t, v in plans.items()
            for e in v
        )
        log(f"[bench] estimated time: ~{est * len(prompts) * len(r.seeds) / 60:.0f} min")
    meta = {
        "kind": "meta",
        "record_version": RECORD_VERSION,
        "config": cfg.to_dict(),
        "run": run_metadata(cfg, pair),
        "calibration": calibration.to_dict() if calibration else None,
        "plans": {str(t): [entry_meta(e) for e in v] for t, v in plans.items()},
        "prompts": [
            {"id": p.id, "set": p.set, "domain": p.domain, "tokens": len(ids)}
            for p, ids in zip(prompts, encoded, strict=True)
        ],
    }
    with out.open("w") as fh:
        _write(fh, meta)
        if batched:
            order, errors = _run_batched(cfg, plans, pair, prompts, encoded, eos, fh, progress, log)
            log(
                f"[bench] wrote {order} records to {out}"
                + (f" ({errors} failed)" if errors else "")
            )
            return out
        # warm-up: every configuration once, untimed (kernels, allocator, mask shapes)
        if r.warmup_tokens > 0:
            bar = progress_bar(sum(len(v) for v in plans.values()), progress)
            bar.set_description("warm-up")
            for temp, entries in plans.items():
                for e in entries:
                    bar.set_postfix_str(f"T={temp} {e.label}")
                    run_entry(
                        e,
                        pair,
                        encoded[0],
                        temp,
                        0,
                        r.warmup_tokens,
                        eos,
                        draft_sharpness=r.draft_sharpness,
                    )
                    bar.update()
            bar.close()
        bar = progress_bar(total, progress)
        bar.set_description(cfg.name)
        order = errors = 0
        for pi, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True)):
            for temp, entries in plans.items():
                shift = pi % len(entries)
                rotated = entries[shift:] + entries[:shift]
                for seed in r.seeds:
                    for e in rotated:
                        bar.set_postfix_str(f"{prompt.id} T={temp} s={seed} {e.label}")
                        try:
                            fields = run_entry(
                                e,
                                pair,
                                ids,
                                temp,
                                seed,
                                r.max_new_tokens,
                                eos,
                                draft_sharpness=r.draft_sharpness,
                            )
                        except (RuntimeError, ValueError, MemoryError) as exc:
                            # the warm-up ran every configuration, so this is a rare failure
                            # (e.g. out of memory on one prompt): record it, keep going
                            fields = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                            errors += 1
                            log(f"[bench] {prompt.id} T={temp} {e.label} failed: {exc}")
                        _write(
                            fh, _record(e, prompt, ids, temp, seed, r.max_new_tokens, order, fields)
                        )
                        order += 1
                        bar.update()
        bar.close()
    log(f"[bench] wrote {order} records to {out}" + (f" ({errors} failed)" if errors else ""))
    return out


def _run_batched(
    cfg: BenchConfig,
    plans: dict[float, list[Entry]],
    pair: ModelPair,
    prompts: list[Prompt],
    encoded: list[list[int]],
    eos: list[int] | None,
    fh: TextIO,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[int, int]:
    r = cfg.run
    if r.warmup_tokens > 0:
        bar = progress_bar(sum(len(v) for v in plans.values()) * len(r.batch_sizes), progress)
        bar.set_description("warm-up")
        batching.warm_up(
            plans, pair, encoded, r.batch_sizes, r.warmup_tokens, eos, bar, log, r.draft_sharpness
        )
        bar.close()
    bar = progress_bar(
        batching.count_runs(plans, len(prompts), r.batch_sizes, len(r.seeds)), progress
    )
    bar.set_description(cfg.name)
    done = batching.run_batches(
        plans,
        pair,
        prompts,
        encoded,
        sizes=r.batch_sizes,
        seeds=r.seeds,
        max_new_tokens=r.max_new_tokens,
        eos=eos,
        write=lambda rec: _write(fh, rec),
        bar=bar,
        log=log,
        sharpness=r.draft_sharpness,
    )
    bar.close()
    return done


def _record(
    e: Entry,
    prompt: Prompt,
    ids: list[int],
    temp: float,
    seed: int,
    max_new_tokens: int,
    order: int,
    fields: dict[str, Any],
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "result",
        "prompt_id": prompt.id,
        "prompt_set": prompt.set,
        "domain": prompt.domain,
        "prompt_tokens": len(ids),
        "temperature": temp,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        **entry_fields(e),
        "drafter": e.drafter,
        "order": order,
        "timestamp": time.time(),
    }
    rec.update(fields)
    rec["method"] = e.method
    if e.prediction is not None:
        rec["prediction"] = e.prediction
    return rec


def _write(fh: TextIO, obj: dict[str, Any]) -> None:
    fh.write(json.dumps(obj, allow_nan=False) + "\n")
    fh.flush()
