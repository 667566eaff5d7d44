"""``ersd generate``'s configuration choice (``--config auto``) and its identity report: whether
the loaded target keeps ERSD's text equal to target-only sampling, said before the run, and how
close the text came to a flip, said after it (:mod:`ersd.precision`,
:mod:`ersd.config_choice`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

#: the probe text of the identity check: ~100 tokens, so that the first call (prompt and tree
#: together) is as wide as real ones (llama.cpp's attention changes kernel from 64 tokens a call)
PROBE = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number, computed iteratively."""\n'
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "def is_palindrome(text):\n    cleaned = [c.lower() for c in text if c.isalnum()]\n"
    "    return cleaned == cleaned[::-1]\n\n\nclass Stack:\n    def __init__(self):\n"
    "        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n"
)


def apply_config_auto(models: Any, tree: str, temperature: float, log: Any) -> tuple[Any, str]:
    """``--config auto``: the target/draft dtypes and the tree chosen by this machine's stored
    measurements (:func:`ersd.config_choice.choose_config`); refuses options it sets."""
    from click.core import ParameterSource

    from ersd.config_choice import choose_config

    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("dtype", "draft_dtype", "tree")
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
    ]
    if given:
        raise click.UsageError(
            f"--config auto chooses {', '.join(given)} itself; drop {' and '.join(given)} or "
            "--config auto"
        )
    if models.backend != "hf" or not models.has_draft:
        raise click.UsageError(
            "--config auto chooses PyTorch dtypes for a target and a draft model; with "
            "--backend llamacpp or no draft use --tree auto instead"
        )
    choice = choose_config(models.target, models.draft, temperature=temperature)
    log(f"[{choice.summary()}]")
    return replace(models, dtype=choice.dtype, draft_dtype=choice.draft_dtype), choice.tree


def identity_before_run(pair: Any, method: Any, log: Any) -> Any:
    """The target's identity check (recorded per model and machine, measured once), said before
    an ERSD run with a draft; None when there is nothing to say (no draft, another method)."""
    from ersd.config_choice import ROUNDING_TOLERANCE
    from ersd.methods.ersd import ERSD
    from ersd.precision import IdentityRecords, checked_identity

    meth = method
    if pair.draft is None or not (meth == "ersd" or isinstance(meth, ERSD)):
        return None
    probe = [int(t) for t in pair.target.tokenizer.encode(PROBE)]
    check = checked_identity(pair.target, probe, IdentityRecords.default())
    if check.max_abs_diff <= ROUNDING_TOLERANCE:
        log(f"[identity: {check.summary()}]")
    else:
        log(f"[identity: WARNING, {check.summary()}]")
    return check


def margins_after_run(
    pair: Any, request: Any, tokens: list[int], check: Any, log: Any
) -> dict[str, Any]:
    """The smallest race margin of ``tokens`` (generated for ``request``, an
    :class:`ersd.request.Request`) against the measured error (nothing when the rows were
    bit-identical: no flip is possible)."""
    from ersd.precision import race_margins

    if check is None:
        return {}
    out: dict[str, Any] = {"identity": check.to_dict()}
    if check.identical:
        return out
    if request.race_scheme != "v1":  # the margins replay the races through the v1 audit
        log(
            f"  race margins        not computed: the margin replay draws race scheme v1 and "
            f"this text used {request.race_scheme}; rerun with --race-scheme v1 to tell an "
            "identical text from a lucky one"
        )
        out["margins"] = None
        return out
    params = request.sampling
    rep = race_margins(
        pair.target,
        request.prompt,
        tokens,
        error=check.max_abs_diff,
        seed=request.seed,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        watermark=request.watermark,
    )
    log(f"  race margins        {rep.summary()}")
    out["margins"] = rep.to_dict()
    return out
