"""The plan of a benchmark run: which configurations run at one temperature.

Target-only sampling (the speedup denominator), the two-token target-only baseline, Hugging Face
assisted generation at each budget, and every method × natural shape × budget
(:func:`ersd.bench.trees.natural_shapes`), plus ERSD's optimal-per-call and cost-aware trees from
the calibration and the config's extra ``run.trees``.  One shape run by one method twice (under two
specs) is one :class:`Entry` with aliases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ersd
from ersd.bench.calibration import Calibration
from ersd.bench.config import BenchConfig
from ersd.bench.costs import predict
from ersd.bench.trees import natural_shapes
from ersd.theory.profile import nearest_temperature
from ersd.tree import TreeShape, parse_tree


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

    @property
    def label(self) -> str:
        return self.method + (f" {self.tree}" if self.tree else f" k={self.k}" if self.k else "")


def needs_profile(cfg: BenchConfig) -> bool:
    r = cfg.run
    trees = [s for specs in r.trees.values() for s in specs]
    return ("ersd" in r.methods and (r.optimal or r.cost_aware)) or any(
        s.startswith(("optimal:", "cost-aware")) for s in trees
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
        if spec == "cost-aware":
            if cal is None or not cal.choices:
                return
            choice = "cost-aware"
            spec = nearest_temperature(cal.choices, temperature)["cost_aware"]["spec"]
        shape = parse_tree(spec, profile=depth_probs)
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


def entry_meta(e: Entry) -> dict[str, Any]:
    return {
        "method": e.method,
        "tree": e.tree,
        "k": e.k,
        "choice": e.choice,
        "aliases": e.aliases,
        "paths": [list(p) for p in e.shape.paths] if e.shape else None,
        "prediction": e.prediction,
    }
