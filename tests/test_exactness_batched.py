"""The exactness suite through the batched path: same α, same N, same mutants.

Each configuration draws its N sequences with ONE :func:`ersd.generate_batch` call (one seed per
row, at most 64 rows at a time, so rows continuously finish and join) and tests them against the
exact law, exactly as :mod:`tests.test_exactness` does one sequence at a time.
"""

from __future__ import annotations

from collections import Counter

import pytest

import ersd
from ersd.methods.base import Method
from tests.exactness_util import ALPHA, FitResult, config_seed, exact_law, gof_test
from tests.test_exactness import (
    DRAFTS,
    EOS,
    LENGTH,
    PROMPT,
    SETTINGS,
    TARGET,
    ERSDCorrectionFromDraft,
    N,
    SDNoResidual,
    SpecInferStaleResidual,
)


def batched_law_test(
    method: str | Method,
    shape: str,
    setting: str,
    draft: str,
    eos: int | None = None,
    race_scheme: str = "v1",
) -> FitResult:
    kw = SETTINGS[setting]
    law = exact_law(TARGET, PROMPT, LENGTH, kw, eos)
    tag = ("batched", str(method), shape, setting, draft, eos)
    base = config_seed(*tag) if race_scheme == "v1" else config_seed(*tag, race_scheme)
    results = ersd.generate_batch(
        TARGET.model(),
        DRAFTS[draft].model(),
        [PROMPT] * N,
        seeds=list(range(base, base + N)),
        max_new_tokens=LENGTH,
        method=method,
        tree=shape,
        eos_token_id=eos,
        max_batch_size=64,
        race_scheme=race_scheme,
        **kw,
    )
    return gof_test(Counter(tuple(r.tokens) for r in results), law)


@pytest.mark.parametrize(
    ("method", "shape", "setting", "draft", "eos"),
    [
        ("ersd", "multi:2x2", "T1.0", "mild", None),
        ("ersd", "paths:[[0],[1],[0,0],[0,1],[1,0]]", "T1.0-top_k3-top_p0.9", "adversarial", EOS),
        ("sd", "chain:3", "T0.6", "bad", None),
        ("specinfer", "batch:3", "T1.0-top_k3-top_p0.9", "sparse", None),
        ("spectr", "multi:2x2", "T1.5", "mild", EOS),
        ("gls", "multi:2x2", "T1.0", "onehot", None),
    ],
)
def test_batched_sequence_law(method: str, shape: str, setting: str, draft: str, eos) -> None:
    res = batched_law_test(method, shape, setting, draft, eos)
    assert res.pvalue >= ALPHA, f"{method} {shape} {setting} {draft} (batched): {res}"


@pytest.mark.parametrize(
    ("mutant", "shape", "draft"),
    [
        (SDNoResidual(), "chain:3", "mild"),
        (SpecInferStaleResidual(), "batch:3", "bad"),
        (ERSDCorrectionFromDraft(), "chain:3", "mild"),
    ],
    ids=lambda x: getattr(x, "name", x) if not isinstance(x, str) else x,
)
def test_batched_mutant_is_rejected(mutant: Method, shape: str, draft: str) -> None:
    res = batched_law_test(mutant, shape, "T1.0", draft)
    assert res.pvalue < ALPHA, f"mutant {mutant.name} was not rejected through the batch: {res}"
