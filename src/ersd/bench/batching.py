"""Batched runs of ``ersd bench run``: ``run.batch_sizes`` beyond ``[1]``.

At batch size ``B`` one run generates for ``B`` prompts together
(:func:`ersd.bench.planning.prompt_groups`: consecutive prompts of the set, cycling when it has
fewer), for every planned configuration side by side, through

* ``target-only``: :func:`ersd.generate_batch` without a draft (batched target-only decoding);
* ``hf-generate``: Hugging Face ``generate`` of the target on the left-padded batch
  (:func:`ersd.bench.baselines.hf_generate`, same models, dtype and sampling settings);
* every method / tree: :func:`ersd.generate_batch` with the draft model.

Row ``j`` of batch ``g`` is slot ``i = g·B + j`` of the pass over the prompts and uses the seed
:func:`ersd.derive_seed` ``(seed, i)``, whatever ``B``: a prompt's tokens are the same at every
batch size (batch invariance), only the speed differs.

One ``kind = "batch"`` record per run holds ``batch_size``, the total new tokens, the wall
seconds, total tokens/s, the forward seconds and calls of the target and the draft (the models'
own ``forward_seconds`` / ``forward_calls`` counters where they keep them, i.e. the Hugging Face
adapter; else the engine's per-step scoring and drafting times: ``time_source``), and ``other``
seconds (wall minus forwards): the time split of the report (:mod:`ersd.bench.batch_report`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ersd
from ersd.bench.baselines import hf_generate
from ersd.bench.models import ModelPair
from ersd.bench.planning import Entry, batch_plan, entry_fields, prompt_groups
from ersd.bench.prompts import Prompt
from ersd.methods.ersd import with_sharpness


def row_seeds(seed: int, group: list[int], index: int, batch_size: int) -> list[int]:
    """The seeds of batch ``index`` (rows are slots ``index·B + j`` of the pass)."""
    return [ersd.derive_seed(seed, index * batch_size + j) for j in range(len(group))]


class _Counter:
    """Forward calls and seconds a model spent since it was made (``None`` where the model keeps
    no counters, or where draft and target are one object)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls0 = getattr(model, "forward_calls", None)
        self.seconds0 = getattr(model, "forward_seconds", None)

    def delta(self) -> tuple[int | None, float | None]:
        calls = getattr(self.model, "forward_calls", None)
        secs = getattr(self.model, "forward_seconds", None)
        return (
            None if calls is None or self.calls0 is None else int(calls - self.calls0),
            None if secs is None or self.seconds0 is None else float(secs - self.seconds0),
        )


def _engine_times(results: list[ersd.GenerationResult]) -> tuple[float, float]:
    """(target, draft) seconds of the engine's steps: all rows start together, so step ``j`` of
    every row is engine step ``j``, whose shared times every row's record carries."""
    steps = max(len(r.steps) for r in results)
    target = draft = 0.0
    for j in range(steps):
        recs = [r.steps[j] for r in results if len(r.steps) > j]
        target += max(s.target_time for s in recs)
        draft += max(s.draft_time for s in recs)
    return target, draft


