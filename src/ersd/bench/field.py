"""The field's multi-draft protocol as one preset (issue 53): ``ersd bench field-multidraft``.

The multi-draft papers report block efficiency (tokens per target call) at several draft counts
on one protocol (Liu, Wan, Gao & Gündüz 2026: Qwen2.5-7B ← 0.5B-Instruct, CNN/DM and ELI5,
n = 1000, top-k 50, top-p 1, T = 1, 128 new tokens, L = 4, B ∈ {1, 2, 4, 6, 8}).  This module
runs that table for every method of the catalog on one model pair:

* **cells**: every method at ``B`` drafts of length ``L`` (``chain:L`` at ``B = 1``,
  ``multi:BxL`` beyond; SD at ``B = 1`` only; SpecHub, which verifies at most two children per
  node, on its own shape of ``B·L`` nodes: ``multi:2xL`` at ``B = 2``, ``binary:B·L`` beyond),
  plus **ERSD's best tree at each node budget** ``B·L`` (the Tunstall tree of
  :func:`ersd.theory.optimal_tree` on the rank profile measured on the calibration prompts);
* **scales**: :data:`SCALES` — ``cpu`` (the bundled Qwen2.5-Coder 1.5B ← 0.5B, a summarisation
  and a code category), ``liu`` (the exact Liu et al. GPU protocol, prompts from ``datasets``),
  ``smollm`` and ``toy`` (the harness on small / weight-free pairs);
* **records**: one JSON line per prompt × cell, written and flushed as it is made; a stopped run
  rerun with the same ``--out`` **resumes**: it keeps every complete record, drops a torn last
  line, and runs only what is missing (a file from another configuration is refused);
* **the exact column** (one ``exact`` record per prompt): on the contexts of the prompt's first
  sampled continuation (target-distributed, whatever method made it), one teacher-forced forward
  of each model gives ``p`` and ``q`` after top-k; per context the exact one-step acceptance of
  every method with a formula cheap at support 50 (SD, SpecInfer, SpecTr, SpecHub, ERSD) and the
  i.i.d. optimum :func:`ersd.theory.optimal_transport.iid_optimum` — conditional expectations of
  the first-step acceptance indicator on the same contexts for every method (a Rao–Blackwellised,
  paired estimator; its unbiasedness is tested against plain Monte Carlo).

:func:`summarise` turns the records into the tables (95% t-intervals over prompts, paired by
prompt) and :func:`write_report` into ``report.md``, ``summary.json`` and a figure.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ersd.bench.config import BenchConfigError, ModelsConfig
from ersd.bench.prompts import Prompt, encode_prompt, load_prompts
from ersd.bench.stats import interval_record
from ersd.methods.catalog import CATALOG, report_order

#: the methods of the field's table, in the papers' order
FIELD_METHODS: tuple[str, ...] = ("sd", "specinfer", "rrs-wor", "spectr", "spechub", "gls", "ersd")
#: the label of ERSD's best tree at an equal node budget
ERSD_TREE = "ersd-tree"
#: methods with an exact one-step formula cheap enough at support 50 (ersd.theory.acceptance);
#: GLS (a quadrature per token, ~20 s a context) and RRS-wor (histories grow as V^K) are left out
EXACT_METHODS: tuple[str, ...] = ("sd", "specinfer", "spectr", "spechub", "ersd")
RECORD_VERSION = 1
#: settings a resume may change (records are keyed by prompt and cell)
RESUMABLE_CHANGES = ("prompts_per_category",)


@dataclass(frozen=True)
class Category:
    """A prompt category: ``source`` is ``bundled:SET`` (optionally ``:domain,domain``, a filter
    on the set's ``domain`` field) or ``datasets:PATH:CONFIG:SPLIT:FIELD`` (Hugging Face
    ``datasets``, needs the hub); ``instruction`` is put before a dataset's text."""

    name: str
    source: str
    instruction: str = ""


