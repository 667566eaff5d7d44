"""``ersd bench run`` and ``ersd bench calibrate``: records, not summaries.

**Calibrate** (on the calibration prompt split, never the evaluation one): run ERSD with a chain
drafter and record the rank of the target's race winner in the drafter's race at every verified
context, per depth (:class:`ersd.theory.RankProfile`); time target and draft forwards as a function
of the number of new tokens (:func:`ersd.bench.costs.measure_costs`) and the per-step overheads;
from both, pick the optimal-per-call tree at each budget and the cost-aware tree.

**Run**: for every prompt × temperature × seed, every planned configuration runs back to back in
one process — target-only sampling (the speedup denominator), the two-token target-only baseline,
Hugging Face assisted generation at each budget, and every method × natural shape × budget (plus
ERSD's optimal and cost-aware trees).  The order of configurations rotates from prompt to prompt,
so slow drift of the machine spreads over all of them.  Every configuration is warmed up once
before timing.  One JSON line per run is written (and flushed) as it finishes; the first line is a
``meta`` record (versions, dtype, threads, CPU, date, config, calibration summary).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

import ersd
from ersd.bench import dynamic as dynamic_trees
from ersd.bench.baselines import hf_assisted, target_only_two_token
from ersd.bench.config import BenchConfig, BenchConfigError
from ersd.bench.costs import CostModel, choose_trees, measure_costs, predict
from ersd.bench.models import ModelPair, load_pair
from ersd.bench.prompts import Prompt, encode_prompt, load_prompts
from ersd.bench.trees import (
    CALIBRATION_FORMAT,
    MIN_DEPTH_COUNT,
    natural_shapes,
    pick_profile,
    resolve_tree,
)
from ersd.drafting import MarginRecorder
from ersd.theory import RankProfile, block_efficiency_bound, rank_entropy
from ersd.tree import TreeShape

RECORD_VERSION = 1


# ----------------------------------------------------------------------------------------------
# metadata


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
        "batch_size": 1,
        "sampling": "temperature only (no top-k / top-p)",
    }


# ----------------------------------------------------------------------------------------------
# calibration


@dataclass
class Calibration:
    """Rank profiles per temperature, forward-cost curves and the tree choices derived from them."""

    profiles: dict[float, RankProfile]
    costs: CostModel | None
    choices: dict[float, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def depth_probs(self, temperature: float) -> list[Any]:
        return pick_profile(self.profiles, temperature).depth_rank_probs(min_count=MIN_DEPTH_COUNT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "version": 1,
            "profiles": {str(t): p.to_dict() for t, p in self.profiles.items()},
            "costs": self.costs.to_dict() if self.costs else None,
            "choices": {str(t): c for t, c in self.choices.items()},
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise BenchConfigError(
                f"calibration file {str(p)!r} does not exist; write it with `ersd bench "
                "calibrate CONFIG --out FILE` or leave run.profile empty to calibrate in the run"
            ) from None
        if isinstance(data, dict) and data.get("format") == CALIBRATION_FORMAT:
            costs = CostModel.from_dict(data["costs"]) if data.get("costs") else None
            return cls(
                profiles={float(t): RankProfile.from_dict(d) for t, d in data["profiles"].items()},
                costs=costs,
                choices={float(t): c for t, c in (data.get("choices") or {}).items()},
                meta=data.get("meta") or {},
            )
        prof = RankProfile.from_dict(data)  # a plain rank profile (theory format)
        temp = float(prof.meta.get("temperature", 1.0))
        return cls(profiles={temp: prof}, costs=None)


def _eos(cfg: BenchConfig, pair: ModelPair) -> list[int] | None:
    return pair.eos_token_ids if cfg.run.stop_at_eos and pair.eos_token_ids else None


def calibrate(
    cfg: BenchConfig,
    pair: ModelPair | None = None,
    log: Callable[[str], None] = print,
    measure_cost: bool = True,
    progress: bool = False,
) -> Calibration:
    """Measure rank profiles (per calibration temperature) and forward costs; choose trees."""
    pair = pair or load_pair(cfg.models)
    c = cfg.calibrate
    prompts = load_prompts(cfg.prompts.sets, "calib", max(cfg.prompts.calib_count, 1))
    ids_list = [
        encode_prompt(pair.tokenizer, p, cfg.prompts.template, cfg.prompts.max_prompt_tokens)
        for p in prompts
    ]
    ersd.generate(pair.target, pair.draft, ids_list[0], max_new_tokens=4, tree=c.tree)  # warm-up
    bar = _progress(len(c.temperatures) * len(ids_list) + int(measure_cost), progress)
    bar.set_description("calibrate")
    profiles: dict[float, RankProfile] = {}
    overheads: list[float] = []
    stats: dict[str, Any] = {}
    for temp in c.temperatures:
        results = []
        recorder = MarginRecorder(pair.draft)  # ranks by draft-race margin (dynamic trees)
        for i, ids in enumerate(ids_list):
            bar.set_postfix_str(f"T={temp} {prompts[i].id} ersd {c.tree}")
            res = ersd.generate(
                pair.target,
                recorder,
                ids,
                max_new_tokens=c.max_new_tokens,
                method="ersd",
                tree=c.tree,
                temperature=temp,
                seed=10_000 + i,
                eos_token_id=_eos(cfg, pair),
            )
            results.append(res)
            overheads.extend(s.other_time for s in res.steps)
            bar.update()
        prof = RankProfile.from_results(
            results,
            vocab_size=pair.target.vocab_size,
            temperature=temp,
            tree=c.tree,
            prompts=[p.id for p in prompts],
            target=cfg.models.target,
            draft=cfg.models.draft,
            dtype=cfg.models.dtype,
        )
        prof.margin = recorder.table
        profiles[temp] = prof
        tokens = sum(len(r.tokens) for r in results)
        calls = sum(r.target_calls for r in results)
        stats[str(temp)] = {
            "block_efficiency": tokens / calls,
            "rank_observations": prof.num_observations,
            "P(R=1)": float(prof.rank_probs()[0]),
            "H[R]_nats": rank_entropy(prof.rank_probs()),
        }
        log(
            f"[calibrate] T={temp}: {prof.num_observations} ranks, P(R=1)="
            f"{stats[str(temp)]['P(R=1)']:.3f}, H[R]={stats[str(temp)]['H[R]_nats']:.3f} nats, "
            f"{c.tree} block efficiency {tokens / calls:.2f}"
        )
    costs = None
    if measure_cost:
        bar.set_postfix_str("timing forwards")
        costs = measure_costs(pair.target, pair.draft, ids_list[0], c.cost_sizes, c.cost_repeats)
        costs.overhead = sum(overheads) / max(len(overheads), 1)
        plain = ersd.generate(pair.target, None, ids_list[0], max_new_tokens=16, temperature=1.0)
        costs.overhead_plain = sum(s.other_time for s in plain.steps) / len(plain.steps)
        costs.meta = {"context_tokens": len(ids_list[0]), "repeats": c.cost_repeats}
        bar.update()
        log(
            "[calibrate] forward ms by new tokens "
            + ", ".join(
                f"{s}: {1e3 * t:.0f}/{1e3 * d:.0f}"
                for s, t, d in zip(costs.sizes, costs.target, costs.draft, strict=True)
            )
            + f" (target/draft); overhead {1e3 * costs.overhead:.1f} ms/step"
        )
    bar.close()
    cal = Calibration(profiles=profiles, costs=costs, meta={"stats": stats})
    if costs is not None:
        for temp in profiles:
            cal.choices[temp] = choose_trees(
                cal.depth_probs(temp), costs, cfg.run.budgets, c.max_candidate_nodes
            )
            ca = cal.choices[temp]["cost_aware"]
            log(
                f"[calibrate] T={temp}: cost-aware tree {ca['spec']} ({ca['num_nodes']} nodes, "
                f"depth {ca['depth']}): predicted {ca['block_efficiency']:.2f} tokens/call, "
                f"{ca['speedup']:.2f}x over target-only"
            )
    return cal


# ----------------------------------------------------------------------------------------------
# the plan


@dataclass
class Entry:
    """One configuration to run on every prompt × seed at one temperature."""

    method: str  # a registry method, "target-only", "target-only-2tok" or "hf-assisted"
    tree: str | None = None
    shape: TreeShape | None = None
    k: int | None = None
    choice: str | None = None  # "optimal-per-call" / "cost-aware" / None
    aliases: list[str] = field(default_factory=list)
    prediction: dict[str, Any] | None = None
    dynamic: dynamic_trees.DynamicSetup | None = None  # a dynamic:K tree's calibrated settings

    @property
    def label(self) -> str:
        return self.method + (f" {self.tree}" if self.tree else f" k={self.k}" if self.k else "")


def needs_profile(cfg: BenchConfig) -> bool:
    r = cfg.run
    trees = [s for specs in r.trees.values() for s in specs]
    return ("ersd" in r.methods and (r.optimal or r.cost_aware)) or any(
        s.startswith(("optimal:", "cost-aware")) or dynamic_trees.is_dynamic(s) for s in trees
    )


def plan(cfg: BenchConfig, temperature: float, cal: Calibration | None) -> list[Entry]:
    """The configurations at one temperature (see module docstring)."""
    r = cfg.run
    entries: list[Entry] = []
    if "target-only" in r.baselines:
        entries.append(Entry("target-only"))
    if "target-only-2tok" in r.baselines:
        entries.append(Entry("target-only-2tok"))
    seen: dict[tuple[str, tuple[tuple[int, ...], ...]], Entry] = {}
    depth_probs = cal.depth_probs(temperature) if cal and cal.profiles else None

    def add(method: str, spec: str, k: int | None, choice: str | None = None) -> None:
        if dynamic_trees.is_dynamic(spec):  # grown per step by ersd.drafting.DynamicDrafter
            dyn = dynamic_trees.setup(spec, cal, temperature)
            if dyn is not None:
                entries.append(Entry(method, spec, None, dyn.spec.budget, dynamic=dyn))
            return
        if spec == "cost-aware":
            if cal is None or not cal.choices:
                return
            choice = "cost-aware"
            spec = _nearest(cal.choices, temperature)["cost_aware"]["spec"]
        shape = (
            resolve_tree(spec, depth_probs) if spec.startswith("optimal:") else resolve_tree(spec)
        )
        ersd.get_method(method).check_shape(shape)
        key = (method, shape.paths)
        if key in seen:
            old = seen[key]
            if spec != old.tree and spec not in old.aliases:
                old.aliases.append(spec)
            if choice and choice not in (old.choice or "").split("+"):
                old.choice = f"{old.choice}+{choice}" if old.choice else choice
            return
        pred = None
        if method == "ersd" and depth_probs is not None and cal is not None and cal.costs:
            pred = predict(shape, depth_probs, cal.costs, spec).to_dict()
        e = Entry(method, spec, shape, k if k is not None else shape.num_nodes, choice, [], pred)
        seen[key] = e
        entries.append(e)

    for k in r.budgets:
        if "hf-assisted" in r.baselines:
            entries.append(Entry("hf-assisted", k=k))
        for method in r.methods:
            for spec in natural_shapes(method, k, r.shapes):
                add(method, spec, k)
            if method == "ersd" and r.optimal and depth_probs is not None:
                add("ersd", f"optimal:{k}", k, "optimal-per-call")
    if "ersd" in r.methods and r.cost_aware and cal is not None and cal.choices:
        add("ersd", "cost-aware", None)
    for method, specs in r.trees.items():
        for spec in specs:
            if spec.startswith(("optimal:", "cost-aware")) and depth_probs is None:
                continue
            add(method, spec, None)
    return entries


def _nearest(by_temp: dict[float, Any], temperature: float) -> Any:
    return by_temp[min(by_temp, key=lambda t: (abs(t - temperature), t))]


# ----------------------------------------------------------------------------------------------
# running


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
) -> dict[str, Any]:
    """Run one configuration on one prompt; the measured fields of its record."""
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
        )
        return {**_result_fields(res, entry.method), **extra}
    assert entry.shape is not None
    res = ersd.generate(
        pair.target,
        pair.draft,
        ids,
        max_new_tokens=max_new_tokens,
        method=entry.method,
        tree=entry.shape,
        temperature=temperature,
        seed=seed,
        eos_token_id=eos,
    )
    return _result_fields(res, entry.method)


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="run",
        disable=not enabled,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}",
    )


def run_bench(
    cfg: BenchConfig,
    out: str | Path,
    *,
    calibration: Calibration | None = None,
    pair: ModelPair | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """Run the benchmark of ``cfg`` and write JSONL records to ``out``; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if cfg.models.threads > 0:
        torch.set_num_threads(cfg.models.threads)
    t_load = time.perf_counter()
    pair = pair or load_pair(cfg.models)
    if pair.is_hf is False and "hf-assisted" in cfg.run.baselines:
        raise BenchConfigError(
            f"run.baselines lists 'hf-assisted' but {cfg.models.target!r} is not a Hugging Face "
            "model; remove 'hf-assisted' from run.baselines or use HF models"
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
        prompts = load_prompts(cfg.prompts.sets, "calib", 1)
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
    prompts = load_prompts(cfg.prompts.sets, "eval", cfg.prompts.count)
    encoded = [
        encode_prompt(pair.tokenizer, p, cfg.prompts.template, cfg.prompts.max_prompt_tokens)
        for p in prompts
    ]
    plans = {t: plan(cfg, t, calibration) for t in cfg.run.temperatures}
    eos = _eos(cfg, pair)
    r = cfg.run
    total = sum(len(v) for v in plans.values()) * len(prompts) * len(r.seeds)
    log(
        f"[bench] {len(prompts)} prompts x {len(r.seeds)} seeds; per temperature: "
        + "; ".join(f"T={t}: {len(v)} configurations" for t, v in plans.items())
        + f"; {total} runs of {r.max_new_tokens} tokens"
    )
    if calibration is not None and calibration.costs is not None:
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
        "plans": {str(t): [_entry_meta(e) for e in v] for t, v in plans.items()},
        "prompts": [
            {"id": p.id, "set": p.set, "domain": p.domain, "tokens": len(ids)}
            for p, ids in zip(prompts, encoded, strict=True)
        ],
    }
    with out.open("w") as fh:
        _write(fh, meta)
        # warm-up: every configuration once, untimed (kernels, allocator, mask shapes)
        if r.warmup_tokens > 0:
            bar = _progress(sum(len(v) for v in plans.values()), progress)
            bar.set_description("warm-up")
            for temp, entries in plans.items():
                for e in entries:
                    bar.set_postfix_str(f"T={temp} {e.label}")
                    run_entry(e, pair, encoded[0], temp, 0, r.warmup_tokens, eos)
                    bar.update()
            bar.close()
        bar = _progress(total, progress)
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
                            fields = run_entry(e, pair, ids, temp, seed, r.max_new_tokens, eos)
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