def run_batch_entry(
    entry: Entry,
    pair: ModelPair,
    prompts: list[list[int]],
    seeds: list[int],
    temperature: float,
    max_new_tokens: int,
    eos: list[int] | None,
    sharpness: float = 1.0,
) -> dict[str, Any]:
    """Run one configuration on one batch of prompts; the measured fields of its record (ERSD's
    drafter races ``q**sharpness``)."""
    if entry.method == "hf-generate":
        return hf_generate(
            pair.target,
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seeds[0],
            eos_token_id=eos,
        )
    drafted = entry.method != "target-only"
    draft = pair.draft if drafted and pair.draft is not pair.target else None
    tc, dc = _Counter(pair.target), _Counter(draft)
    t0 = time.perf_counter()
    results = ersd.generate_batch(
        pair.target,
        pair.draft if drafted else None,
        prompts,
        seeds=seeds,
        max_new_tokens=max_new_tokens,
        method=with_sharpness(entry.method, sharpness) if drafted else "ersd",
        tree=pair.tree(entry.shape or entry.tree or "chain:1") if drafted else "chain:1",
        temperature=temperature,
        eos_token_id=eos,
    )
    wall = time.perf_counter() - t0
    (t_calls, t_secs), (d_calls, d_secs) = tc.delta(), dc.delta()
    e_target, e_draft = _engine_times(results)
    source = "forward_seconds"
    if t_secs is None or (drafted and d_secs is None):
        source, t_secs, d_secs = "engine", e_target, e_draft
    d_secs = d_secs or 0.0
    total = sum(len(r.tokens) for r in results)
    calls = sum(r.target_calls for r in results)
    fields: dict[str, Any] = {
        "num_tokens": total,
        "tokens": [list(r.tokens) for r in results],
        "finish_reasons": [r.finish_reason for r in results],
        "steps": max(r.target_calls for r in results),
        "target_calls": calls,
        "block_efficiency": total / calls if calls else 0.0,
        "target_forwards": t_calls,
        "draft_forwards": d_calls if drafted else 0,
        "wall_time": wall,
        "target_forward_time": t_secs,
        "draft_forward_time": d_secs,
        "other_time": max(wall - t_secs - d_secs, 0.0),
        "engine_target_time": e_target,
        "engine_draft_time": e_draft,
        "time_source": source,
        "tokens_per_second": total / wall if wall > 0 else float("inf"),
    }
    if entry.method == "ersd":
        fields["ranks"] = [[list(s.ranks) for s in r.steps] for r in results]
    if str(entry.tree or "").startswith("auto"):
        fields.update(auto_summary(results))
    return fields


def auto_summary(results: list[ersd.GenerationResult]) -> dict[str, Any]:
    """What ``tree="auto"`` chose in a batched run and what it predicted: the trees chosen
    (row-steps per tree), the mean over engine steps of the predicted tokens/s of the batch
    (each step's prediction for its own batch size; the rows of a step share one forward), and
    the like-for-like check of the cost model over the **decode steps** (every engine step after
    the first, which feeds the rows' prompts — prefill, outside what the model predicts):
    predicted tokens/s = Σ predicted new tokens ÷ Σ predicted step seconds of the decisions
    taken, measured tokens/s = Σ new tokens ÷ Σ step seconds of the same steps."""
    trees: dict[str, int] = {}
    per_step: list[float] = []
    pred_tokens = pred_secs = tokens = secs = 0.0
    decode_steps = 0
    for j in range(max((len(r.steps) for r in results), default=0)):
        recs = [r.steps[j] for r in results if len(r.steps) > j]
        preds = []
        for s in recs:
            if s.choice:
                trees[s.choice["tree"]] = trees.get(s.choice["tree"], 0) + 1
                preds.append(float(s.choice["predicted"]))
        if preds:
            per_step.append(sum(preds) / len(preds))
        choice = next((s.choice for s in recs if s.choice), None)  # shared by the batch
        if j > 0 and choice and choice.get("predicted_seconds"):
            pred_tokens += float(choice["predicted_tokens"])
            pred_secs += float(choice["predicted_seconds"])
            tokens += sum(len(s.tokens) for s in recs)
            secs += max(s.total_time for s in recs)
            decode_steps += 1
    out: dict[str, Any] = {
        "auto_trees": dict(sorted(trees.items(), key=lambda kv: -kv[1])),
        "auto_predicted_tokens_per_second": sum(per_step) / len(per_step) if per_step else None,
    }
    if pred_secs > 0 and secs > 0:
        out["auto_decode"] = {
            "steps": decode_steps,
            "predicted_tokens": pred_tokens,
            "predicted_seconds": pred_secs,
            "tokens": tokens,
            "seconds": secs,
        }
    return out


