"""The device check script (``scripts/device/race_check.py``) runs CUDA-free on the CPU: its
race, plugin, verification and drafter-invariance stages, small (the lent GPU runs it whole)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "race_check.py"


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setenv("DEV", "cpu")
    monkeypatch.setenv("QUICK", "1")
    spec = importlib.util.spec_from_file_location("race_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    os.environ.pop("ERSD_VLLM_NOISE", None)


def test_device_script_stages_pass_on_the_cpu(script, capsys) -> None:
    script.races()
    script.plugin()
    script.verification()
    script.invariance()
    out = capsys.readouterr().out
    for stage in ("1 races", "2 plugin", "3 verification", "4 drafter invariance"):
        assert stage in out, out
    assert "FAIL" not in out


def test_device_script_fails_loudly(script) -> None:
    with pytest.raises(SystemExit):
        script.check(False, "a deliberate failure")
