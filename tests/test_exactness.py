"""Exactness suite: every verification method samples the target's exact sequence law.

What is tested (details and measured results: ``docs/exactness.md``):

1. **Sequence law.** For every method in :data:`ersd.METHODS` and tree shape it supports, with
   temperatures 0.6 / 1.0 / 1.5 and top-k + top-p, ``N = 3000`` sequences of ``L = 3`` new tokens
   (distinct seeds) are drawn with :func:`ersd.generate` from a weight-free target over ``V = 4``
   tokens (logits a fixed random table of the last two tokens) with a drafter that differs from it
   (mildly perturbed, unrelated, reversed preferences, or with the target's favourite token
   masked).  Their empirical law over the 64 sequences is compared with the target's law,
   enumerated exactly with :func:`ersd.logits_to_probs`, by a Pearson chi-square test at
   significance level ``ALPHA = 1e-4`` (cells with expected count < 5 pooled; a sequence of
   target probability 0 is a certain rejection).  One configuration per method adds an
   ``eos_token_id`` (variable-length sequences).
2. **Power.** Deliberately broken variants ("mutants", subclasses overriding one hook) must be
   rejected by the same test at the same sample size: ``p < ALPHA``.
3. **Temperature 0.** Every method and shape reproduces greedy decoding token for token.

Grid: by default each (method, shape) pair runs at one sampling setting (two for ``sd``, which has
two shapes); the settings rotate over shapes and between methods so that every method meets every
setting and every shape meets every setting (33 configurations + 7 with EOS, a few minutes on 2
cores).  ``ERSD_EXACTNESS=full`` runs the full cross product method x shape x setting (124 + 7
configurations, about 3.5x longer).  ``ERSD_EXACTNESS_LOG=path`` appends every p-value to a JSONL
file.  Seeds are fixed, so the suite is deterministic; with ``ALPHA = 1e-4`` and 40 sequence-law
tests an exact implementation fails one by chance with probability at most 0.4%.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

import ersd
import ersd.race
from ersd.errors import UnsupportedTreeError
from ersd.methods._common import lane_uniform
from ersd.methods.base import Method, NodeDecision, NodeNoise
from ersd.methods.ersd import ERSD
from ersd.methods.gls import GumbelListSampling
from ersd.methods.rrs_wor import RRSWithoutReplacement
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.spechub import SpecHub
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr
from ersd.race import STREAM_RACE, _mix64, race_winner, root_key
from ersd.tree import parse_tree
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
}
SETTING_NAMES = list(SETTINGS)
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
) -> FitResult:
    """Draw ``n`` sequences with ``generate`` and test them against the exact law."""
    kw = SETTINGS[setting]
    params = ersd.SamplingParams(**kw)
    law = exact_law(target, PROMPT, length, params, eos_token_id)
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
    """Cross-check of the enumeration itself: a plain multinomial sampler (torch, no ersd code
    beyond logits_to_probs) passes, and the same sampler at the wrong temperature fails."""
    g = torch.Generator().manual_seed(7)
    params = ersd.SamplingParams(1.0)
    law = exact_law(TARGET, PROMPT, LENGTH, params)

    def sample(temp: float) -> tuple[int, ...]:
        seq: list[int] = []
        for _ in range(LENGTH):
            p = ersd.logits_to_probs(TARGET.logits([*PROMPT, *seq]), ersd.SamplingParams(temp))
            seq.append(int(torch.multinomial(p, 1, generator=g).item()))
        return tuple(seq)

    from collections import Counter

    good = gof_test(Counter(sample(1.0) for _ in range(N)), law)
    bad = gof_test(Counter(sample(1.2) for _ in range(N)), law)
    assert good.pvalue >= ALPHA, good
    assert bad.pvalue < ALPHA, bad


# --- 2. power: mutants must be rejected -----------------------------------------------------------


class SDWrongDraftTemperature(SpeculativeSampling):
    """Accepts with ``p / q'`` where ``q'`` is the draft at half the temperature (``q^2``)."""

    name = "mutant-sd-wrong-q"

    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
    ) -> float:
        q2 = draft_probs**2 / (draft_probs**2).sum()
        return super().acceptance_probability(target_probs, q2, token)


class SDSharedNoise(SpeculativeSampling):
    """Reuses the draft lanes' uniforms as the acceptance coins."""

    name = "mutant-sd-shared-noise"

    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        return [lane_uniform(noise, k) for k in range(n)]


class SpecInferSharedNoise(SpecInfer):
    name = "mutant-specinfer-shared-noise"

    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        return [lane_uniform(noise, k) for k in range(n)]