def estimate_seconds(e: Entry, cal: Calibration, temperature: float, tokens: int) -> float:
    """Rough seconds of one run of ``e`` from the cost model (ERSD's prediction for trees; the
    ERSD prediction of the same shape for other methods, which accept less; ``target(1)`` per
    token for target-only; a chain for HF assisted)."""
    costs = cal.costs
    assert costs is not None
    if e.method in ("target-only", "target-only-2tok"):
        return tokens / costs.target_only_rate()
    shape = e.shape or TreeShape.chain(e.k or 1)
    if e.prediction is not None:
        return tokens / float(e.prediction["tokens_per_second"])
    return tokens / predict(shape, cal.depth_probs(temperature), costs).tokens_per_second


def _entry_meta(e: Entry) -> dict[str, Any]:
    return {
        "method": e.method,
        "tree": e.tree,
        "k": e.k,
        "choice": e.choice,
        "aliases": e.aliases,
        "paths": [list(p) for p in e.shape.paths] if e.shape else None,
        "prediction": e.prediction,
    }


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
        "tree": e.tree,
        "k": e.k,
        "num_nodes": e.shape.num_nodes if e.shape else None,
        "depth": e.shape.depth if e.shape else None,
        "choice": e.choice,
        "aliases": e.aliases,
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


def bound_for(cal: Calibration, temperature: float, k: int, vocab_size: int) -> float:
    """The paper's upper bound on tokens per call at budget ``k`` from the measured profile."""
    return block_efficiency_bound(
        pick_profile(cal.profiles, temperature).rank_probs(), k, vocab_size
    )