def count_runs(
    plans: dict[float, list[Entry]], n_prompts: int, sizes: list[int], seeds: int
) -> int:
    per_temp = sum(len(prompt_groups(n_prompts, b)) for b in sizes)
    return sum(len(v) for v in plans.values()) * per_temp * seeds


def warm_up(
    plans: dict[float, list[Entry]],
    pair: ModelPair,
    encoded: list[list[int]],
    sizes: list[int],
    tokens: int,
    eos: list[int] | None,
    bar: Any,
    log: Callable[[str], None],
    sharpness: float = 1.0,
) -> None:
    """Every configuration once per batch size, untimed (kernels and shapes of each size); a
    configuration that fails here is logged, and its timed runs record the error.  With a
    ``tree="auto"`` entry the cost curves of every batch size a run can pass through (rows
    finish one by one) are measured here, not inside a timed run."""
    if any(str(e.tree or "").startswith("auto") for es in plans.values() for e in es):
        from ersd.auto import draft_model_of, prepare_costs
        from ersd.generation import as_drafter

        draft = draft_model_of(as_drafter(pair.draft)) if pair.draft is not pair.target else None
        prepare_costs(pair.target, draft, encoded[0], max(sizes), pair.curves)
    for temp, entries in plans.items():
        for b, e in batch_plan(entries, sizes):
            bar.set_postfix_str(f"T={temp} B={b} {e.label}")
            group = prompt_groups(len(encoded), b)[0]
            batch = [encoded[i] for i in group]
            try:
                seeds = row_seeds(0, group, 0, b)
                run_batch_entry(e, pair, batch, seeds, temp, tokens, eos, sharpness)
            except (RuntimeError, ValueError, MemoryError, ersd.ErsdError) as exc:
                log(f"[bench] warm-up of T={temp} B={b} {e.label} failed: {exc}")
            bar.update()


def run_batches(
    plans: dict[float, list[Entry]],
    pair: ModelPair,
    prompts: list[Prompt],
    encoded: list[list[int]],
    *,
    sizes: list[int],
    seeds: list[int],
    max_new_tokens: int,
    eos: list[int] | None,
    write: Callable[[dict[str, Any]], None],
    bar: Any,
    log: Callable[[str], None],
    sharpness: float = 1.0,
) -> tuple[int, int]:
    """Every batch of every size, configurations side by side and rotated from batch to batch;
    one record per run through ``write``.  Returns (records written, failed runs)."""
    order = errors = rotation = 0
    for seed in seeds:
        for temp, entries in plans.items():
            for b in sizes:
                for gi, group in enumerate(prompt_groups(len(encoded), b)):
                    shift = rotation % len(entries)
                    rotation += 1
                    batch = [encoded[i] for i in group]
                    per_row = row_seeds(seed, group, gi, b)
                    for e in entries[shift:] + entries[:shift]:
                        bar.set_postfix_str(f"T={temp} s={seed} B={b} #{gi} {e.label}")
                        try:
                            fields = run_batch_entry(
                                e, pair, batch, per_row, temp, max_new_tokens, eos, sharpness
                            )
                        except (RuntimeError, ValueError, MemoryError, ersd.ErsdError) as exc:
                            fields = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                            errors += 1
                            log(f"[bench] T={temp} B={b} batch {gi} {e.label} failed: {exc}")
                        rec = {
                            "kind": "batch",
                            "batch_size": b,
                            "group": gi,
                            "prompt_ids": [prompts[i].id for i in group],
                            "prompt_tokens": [len(x) for x in batch],
                            "row_seeds": per_row,
                            "temperature": temp,
                            "seed": seed,
                            "max_new_tokens": max_new_tokens,
                            **entry_fields(e),
                            "order": order,
                            "timestamp": time.time(),
                            **fields,
                            "method": e.method,
                        }
                        if e.prediction is not None:
                            rec["prediction"] = e.prediction
                        write(rec)
                        order += 1
                        bar.update()
    return order, errors
