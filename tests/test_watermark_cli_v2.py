"""Issue 48's watermark items on the command line, in subprocesses: one-line errors for a key in
a missing folder, unbounded or malformed inputs; ``ersd audit --ids`` fed by ``ersd generate
--json``; a version-2 key end to end; the key's tokenizer recognised by vocabulary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.test_cli_errors import PAIR, Run, assert_clean_error, run_ersd

PROMPT = "Write a short note about lighthouses."
SEED = 3


def _key(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "k.key"
    path.write_text(json.dumps({"key": "5c" * 16 + "a3" * 16, **fields}))
    path.chmod(0o600)
    return path


def test_keygen_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    r = run_ersd("watermark", "keygen", "--out", str(tmp_path / "no-such-dir" / "x.key"))
    assert_clean_error(r, "cannot create the key file", json_mode=False)


def _detect(key: Path, *args: str) -> Run:
    return run_ersd(
        "watermark", "detect", "--key-file", str(key), "--tokenizer", "smollm2-135m", *args
    )


def test_detect_stops_at_once_on_an_endless_input(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    r = _detect(_key(tmp_path), "/dev/zero")
    assert time.perf_counter() - t0 < 60
    assert_clean_error(r, "larger than", json_mode=False)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("5", "got a JSON int"),
        ('"1 2 3"', "got a JSON str"),
        ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
        ("[" + "9" * 5000 + "]", "unreadable JSON value"),
        ("[1, 2", "not valid JSON"),
        ("[[1, 2]]", "not an integer token id"),
    ],
)
def test_detect_ids_errors_are_one_line(tmp_path: Path, body: str, fragment: str) -> None:
    ids = tmp_path / "ids.json"
    ids.write_text(body)
    r = _detect(_key(tmp_path), "--ids", str(ids))
    assert_clean_error(r, fragment, json_mode=False)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"num_salts": 10**10}, "num_salts"),
        ({"version": 7}, "version"),
    ],
)
def test_detect_key_errors_are_one_line(tmp_path: Path, fields: dict, fragment: str) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello " * 30)
    r = _detect(_key(tmp_path, **fields), str(text))
    assert_clean_error(r, fragment, json_mode=False)


def test_a_json_key_file_with_a_huge_integer_is_one_line(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    key.write_text('{"key": "' + "ab" * 16 + '", "num_salts": ' + "9" * 5000 + "}")
    key.chmod(0o600)
    text = tmp_path / "t.txt"
    text.write_text("hello " * 30)
    r = _detect(key, str(text))
    assert_clean_error(r, "unreadable JSON value", json_mode=False)


# --- with the model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    folder = tmp_path_factory.mktemp("wm2")
    key = folder / "k.key"
    r = run_ersd("watermark", "keygen", "--out", str(key), "--tokenizer", "smollm2-135m")
    assert r.rc == 0, r.stderr
    # keygen's file as written, with its random secret pinned: a random secret makes a random
    # text, and now and then that text is a lone end-of-text token (CI met one) with nothing left
    # to audit or detect; pinned, the text is a fixed function of (secret, seed, prompt)
    fields = json.loads(key.read_text())
    assert fields.get("tokenizer") and fields.get("version") == 2, fields
    fields["key"] = "5c" * 16 + "a3" * 16
    key.write_text(json.dumps(fields))
    r = run_ersd(
        "generate",
        *PAIR,
        "--draft-layers",
        "10",
        "--temperature",
        "1",
        "--max-new-tokens",
        "48",
        "--seed",
        str(SEED),
        "--watermark-key-file",
        str(key),
        "--json",
        PROMPT,
    )
    assert r.rc == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out["tokens"], list) and len(out["tokens"]) >= 20, out
    return key, out


@pytest.mark.realmodel
def test_audit_ids_from_generate_json_and_detect_with_the_prompt(
    v2: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    key, out = v2
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(out))  # generate --json's whole object: audit reads its tokens
    common = ["audit", "--target", "smollm2-135m", "--prompt", PROMPT, "--seed", str(SEED)]
    r = run_ersd(*common, "--watermark-key-file", str(key), "--ids", str(gen), "--json")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    tokens = out["tokens"]
    assert isinstance(tokens, list)
    assert r.rc == 0 and rep["status"] == "verified" and rep["tokens"] == len(tokens)
    tokens = list(tokens)
    tokens[10] = (tokens[10] + 1) % 49152
    gen.write_text(json.dumps(tokens))
    r = run_ersd(*common, "--watermark-key-file", str(key), "--ids", str(gen), "--json")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.rc == 1 and rep["status"] == "forgery" and rep["first_forgery"] == 10
    # the text: verified (re-aligned wherever it re-tokenizes otherwise), exit 0
    r = run_ersd(*common, "--watermark-key-file", str(key), "--text", str(out["text"]), "--json")
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.rc == 0 and rep["status"] == "verified", r.stdout + r.stderr
    # detect: without the prompt the opening is unscored; with it, every position is
    text = tmp_path / "t.txt"
    text.write_text(str(out["text"]))
    r = _detect(key, "--json", str(text))
    blind = json.loads(r.stdout.strip().splitlines()[-1])
    r = _detect(key, "--json", "--prompt", PROMPT, str(text))
    full = json.loads(r.stdout.strip().splitlines()[-1])
    assert blind["skipped_opening"] == 4 and full["skipped_opening"] == 0
    assert full["p_value"] <= blind["p_value"] < 1e-3


@pytest.mark.realmodel
def test_the_keys_tokenizer_is_recognised_by_its_folder(
    v2: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    from ersd.models.bundled.cache import prepare

    key, out = v2
    folder = str(prepare("smollm2-135m", progress=False))
    text = tmp_path / "t.txt"
    text.write_text(str(out["text"]))
    r = run_ersd("watermark", "detect", "--key-file", str(key), "--tokenizer", folder, str(text))
    assert r.rc == 0 and r.stdout.startswith("WATERMARKED"), r.stdout + r.stderr
    r = run_ersd(
        "watermark",
        "detect",
        "--key-file",
        str(key),
        "--tokenizer",
        "qwen2.5-coder-0.5b",
        str(text),
    )
    assert r.rc != 0 and "smollm2-135m" in r.stderr and "Traceback" not in r.stderr
