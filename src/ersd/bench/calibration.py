"""Calibration of a benchmark: rank profiles per temperature, forward costs, tree choices.

On the calibration prompt split (never the evaluation one): run ERSD with a chain drafter and
record the rank of the target's race winner in the drafter's race at every verified context, per
depth (:class:`ersd.theory.RankProfile`), and the same ranks by draft-race margin through a
:class:`ersd.drafting.MarginRecorder` (the profile's margin table, which dynamic trees' acceptance
predictor reads: :mod:`ersd.bench.dynamic`); time target and draft forwards as a function of the
number of new tokens (:func:`ersd.bench.costs.measure_costs`) and the per-step overheads; from
both, pick the optimal-per-call tree at each budget and the cost-aware tree. The file is read back
with the library's one reader, :func:`ersd.theory.load_profiles`. Progress goes to a ``log``
callback (default: the ``ersd.bench`` logger) and an optional tqdm bar.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ersd
from ersd.bench.config import BenchConfig, BenchConfigError
from ersd.bench.costs import CostModel, choose_trees, measure_costs
from ersd.bench.models import ModelPair, load_pair
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.drafting import MarginRecorder
from ersd.drafting.dynamic import SharpnessFit
from ersd.methods.ersd import with_sharpness
from ersd.theory import RankProfile, RankProfileError, rank_entropy
from ersd.theory.profile import CALIBRATION_FORMAT, load_profiles, tree_depth_probs

logger = logging.getLogger("ersd.bench")


@dataclass
class Calibration:
    """Rank profiles per temperature, forward-cost curves and the tree choices derived from them."""

    profiles: dict[float, RankProfile]
    costs: CostModel | None
    choices: dict[float, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def depth_probs(self, temperature: float) -> list[Any]:
        return tree_depth_probs(self.profiles, temperature)

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
        """A calibration file, or a plain rank profile (no cost curves)."""
        try:
            f = load_profiles(path)
        except RankProfileError as exc:
            raise BenchConfigError(
                f"run.profile: {exc}; or leave run.profile empty to calibrate in the run"
            ) from None
        costs = f.data.get("costs")
        return cls(
            profiles=f.profiles,
            costs=CostModel.from_dict(costs) if costs else None,
            choices={float(t): c for t, c in (f.data.get("choices") or {}).items()},
            meta=f.data.get("meta") or {},
        )


def eos_ids(cfg: BenchConfig, pair: ModelPair) -> list[int] | None:
    return pair.eos_token_ids if cfg.run.stop_at_eos and pair.eos_token_ids else None


def calibrate(
    cfg: BenchConfig,
    pair: ModelPair | None = None,
    log: Callable[[str], None] = logger.info,
    measure_cost: bool = True,
    progress: bool = False,
) -> Calibration:
    """Measure rank profiles (per calibration temperature) and forward costs; choose trees."""
    pair = pair or load_pair(cfg.models)
    c = cfg.calibrate
    prompts = load_prompts(
        cfg.prompts.sets, "calib", max(cfg.prompts.calib_count, 1), cfg.prompts.file
    )
    ids_list = [
        encode_prompt(pair.tokenizer, p, cfg.prompts.template, cfg.prompts.max_prompt_tokens)
        for p in prompts
    ]
    ersd.generate(pair.target, pair.draft, ids_list[0], max_new_tokens=4, tree=c.tree)  # warm-up
    bar = progress_bar(len(c.temperatures) * len(ids_list) + int(measure_cost), progress)
    bar.set_description("calibrate")
    profiles: dict[float, RankProfile] = {}
    overheads: list[float] = []
    stats: dict[str, Any] = {}
    rule = with_sharpness("ersd", cfg.run.draft_sharpness)
    for temp in c.temperatures:
        results = []
        # ranks by draft-race margin (dynamic trees) and every draft sharpness's acceptance
        fit = SharpnessFit()
        recorder = MarginRecorder(pair.draft, fit=fit)
        for i, ids in enumerate(ids_list):
            bar.set_postfix_str(f"T={temp} {prompts[i].id} ersd {c.tree}")
            res = ersd.generate(
                pair.target,
                recorder,
                ids,
                max_new_tokens=c.max_new_tokens,
                method=rule,
                tree=c.tree,
                temperature=temp,
                seed=10_000 + i,
                eos_token_id=eos_ids(cfg, pair),
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
            "draft_sharpness": cfg.run.draft_sharpness,
            "sharpness_fit": fit.to_dict(),
        }
        log(
            f"[calibrate] T={temp}: {prof.num_observations} ranks, P(R=1)="
            f"{stats[str(temp)]['P(R=1)']:.3f}, H[R]={stats[str(temp)]['H[R]_nats']:.3f} nats, "
            f"{c.tree} block efficiency {tokens / calls:.2f}"
        )
        if fit.contexts:
            rates = dict(zip(fit.grid, fit.rates(), strict=True))
            log(
                f"[calibrate] T={temp}: draft sharpness {fit.best():g} accepts the most "
                f"({rates[fit.best()]:.3f} per verified context, {rates.get(1.0, float('nan')):.3f}"
                f" at 1, over {fit.contexts}); set run.draft_sharpness to use it"
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


def progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar (``enabled=False``: a silent one that still counts)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit="run",
        disable=not enabled,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}",
    )
