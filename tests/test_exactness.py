"""Exactness suite: every verification method samples the target's exact sequence law.

What is tested (details and measured results: ``docs/exactness.md``):

1. **Sequence law.** For every method in :data:`ersd.METHODS` and tree shape it supports, with
   temperatures 0.6 / 1.0 / 1.5, top-k + top-p and min-p, ``N = 3000`` sequences of ``L = 3``
   new tokens (distinct seeds) are drawn with :func:`ersd.generate` from a weight-free target
   over ``V = 4`` tokens (logits a fixed random table of the last two tokens) with a drafter that
   differs from it (mildly perturbed, unrelated, reversed preferences, or with the target's
   favourite token masked).  Their empirical law over the 64 sequences is compared with the
   target's law, enumerated exactly with an independent reference of the sampling transforms
   (``tests/reference_sampling.py``, not the library's ``logits_to_probs``), by a Pearson
   chi-square test at significance level ``ALPHA = 1e-4`` (cells with expected count < 5 pooled;
   a sequence of target probability 0 is a certain rejection).  One configuration per method
   adds an ``eos_token_id`` (variable-length sequences).
2. **Power.** Deliberately broken variants ("mutants": subclasses overriding one hook, and
   ``logits_to_probs`` replaced by a version with one bug in temperature, top-k, top-p or min-p)
   must be rejected by the same test at the same sample size: ``p < ALPHA``.
3. **Temperature 0.** Every method and shape reproduces greedy decoding token for token.

Grid: by default each (method, shape) pair runs at one sampling setting (two for ``sd``, which has
two shapes); the settings rotate over shapes and between methods so that every method meets every
setting and every shape meets every setting (39 configurations + 7 with EOS, a few minutes on 2
cores).  ``ERSD_EXACTNESS=full`` runs the full cross product method x shape x setting (155 + 7
configurations, about 3.5x longer).  ``ERSD_EXACTNESS_LOG=path`` appends every p-value to a JSONL
file.  Seeds are fixed, so the suite is deterministic; with ``ALPHA = 1e-4`` and 46 sequence-law
tests an exact implementation fails one by chance with probability at most 0.5%.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import ersd
from ersd.errors import UnsupportedTreeError
from ersd.methods.base import Method, NodeDecision
from ersd.probs import logits_to_probs as library_logits_to_probs
from ersd.tree import parse_tree
from ersd.validation import MIN_TEMPERATURE
from tests.exactness_mutants import (
    ERSDCorrectionFromDraft,
    ERSDStaleBonus,
    GLSCorrectionFromDraft,
    RRSWithoutRemoval,
    SDNoResidual,
    SDSharedNoise,
    SDWrongDraftTemperature,
    SpecHubNoHubResidual,
    SpecInferSharedNoise,
    SpecInferStaleResidual,
    SpecTrRhoOne,
    keyed_by_last_token,
    with_filter_bug,
)
from tests.exactness_util import (
    ALPHA,
    FitResult,
    TableLM,
    all_prompts,
    config_seed,
    exact_law,
    gof_test,
    greedy_reference,
    make_drafts,
    make_target,
    sample_counts,
)
from tests.reference_sampling import reference_probs

#: sequences drawn per configuration (the mutants are rejected at this same size)
N = 3000
#: new tokens per sequence
LENGTH = 3
VOCAB = 4
PROMPT = [1, 2]
#: the EOS token of the variable-length configurations
EOS = 0

TARGET = make_target(VOCAB, seed=0)
DRAFTS = make_drafts(TARGET, seed=100)
DRAFT_NAMES = list(DRAFTS)

#: chains, batches and real trees; the last one branches at two levels (root and first child)
SHAPES = ["chain:1", "chain:3", "multi:2x2", "batch:3", "paths:[[0],[1],[0,0],[0,1],[1,0]]"]
SETTINGS: dict[str, dict[str, float | int | None]] = {
    "T0.6": {"temperature": 0.6},
    "T1.0": {"temperature": 1.0},
    "T1.5": {"temperature": 1.5},
    "T1.0-top_k3-top_p0.9": {"temperature": 1.0, "top_k": 3, "top_p": 0.9},
    "T1.5-min_p0.2": {"temperature": 1.5, "min_p": 0.2},
}
SETTING_NAMES = list(SETTINGS)
#: settings used only by mutants (each makes one filter decisive on V = 4)
MUTANT_SETTINGS: dict[str, dict[str, float | int | None]] = {
    "T1.0-top_k2": {"temperature": 1.0, "top_k": 2},
    "T1.0-top_p0.8": {"temperature": 1.0, "top_p": 0.8},
}
ALL_SETTINGS = {**SETTINGS, **MUTANT_SETTINGS}
FULL = os.environ.get("ERSD_EXACTNESS", "") == "full"


def supports(method: Method, shape: str) -> bool:
    try:
        method.check_shape(parse_tree(shape))
    except UnsupportedTreeError:
        return False
    return True


def _grid() -> list[tuple[str, str, str, str]]:
    """(method, shape, setting, draft) configurations of the sequence-law test.

    Full mode: every supported shape at every setting.  Default: each (method, shape) pair runs
    at one setting (several for a method with fewer shapes than settings); the settings rotate
    over a method's shapes, and the rotation is shifted between methods that support the same
    shapes, so that every method meets every setting and every shape meets every setting across
    methods (checked by ``test_grid_covers_every_method_shape_and_setting``).  Drafters rotate
    over the configurations.
    """
    out = []
    seen_lists: list[list[str]] = []
    for name, method in ersd.METHODS.items():
        shapes = [s for s in SHAPES if supports(method, s)]
        shift = seen_lists.count(shapes)
        seen_lists.append(shapes)
        per_shape = -(-len(SETTING_NAMES) // len(shapes))
        for i, shape in enumerate(shapes):
            if FULL:
                settings = SETTING_NAMES
            else:
                settings = [
                    SETTING_NAMES[(i * per_shape + j + shift) % len(SETTING_NAMES)]
                    for j in range(per_shape)
                ]
            for j, setting in enumerate(settings):
                k = (i + j + len(name)) if FULL else len(out)
                out.append((name, shape, setting, DRAFT_NAMES[k % len(DRAFT_NAMES)]))
    return out


def _eos_grid() -> list[tuple[str, str]]:
    """One (method, shape) per method for the EOS test: its deepest branching shape."""
    out = []
    for name, method in ersd.METHODS.items():
        shapes = [s for s in SHAPES if supports(method, s)]
        out.append((name, shapes[-1]))
    return out


def _log(record: dict[str, object]) -> None:
    """Append a result line to ``$ERSD_EXACTNESS_LOG`` (used to write docs/exactness.md)."""
    path = os.environ.get("ERSD_EXACTNESS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def sequence_law_test(
    method: str | Method,
    shape: str,
    setting: str,
    draft: TableLM,
    *,
    tag: Sequence[object],
    eos_token_id: int | None = None,
    length: int = LENGTH,
    n: int = N,
    target: TableLM = TARGET,
    run: Callable[[Callable[[int], list[int]], int], list[int]] | None = None,
    race_scheme: str = "v1",
) -> FitResult:
    """Draw ``n`` sequences with ``generate`` and test them against the exact law (races drawn
    under ``race_scheme``: ``tests/test_exactness_v2.py`` runs the suite under v2)."""
    kw = ALL_SETTINGS[setting]
    law = exact_law(target, PROMPT, length, kw, eos_token_id)
    tmodel, dmodel = target.model(), draft.model()

    def one(seed: int) -> list[int]:
        return ersd.generate(
            tmodel,
            dmodel,
            PROMPT,
            max_new_tokens=length,
            method=method,
            tree=shape,
            seed=seed,
            eos_token_id=eos_token_id,
            race_scheme=race_scheme,
            **kw,
        ).tokens

    base = config_seed(*tag)
    draw = one if run is None else (lambda s: run(one, s))
    res = gof_test(sample_counts(draw, range(base, base + n)), law)
    _log(
        {
            "tag": [str(t) for t in tag],
            "pvalue": res.pvalue,
            "statistic": res.statistic,
            "dof": res.dof,
            "cells": res.cells,
            "n": n,
        }
    )
    return res


# --- 1. the sequence law of every method ---------------------------------------------------------


@pytest.mark.parametrize(("method", "shape", "setting", "draft"), _grid())
def test_sequence_law(method: str, shape: str, setting: str, draft: str) -> None:
    res = sequence_law_test(
        method, shape, setting, DRAFTS[draft], tag=("law", method, shape, setting, draft)
    )
    assert res.pvalue >= ALPHA, (
        f"{method} with tree {shape}, {setting}, {draft} drafter: the law of the generated "
        f"sequence differs from the target's: {res}"
    )


@pytest.mark.parametrize(("method", "shape"), _eos_grid())
def test_sequence_law_with_eos(method: str, shape: str) -> None:
    res = sequence_law_test(
        method,
        shape,
        "T1.0",
        DRAFTS["bad"],
        tag=("eos", method, shape),
        eos_token_id=EOS,
        length=LENGTH + 1,
    )
    assert res.pvalue >= ALPHA, f"{method} with tree {shape} and EOS {EOS}: {res}"


def test_grid_covers_every_method_shape_and_setting() -> None:
    grid = _grid()
    for name, method in ersd.METHODS.items():
        mine = [g for g in grid if g[0] == name]
        assert {g[1] for g in mine} == {s for s in SHAPES if supports(method, s)}
        assert {g[2] for g in mine} == set(SETTING_NAMES)
    for shape in SHAPES:  # every shape meets every setting (across methods)
        assert {g[2] for g in grid if g[1] == shape} == set(SETTING_NAMES), shape
    assert {g[3] for g in grid} == set(DRAFT_NAMES)
    # chains, batches and real trees are all covered by some method
    assert any(parse_tree(s).is_chain for _, s, _, _ in grid)
    assert any(parse_tree(s).depth == 1 and parse_tree(s).num_nodes > 1 for _, s, _, _ in grid)
    assert any(sum(len(c) > 1 for c in parse_tree(s).children) >= 2 for _, s, _, _ in grid)


def test_exact_law_matches_target_only_sampling_of_a_plain_loop() -> None:
    """Cross-check of the enumeration itself: a plain multinomial sampler (torch, no ersd code)
    passes, and the same sampler at the wrong temperature fails."""
    g = torch.Generator().manual_seed(7)
    law = exact_law(TARGET, PROMPT, LENGTH, {"temperature": 1.0})

    def sample(temp: float) -> tuple[int, ...]:
        seq: list[int] = []
        for _ in range(LENGTH):
            logits = TARGET.logits([*PROMPT, *seq]).tolist()
            p = torch.tensor(reference_probs(logits, temperature=temp), dtype=torch.float64)
            seq.append(int(torch.multinomial(p, 1, generator=g).item()))
        return tuple(seq)

    from collections import Counter

    good = gof_test(Counter(sample(1.0) for _ in range(N)), law)
    bad = gof_test(Counter(sample(1.2) for _ in range(N)), law)
    assert good.pvalue >= ALPHA, good
    assert bad.pvalue < ALPHA, bad


_FILTER_GRID = [
    {"temperature": t, "top_k": k, "top_p": p, "min_p": m}
    for t in (0.0, 0.3, 1.0, 2.0)
    for k in (None, 1, 2, 5)
    for p in (None, 0.5, 0.9)
    for m in (None, 0.05, 0.3)
]


def test_library_filters_match_the_reference() -> None:
    """ersd.logits_to_probs agrees with the independent reference on random and tied logits."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(8, generator=g, dtype=torch.float64) * s for s in (0.5, 2.0, 6.0)]
    rows.append(torch.tensor([1.0, 3.0, 3.0, -1.0, 3.0, 0.0, 2.0, 2.0], dtype=torch.float64))
    for kw in _FILTER_GRID:
        params = ersd.SamplingParams(**kw)
        for x in rows:
            want = reference_probs(x.tolist(), **kw)
            got = library_logits_to_probs(x, params).tolist()
            assert got == pytest.approx(want, abs=1e-12), (kw, x.tolist())


