"""Exactness with drafters that are not models: every method, deterministic drafts, same test.

The sequence-law test of ``tests/test_exactness.py`` (same target table, V = 4, L = 3 new tokens,
N = 3000 seeds, Pearson chi-square against the exact law at ``ALPHA = 1e-4``) is run with:

* ``lookup``       — :class:`ersd.drafting.LookupDrafter` on a prompt with repeats;
* ``suffix``       — :class:`ersd.drafting.SuffixDrafter` with a corpus of random documents;
* ``least-likely`` — proposes the target's *least* likely tokens (a deterministic drafter whose
  proposals the target almost never wants; under top-k they have probability 0);
* ``hybrid``       — lookup + the ``mild`` table draft model (ERSD: merged trees; the others:
  per-step choice, ``fallback`` policy so the run is deterministic);
* ``guided``       — lookup + the ``mild`` draft, policy ``guided`` on ``chain:3``: the model drafts
  every step, with the lookup run as its guess (a separate test: the grid's multi-child shapes
  would not use the guess).  A broken guided drafter that trusts the guess (takes the guessed
  token as the child instead of the draft rule's choice) must be rejected under SD.

Power: the same test must reject (p < ALPHA) the naive way of using deterministic multi-branch
drafts with the i.i.d./without-replacement methods (children hand-picked instead of drawn by the
method's drafting rule from ``q``), and the suite's method mutants whose bug is visible with
deterministic drafts.  Measured p-values: docs/drafters.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager

import pytest
import torch

import ersd
from ersd.drafting import (
    HybridDrafter,
    LookupDrafter,
    ModelDrafter,
    ModelDraftSession,
    SuffixDrafter,
    grow,
)
from ersd.drafting.free import DrafterStats, FreeSession
from ersd.drafting.grow import Continuation
from tests.exactness_util import (
    ALPHA,
    FitResult,
    TableLM,
    config_seed,
    exact_law,
    gof_test,
    greedy_reference,
    sample_counts,
)
from tests.test_exactness import (
    DRAFTS,
    LENGTH,
    MUTANTS,
    SETTING_NAMES,
    SETTINGS,
    SHAPES,
    TARGET,
    VOCAB,
    N,
    _log,
    supports,
)

#: a prompt with repeats, so the lookup drafter finds matches and several continuations
PROMPT = [1, 2, 3, 1, 2, 0, 1, 2, 1]


class LeastLikelyDrafter:
    """Proposes the target's least likely tokens at every context (by raw logits)."""

    vocab_size = None

    def __init__(self, target: TableLM, branches: int = 3) -> None:
        self.target = target
        self.branches = branches
        self.stats = DrafterStats()

    def start_drafting(self, prompt: Sequence[int]) -> LeastLikelySession:
        return LeastLikelySession(self, prompt)


class LeastLikelySession(FreeSession):
    source = "least-likely"

    def __init__(self, drafter: LeastLikelyDrafter, prompt: Sequence[int]) -> None:
        super().__init__(drafter.stats, 16, 16, drafter.branches)
        self.drafter = drafter
        self.text = list(prompt)

    def root_state(self) -> Hashable:
        return tuple(self.text[-2:])

    def expand(self, state: Hashable) -> list[Continuation]:
        tail: tuple[int, ...] = state  # type: ignore[assignment]
        order = torch.argsort(self.drafter.target.logits(tail)).tolist()  # least likely first
        k = self.drafter.branches
        return [Continuation(int(t), 1.0 / k, (*tail[-1:], int(t))) for t in order[:k]]

    def append(self, tokens: Sequence[int]) -> None:
        self.text.extend(tokens)


def _corpus() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (12,), generator=g).tolist() for _ in range(4)]


