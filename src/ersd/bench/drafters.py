"""Benchmark pieces for drafters that are not (only) a model: entries, the Hugging Face
prompt-lookup baseline, per-source statistics in the records, and a user's own prompt file.

* ``run.drafters`` lists drafter specs (:mod:`ersd.drafting.spec`); the word ``draft`` in a spec
  is the config's draft model (``lookup+draft`` = hybrid with it).  Each spec runs with every
  method of ``run.methods`` at every budget (its natural shapes, as the model drafter).
* ``hf-prompt-lookup`` in ``run.baselines``: ``model.generate(prompt_lookup_num_tokens=k,
  max_matching_ngram_size=3)`` on the same target, same sampling settings, k = each budget.
* ``prompts.file``: a JSONL file of ``{"prompt": ..., "id"?: ..., "domain"?: ...}`` lines (or a
  plain text file: one prompt per paragraph, separated by blank lines).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ersd.bench.baselines import _ForwardTimer, neutral_generation_config, timed_generate
from ersd.bench.errors import BenchConfigError
from ersd.drafting import Drafter, DrafterConfigError, parse_drafter

#: the n-gram size of the HF prompt-lookup baseline (= LookupDrafter's default ``n``)
HF_LOOKUP_NGRAM = 3
#: the name of the config's draft model inside a drafter spec
DRAFT_WORD = "draft"


def check_drafter_spec(spec: str) -> None:
    """Raise :class:`BenchConfigError` if ``spec`` is not a valid ``run.drafters`` entry."""

    def load(name: str) -> Any:
        if name != DRAFT_WORD:
            raise DrafterConfigError(
                f"the model part of a bench drafter spec must be '{DRAFT_WORD}' (the config's "
                f"models.draft), got {name!r}; e.g. 'lookup+draft'"
            )
        return _Placeholder()

    try:
        parse_drafter(spec, load_model=load)
    except DrafterConfigError as exc:
        raise BenchConfigError(f"run.drafters entry {spec!r}: {exc}") from None


class _Placeholder:
    """Stands in for the draft model while a spec is only validated."""

    vocab_size = 1

    def start(self, prompt: Sequence[int]) -> Any:  # pragma: no cover - never started
        raise AssertionError


def make_drafter(spec: str, draft_model: Any) -> Drafter:
    """A fresh drafter for one run (its statistics and cost model start empty)."""
    return parse_drafter(spec, load_model=lambda name: draft_model)


def drafter_fields(drafter: Any) -> dict[str, Any]:
    """Record fields of a drafter: per-source statistics and (hybrid) the mixes chosen."""
    out: dict[str, Any] = {}
    stats = getattr(drafter, "stats", None)
    if stats is not None:
        out["drafter_stats"] = stats.as_dict()
    mixes = getattr(drafter, "mixes", None)
    if mixes is not None:
        out["drafter_mixes"] = dict(mixes)
    return out


def load_prompt_file(path: str | Path) -> list[dict[str, str]]:
    """Rows ``{"id", "domain", "prompt"}`` of a user's prompt file (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise BenchConfigError(f"prompts.file {str(p)!r} does not exist; give a path to a file")
    text = p.read_text(encoding="utf-8")
    rows: list[dict[str, str]] = []
    if p.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchConfigError(
                    f"prompts.file {p.name} line {i}: not JSON ({exc})"
                ) from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise BenchConfigError(
                    f'prompts.file {p.name} line {i}: expected an object with a "prompt" string'
                )
            rows.append(
                {
                    "id": str(row.get("id", f"{p.stem}/{len(rows)}")),
                    "domain": str(row.get("domain", "chat")),
                    "prompt": row["prompt"],
                }
            )
    else:
        for block in text.split("\n\n"):
            if block.strip():
                rows.append({"id": f"{p.stem}/{len(rows)}", "domain": "chat", "prompt": block})
    if not rows:
        raise BenchConfigError(f"prompts.file {p.name} holds no prompts")
    return rows


def hf_prompt_lookup(
    target: Any,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    num_tokens: int,
    eos_token_id: Sequence[int] | None,
    ngram: int = HF_LOOKUP_NGRAM,
) -> dict[str, Any]:
    """Hugging Face prompt-lookup decoding on the same target; a record-ready dict.

    Same neutral sampling settings as :func:`ersd.bench.baselines.hf_assisted`; no draft model.
    """

    from ersd.models.hf import HFModel

    if not isinstance(target, HFModel):
        raise TypeError(
            "hf_prompt_lookup needs a Hugging Face target (ersd.models.hf.HFModel), got "
            f"{type(target).__name__}"
        )
    tm = target.hf_module
    eos = list(eos_token_id or [])
    gen_cfg = neutral_generation_config(
        temperature,
        max_new_tokens,
        eos,
        prompt_lookup_num_tokens=num_tokens,
        max_matching_ngram_size=ngram,
    )
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=target.device)
    timer = _ForwardTimer(tm)
    out, wall, caught = timed_generate(
        tm,
        seed,
        [timer],
        inputs=ids,
        attention_mask=torch.ones_like(ids),
        generation_config=gen_cfg,
    )
    tokens = [int(t) for t in out[0, ids.shape[1] :]]
    calls = timer.calls
    return {
        "method": "hf-prompt-lookup",
        "num_tokens": len(tokens),
        "target_calls": calls,
        "draft_forwards": 0,
        "block_efficiency": len(tokens) / calls if calls else 0.0,
        "mean_accepted": (len(tokens) - calls) / calls if calls else 0.0,
        "wall_time": wall,
        "draft_time": 0.0,  # the n-gram search is inside HF's loop: counted in other_time
        "target_time": timer.seconds,
        "other_time": max(wall - timer.seconds, 0.0),
        "tokens_per_second": len(tokens) / wall if wall > 0 else float("inf"),
        "finish_reason": "eos" if tokens and tokens[-1] in eos else "length",
        "tokens": tokens,
        "hf_warnings": caught,
    }
