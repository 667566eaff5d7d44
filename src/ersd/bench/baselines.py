"""Baselines that are not a verification method of the registry.

* :func:`target_only_two_token` — target-only sampling that pays a **two-token** forward per token.
  On CPUs a one-row bfloat16 matrix product hits a slower kernel than a two-row one, so plain
  one-token decoding is slower than it needs to be and flatters every speedup (about 1.2× on the
  reference machine, ``shared/reference/models.md``).  This decoder scores the pending token plus
  one throw-away node in each forward and keeps only the root row, so its tokens are the
  target-only race samples (same keys as :func:`ersd.generate` with ``draft=None``) at the cheaper
  per-token cost.
* :func:`hf_assisted` — Hugging Face assisted generation (``model.generate(assistant_model=...)``,
  Leviathan-style speculative sampling at T > 0, greedy matching at T = 0) with a constant
  ``num_assistant_tokens = k``, timed with forward hooks.
* :func:`hf_generate` — plain Hugging Face ``generate`` of the target for one prompt or a
  left-padded batch of prompts (the batched-decoding baseline of ``run.batch_sizes``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

import ersd
from ersd.results import GenerationResult


def target_only_two_token(
    target: Any,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    eos_token_id: Sequence[int] | None = None,
) -> GenerationResult:
    """Target-only race sampling where every forward feeds two tokens (see module docstring)."""
    return ersd.generate(
        target,
        None,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        eos_token_id=eos_token_id,
        min_forward_tokens=2,
        label="target-only-2tok",
    )


def neutral_generation_config(
    temperature: float, max_new_tokens: int, eos: list[int], **extra: Any
) -> Any:
    """A transformers ``GenerationConfig`` that samples the plain target law at ``temperature``.

    Every filter is set to its neutral value explicitly: ``None`` would be filled in from the
    model's own generation config (Qwen's ships top_k=20, top_p=0.8, repetition_penalty=1.1).
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        min_new_tokens=None if eos else max_new_tokens,
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else 0,
        **extra,
    )


