"""The plan of a benchmark run: which configurations run at one temperature.

Target-only sampling (the speedup denominator), the two-token target-only baseline, Hugging Face
assisted generation at each budget, and every method × natural shape × budget
(:func:`ersd.bench.trees.natural_shapes`), plus ERSD's optimal-per-call and cost-aware trees from
the calibration and the config's extra ``run.trees`` (``dynamic[-cost]:K`` specs among them run
with a calibrated :class:`ersd.drafting.DynamicDrafter`: :mod:`ersd.bench.dynamic`).  Each
``run.drafters`` spec (model-free / hybrid drafters, :mod:`ersd.bench.drafters`) runs every
method × natural shape × budget again with that drafter, and ``hf-prompt-lookup`` (a baseline)
runs at each budget.  One shape run by one method twice (under two
specs) is one :class:`Entry` with aliases.  ``hf-generate`` (plain Hugging Face ``generate``) is a
baseline without a budget.  ``auto`` in ``run.trees`` is kept as a label: the library chooses the
tree when the run starts.

With ``run.batch_sizes`` beyond ``[1]`` the same entries run as batches
(:mod:`ersd.bench.batching`): :func:`batch_plan` pairs every entry with every batch size, and
:func:`prompt_groups` says which prompts each batch holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ersd
from ersd.bench import dynamic as dynamic_trees
from ersd.bench.calibration import Calibration
from ersd.bench.config import BenchConfig
from ersd.bench.costs import predict
from ersd.bench.trees import natural_shapes
from ersd.theory.profile import nearest_temperature
from ersd.tree import TreeShape
from ersd.tree_spec import parse_tree


@dataclass
class Entry:
    """One configuration to run on every prompt × seed at one temperature."""

    method: str  # a registry method, "target-only", "target-only-2tok" or an HF baseline
    tree: str | None = None
    shape: TreeShape | None = None
    k: int | None = None
    choice: str | None = None  # "optimal-per-call" / "cost-aware" / None
    aliases: list[str] = field(default_factory=list)
    prediction: dict[str, Any] | None = None
    drafter: str | None = None  # a drafter spec (run.drafters); None: the draft model
    dynamic: dynamic_trees.DynamicSetup | None = None  # a dynamic:K tree's calibrated settings

    @property
    def label(self) -> str:
        tail = f" {self.tree}" if self.tree else f" k={self.k}" if self.k else ""
        return self.method + tail + (f" @{self.drafter}" if self.drafter else "")


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
    if "hf-generate" in r.baselines:
        entries.append(Entry("hf-generate"))
    seen: dict[tuple[str, tuple[tuple[int, ...], ...]], Entry] = {}
    depth_probs = cal.depth_probs(temperature) if cal and cal.profiles else None

    def add(method: str, spec: str, k: int | None, choice: str | None = None) -> None:
        if spec == "auto":  # chosen by the library at run time (tree="auto")
            if not any(e.method == method and e.tree == "auto" for e in entries):
                entries.append(Entry(method, "auto"))
            return
        if dynamic_trees.is_dynamic(spec):  # grown per step by ersd.drafting.DynamicDrafter
            dyn = dynamic_trees.setup(spec, cal, temperature, method)
            if dyn is not None:
                entries.append(Entry(method, spec, None, dyn.spec.budget, dynamic=dyn))
            return
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
        if "hf-prompt-lookup" in r.baselines:
            entries.append(Entry("hf-prompt-lookup", k=k))
        for drafter in r.drafters:  # model-free / hybrid drafters: natural shapes, no merging
            for method in r.methods:
                for spec in natural_shapes(method, k, r.shapes):
                    entries.append(Entry(method, spec, parse_tree(spec), k, drafter=drafter))
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
    if e.method in ("target-only", "target-only-2tok", "hf-generate"):
        return tokens / costs.target_only_rate()
    shape = e.shape or TreeShape.chain(e.k or 1)
    if e.prediction is not None:
        return tokens / float(e.prediction["tokens_per_second"])
    return tokens / predict(shape, cal.depth_probs(temperature), costs).tokens_per_second


def is_batched(cfg: BenchConfig) -> bool:
    """True when the config runs batches (``run.batch_sizes`` other than ``[1]``)."""
    return cfg.run.batch_sizes != [1]


def batch_plan(entries: list[Entry], batch_sizes: list[int]) -> list[tuple[int, Entry]]:
    """Every entry at every batch size, batch sizes in the config's order."""
    return [(b, e) for b in batch_sizes for e in entries]


def prompt_groups(n_prompts: int, batch_size: int) -> list[list[int]]:
    """The prompt indices of each batch at ``batch_size``: consecutive prompts, cycling through
    the set when it has fewer than ``batch_size`` (or the last batch runs short), so that every
    batch size covers every prompt once or more: ``ceil(n / B)`` batches of ``B`` rows."""
    n_groups = -(-n_prompts // batch_size)
    return [[(g * batch_size + j) % n_prompts for j in range(batch_size)] for g in range(n_groups)]


def entry_meta(e: Entry) -> dict[str, Any]:
    return {
        "method": e.method,
        "tree": e.tree,
        "k": e.k,
        "choice": e.choice,
        "aliases": e.aliases,
        "paths": [list(p) for p in e.shape.paths] if e.shape else None,
        "prediction": e.prediction,
        "drafter": e.drafter,
    }


def entry_fields(e: Entry) -> dict[str, Any]:
    """The record fields that describe a plan entry's configuration (tree, size, variant)."""
    return {
        "tree": e.tree,
        "k": e.k,
        "num_nodes": e.shape.num_nodes if e.shape else None,
        "depth": e.shape.depth if e.shape else None,
        "choice": e.choice,
        "aliases": e.aliases,
    }