@dataclass(frozen=True)
class FieldPreset:
    """One scale of the protocol (:data:`SCALES`); :meth:`replace` applies command-line
    overrides and checks them."""

    scale: str
    description: str
    target: str
    draft: str
    categories: tuple[Category, ...]
    prompts_per_category: int
    dtype: str = "float32"
    draft_dtype: str = ""
    device: str = "cpu"
    max_new_tokens: int = 128
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 1.0
    draft_length: int = 4
    drafts: tuple[int, ...] = (1, 2, 4, 6, 8)
    methods: tuple[str, ...] = FIELD_METHODS
    seeds: tuple[int, ...] = (0,)
    max_prompt_tokens: int = 1024
    #: contexts per prompt in the exact column (0: none; they cost a quadrature each for ERSD)
    exact_contexts: int = 32
    #: tokens the calibration run (ERSD chain:8 on the first calibration prompt of each category)
    #: makes for the rank profile of the equal-budget trees
    calibration_tokens: int = 64
    stop_at_eos: bool = False

    def replace(self, **changes: Any) -> FieldPreset:
        out = dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
        out.check()
        return out

    def check(self) -> None:
        if self.prompts_per_category < 1:
            raise BenchConfigError("prompts per category must be >= 1 (--prompts)")
        if self.max_new_tokens < 1 or self.draft_length < 1:
            raise BenchConfigError("--max-new-tokens and the draft length must be >= 1")
        if not self.drafts or any(b < 1 for b in self.drafts):
            raise BenchConfigError(f"--drafts {list(self.drafts)} must list draft counts >= 1")
        for m in self.methods:
            if m not in FIELD_METHODS:
                raise BenchConfigError(
                    f"unknown method {m!r} in --methods; the field's methods: "
                    f"{', '.join(FIELD_METHODS)}"
                )
        if self.top_k < 1 or not 0 < self.top_p <= 1 or not self.temperature > 0:
            raise BenchConfigError("top-k must be >= 1, 0 < top-p <= 1 and the temperature > 0")
        if self.calibration_tokens < 1:
            raise BenchConfigError("--calibration-tokens must be >= 1")
        if self.exact_contexts < 0:
            raise BenchConfigError("--exact-contexts must be >= 0 (0: no exact column)")

    def models(self) -> ModelsConfig:
        return ModelsConfig(
            target=self.target,
            draft=self.draft,
            dtype=self.dtype,
            draft_dtype=self.draft_dtype,
            device=self.device,
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (tuples as lists: what a records file reads back)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


_CNN = Category(
    "summarization",
    "datasets:abisee/cnn_dailymail:3.0.0:test:article",
    "Summarize the following news article in a few sentences.\n\n",
)
_ELI5 = Category("eli5", "datasets:sentence-transformers/eli5:pair:train:question", "")

SCALES: dict[str, FieldPreset] = {
    p.scale: p
    for p in (
        FieldPreset(
            scale="liu",
            description="Liu et al. (2026) GPU protocol: Qwen2.5-7B <- Qwen2.5-0.5B-Instruct, "
            "CNN/DM + ELI5 (n = 1000), top-k 50, T = 1, 128 new tokens, L = 4, B = 1..8",
            target="Qwen/Qwen2.5-7B",
            draft="Qwen/Qwen2.5-0.5B-Instruct",
            categories=(_CNN, _ELI5),
            prompts_per_category=500,
            dtype="bfloat16",
            device="cuda",
            max_prompt_tokens=2048,
            exact_contexts=16,
        ),
        FieldPreset(
            scale="cpu",
            description="bundled Qwen2.5-Coder 1.5B (float32) <- 0.5B (int8) on 2 CPU cores: "
            "grounded summarisation/extraction + HumanEval code, the protocol's sampling",
            target="qwen2.5-coder-1.5b",
            draft="qwen2.5-coder-0.5b",
            categories=(
                Category("summarization", "bundled:grounded:summarize,extract"),
                Category("code", "bundled:humaneval"),
            ),
            prompts_per_category=2,
            draft_dtype="int8",
        ),
        FieldPreset(
            scale="smollm",
            description="SmolLM2-135M <- its first 10 layers (a harness check, not the field's "
            "pair)",
            target="smollm2-135m",
            draft="smollm2-135m",
            categories=(
                Category("summarization", "bundled:grounded:summarize,extract"),
                Category("code", "bundled:humaneval"),
            ),
            prompts_per_category=2,
        ),
        FieldPreset(
            scale="toy",
            description="weight-free toy pair (bigram tables, vocabulary 64): the harness only",
            target="toy",
            draft="toy",
            categories=(
                Category("summarization", "bundled:grounded:summarize,extract"),
                Category("code", "bundled:humaneval"),
            ),
            prompts_per_category=2,
            max_new_tokens=24,
            drafts=(1, 2, 4),
            exact_contexts=4,
            calibration_tokens=24,
        ),
    )
}


def preset(scale: str) -> FieldPreset:
    """The preset of ``scale`` (:data:`SCALES`), or a one-line error naming them."""
    if scale not in SCALES:
        raise BenchConfigError(
            f"unknown scale {scale!r} for the field-multidraft preset; known: {', '.join(SCALES)}"
        )
    return SCALES[scale]


# --- cells ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    method: str  # a catalog method, or ERSD_TREE
    drafts: int  # B
    tree: str  # tree spec
    nodes: int  # B·L: the node budget

    @property
    def label(self) -> str:
        return f"{self.method}@B{self.drafts}"

    @property
    def run_method(self) -> str:
        return "ersd" if self.method == ERSD_TREE else self.method


def method_shape(method: str, drafts: int, length: int) -> str | None:
    """The tree ``method`` runs at ``drafts`` drafts of ``length`` tokens (None: not run)."""
    if method == "sd":
        return f"chain:{length}" if drafts == 1 else None
    if drafts == 1:
        return f"chain:{length}"
    if method == "spechub":  # two children per node at most: its own shape of B·L nodes
        return f"multi:2x{length}" if drafts == 2 else f"binary:{drafts * length}"
    return f"multi:{drafts}x{length}"


def cells(p: FieldPreset, trees: dict[int, str] | None = None) -> list[Cell]:
    """Every cell of the table; ``trees`` maps a node budget to ERSD's best tree there."""
    out = []
    for b in p.drafts:
        for m in p.methods:
            shape = method_shape(m, b, p.draft_length)
            if shape is not None:
                out.append(Cell(m, b, shape, b * p.draft_length))
        if trees and "ersd" in p.methods and (b * p.draft_length) in trees:
            out.append(Cell(ERSD_TREE, b, trees[b * p.draft_length], b * p.draft_length))
    return out


# --- prompts ----------------------------------------------------------------------------------


def _bundled(cat: Category, split: str, count: int) -> list[Prompt]:
    parts = cat.source.split(":")
    name = parts[1]
    domains = set(parts[2].split(",")) if len(parts) > 2 and parts[2] else None
    rows = load_prompts([name], split, 10_000)
    rows = [r for r in rows if domains is None or r.domain in domains]
    return [dataclasses.replace(r, domain=cat.name) for r in rows[:count]]


def _datasets(cat: Category, split: str, count: int) -> list[Prompt]:
    try:
        import datasets
    except ImportError:
        raise BenchConfigError(
            f"category {cat.name!r} reads {cat.source!r} with Hugging Face `datasets`, which is "
            "not installed; pip install datasets (and give the machine hub access), or use "
            "--scale cpu"
        ) from None
    _, path, config, hf_split, column = cat.source.split(":")
    ds = datasets.load_dataset(path, config or None, split=hf_split)
    # evaluation prompts first; calibration prompts are the ones after them (disjoint)
    start = 0 if split == "eval" else 10_000
    out = []
    for i in range(start, min(len(ds), start + count)):
        text = cat.instruction + str(ds[i][column])
        out.append(Prompt(f"{cat.name}/{i}", cat.name, cat.name, split, text))
    return out


def category_prompts(cat: Category, split: str, count: int) -> list[Prompt]:
    """The first ``count`` prompts of a category's ``split`` (eval or calib)."""
    if cat.source.startswith("bundled:"):
        return _bundled(cat, split, count)
    if cat.source.startswith("datasets:"):
        return _datasets(cat, split, count)
    raise BenchConfigError(
        f"category {cat.name!r}: source {cat.source!r} must start with 'bundled:' or 'datasets:'"
    )


def _template(cat: Category) -> str:
    return "raw" if cat.name == "code" else "auto"


# --- records ----------------------------------------------------------------------------------


class RecordsFile:
    """The JSONL file of a run: what is in it already (for a resume) and appending to it."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.meta: dict[str, Any] | None = None
        self.profile: dict[str, Any] | None = None
        self.done: dict[tuple[str, str], dict[str, Any]] = {}
        if path.exists():
            self._load(config)

    def _load(self, config: dict[str, Any]) -> None:
        raw = self.path.read_bytes()
        keep = raw.rfind(b"\n") + 1  # a torn last line (an interrupted write) is dropped
        lines = raw[:keep].decode().splitlines()
        if keep < len(raw):
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise BenchConfigError(
                    f"{self.path}:{i + 1} is not a JSON record; resume needs the file as the "
                    "run wrote it (give a new --out to start afresh)"
                ) from None
            kind = rec.get("kind")
            if kind == "meta":
                self.meta = rec
            elif kind == "profile":
                self.profile = rec
            elif kind in ("cell", "exact"):
                self.done[(rec["prompt"], rec["cell"])] = rec
        if self.meta is None and (self.done or self.profile):
            raise BenchConfigError(f"{self.path} has records but no meta line; give a new --out")
        old = (self.meta or {}).get("config") or {}
        # more (or fewer) prompts per category extends a run: records are keyed by prompt
        diff = sorted(
            k
            for k in set(old) | set(config)
            if old.get(k) != config.get(k) and k not in RESUMABLE_CHANGES
        )
        if self.meta is not None and diff:
            raise BenchConfigError(
                f"{self.path} was written by another configuration (differs in: "
                f"{', '.join(diff)}); resume with the same settings or give a new --out"
            )

    def write(self, rec: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a records file (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


# --- running ----------------------------------------------------------------------------------


def _generate(pair: Any, p: FieldPreset, cell: Cell, ids: list[int], seed: int) -> Any:
    import ersd

    return ersd.generate(
        pair.target,
        pair.draft,
        ids,
        max_new_tokens=p.max_new_tokens,
        method=cell.run_method,
        tree=cell.tree,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p if p.top_p < 1 else None,
        seed=seed,
        eos_token_id=pair.eos_token_ids if p.stop_at_eos else None,
    )


def calibrate_trees(
    pair: Any, p: FieldPreset, prompts: Sequence[tuple[Category, Prompt]]
) -> dict[str, Any]:
    """ERSD's rank profile (chain:8 on the calibration prompts) and the Tunstall tree of
    :func:`ersd.theory.optimal_tree` at every node budget ``B·L``."""
    import ersd
    from ersd.theory import optimal_tree

    hist: dict[int, int] = defaultdict(int)
    for cat, prompt in prompts:
        ids = encode_prompt(pair.tokenizer, prompt, _template(cat), p.max_prompt_tokens)
        res = ersd.generate(
            pair.target,
            pair.draft,
            ids,
            max_new_tokens=p.calibration_tokens,
            method="ersd",
            tree="chain:8",
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p if p.top_p < 1 else None,
            seed=12345,
        )
        for r in res.ranks:
            hist[int(r)] += 1
    n = sum(hist.values())
    width = max(2, min(64, max(hist) if hist else 2))
    probs = np.zeros(width)
    for r, c in hist.items():
        if 1 <= r <= width:
            probs[r - 1] += c / n
    trees = {}
    for b in p.drafts:
        k = b * p.draft_length
        paths = optimal_tree(probs, k)
        trees[str(k)] = "paths:" + json.dumps([list(x) for x in paths], separators=(",", ":"))
    return {
        "kind": "profile",
        "ranks_observed": n,
        "rank_probs": probs.tolist(),
        "trees": trees,
        "prompts": [pr.id for _c, pr in prompts],
    }


def _cell_record(
    cell: Cell, cat: Category, prompt: Prompt, seed: int, ids: list[int], res: Any, order: int
) -> dict[str, Any]:
    st = res.stats()
    return {
        "kind": "cell",
        "order": order,
        "prompt": prompt.id,
        "category": cat.name,
        "cell": f"{cell.label}/s{seed}",
        "method": cell.method,
        "drafts": cell.drafts,
        "nodes": cell.nodes,
        "tree": cell.tree,
        "seed": seed,
        "prompt_tokens": len(ids),
        "num_tokens": st["num_tokens"],
        "target_calls": st["target_calls"],
        "block_efficiency": st["block_efficiency"],
        "accepted_per_call": [s.num_accepted for s in res.steps],
        "ranks": list(res.ranks) if cell.run_method == "ersd" else None,
        "wall_time": st["wall_time"],
        "tokens": list(res.tokens),
    }


def _contexts_probs(
    pair: Any, p: FieldPreset, ids: list[int], tokens: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced ``p`` and ``q`` (after the sampling filters) at the contexts
    ``ids + tokens[:t]``, ``t < exact_contexts``: one forward of each model."""
    import torch

    from ersd.probs import SamplingParams, logits_to_probs

    n = min(p.exact_contexts, len(tokens))
    params = SamplingParams(
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p if p.top_p < 1 else None
    )
    out = []
    for model in (pair.target, pair.draft):
        session = model.start(ids)
        feed = list(tokens[: n - 1])
        with torch.inference_mode():
            logits = session.score(feed, list(range(-1, len(feed) - 1)))
        out.append(logits_to_probs(logits[:n].float().cpu(), params).numpy())
    return out[0], out[1]


def exact_column(
    target_rows: np.ndarray, draft_rows: np.ndarray, drafts: Sequence[int]
) -> dict[str, Any]:
    """Per context: the exact one-step acceptance of :data:`EXACT_METHODS` at every draft count
    and the i.i.d. optimum (on the union of the two supports)."""
    from ersd.theory.acceptance import acceptance_probability, ersd_rank_joint
    from ersd.theory.optimal_transport import iid_optimum

    ks = sorted(set(drafts))
    cols: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for prow, qrow in zip(target_rows, draft_rows, strict=True):
        live = (prow > 0) | (qrow > 0)
        pp, qq = prow[live] / prow[live].sum(), qrow[live] / qrow[live].sum()
        cols["support"]["1"].append(float(live.sum()))
        cum = np.cumsum(ersd_rank_joint(pp, qq, max(ks)).sum(axis=0))
        for k in ks:
            cols["iid-optimum"][str(k)].append(iid_optimum(pp, qq, k))
            cols["ersd"][str(k)].append(float(min(1.0, cum[k - 1])))
            for m in ("specinfer", "spectr"):
                cols[m][str(k)].append(acceptance_probability(pp, qq, k, m))
            if k <= 2:
                cols["spechub"][str(k)].append(acceptance_probability(pp, qq, k, "spechub"))
        cols["sd"]["1"].append(acceptance_probability(pp, qq, 1, "sd"))
    return {m: {k: list(v) for k, v in d.items()} for m, d in cols.items()}


def run_field(
    p: FieldPreset,
    out: str | Path,
    *,
    pair: Any = None,
    log: Callable[[str], None] = print,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Run (or resume) the preset ``p``, appending records to ``out``; returns the path.

    ``on_record`` is called after each record is written (progress; tests interrupt with it).
    """
    from ersd.bench.models import load_pair

    p.check()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = p.to_dict()
    records = RecordsFile(out, config)
    t0 = time.perf_counter()
    if pair is None:
        models = p.models()
        if p.scale == "smollm":
            models.draft_layers = 10
        pair = load_pair(models)
    log(f"[field] {p.scale}: {getattr(pair, 'description', '')} ({time.perf_counter() - t0:.0f}s)")
    evals = [(c, pr) for c in p.categories for pr in category_prompts(c, "eval", 10**9)]
    by_cat: dict[str, list[tuple[Category, Prompt]]] = defaultdict(list)
    for c, pr in evals:
        by_cat[c.name].append((c, pr))
    # interleave categories so a stopped run has covered each one
    prompts: list[tuple[Category, Prompt]] = []
    for i in range(p.prompts_per_category):
        for c in p.categories:
            if i < len(by_cat[c.name]):
                prompts.append(by_cat[c.name][i])
    for c in p.categories:
        if len(by_cat[c.name]) < p.prompts_per_category:
            log(f"[field] category {c.name}: only {len(by_cat[c.name])} prompts")
    if records.meta is None:
        records.write(
            {
                "kind": "meta",
                "record_version": RECORD_VERSION,
                "config": config,
                "models": getattr(pair, "description", ""),
                "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "cpu_count": os.cpu_count(),
                "threads_env": os.environ.get("OMP_NUM_THREADS"),
                "prompts": [pr.id for _c, pr in prompts],
            }
        )
    else:
        log(f"[field] resuming {out}: {len(records.done)} records kept")
    if records.profile is None and "ersd" in p.methods:
        calib = [(c, pr) for c in p.categories for pr in category_prompts(c, "calib", 1)]
        prof = calibrate_trees(pair, p, calib)
        records.write(prof)
        records.profile = prof
        if on_record:
            on_record(prof)
    trees = {int(k): v for k, v in (records.profile or {}).get("trees", {}).items()}
    plan = cells(p, trees)
    order = len(records.done)
    total = len(prompts) * (len(plan) * len(p.seeds) + (1 if p.exact_contexts else 0))
    for pi, (cat, prompt) in enumerate(prompts):
        ids = encode_prompt(pair.tokenizer, prompt, _template(cat), p.max_prompt_tokens)
        shift = pi % len(plan)  # rotate the order from prompt to prompt (machine drift)
        for cell in plan[shift:] + plan[:shift]:
            for seed in p.seeds:
                key = (prompt.id, f"{cell.label}/s{seed}")
                if key in records.done:
                    continue
                t = time.perf_counter()
                res = _generate(pair, p, cell, ids, seed)
                rec = _cell_record(cell, cat, prompt, seed, ids, res, order)
                records.write(rec)
                records.done[key] = rec
                order += 1
                log(
                    f"[field] {order}/{total} {prompt.id} {cell.label} s{seed}: "
                    f"{rec['block_efficiency']:.3f} tok/call ({time.perf_counter() - t:.1f}s)"
                )
                if on_record:
                    on_record(rec)
        if p.exact_contexts and (prompt.id, "exact") not in records.done:
            first = min(
                (r for (pid, _c), r in records.done.items() if pid == prompt.id and "tokens" in r),
                key=lambda r: r["order"],
            )
            t = time.perf_counter()
            prow, qrow = _contexts_probs(pair, p, ids, first["tokens"])
            rec = {
                "kind": "exact",
                "order": order,
                "prompt": prompt.id,
                "category": cat.name,
                "cell": "exact",
                "contexts_from": first["cell"],
                "contexts": len(prow),
                "acceptance": exact_column(prow, qrow, p.drafts),
            }
            records.write(rec)
            records.done[(prompt.id, "exact")] = rec
            order += 1
            took = time.perf_counter() - t
            log(f"[field] {order}/{total} {prompt.id} exact column ({took:.1f}s)")
            if on_record:
                on_record(rec)
    return out


# --- summary and report -----------------------------------------------------------------------


def _display(method: str) -> str:
    if method == ERSD_TREE:
        return "ERSD, best tree"
    if method == "iid-optimum":
        return "i.i.d. optimum"
    return CATALOG[method].display if method in CATALOG else method


def _order(method: str) -> tuple[int, str]:
    if method == ERSD_TREE:
        return (10_000, method)
    return (report_order(method), method)


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tables from the records: block efficiency per method × draft count with 95% t-intervals
    over prompts (seeds averaged first), paired differences against the best other method, the
    exact one-step acceptances, and the paper's bound per ERSD cell."""
    from ersd.theory import block_efficiency_bound, bound_asymptote

    meta = next((r for r in records if r.get("kind") == "meta"), {})
    cfg = meta.get("config", {})
    length = int(cfg.get("draft_length", 4))
    top_k = int(cfg.get("top_k", 50))
    per: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    inner: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    ranks: list[int] = []
    trees: dict[tuple[str, int], str] = {}
    for r in records:
        if r.get("kind") != "cell":
            continue
        per[(r["method"], r["drafts"])][r["prompt"]].append(r["block_efficiency"])
        # without the last call, which max_new_tokens may cut short: no ceiling at short runs
        calls = r.get("accepted_per_call") or []
        inner[(r["method"], r["drafts"])][r["prompt"]].append(
            1 + float(np.mean(calls[:-1])) if len(calls) > 1 else r["block_efficiency"]
        )
        trees[(r["method"], r["drafts"])] = r["tree"]
        if r["method"] == "ersd" and r.get("ranks"):
            ranks.extend(r["ranks"])
    # only prompts that have every planned cell (a stopped run's last prompt may be partial)
    expected = {
        (m, b)
        for b in cfg.get("drafts", [])
        for m in cfg.get("methods", [])
        if method_shape(m, b, length) is not None
    }
    if "ersd" in cfg.get("methods", []) and any(r.get("kind") == "profile" for r in records):
        expected |= {(ERSD_TREE, b) for b in cfg.get("drafts", [])}
    expected |= set(per)
    complete = set.intersection(*(set(per.get(key, {})) for key in expected)) if expected else set()
    partial = sorted({pid for d in per.values() for pid in d} - complete)
    be: dict[tuple[str, int], dict[str, float]] = {
        key: {pid: float(np.mean(v)) for pid, v in d.items() if pid in complete}
        for key, d in per.items()
        if set(d) & complete
    }
    drafts = sorted({b for _m, b in be})
    methods = sorted({m for m, _b in be}, key=_order)
    table = {
        m: {str(b): interval_record(list(be[(m, b)].values())) for b in drafts if (m, b) in be}
        for m in methods
    }
    table_inner = {
        m: {
            str(b): interval_record(
                [float(np.mean(v)) for pid, v in inner[(m, b)].items() if pid in complete]
            )
            for b in drafts
            if (m, b) in be
        }
        for m in methods
    }
    # ERSD (chain / multi) and ERSD's best tree against the best other method, paired by prompt
    paired: dict[str, dict[str, Any]] = {}
    for b in drafts:
        others = [m for m in methods if m not in ("ersd", ERSD_TREE) and (m, b) in be]
        if not others:
            continue
        best = max(others, key=lambda m: float(np.mean(list(be[(m, b)].values()))))
        row: dict[str, Any] = {"best_other": best}
        for mine in ("ersd", ERSD_TREE):
            if (mine, b) not in be:
                continue
            common = sorted(set(be[(mine, b)]) & set(be[(best, b)]))
            diff = [be[(mine, b)][pid] - be[(best, b)][pid] for pid in common]
            rel = [100 * d / be[(best, b)][pid] for d, pid in zip(diff, common, strict=True)]
            row[mine] = {"diff": interval_record(diff), "percent": interval_record(rel)}
        sd = "sd" if ("sd", 1) in be else None
        if sd and ("ersd", b) in be:
            common = sorted(set(be[("ersd", b)]) & set(be[("sd", 1)]))
            row["ersd_minus_sd"] = interval_record(
                [be[("ersd", b)][pid] - be[("sd", 1)][pid] for pid in common]
            )
        paired[str(b)] = row
    # the paper's bound and asymptote at each ERSD cell, from the measured rank profile
    bound: dict[str, Any] = {}
    if ranks:
        width = max(ranks)
        hist = np.bincount(np.asarray(ranks), minlength=width + 1)[1:].astype(float)
        rank_probs = hist / hist.sum()
        for b in drafts:
            k = b * length
            bound[str(b)] = {
                "nodes": k,
                "bound": block_efficiency_bound(rank_probs, k, top_k),
                "asymptote": bound_asymptote(rank_probs, k),
            }
    # exact one-step acceptance on the same contexts (means over prompts of per-prompt means)
    exact: dict[str, dict[str, Any]] = defaultdict(dict)
    first_exact: dict[str, dict[str, Any]] = {}
    for r in records:  # one exact record per prompt (the first), on prompts with every cell
        if r.get("kind") == "exact" and r["prompt"] in complete:
            first_exact.setdefault(r["prompt"], r)
    ex = list(first_exact.values())
    for r in ex:
        for m, d in r["acceptance"].items():
            for k, vals in d.items():
                exact[m].setdefault(k, []).append(float(np.mean(vals)))
    exact_table = {
        m: {k: interval_record(v) for k, v in d.items()} for m, d in exact.items() if m != "support"
    }
    # the per-node model's block efficiency of multi:BxL from each prompt's exact means:
    # 1 + α(B)·Σ_{d<L} α(1)^d (ersd.theory.per_node_block_efficiency; a prediction, not a
    # measurement: it treats the nodes of a path as independent)
    from ersd.theory import per_node_block_efficiency

    predicted: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in ex:
        for m, d in r["acceptance"].items():
            if m == "support" or ("1" not in d and m != "iid-optimum"):
                continue
            one = d.get("1") or r["acceptance"]["sd"]["1"]
            for k, vals in d.items():
                acc = [float(np.mean(one))] * int(k)
                acc[int(k) - 1] = float(np.mean(vals))
                shape = [int(k)] + [1] * (length - 1)
                predicted[m][k].append(per_node_block_efficiency(shape, acc))
    exact_paired: dict[str, dict[str, Any]] = defaultdict(dict)
    for other in ("iid-optimum", "spectr", "specinfer", "sd"):
        for k in sorted({k for r in ex for k in r["acceptance"].get("ersd", {})}, key=int):
            diff = [
                float(np.mean(r["acceptance"]["ersd"][k]))
                - float(np.mean(r["acceptance"][other].get(k, r["acceptance"]["sd"]["1"])))
                for r in ex
                if k in r["acceptance"][other] or other == "sd"
            ]
            if diff:
                exact_paired[other][k] = interval_record(diff)
    ratio: dict[str, Any] = {}
    for r in ex:
        acc = r["acceptance"]
        for k, vals in acc.get("ersd", {}).items():
            opt = acc["iid-optimum"][k]
            ratio.setdefault(k, []).append(float(np.mean(vals) / max(np.mean(opt), 1e-12)))
    return {
        "config": cfg,
        "models": meta.get("models"),
        "prompts": sorted(complete),
        "partial_prompts_left_out": partial,
        "categories": sorted({r["category"] for r in records if r.get("kind") == "cell"}),
        "drafts": drafts,
        "methods": methods,
        "trees": {f"{m}@B{b}": t for (m, b), t in sorted(trees.items())},
        "block_efficiency": table,
        "block_efficiency_without_last_call": table_inner,
        "paired": paired,
        "bound": bound,
        "exact": exact_table,
        "ersd_over_iid_optimum": {k: interval_record(v) for k, v in ratio.items()},
        "ersd_minus_exact": dict(exact_paired),
        "predicted": {
            m: {k: interval_record(v) for k, v in d.items()} for m, d in predicted.items()
        },
        "exact_contexts": int(sum(r["contexts"] for r in ex)),
    }


def _cellfmt(rec: dict[str, Any] | None, digits: int = 3) -> str:
    if not rec:
        return "—"
    lo, hi = rec["ci95"]
    if rec["n"] < 2 or not math.isfinite(lo):
        return f"{rec['mean']:.{digits}f}"
    return f"{rec['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_tables(s: dict[str, Any]) -> str:
    """The report's tables as Markdown (the papers' form: rows = methods, columns = drafts)."""
    drafts = s["drafts"]
    lines = [
        "Block efficiency (tokens per target call), mean [95% t-interval over prompts]; "
        f"L = {s['config'].get('draft_length')}, B drafts; B = 1 is `chain:L` for every method.",
        "",
        "| method | " + " | ".join(f"B = {b}" for b in drafts) + " |",
        "|---|" + "---|" * len(drafts),
    ]
    for m in s["methods"]:
        row = s["block_efficiency"][m]
        lines.append(
            f"| {_display(m)} | " + " | ".join(_cellfmt(row.get(str(b))) for b in drafts) + " |"
        )
    if s["bound"]:
        lines.append(
            "| paper's bound (log 50 + log(BL+1))/H[R] | "
            + " | ".join(f"{s['bound'][str(b)]['bound']:.2f}" for b in drafts)
            + " |"
        )
        lines.append(
            "| its asymptote log(BL)/H[R] | "
            + " | ".join(f"{s['bound'][str(b)]['asymptote']:.2f}" for b in drafts)
            + " |"
        )
    lines += [
        "",
        "The same without each run's last target call, which the token limit may cut short (at "
        "short runs the full count has a ceiling: N tokens in at least ⌈N/(L+1)⌉ calls): "
        "1 + mean accepted drafts per call over the other calls.",
        "",
        "| method | " + " | ".join(f"B = {b}" for b in drafts) + " |",
        "|---|" + "---|" * len(drafts),
    ]
    for m in s["methods"]:
        row = s.get("block_efficiency_without_last_call", {}).get(m, {})
        lines.append(
            f"| {_display(m)} | " + " | ".join(_cellfmt(row.get(str(b))) for b in drafts) + " |"
        )
    lines += [
        "",
        "Equal node budget (B·L nodes per call): ERSD's `multi:BxL`, ERSD's best tree in the same "
        "budget, and both against the best other method at that budget, paired by prompt "
        "(difference in tokens/call and in %, mean [95% interval]).",
        "",
        "| nodes | best other | its BE | ERSD multi | ERSD − best (%) | ERSD best tree | "
        "tree − best (%) | ERSD − SD |",
        "|---|---|---|---|---|---|---|---|",
    ]
    length = s["config"].get("draft_length", 4)
    for b in drafts:
        row = s["paired"].get(str(b))
        if not row:
            continue
        best = row["best_other"]
        be = s["block_efficiency"]
        lines.append(
            f"| {b * length} | {_display(best)} | {_cellfmt(be[best].get(str(b)))} | "
            f"{_cellfmt(be.get('ersd', {}).get(str(b)))} | "
            f"{_cellfmt((row.get('ersd') or {}).get('percent'), 1)} | "
            f"{_cellfmt(be.get(ERSD_TREE, {}).get(str(b)))} | "
            f"{_cellfmt((row.get(ERSD_TREE) or {}).get('percent'), 1)} | "
            f"{_cellfmt(row.get('ersd_minus_sd'))} |"
        )
    if s["exact"]:
        ks = sorted({int(k) for d in s["exact"].values() for k in d})
        lines += [
            "",
            f"Exact one-step acceptance on the same {s['exact_contexts']} contexts (teacher-"
            "forced on each prompt's first continuation; K drafts at one node; mean over prompts "
            "[95% interval]); the i.i.d. optimum bounds every verifier of i.i.d. drafts "
            "(SpecInfer, SpecTr, GLS), not ERSD or RRS-wor, whose drafts are distinct.",
            "",
            "| method | " + " | ".join(f"K = {k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        for m in sorted(s["exact"], key=lambda m: (m == "iid-optimum", _order(m))):
            row = s["exact"][m]
            lines.append(
                f"| {_display(m)} | " + " | ".join(_cellfmt(row.get(str(k))) for k in ks) + " |"
            )
        r = s["ersd_over_iid_optimum"]
        lines.append(
            "| ERSD ÷ i.i.d. optimum | " + " | ".join(_cellfmt(r.get(str(k))) for k in ks) + " |"
        )
        for other, row in s.get("ersd_minus_exact", {}).items():
            what = "SD at K = 1 (1 − TV)" if other == "sd" else _display(other)
            lines.append(
                f"| ERSD − {what}, paired | "
                + " | ".join(_cellfmt(row.get(str(k))) for k in ks)
                + " |"
            )
        lines += [
            "",
            f"Per-node model from the same contexts: block efficiency of `multi:Kx{length}` "
            f"predicted as 1 + α(K)·Σ_(d<{length}) α(1)^d with each method's exact means (a "
            "prediction that treats a path's nodes as independent, not a measurement; the "
            r"i.i.d. optimum row uses α\* at the root and 1 − TV below).",
            "",
            "| method | " + " | ".join(f"K = {k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks),
        ]
        for m in sorted(s["predicted"], key=lambda m: (m == "iid-optimum", _order(m))):
            row = s["predicted"][m]
            lines.append(
                f"| {_display(m)} | " + " | ".join(_cellfmt(row.get(str(k))) for k in ks) + " |"
            )
    return "\n".join(lines) + "\n"


def plot(s: dict[str, Any], path: str | Path) -> Path:
    """Block efficiency vs drafts per method (95% intervals), the paper's bound, and the
    per-node model's i.i.d.-optimal verifier from the exact column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafts = s["drafts"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in s["methods"]:
        row = s["block_efficiency"][m]
        xs = [b for b in drafts if str(b) in row]
        if not xs:
            continue
        ys = [row[str(b)]["mean"] for b in xs]
        lows = [
            row[str(b)]["ci95"][0] if row[str(b)]["n"] > 1 else y
            for y, b in zip(ys, xs, strict=True)
        ]
        highs = [
            row[str(b)]["ci95"][1] if row[str(b)]["n"] > 1 else y
            for y, b in zip(ys, xs, strict=True)
        ]
        err = [
            [y - lo for y, lo in zip(ys, lows, strict=True)],
            [hi - y for y, hi in zip(ys, highs, strict=True)],
        ]
        colour = CATALOG[m if m in CATALOG else "ersd"].colour
        style = "--" if m == ERSD_TREE else "-"
        ax.errorbar(xs, ys, yerr=err, label=_display(m), color=colour, ls=style, marker="o", ms=3)
    length = s["config"].get("draft_length", 4)
    opt = s["exact"].get("iid-optimum", {})
    one = s["exact"].get("sd", {}).get("1")
    if opt and one:
        a1 = one["mean"]
        xs = [b for b in drafts if str(b) in opt]
        ys = [1 + opt[str(b)]["mean"] * sum(a1**d for d in range(length)) for b in xs]
        ax.plot(xs, ys, color="black", ls=":", label="i.i.d. optimum at the root (per-node model)")
    if s["bound"]:
        ax.plot(
            drafts,
            [s["bound"][str(b)]["bound"] for b in drafts],
            color="grey",
            ls="-.",
            label="paper's bound (ERSD)",
        )
    ax.set_xlabel(f"drafts B (L = {length}; node budget B·L)")
    ax.set_ylabel("block efficiency (tokens / target call)")
    ax.set_xticks(drafts)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{s['models']}".split(" (")[0], fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(records_path: str | Path | Sequence[str | Path], out_dir: str | Path) -> Path:
    """``summary.json``, ``tables.md`` and ``block_efficiency_vs_drafts.png`` in ``out_dir``.

    With several records files, the first gives the settings and the measured cells, and the
    ``exact`` records of all of them are read (e.g. a measured run and an exact-column run on
    the same prompts); cells of the other files are left out, so no cell mixes two runs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [records_path] if isinstance(records_path, str | Path) else list(records_path)
    recs = read_records(paths[0])
    recs += [r for path in paths[1:] for r in read_records(path) if r.get("kind") == "exact"]
    s = summarise(recs)
    if not s["block_efficiency"]:
        raise BenchConfigError(f"{paths[0]} holds no cell records yet; run the preset first")
    (out_dir / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    (out_dir / "tables.md").write_text(format_tables(s))
    plot(s, out_dir / "block_efficiency_vs_drafts.png")
    return out_dir


def describe_plan(p: FieldPreset) -> list[str]:
    """What the preset runs, for ``--dry-run``."""
    plan = cells(p, {b * p.draft_length: "(from calibration)" for b in p.drafts})
    lines = [p.description, f"models: {p.target} <- {p.draft}"]
    lines += [f"category {c.name}: {c.source}" for c in p.categories]
    lines.append(
        f"{p.prompts_per_category} prompts per category x {len(p.seeds)} seeds; "
        f"{p.max_new_tokens} new tokens; top-k {p.top_k}, top-p {p.top_p}, T = {p.temperature}"
    )
    lines += [f"  {c.label:18s} {c.tree}" for c in plan]
    lines.append(f"exact column: {p.exact_contexts} contexts per prompt")
    return lines


__all__ = [
    "FIELD_METHODS",
    "SCALES",
    "Category",
    "Cell",
    "FieldPreset",
    "cells",
    "preset",
    "run_field",
    "summarise",
    "write_report",
]