class _ForwardTimer:
    """Counts and times the top-level forward calls of a torch module (pre/post hooks)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._t0 = 0.0
        self._handles = [
            module.register_forward_pre_hook(self._pre),
            module.register_forward_hook(self._post),
        ]

    def _pre(self, *args: Any) -> None:
        self._t0 = time.perf_counter()

    def _post(self, *args: Any) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._t0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def timed_generate(
    tm: Any, seed: int, timers: Sequence[_ForwardTimer], **kwargs: Any
) -> tuple[Any, float, list[str]]:
    """``tm.generate(**kwargs)`` under torch seed ``seed`` (the global RNG restored afterwards):
    its output, wall seconds and the distinct warnings it raised; ``timers`` are removed after."""
    try:
        with warnings.catch_warnings(record=True) as wlist, torch.random.fork_rng(devices=[]):
            warnings.simplefilter("always")
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = tm.generate(**kwargs)
            wall = time.perf_counter() - t0
            caught = sorted({str(w.message)[:200] for w in wlist})
    finally:
        for timer in timers:
            timer.remove()
    return out, wall, caught


def hf_assisted(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    num_assistant_tokens: int,
    eos_token_id: Sequence[int] | None,
) -> dict[str, Any]:
    """Hugging Face assisted generation on the same models; a record-ready dict of statistics.

    Sampling is plain temperature sampling (top-k/top-p/repetition penalty of the models'
    generation configs are switched off) so that it matches the other methods.  Without
    ``eos_token_id`` EOS is suppressed (``min_new_tokens``) so every run makes the same number of
    tokens.  The seed goes to a forked torch RNG (HF samples from the global generator).
    """
    from transformers import GenerationConfig

    from ersd.models.hf import HFModel

    if not (isinstance(target, HFModel) and isinstance(draft, HFModel)):
        raise TypeError(
            "hf_assisted needs two Hugging Face models (ersd.models.hf.HFModel), got "
            f"{type(target).__name__} and {type(draft).__name__}"
        )
    tm, dm = target.hf_module, draft.hf_module
    eos = list(eos_token_id or [])
    gen_cfg = neutral_generation_config(temperature, max_new_tokens, eos)
    saved = dm.generation_config
    dm.generation_config = GenerationConfig(
        **{
            **saved.to_dict(),
            "num_assistant_tokens": num_assistant_tokens,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }
    )
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=target.device)
    t_timer, d_timer = _ForwardTimer(tm), _ForwardTimer(dm)
    try:
        out, wall, caught = timed_generate(
            tm,
            seed,
            [t_timer, d_timer],
            inputs=ids,
            attention_mask=torch.ones_like(ids),
            assistant_model=dm,
            generation_config=gen_cfg,
        )
    finally:
        dm.generation_config = saved
    tokens = [int(t) for t in out[0, ids.shape[1] :]]
    calls = t_timer.calls
    other = max(wall - t_timer.seconds - d_timer.seconds, 0.0)
    return {
        "method": "hf-assisted",
        "num_tokens": len(tokens),
        "target_calls": calls,
        "draft_forwards": d_timer.calls,
        "block_efficiency": len(tokens) / calls if calls else 0.0,
        "mean_accepted": (len(tokens) - calls) / calls if calls else 0.0,
        "wall_time": wall,
        "draft_time": d_timer.seconds,
        "target_time": t_timer.seconds,
        "other_time": other,
        "tokens_per_second": len(tokens) / wall if wall > 0 else float("inf"),
        "finish_reason": "eos" if tokens and tokens[-1] in eos else "length",
        "tokens": tokens,
        "hf_warnings": caught,
    }


def hf_generate(
    target: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    eos_token_id: Sequence[int] | None,
) -> dict[str, Any]:
    """Hugging Face ``generate`` of the target alone on a batch of prompts; record-ready stats.

    The prompts are left-padded into one batch (``attention_mask`` zero on the padding, so the
    model derives each row's positions from it) and decoded together with the neutral generation
    config (:func:`neutral_generation_config`: plain temperature sampling, ``do_sample`` only at
    T > 0).  Without ``eos_token_id`` every row makes exactly ``max_new_tokens`` tokens; with it a
    row's tokens end at its first EOS.  HF samples from the global torch generator, so ``seed``
    seeds a forked one for the whole batch (rows get no per-row seeds: the baseline is about
    speed, not about reproducing ersd's tokens).  Forward calls and seconds come from hooks on the
    transformers module.
    """
    from ersd.models.hf import HFModel

    if not isinstance(target, HFModel):
        raise TypeError(
            f"hf_generate needs a Hugging Face model (ersd.models.hf.HFModel), got "
            f"{type(target).__name__}"
        )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("hf_generate needs one or more non-empty prompts")
    tm = target.hf_module
    eos = list(eos_token_id or [])
    gen_cfg = neutral_generation_config(temperature, max_new_tokens, eos)
    width = max(len(p) for p in prompts)
    pad = int(gen_cfg.pad_token_id)
    ids = torch.tensor(
        [[pad] * (width - len(p)) + list(p) for p in prompts],
        dtype=torch.long,
        device=target.device,
    )
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts],
        dtype=torch.long,
        device=ids.device,
    )
    timer = _ForwardTimer(tm)
    out, wall, caught = timed_generate(
        tm, seed, [timer], inputs=ids, attention_mask=mask, generation_config=gen_cfg
    )
    rows: list[list[int]] = []
    finish: list[str] = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), None)
        rows.append([int(t) for t in row[:cut]] if cut else [int(t) for t in row])
        finish.append("eos" if cut else "length")
    total = sum(len(r) for r in rows)
    return {
        "num_tokens": total,
        "tokens": rows,
        "finish_reasons": finish,
        "steps": timer.calls,  # one forward per decoding step of the whole batch
        "target_calls": timer.calls * len(prompts),  # a target call per row per step
        "block_efficiency": total / (timer.calls * len(prompts)) if timer.calls else 0.0,
        "target_forwards": timer.calls,
        "draft_forwards": 0,
        "wall_time": wall,
        "target_forward_time": timer.seconds,
        "draft_forward_time": 0.0,
        "other_time": max(wall - timer.seconds, 0.0),
        "time_source": "hooks",
        "tokens_per_second": total / wall if wall > 0 else float("inf"),
        "hf_warnings": caught,
    }