DRAFTERS: dict[str, Callable[[str], object]] = {
    "lookup": lambda method: LookupDrafter(n=2, k=4, branches=2),
    "suffix": lambda method: SuffixDrafter(match=3, k=4, branches=3, corpus=_corpus()),
    "least-likely": lambda method: LeastLikelyDrafter(TARGET, branches=3),
    "hybrid": lambda method: HybridDrafter(
        LookupDrafter(n=2, k=3, branches=2),
        DRAFTS["mild"].model(),
        policy="both" if method == "ersd" else "fallback",
    ),
}
#: the guided hybrid (chain shapes only; not in the grid, see the module docstring)
GUIDED = "guided"
DRAFTERS_EXTRA: dict[str, Callable[[str], object]] = {
    GUIDED: lambda method: HybridDrafter(
        LookupDrafter(n=2, k=3, branches=1), DRAFTS["mild"].model(), policy="guided"
    ),
}


def law_test(
    method: str | ersd.methods.Method,
    shape: str,
    setting: str,
    drafter: str,
    tag: Sequence[object],
    n: int = N,
) -> FitResult:
    kw = SETTINGS[setting]
    law = exact_law(TARGET, PROMPT, LENGTH, kw)
    target = TARGET.model()
    name = method if isinstance(method, str) else method.name
    draft = {**DRAFTERS, **DRAFTERS_EXTRA}[drafter](name)

    def one(seed: int) -> list[int]:
        return ersd.generate(
            target,
            draft,  # type: ignore[arg-type]
            PROMPT,
            max_new_tokens=LENGTH,
            method=method,
            tree=shape,
            seed=seed,
            **kw,  # type: ignore[arg-type]
        ).tokens

    base = config_seed("drafters", *tag)
    res = gof_test(sample_counts(one, range(base, base + n)), law)
    _log({"tag": ["drafters", *map(str, tag)], "pvalue": res.pvalue, "cells": res.cells, "n": n})
    return res


def _grid() -> list[tuple[str, str, str, str]]:
    """(method, shape, setting, drafter): every method with every drafter on its deepest
    branching shape (chains for SD); settings rotate."""
    out = []
    for name, method in ersd.METHODS.items():
        shapes = [s for s in SHAPES if supports(method, s)]
        for shape, drafter in [(shapes[-1], d) for d in DRAFTERS]:
            out.append((name, shape, SETTING_NAMES[len(out) % len(SETTING_NAMES)], drafter))
    return out


@pytest.mark.parametrize(("method", "shape", "setting", "drafter"), _grid())
def test_sequence_law_with_model_free_drafters(
    method: str, shape: str, setting: str, drafter: str, one_torch_thread: None
) -> None:
    res = law_test(method, shape, setting, drafter, tag=(method, shape, setting, drafter))
    assert res.pvalue >= ALPHA, (
        f"{method} with tree {shape}, {setting}, {drafter} drafter: the law of the generated "
        f"sequence differs from the target's: {res}"
    )


@pytest.mark.parametrize(
    ("method", "setting"),
    [
        (name, SETTING_NAMES[i % len(SETTING_NAMES)])
        for i, (name, m) in enumerate(ersd.METHODS.items())
        if supports(m, "chain:3")
    ],
)
def test_sequence_law_with_the_guided_hybrid(method: str, setting: str, one_torch_thread) -> None:
    res = law_test(method, "chain:3", setting, GUIDED, tag=(method, "chain:3", setting, GUIDED))
    assert res.pvalue >= ALPHA, f"{method}, {setting}, guided hybrid: law differs: {res}"


class _TrustingSession(ModelDraftSession):
    """Broken guided drafting: a guessed token becomes the child as it is, instead of the token
    the rule drafts from the draft's logits (whose ``q`` is still recorded)."""

    def grow(self, shape, key, rule, params, noise, guess=()):  # type: ignore[no-untyped-def]
        self._guess = list(guess)
        return (yield from super().grow(shape, key, rule, params, noise, guess))

    def _draft_at(self, tree, ctx, logits, num_children, rule, params, noise):  # type: ignore[no-untyped-def]
        toks = super()._draft_at(tree, ctx, logits, num_children, rule, params, noise)
        depth = 0 if ctx == tree.ROOT else tree.depth_of(tree.node_of(ctx))
        return [self._guess[depth]] if depth < len(self._guess) else toks


