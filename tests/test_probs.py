"""The one logits -> probabilities path."""

from __future__ import annotations

import math

import pytest
import torch

from ersd import InvalidLogitsError, SamplingParams, SamplingParamsError, logits_to_probs
from ersd.probs import check_logits

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])


def test_temperature_one_is_softmax() -> None:
    p = logits_to_probs(LOGITS, SamplingParams())
    assert p.dtype == torch.float64
    assert torch.allclose(p, torch.softmax(LOGITS.double(), -1))


def test_temperature_zero_is_one_hot_argmax() -> None:
    p = logits_to_probs(LOGITS, SamplingParams(temperature=0))
    assert p.tolist() == [0, 0, 0, 0, 1]


def test_temperature_scales() -> None:
    p = logits_to_probs(LOGITS, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(LOGITS.double() / 0.5, -1))


def test_top_k_keeps_k_largest() -> None:
    p = logits_to_probs(LOGITS, SamplingParams(top_k=2))
    assert (p > 0).tolist() == [True, False, False, False, True]
    assert math.isclose(float(p.sum()), 1.0)


def test_top_p_keeps_smallest_nucleus() -> None:
    full = torch.softmax(LOGITS.double(), -1)  # approx [.23, .08, .05, .01, .63]
    p = logits_to_probs(LOGITS, SamplingParams(top_p=0.8))
    kept = (p > 0).tolist()
    assert kept == [True, False, False, False, True]  # 0.63 < 0.8, 0.63 + 0.23 >= 0.8
    assert torch.allclose(p[[0, 4]], full[[0, 4]] / full[[0, 4]].sum())
    assert (logits_to_probs(LOGITS, SamplingParams(top_p=0.5)) > 0).sum() == 1


def test_min_p() -> None:
    p = logits_to_probs(LOGITS, SamplingParams(min_p=0.2))
    full = torch.softmax(LOGITS.double(), -1)
    assert ((p > 0) == (full >= 0.2 * full.max())).all()


def test_batched_rows_are_independent() -> None:
    x = torch.stack([LOGITS, LOGITS.flip(0)])
    p = logits_to_probs(x, SamplingParams(top_k=2, top_p=0.9))
    assert torch.allclose(p[1], p[0].flip(0))


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
    ],
)
def test_bad_params_name_the_fix(kwargs: dict[str, float], word: str) -> None:
    with pytest.raises(SamplingParamsError, match=word):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_bad_logits() -> None:
    with pytest.raises(InvalidLogitsError, match="NaN"):
        check_logits(torch.tensor([0.0, float("nan")]))
    with pytest.raises(InvalidLogitsError, match=r"\+inf"):
        check_logits(torch.tensor([0.0, float("inf")]))
    with pytest.raises(InvalidLogitsError, match="all -inf"):
        check_logits(torch.tensor([[float("-inf"), float("-inf")]]))
    with pytest.raises(InvalidLogitsError, match="vocab_size"):
        check_logits(torch.zeros(3), vocab_size=4)
