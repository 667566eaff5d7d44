"""The llama.cpp backend without its extra: a clear error with the exact install command.

Runs whether or not llama-cpp-python is installed (the import is blocked for the test)."""

from __future__ import annotations

import sys

import pytest

import ersd
from ersd.errors import ModelLoadError
from ersd.models import llamacpp


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "_LIB", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ModelLoadError) as err:
        ersd.load_model("smollm2-135m", backend="llamacpp")
    assert "pip install 'ersd[llamacpp]'" in str(err.value)
    assert llamacpp.LLAMA_CPP_PYTHON_VERSION in str(err.value)


def test_extra_pin_matches_module() -> None:
    """The extra in pyproject.toml pins the version the module names (one fact, two places)."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'llamacpp = ["llama-cpp-python=={llamacpp.LLAMA_CPP_PYTHON_VERSION}"]' in text