def test_a_guided_drafter_that_trusts_the_guess_is_rejected(
    monkeypatch: pytest.MonkeyPatch, one_torch_thread: None
) -> None:
    monkeypatch.setattr(
        ModelDrafter,
        "start_drafting",
        lambda self, prompt: _TrustingSession(self.model.start(list(prompt))),
    )
    res = law_test("sd", "chain:3", "T1.0", GUIDED, tag=("m", "guided-trusts-guess"))
    assert res.pvalue < ALPHA, f"a guided drafter trusting the guess was not rejected: {res}"


def test_grid_has_branching_deterministic_drafts_for_every_multi_child_method() -> None:
    grid = _grid()
    for name, method in ersd.METHODS.items():
        mine = [g for g in grid if g[0] == name]
        assert {g[3] for g in mine} == set(DRAFTERS)
        if supports(method, "multi:2x2"):
            assert any(not ersd.parse_tree(g[1]).is_chain for g in mine)


# --- power ---------------------------------------------------------------------------------------


@contextmanager
def _hand_picked_children() -> Iterator[None]:
    """The naive use of deterministic drafts: propose the set itself (best first) under every
    method, with ``q`` uniform/weighted over it, instead of drawing children from ``q``."""
    original = grow.any_children_exact
    grow.any_children_exact = lambda rule: True  # type: ignore[assignment]
    try:
        yield
    finally:
        grow.any_children_exact = original  # type: ignore[assignment]


#: methods whose verification assumes children drawn from q (SpecHub is left out: with two
#: candidates its drafting always yields the same pair and its verification ignores their order,
#: so hand-picking is exact there; ERSD and GLS are exact for any children)
NAIVE = [("specinfer", "batch:3"), ("rrs-wor", "batch:3"), ("spectr", "batch:3")]


@pytest.mark.parametrize(("method", "shape"), NAIVE)
def test_hand_picked_deterministic_children_are_rejected(
    method: str, shape: str, one_torch_thread: None
) -> None:
    with _hand_picked_children():
        res = law_test(method, shape, "T1.0", "least-likely", tag=("naive", method, shape))
    assert res.pvalue < ALPHA, f"naive deterministic children under {method} not rejected: {res}"


#: the suite's mutants whose bug shows with deterministic drafts, and the drafter that shows it
#: (the others only change how a non-degenerate q is used or which uniform drafts it: with a
#: one-hot q they are the exact method; see docs/drafters.md)
VISIBLE = {
    "mutant-sd-no-residual": "lookup",
    "mutant-specinfer-stale-residual": "least-likely",
    "mutant-spectr-rho-1": "least-likely",
    "mutant-gls-correction-from-draft": "lookup",
    "mutant-ersd-correction-from-draft": "lookup",
    "mutant-ersd-stale-bonus": "lookup",
}


def _mutant_name(mutant) -> str:
    return mutant.id.rsplit("-", 1)[0]


@pytest.mark.parametrize(
    "mutant",
    [m for m in MUTANTS if m.run is None and _mutant_name(m) in VISIBLE],
    ids=lambda m: m.id,
)
def test_suite_mutants_are_rejected_with_deterministic_drafters(mutant, one_torch_thread) -> None:
    drafter = VISIBLE[_mutant_name(mutant)]
    res = law_test(mutant.method, mutant.shape, mutant.setting, drafter, tag=("m", mutant.id))
    assert res.pvalue < ALPHA, f"mutant {mutant.id} with the {drafter} drafter not rejected: {res}"


# --- temperature 0 -------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_temperature_zero_is_greedy_with_model_free_drafters(drafter: str) -> None:
    target = TARGET.model()
    for name, method in ersd.METHODS.items():
        shape = [s for s in SHAPES if supports(method, s)][-1]
        for k, prompt in enumerate([PROMPT, [0, 3, 0, 3, 0], [2, 2, 2]]):
            want = greedy_reference(TARGET, prompt, 6)
            got = ersd.generate(
                target,
                DRAFTERS[drafter](name),  # type: ignore[arg-type]
                prompt,
                max_new_tokens=6,
                method=name,
                tree=shape,
                temperature=0.0,
                seed=k,
            )
            assert got.tokens == want, (drafter, name, shape, prompt)