class SDNoResidual(SpeculativeSampling):
    """Samples the correction token from ``p`` instead of ``norm(max(p - q, 0))``."""

    name = "mutant-sd-no-residual"

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return target_probs


class SpecInferStaleResidual(SpecInfer):
    """Uses ``norm(max(p - q, 0))`` of the *original* ``p`` after every rejection (forgets
    that earlier children were rejected)."""

    name = "mutant-specinfer-stale-residual"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        self._p0 = target_probs
        return super().verify_node(target_probs, draft_probs, children, noise)

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return super().residual(self._p0, draft_probs)


class RRSWithoutRemoval(RRSWithoutReplacement):
    """Drafts without replacement but keeps ``q`` unchanged after a rejection (SpecInfer's rule
    on without-replacement drafts)."""

    name = "mutant-rrs-wor-keeps-q"

    def next_draft_probs(self, draft_probs: torch.Tensor, token: int) -> torch.Tensor:
        return draft_probs


class SpecTrRhoOne(SpecTr):
    """SpecTr with ``rho = 1`` whatever the number of drafts."""

    name = "mutant-spectr-rho-1"

    def compute_rho(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, num_drafts: int
    ) -> float:
        return 1.0


class SpecHubNoHubResidual(SpecHub):
    """SpecHub whose residual forgets the hub's accepted mass (``r'(a) = p(a)``)."""

    name = "mutant-spechub-hub-residual"

    def residual(
        self, target_probs: torch.Tensor, pair_probs: torch.Tensor, hub: int, hub_mass: float
    ) -> torch.Tensor:
        return super().residual(target_probs, pair_probs, hub, 0.0)


class GLSCorrectionFromDraft(GumbelListSampling):
    """GLS that emits the first lane's draft winner instead of the target's token on a miss."""

    name = "mutant-gls-correction-from-draft"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        d = super().verify_node(target_probs, draft_probs, children, noise)
        if d.child is None:
            return NodeDecision(None, int(children[0]))
        return d


class ERSDCorrectionFromDraft(ERSD):
    """ERSD that emits the drafter's race winner (``argmin E / q``) on a miss."""

    name = "mutant-ersd-correction-from-draft"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        d = super().verify_node(target_probs, draft_probs, children, noise)
        if d.child is None:
            return NodeDecision(None, race_winner(draft_probs, noise.exponentials()))
        return d


class ERSDStaleBonus(ERSD):
    """ERSD whose bonus token reuses the race of the leaf's parent (a key not extended)."""

    name = "mutant-ersd-stale-bonus"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        self._parent = noise
        return super().verify_node(target_probs, draft_probs, children, noise)

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        return race_winner(target_probs, self._parent.exponentials(STREAM_RACE))


@contextmanager
def _races_keyed_by_last_token(seed: int) -> Iterator[None]:
    """Key every race after the prompt by (seed, last token) only, as text watermarks do.

    Patches ``extend_key`` in every loaded ersd module that uses it (the loop, the draft tree,
    the race module itself), so the mutant keeps working whichever module extends the keys.
    """
    original = ersd.race.extend_key
    salt = root_key(seed, [])
    users = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("ersd") and getattr(m, "extend_key", None) is original
    ]
    for m in users:
        m.extend_key = lambda key, token: _mix64(salt ^ _mix64(int(token) + 1))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in users:
            m.extend_key = original  # type: ignore[attr-defined]


def _keyed_by_last_token(one: Callable[[int], list[int]], seed: int) -> list[int]:
    with _races_keyed_by_last_token(seed):
        return one(seed)


@dataclass(frozen=True)
class Mutant:
    method: Method | str
    shape: str
    setting: str
    draft: str
    run: Callable[[Callable[[int], list[int]], int], list[int]] | None = None

    @property
    def id(self) -> str:
        name = self.method if isinstance(self.method, str) else self.method.name
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
    Mutant("ersd", "chain:3", "T1.5", "mild", run=_keyed_by_last_token),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_rejected(mutant: Mutant) -> None:
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


@pytest.mark.parametrize("method", list(ersd.METHODS))
def test_temperature_zero_is_greedy(method: str) -> None:
    target = TARGET.model()
    checked = accepted = 0
    for shape in SHAPES:
        if not supports(ersd.METHODS[method], shape):
            continue
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
                    temperature=0.0,
                    seed=d * 100 + k,
                    eos_token_id=eos,
                )
                assert got.tokens == want, (method, shape, prompt, eos)
                checked += 1
                accepted += got.num_accepted_tokens
    assert checked >= 2 * len(DRAFTS) * VOCAB**2
    assert accepted > 0  # drafts were accepted, not only corrections
