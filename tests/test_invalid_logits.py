"""NaN / inf logits from a real backend are refused, naming the model and the repair (issue 29,
item 1).  Before: ``tiny-qwen2`` with a NaN in one norm weight generated ``[0, 0, 0, 0, 0]``
(softmax of NaN, the race picks token 0) and exited 0."""

from __future__ import annotations

import pytest
import torch

import ersd
from ersd.errors import InvalidLogitsError
from ersd.models.checks import check_scored_logits


def _poisoned(draft: bool = False, value: float = float("nan")) -> object:
    model = ersd.load_model("tiny-qwen2-draft" if draft else "tiny-qwen2")
    with torch.no_grad():
        model.hf_module.model.norm.weight[3] = value  # type: ignore[attr-defined]
    return model


@pytest.mark.parametrize("draft", [False, True], ids=["target-only", "with-draft"])
def test_nan_weight_in_the_target_raises_naming_it(draft: bool) -> None:
    target = _poisoned()
    drafter = ersd.load_model("tiny-qwen2-draft") if draft else None
    with pytest.raises(InvalidLogitsError, match=r"'tiny-qwen2' returned NaN logits") as info:
        ersd.generate(target, drafter, [1, 2, 3], max_new_tokens=5, tree="chain:2", seed=0)
    assert "ersd models prepare" in str(info.value) and "float32" in str(info.value)


def test_nan_weight_in_the_draft_raises_naming_the_draft() -> None:
    target = ersd.load_model("tiny-qwen2")
    with pytest.raises(InvalidLogitsError, match=r"'tiny-qwen2-draft' returned NaN"):
        ersd.generate(target, _poisoned(draft=True), [1, 2, 3], max_new_tokens=5, seed=0)


def test_the_batched_path_checks_too() -> None:
    """generate_batch scores rows through ``score_batch`` (one forward for all rows)."""
    target = _poisoned(value=float("inf"))
    with pytest.raises(InvalidLogitsError, match=r"'tiny-qwen2' returned (NaN|\+inf) logits"):
        ersd.generate_batch(
            target, ersd.load_model("tiny-qwen2-draft"), [[1, 2], [3, 4, 5]], max_new_tokens=4
        )


def test_a_healthy_model_is_unchanged_by_the_check() -> None:
    """The check only refuses: a healthy model generates its full length."""
    out = ersd.generate(ersd.load_model("tiny-qwen2"), None, [1, 2, 3], max_new_tokens=5, seed=0)
    assert len(out.tokens) == 5


def assert_refusals(ok: torch.Tensor) -> None:
    """``check_scored_logits`` accepts ``ok`` (2-D rows, masked tokens allowed) and refuses it
    with a NaN or a +inf in its last row, or with that row all -inf, naming what and how many."""
    check_scored_logits(ok, "m")
    rows, v = ok.shape
    for value, what in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        bad = ok.clone()
        bad[-1, v - 3] = value
        with pytest.raises(
            InvalidLogitsError, match=rf"'m' returned {what} logits \(1 of {rows} rows"
        ):
            check_scored_logits(bad, "m")
    dead = ok.clone()
    dead[-1] = float("-inf")
    with pytest.raises(InvalidLogitsError, match="all -inf"):
        check_scored_logits(dead, "m")


def test_check_scored_logits_accepts_a_masked_vocabulary_only() -> None:
    ok = torch.zeros(2, 5)
    ok[0, 1] = float("-inf")  # masked tokens are a valid distribution
    assert_refusals(ok)


@pytest.mark.realmodel
def test_llamacpp_nan_logits_raise_naming_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp quantizes activations (a NaN norm weight comes out as finite garbage), so its
    NaN logits are simulated at the one place they come from: the context's logits rows."""
    import importlib.util

    import numpy as np

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'ersd[llamacpp]')")
    from ersd.models import llamacpp_session

    model = ersd.load_model("smollm2-135m", backend="llamacpp", threads=1, context=256)
    healthy = ersd.generate(model, None, [1, 2, 3], max_new_tokens=2, seed=0)
    assert len(healthy.tokens) == 2
    real = llamacpp_session._Context.logits_into

    def nan_logits(self: object, i: int, dst: np.ndarray) -> None:
        real(self, i, dst)  # type: ignore[arg-type]
        dst[7] = np.nan

    monkeypatch.setattr(llamacpp_session._Context, "logits_into", nan_logits)
    with pytest.raises(InvalidLogitsError, match=rf"'{model.name}' returned NaN logits"):
        ersd.generate(model, None, [4, 5, 6], max_new_tokens=2, seed=0)


def test_all_finite_from_one_sum() -> None:
    """The sum shortcut: any NaN or infinity is found, and finite rows whose sum overflows fall
    back to the entry-wise test instead of being refused."""
    from ersd.models.checks import all_finite

    x = torch.randn(3, 1000)
    assert all_finite(x)
    for bad in (float("nan"), float("inf"), float("-inf")):
        y = x.clone()
        y[1, 7] = bad
        assert not all_finite(y)
    big = torch.full((2, 1000), 3e38)  # every entry finite, the float32 sum overflows
    assert all_finite(big)
    big[0, 0] = float("inf")
    assert not all_finite(big)
