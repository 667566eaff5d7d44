"""The exactness suite under race scheme v2 (:mod:`ersd.race`): the same grid, the same ``N``,
the same ``ALPHA``, the same mutants, one sequence at a time and through the batch.

Every configuration of :mod:`tests.test_exactness` (sequence law of every method and shape, with
and without EOS) and of :mod:`tests.test_exactness_batched` is drawn again with
``race_scheme="v2"`` (other seeds: the tags name the scheme), and every mutant must still be
rejected, so v2 is shown exact with the power v1 was shown with.  On the tests' ``V = 4`` a race
is one block of v2 (the lazy race's bound is exercised by ``tests/test_race_v2.py``, on
vocabularies of many blocks, including the law of its winner and a broken lazy race).
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from tests.exactness_util import ALPHA
from tests.test_exactness import (
    DRAFTS,
    EOS,
    LENGTH,
    MUTANTS,
    Mutant,
    _eos_grid,
    _grid,
    sequence_law_test,
)
from tests.test_exactness_batched import batched_law_test

SCHEME = "v2"
BATCHED = [
    ("ersd", "multi:2x2", "T1.0", "mild", None),
    ("ersd", "paths:[[0],[1],[0,0],[0,1],[1,0]]", "T1.0-top_k3-top_p0.9", "adversarial", EOS),
    ("sd", "chain:3", "T0.6", "bad", None),
    ("specinfer", "batch:3", "T1.0-top_k3-top_p0.9", "sparse", None),
    ("gls", "multi:2x2", "T1.0", "onehot", None),
]


@pytest.mark.parametrize(("method", "shape", "setting", "draft"), _grid())
def test_sequence_law_v2(method: str, shape: str, setting: str, draft: str) -> None:
    res = sequence_law_test(
        method,
        shape,
        setting,
        DRAFTS[draft],
        tag=("law", SCHEME, method, shape, setting, draft),
        race_scheme=SCHEME,
    )
    assert res.pvalue >= ALPHA, f"{method} {shape} {setting} {draft} under v2: {res}"


@pytest.mark.parametrize(("method", "shape"), _eos_grid())
def test_sequence_law_with_eos_v2(method: str, shape: str) -> None:
    res = sequence_law_test(
        method,
        shape,
        "T1.0",
        DRAFTS["bad"],
        tag=("eos", SCHEME, method, shape),
        eos_token_id=EOS,
        length=LENGTH + 1,
        race_scheme=SCHEME,
    )
    assert res.pvalue >= ALPHA, f"{method} {shape} with EOS under v2: {res}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_rejected_v2(mutant: Mutant) -> None:
    with mutant.context() if mutant.context else nullcontext():
        res = sequence_law_test(
            mutant.method,
            mutant.shape,
            mutant.setting,
            DRAFTS[mutant.draft],
            tag=("mutant", SCHEME, mutant.id),
            run=mutant.run,
            race_scheme=SCHEME,
        )
    assert res.pvalue < ALPHA, f"mutant {mutant.id} was not rejected under v2: {res}"


@pytest.mark.parametrize(("method", "shape", "setting", "draft", "eos"), BATCHED)
def test_batched_sequence_law_v2(
    method: str, shape: str, setting: str, draft: str, eos: int | None
) -> None:
    res = batched_law_test(method, shape, setting, draft, eos, race_scheme=SCHEME)
    assert res.pvalue >= ALPHA, f"{method} {shape} {setting} {draft} (batched, v2): {res}"


#: the batched v1 suite's mutants, and ERSD's own (the race is what v2 changes)
BATCHED_MUTANTS = [
    m
    for m in MUTANTS
    if m.run is None
    and m.context is None
    and m.id.split("-chain")[0].split("-batch")[0]
    in (
        "mutant-sd-no-residual",
        "mutant-specinfer-stale-residual",
        "mutant-ersd-correction-from-draft",
        "mutant-ersd-stale-bonus",
    )
]


@pytest.mark.parametrize("mutant", BATCHED_MUTANTS, ids=lambda m: m.id)
def test_batched_mutant_is_rejected_v2(mutant: Mutant) -> None:
    res = batched_law_test(
        mutant.method, mutant.shape, mutant.setting, mutant.draft, race_scheme=SCHEME
    )
    assert res.pvalue < ALPHA, f"mutant {mutant.id} was not rejected through the batch (v2): {res}"


def test_batched_mutants_are_chosen() -> None:
    assert len(BATCHED_MUTANTS) == 4, [m.id for m in BATCHED_MUTANTS]
