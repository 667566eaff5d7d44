"""``ersd generate``'s configuration choice (``--config auto``) and its identity report: whether
the loaded target keeps ERSD's text equal to target-only sampling, said before the run, and how
close the text came to a flip, said after it (:mod:`ersd.precision`,
:mod:`ersd.config_choice`)."""

from __future__ import annotations

import time
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
    sets = (
        ("batch_policy", "tree")
        if models.backend == "llamacpp"
        else ("dtype", "draft_dtype", "tree")
    )
    given = [
        f"--{name.replace('_', '-')}"
        for name in sets
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
    ]
    if given:
        raise click.UsageError(
            f"--config auto chooses {', '.join(given)} itself; drop {' and '.join(given)} or "
            "--config auto"
        )
    if not models.has_draft:
        raise click.UsageError(
            "--config auto chooses how a target runs with a draft; with --draft none there is "
            "nothing to choose: drop --config auto"
        )
    if models.backend == "llamacpp":  # chosen once the models are loaded: choose_llamacpp_policy
        return models, "auto"
    choice = choose_config(models.target, models.draft, temperature=temperature)
    log(f"[{choice.summary()}]")
    return replace(models, dtype=choice.dtype, draft_dtype=choice.draft_dtype), choice.tree


def choose_llamacpp_policy(pair: Any, temperature: float, log: Any) -> tuple[Any, str]:
    """``--config auto`` with ``--backend llamacpp``, once the exact-policy target and the draft
    are loaded: keep them and draft with ``tree="auto"``, or -- where the stored measurements say
    no draft repays the exact policy's forwards -- reload the target with llama.cpp's fast policy
    and run it target-only (:func:`ersd.config_choice.choose_llamacpp`)."""
    import ersd
    from ersd.auto import draft_model_of
    from ersd.config_choice import choose_llamacpp

    draft = draft_model_of(pair.draft) if pair.draft is not None else None
    choice = choose_llamacpp(pair.target, draft, temperature=temperature)
    if choice.candidate.batch_policy == "fast":
        t0 = time.perf_counter()
        target = ersd.load_model(
            pair.args.target, backend="llamacpp", threads=pair.target.threads, exact=False
        )
        pair = replace(
            pair,
            args=replace(pair.args, batch_policy="fast", draft="none"),
            target=target,
            draft=None,
            seconds=pair.seconds + time.perf_counter() - t0,
        )
        log(f"[config auto: llama.cpp fast batch policy, target-only ({choice.reason})]")
    else:
        log(f"[config auto: llama.cpp exact batch policy, tree {choice.tree} ({choice.reason})]")
    return pair, choice.tree


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
