"""``ersd watermark detect --model`` (model-weighted) and ``--spans`` (localized), run for real
in subprocesses on SmolLM2-135M (float32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ersd
from ersd.watermark import load_watermark
from tests.test_cli_errors import run_ersd

pytestmark = pytest.mark.realmodel

KEY_HEX = "5c" * 16 + "a3" * 16
PROMPT = "The lighthouse keeper"
HUMAN = Path(__file__).read_text()[:1500]  # human-written text


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("wmcli")
    key = tmp / "key.json"
    key.write_text(json.dumps({"key": KEY_HEX, "tokenizer": "smollm2-135m"}))
    key.chmod(0o600)
    model = ersd.load_model("smollm2-135m", dtype="float32")
    tok = model.tokenizer
    wm = load_watermark(key)
    prompt = tok.encode(PROMPT)
    marked = ersd.generate(
        model, None, prompt, max_new_tokens=96, seed=3, temperature=0.7, watermark=wm
    ).tokens
    human = tok.encode(HUMAN)
    return {"key": key, "tmp": tmp, "marked": marked, "human": human, "model": model, "wm": wm}


def _detect(setup: dict[str, object], ids: list[int], *args: str) -> dict:
    path = Path(str(setup["tmp"])) / "ids.json"
    path.write_text(json.dumps(ids))
    r = run_ersd(
        "watermark", "detect", "--key-file", str(setup["key"]), "--tokenizer", "smollm2-135m",
        "--ids", "--json", *args, str(path),
    )  # fmt: skip
    assert r.rc == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_detect_with_a_model_weights_tokens_and_reports_its_verdict(
    setup: dict[str, object],
) -> None:
    marked = list(setup["marked"])  # type: ignore[call-overload]
    d = _detect(setup, marked, "--model", "smollm2-135m", "--temperature", "0.7")
    assert d["verdict"] == "watermarked" and d["p_value"] < 1e-4, d
    assert 0 < d["weighted_tokens"] <= d["scored_tokens"] and d["expected_power"] > 0.5
    human = list(setup["human"])  # type: ignore[call-overload]
    h = _detect(setup, human[:200], "--model", "smollm2-135m")
    assert not h["watermarked"] and h["verdict"] in ("not watermarked", "not enough signal")


def test_a_near_deterministic_text_is_not_enough_signal(setup: dict[str, object]) -> None:
    """Counting to 40: every token after the first few is nearly certain under the model, so
    the model-free "not watermarked" would be a claim without evidence; the weighted detector
    says so."""
    from ersd.watermark import detect
    from ersd.watermark.weighted import detect_with_model

    model, wm = setup["model"], setup["wm"]
    ids = model.tokenizer.encode(", ".join(str(i) for i in range(1, 41)))  # type: ignore[attr-defined]
    res = detect_with_model(ids, wm, model)  # type: ignore[arg-type]
    assert res.verdict == "not enough signal" and res.expected_power < 0.5, res
    assert not detect(ids, wm).watermarked  # type: ignore[arg-type]  # model-free: "not watermarked", no caveat


def test_detect_spans_finds_the_pasted_text(setup: dict[str, object]) -> None:
    human = list(setup["human"])  # type: ignore[call-overload]
    marked = list(setup["marked"])  # type: ignore[call-overload]
    cut = len(human) // 2
    doc = human[:cut] + marked + human[cut:]
    d = _detect(setup, doc, "--spans")
    assert d["watermarked"] and d["spans"], d
    assert any(s["start"] < cut + len(marked) and s["end"] > cut for s in d["spans"])
    assert all(s["char_end"] > s["char_start"] for s in d["spans"])
    r = run_ersd(
        "watermark", "detect", "--key-file", str(setup["key"]), "--tokenizer", "smollm2-135m",
        "--ids", "--spans", str(Path(str(setup["tmp"])) / "ids.json"),
    )  # fmt: skip
    assert r.rc == 0 and r.stdout.startswith("WATERMARKED SPANS") and "[[" in r.stdout, r.stdout
    r = run_ersd(
        "watermark", "detect", "--key-file", str(setup["key"]), "--tokenizer", "smollm2-135m",
        "--ids", "--spans", "--model", "smollm2-135m", str(Path(str(setup["tmp"])) / "ids.json"),
    )  # fmt: skip
    assert r.rc != 0 and "drop --model" in r.stderr and "Traceback" not in r.stderr
