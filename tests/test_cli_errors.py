"""Bad input to the real ``ersd`` command: one ``Error:`` line, no traceback, non-zero exit.

Every case runs the installed console script (or ``python -m``-style equivalent) in a subprocess,
because click's test runner never prints tracebacks: only a real process shows what a user sees.
Each case checks

* a non-zero exit status;
* no ``Traceback`` anywhere on stderr;
* exactly one line starting with ``Error:`` on stderr, and it is the last line (click's usage
  banner may precede a usage error; progress lines may precede a load error), naming the
  problem (a fragment of the expected message);
* with ``--json``: nothing at all on stdout.

Cases marked ``xfail(strict=True)`` fail today in code another change owns (model loading, the
generate command); the reason says what must be wired.  ``strict`` makes them fail loudly once
fixed, so the mark is removed then.  The full list with the messages: ``docs/errors.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import ersd

SRC = str(Path(ersd.__file__).resolve().parents[1])
_SCRIPT = Path(sys.executable).with_name("ersd")
#: the real console script when installed next to this interpreter, else the same entry point
ERSD = (
    [str(_SCRIPT)]
    if _SCRIPT.is_file()
    else [sys.executable, "-c", "import sys; from ersd.cli import main; sys.exit(main())"]
)
SMOL = ["--target", "smollm2-135m", "--draft", "none", "--dtype", "float32"]
PAIR = ["--target", "smollm2-135m", "--draft", "smollm2-135m", "--dtype", "float32"]
SHORT = ["--max-new-tokens", "2", "--json", "hi"]


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str


def run_ersd(*args: str, env: dict[str, str] | None = None) -> Run:
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        [*ERSD, *args], capture_output=True, text=True, env=full_env, timeout=600, check=False
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_clean_error(res: Run, fragment: str, *, json_mode: bool) -> None:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.rc != 0, (res.rc, res.stdout[-500:], res.stderr[-500:])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr[-2000:]
    assert fragment in errors[0], errors[0]
    if json_mode:
        assert res.stdout == "", res.stdout[-500:]


# --- cases that fail before any model is loaded ---------------------------------------------------
# (generate cases name the small SmolLM2 anyway, so that a check moved after loading costs seconds,
# not the default Qwen pair)

FAST_CASES = [
    pytest.param(
        ["generate", *SMOL, "--tree", "chain:0", "--json", "hi"], "chain:4", id="tree-chain0"
    ),
    pytest.param(
        ["generate", *SMOL, "--method", "nope", "--json", "hi"], "known methods", id="method"
    ),
    pytest.param(
        ["generate", *SMOL, "--temperature", "-1", "--json", "hi"], "temperature", id="temp-neg"
    ),
    pytest.param(
        ["generate", *SMOL, "--temperature", "nan", "--json", "hi"], "temperature", id="temp-nan"
    ),
    pytest.param(["generate", *SMOL, "--top-p", "0", "--json", "hi"], "top_p", id="top-p-0"),
    pytest.param(["generate", *SMOL, "--top-p", "1.5", "--json", "hi"], "top_p", id="top-p-1.5"),
    pytest.param(["generate", *SMOL, "--top-k", "0", "--json", "hi"], "top_k", id="top-k-0"),
    pytest.param(["generate", *SMOL, "--min-p", "1", "--json", "hi"], "min_p", id="min-p-1"),
    pytest.param(["generate", *SMOL, "--seed", "1.5", "--json", "hi"], "seed", id="seed-float"),
    pytest.param(
        ["generate", *SMOL, "--dtype", "int4", "--json", "hi"], "dtype", id="dtype-choice"
    ),
    pytest.param(
        ["models", "prepare", "nope"], "unknown bundled model 'nope'", id="prepare-unknown"
    ),
    pytest.param(["models", "prepare"], "give model names or --all", id="prepare-nothing"),
    pytest.param(["models", "requirements", "nope"], "known names", id="requirements-unknown"),
    pytest.param(["nope"], "No such command", id="unknown-command"),
    pytest.param(["bench", "run", "no-such-config"], "no-such-config", id="bench-unknown-config"),
]


@pytest.mark.parametrize(("args", "fragment"), FAST_CASES)
def test_cli_error_without_weights(args: list[str], fragment: str) -> None:
    assert_clean_error(run_ersd(*args), fragment, json_mode="--json" in args)


def test_read_only_cache_names_ersd_cache(tmp_path: Path) -> None:
    """An unprepared, unwritable cache: the fix is $ERSD_CACHE (here EPERM under /sys)."""
    env = {"ERSD_CACHE": "/sys/ersd-cache"}
    res = run_ersd("models", "prepare", "--quiet", "smollm2-135m", env=env)
    assert_clean_error(res, "export ERSD_CACHE=", json_mode=False)
    res = run_ersd("generate", *SMOL, *SHORT, env=env)
    assert_clean_error(res, "export ERSD_CACHE=", json_mode=True)


def test_cache_dir_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = run_ersd(
        "models", "prepare", "--quiet", "--cache-dir", str(afile / "sub"), "smollm2-135m"
    )
    assert_clean_error(res, "ERSD_CACHE", json_mode=False)


def test_profile_path_that_is_a_directory(tmp_path: Path) -> None:
    res = run_ersd("theory", "--profile", str(tmp_path))
    assert_clean_error(res, "is a directory", json_mode=False)


def test_profile_path_that_does_not_exist(tmp_path: Path) -> None:
    res = run_ersd("theory", "--profile", str(tmp_path / "missing.json"))
    assert_clean_error(res, "does not exist", json_mode=False)


def test_profile_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    res = run_ersd("theory", "--profile", str(bad))
    assert_clean_error(res, "profile.json", json_mode=False)


# --- cases that load (or try to load) a model --------------------------------------------------


@pytest.fixture(scope="module")
def smol_folder() -> Path:
    from ersd.models import bundled

    return bundled.prepare("smollm2-135m", progress=False)


def _model_folder(tmp_path: Path, smol: Path, *, skip: str = "", truncate: bool = False) -> Path:
    """A copy of the prepared SmolLM2 folder (weights linked), without ``skip``, or with its
    weights truncated."""
    folder = tmp_path / "model"
    folder.mkdir()
    for src in smol.iterdir():
        if src.name in (skip, "ersd-prepared.json"):
            continue
        if src.name == "model.safetensors":
            if truncate:
                with open(src, "rb") as f:
                    (folder / src.name).write_bytes(f.read(100_000))
            else:
                (folder / src.name).symlink_to(src)
        else:
            (folder / src.name).write_bytes(src.read_bytes())
    return folder


@pytest.mark.realmodel
def test_folder_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "bogus"}')
    res = run_ersd("generate", "--target", str(tmp_path), "--draft", "none", *SHORT)
    assert_clean_error(res, str(tmp_path), json_mode=True)


@pytest.mark.realmodel
def test_truncated_weights_in_a_folder(tmp_path: Path, smol_folder: Path) -> None:
    folder = _model_folder(tmp_path, smol_folder, truncate=True)
    res = run_ersd("generate", "--target", str(folder), "--draft", "none", *SHORT)
    assert_clean_error(res, "model.safetensors", json_mode=True)


@pytest.mark.realmodel
def test_folder_without_tokenizer(tmp_path: Path, smol_folder: Path) -> None:
    folder = _model_folder(tmp_path, smol_folder, skip="tokenizer.json")
    res = run_ersd("generate", "--target", str(folder), "--draft", "none", *SHORT)
    assert_clean_error(res, "tokenizer", json_mode=True)


@pytest.mark.realmodel
def test_damaged_bundled_folder_is_listed_with_the_fix(tmp_path: Path, smol_folder: Path) -> None:
    """A prepared folder whose weights were truncated, in a private cache: ``models list`` says
    DAMAGED with the fix.  (The repair itself is tested with a fake conversion in
    test_bundled.py; a real one takes a minute.)"""
    cache = tmp_path / "cache"
    copy = cache / "models" / smol_folder.name
    copy.mkdir(parents=True)
    for src in smol_folder.iterdir():
        if src.name != "model.safetensors":
            (copy / src.name).write_bytes(src.read_bytes())
    with open(smol_folder / "model.safetensors", "rb") as f:
        (copy / "model.safetensors").write_bytes(f.read(100_000))
    res = run_ersd("models", "list", env={"ERSD_CACHE": str(cache)})
    assert res.rc == 0 and "Traceback" not in res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("smollm2-135m"))
    assert "DAMAGED" in row
    assert "model.safetensors has 100,000 bytes" in res.stdout
    assert "fix: ersd models prepare smollm2-135m" in res.stdout


MODEL_CASES = [
    pytest.param(
        [*SMOL, "--temperature", "1e-320", *SHORT],
        "temperature=0 for greedy",
        id="temp-subnormal",
    ),
    pytest.param(
        [*SMOL, "--device", "gpu", *SHORT],
        "gpu",
        id="device-gpu",
    ),
    pytest.param(
        [*SMOL, "--device", "cuda:7", *SHORT],
        "cuda:7",
        id="device-cuda7",
    ),
    pytest.param(
        [*PAIR, "--draft-layers", "-1", *SHORT],
        "from 1 to 30",
        id="draft-layers-neg",
    ),
    pytest.param(
        [*PAIR, "--draft-layers", "0", *SHORT],
        "from 1 to 30",
        id="draft-layers-0",
    ),
    pytest.param(
        [*PAIR, "--draft-layers", "99", *SHORT],
        "from 1 to 30",
        id="draft-layers-99",
    ),
    pytest.param(
        [*SMOL, "--seed", "-1", *SHORT],
        "seed",
        id="seed-neg",
    ),
    pytest.param(
        [*SMOL, "--seed", str(2**64), *SHORT],
        "seed",
        id="seed-2**64",
    ),
    pytest.param(
        [*SMOL, "--max-new-tokens", "0", "--json", "hi"], "max_new_tokens", id="max-new-0"
    ),
    pytest.param(
        ["--target", "no-such-model", "--draft", "none", *SHORT],
        "no-such-model",
        id="target-unknown",
    ),
]


@pytest.mark.realmodel
@pytest.mark.parametrize(("args", "fragment"), MODEL_CASES)
def test_cli_error_with_a_model(args: list[str], fragment: str, smol_folder: Path) -> None:
    assert_clean_error(run_ersd("generate", *args), fragment, json_mode=True)
