"""The watermark's command line, run for real in subprocesses on SmolLM2-135M (float32):
``ersd watermark keygen``, ``ersd generate --watermark-key-file``, ``ersd watermark detect``,
``ersd audit``; the key never shows in any output."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from ersd.watermark import load_watermark
from tests.test_cli_errors import PAIR, run_ersd

pytestmark = pytest.mark.realmodel

PROMPT = "Tell me a story about a dragon who collects teapots."


def _key_forms(path: Path) -> list[str]:
    wm = load_watermark(path)
    raw = wm.key if isinstance(wm.key, bytes) else int(wm.key).to_bytes(8, "big")
    return [raw.hex(), raw.hex()[:16], base64.b64encode(raw).decode()[:16]]


#: a fixed key and seed, so the sampled text is reproducible (with them SmolLM2 writes all 96
#: tokens without stopping at EOS)
KEY_HEX = "5c" * 16 + "a3" * 16
SEED = 1


def test_keygen_writes_a_private_key_file(tmp_path: Path) -> None:
    path = tmp_path / "new.key"
    r = run_ersd("watermark", "keygen", "--out", str(path), "--tokenizer", "smollm2-135m")
    assert r.rc == 0, r.stderr
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert load_watermark(path).tokenizer == "smollm2-135m"
    for form in _key_forms(path):
        assert form not in r.stdout and form not in r.stderr
    r = run_ersd("watermark", "keygen", "--out", str(path))
    assert r.rc != 0 and "never overwritten" in r.stderr


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wm") / "key.json"
    path.write_text(json.dumps({"key": KEY_HEX, "tokenizer": "smollm2-135m"}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def generated(key_file: Path) -> dict[str, object]:
    r = run_ersd(
        "generate",
        *PAIR,
        "--draft-layers",
        "10",
        "--tree",
        "chain:4",
        "--temperature",
        "1",
        "--max-new-tokens",
        "96",
        "--seed",
        str(SEED),
        "--watermark-key-file",
        str(key_file),
        "--compare",
        "--json",
        PROMPT,
    )
    assert r.rc == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["num_tokens"] >= 64, out  # this key and seed sample a long text
    for form in _key_forms(key_file):
        assert form not in r.stdout and form not in r.stderr
    return out


def test_generate_marks_every_token_and_keeps_drafter_invariance(
    generated: dict[str, object], key_file: Path
) -> None:
    wm = generated["watermark"]
    assert isinstance(wm, dict)
    assert wm["salt"] == SEED % 8 and wm["key_fingerprint"] == load_watermark(key_file).fingerprint
    assert (wm["version"], wm["num_salts"]) == (1, 8)  # a key file without "version" is v1
    assert (
        generated["identical_to_target_only"] is True
    )  # watermarked ERSD = watermarked target-only


def test_generate_refuses_a_key_made_for_another_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "other.key"
    path.write_text(json.dumps({"key": KEY_HEX, "tokenizer": "no-such-tokenizer-anywhere"}))
    path.chmod(0o600)
    r = run_ersd(
        "generate", *PAIR, "--max-new-tokens", "4", "--watermark-key-file", str(path), PROMPT
    )
    assert r.rc != 0
    assert "the key file is for tokenizer 'no-such-tokenizer-anywhere'" in r.stderr
    assert "Traceback" not in r.stderr


def test_detect_finds_the_text_and_not_unwatermarked_text(
    generated: dict[str, object], key_file: Path, tmp_path: Path
) -> None:
    text = tmp_path / "text.txt"
    text.write_text(str(generated["text"]))
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(key_file),
        "--tokenizer",
        "smollm2-135m",
        "--json",
        str(text),
    )
    assert r.rc == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["watermarked"] and d["p_value"] < 1e-6 and d["salt"] == SEED % 8
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(generated["tokens"]))
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(key_file),
        "--tokenizer",
        "smollm2-135m",
        "--ids",
        "--json",
        "--salt",
        str(SEED % 8),
        str(ids),
    )
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["p_value"] < 1e-6 and d["salts_tried"] == 1
    plain = tmp_path / "plain.txt"
    plain.write_text(Path(__file__).read_text()[:2000])  # human-written text
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(key_file),
        "--tokenizer",
        "smollm2-135m",
        str(plain),
    )
    assert r.rc == 0 and r.stdout.startswith("not watermarked"), r.stdout + r.stderr
    for form in _key_forms(key_file):
        assert form not in r.stdout and form not in r.stderr


def test_detect_refuses_another_tokenizer_and_a_readable_key(
    key_file: Path, tmp_path: Path
) -> None:
    text = tmp_path / "t.txt"
    text.write_text("some text " * 20)
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(key_file),
        "--tokenizer",
        "qwen2.5-coder-0.5b",
        str(text),
    )
    assert r.rc != 0 and "smollm2-135m" in r.stderr and "Traceback" not in r.stderr
    open_key = tmp_path / "open.key"
    open_key.write_text(key_file.read_text())
    open_key.chmod(0o644)
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(open_key),
        "--tokenizer",
        "smollm2-135m",
        str(text),
    )
    assert r.rc != 0 and "chmod 600" in r.stderr and "Traceback" not in r.stderr
    for form in _key_forms(key_file):
        assert form not in r.stderr


def test_audit_verifies_the_text_and_catches_an_edit(
    generated: dict[str, object], key_file: Path
) -> None:
    common = [
        "audit",
        "--target",
        "smollm2-135m",
        "--prompt",
        PROMPT,
        "--seed",
        str(SEED),
        "--watermark-key-file",
        str(key_file),
        "--json",
    ]
    tokens = generated["tokens"]
    assert isinstance(tokens, list)
    r = run_ersd(*common, "--text", str(generated["text"]))
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    # text -> tokens may not round-trip exactly; every token that round-trips is the winner
    assert r.rc == 0 and rep["verified"], r.stdout + r.stderr
    edited = str(generated["text"]).replace(" ", " the ", 1)
    r = run_ersd(*common, "--text", edited)
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.rc == 1 and not rep["verified"] and rep["first_forgery"] is not None