# --- 2. power: mutants must be rejected (the mutants: tests/exactness_mutants.py) ---------------


@dataclass(frozen=True)
class Mutant:
    method: Method | str
    shape: str
    setting: str
    draft: str
    run: Callable[[Callable[[int], list[int]], int], list[int]] | None = None
    context: Callable[[], AbstractContextManager[Any]] | None = None

    @property
    def id(self) -> str:
        name = self.method if isinstance(self.method, str) else self.method.name
        if self.context is not None:
            return f"filter-{self.context.__name__}"
        return f"{name}-{self.shape}" if self.run is None else f"{name}-keyed-by-last-token"


MUTANTS = [
    Mutant(SDWrongDraftTemperature(), "chain:3", "T1.0", "mild"),
    Mutant(SDSharedNoise(), "chain:3", "T1.0", "mild"),
    Mutant(SDNoResidual(), "chain:3", "T1.0", "mild"),
    Mutant(SpecInferSharedNoise(), "multi:2x2", "T1.0", "mild"),
    Mutant(SpecInferStaleResidual(), "batch:3", "T1.0", "bad"),
    Mutant(RRSWithoutRemoval(), "batch:3", "T1.0", "bad"),
    Mutant(SpecTrRhoOne(), "batch:3", "T1.0", "bad"),
    Mutant(SpecHubNoHubResidual(), "multi:2x2", "T1.0", "bad"),
    Mutant(GLSCorrectionFromDraft(), "multi:2x2", "T1.0", "mild"),
    Mutant(ERSDCorrectionFromDraft(), "chain:3", "T1.0", "mild"),
    Mutant(ERSDStaleBonus(), "chain:1", "T1.0", "mild"),
    Mutant("ersd", "chain:3", "T1.5", "mild", run=keyed_by_last_token),
    Mutant("ersd", "chain:3", "T0.6", "mild", context=with_filter_bug("temperature-twice")),
    Mutant("ersd", "chain:3", "T1.0-top_k2", "mild", context=with_filter_bug("top_k-off-by-one")),
    Mutant(
        "ersd", "chain:3", "T1.0-top_p0.8", "mild", context=with_filter_bug("top_p-drops-boundary")
    ),
    Mutant("ersd", "chain:3", "T1.5-min_p0.2", "mild", context=with_filter_bug("min_p-absolute")),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_rejected(mutant: Mutant) -> None:
    with mutant.context() if mutant.context else nullcontext():
        res = sequence_law_test(
            mutant.method,
            mutant.shape,
            mutant.setting,
            DRAFTS[mutant.draft],
            tag=("mutant", mutant.id),
            run=mutant.run,
        )
    assert res.pvalue < ALPHA, f"mutant {mutant.id} was not rejected at n={N}: {res}"


def test_every_method_has_a_mutant() -> None:
    """Each registered method's test is shown to have power by at least one mutant of it."""
    covered = {
        type(ersd.get_method(m.method)) if isinstance(m.method, str) else type(m.method).__mro__[1]
        for m in MUTANTS
    }
    missing = [name for name, meth in ersd.METHODS.items() if type(meth) not in covered]
    assert not missing, f"methods without a mutant in MUTANTS: {missing}"


# --- 3. temperature 0 is greedy decoding ---------------------------------------------------------


def _greedy_runs(
    method: str, shape: str, temperature: float
) -> Iterator[tuple[list[int], list[int], ersd.GenerationResult]]:
    """(want, prompt, result) for every drafter and two-token prompt (EOS on every other one)."""
    target = TARGET.model()
    for d, draft in enumerate(DRAFTS.values()):
        for k, prompt in enumerate(all_prompts(VOCAB, 2)):
            eos = EOS if k % 2 else None
            want = greedy_reference(TARGET, prompt, 6, eos)
            got = ersd.generate(
                target,
                draft.model(),
                prompt,
                max_new_tokens=6,
                method=method,
                tree=shape,
                temperature=temperature,
                seed=d * 100 + k,
                eos_token_id=eos,
            )
            yield want, prompt, got


@pytest.mark.parametrize("shape", SHAPES)
def test_temperature_zero_is_greedy(shape: str) -> None:
    """Temperature 0 is handled by the greedy rule, outside the methods (whichever is named)."""
    method = next(name for name, m in ersd.METHODS.items() if supports(m, shape))
    checked = accepted = 0
    for want, prompt, got in _greedy_runs(method, shape, 0.0):
        assert got.tokens == want, (shape, prompt)
        checked += 1
        accepted += got.num_accepted_tokens
    assert checked == len(DRAFTS) * VOCAB**2
    assert accepted > 0  # drafts were accepted, not only corrections


#: the smallest supported temperature: the target's top-two logit gap is >= 0.0063 on every
#: context, so the runner-up has probability <= exp(-63) and sampling is greedy in all but name
NEAR_ZERO = MIN_TEMPERATURE


@pytest.mark.parametrize("method", list(ersd.METHODS))
def test_every_method_is_greedy_near_temperature_zero(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each method's own drafting and verification (spied on: they do run) reproduces greedy
    decoding at the smallest supported temperature, on every shape it supports."""
    gaps = TARGET.table.topk(2, dim=-1).values
    assert float((gaps[..., 0] - gaps[..., 1]).min()) / NEAR_ZERO > 60
    cls = type(ersd.METHODS[method])
    calls: list[str] = []
    original = cls.verify_node

    def spy(self: Method, *args: Any, **kwargs: Any) -> NodeDecision:
        calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "verify_node", spy)
    checked = accepted = 0
    for shape in SHAPES:
        if not supports(ersd.METHODS[method], shape):
            continue
        for want, prompt, got in _greedy_runs(method, shape, NEAR_ZERO):
            assert got.tokens == want, (method, shape, prompt)
            checked += 1
            accepted += got.num_accepted_tokens
    assert checked >= len(DRAFTS) * VOCAB**2
    assert accepted > 0
    assert calls and set(calls) == {method}  # the method itself verified every node
