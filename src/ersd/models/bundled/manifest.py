"""The marker file of a prepared folder and the check that the folder is still intact.

The marker (``ersd-prepared.json``, written last) records the GGUF checksum and dtype the folder
was converted from, and a manifest (key ``files``): the size and sha256 of every file the
conversion wrote, and the modification time it had when it was hashed.  :func:`check_folder`
compares the folder with it: cheaply (files present, sizes, safetensors headers consistent with
the file length, and the sha256 of every file whose modification time changed since it was
hashed: same-size corruption is caught at the next load) or fully (every sha256; ``ersd models
prepare`` does this by default).  A damage that keeps the file's size *and* restores its
modification time is found only by the full check.

Folders prepared by an older ersd have no manifest; they are accepted when their required files
are present and every safetensors file is complete, and :func:`adopt_legacy` then records their
manifest, so they are not converted again.  The manifest is an added key, not a new layout
version: older ersd versions sharing the cache keep accepting the folder.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ersd.models.bundled.catalog import BundledModel

#: written last into a prepared folder; a folder without it is never used
MARKER = "ersd-prepared.json"
#: bumped when the layout of a prepared folder changes (a new version makes prepare convert again)
FORMAT_VERSION = 1
#: files every converted folder has (besides at least one ``*.safetensors``)
REQUIRED_FILES = ("config.json", "tokenizer.json")

READ_BLOCK = 8 * 1024 * 1024


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def describe_files(folder: Path, *, hashes: bool = True) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256", "mtime_ns"}}`` of every file in ``folder`` but the
    marker (``sha256`` is ``None`` without ``hashes``)."""
    return {
        p.relative_to(folder).as_posix(): {
            "size": p.stat().st_size,
            "sha256": file_sha256(p) if hashes else None,
            "mtime_ns": p.stat().st_mtime_ns,
        }
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER and not p.name.startswith(f".{MARKER}")
    }


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's content; ``None`` if it is absent or unreadable."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def marker_matches(info: dict[str, Any] | None, model: BundledModel) -> bool:
    """Whether a marker describes a conversion of ``model``'s weights in the current layout."""
    return bool(
        info is not None
        and info.get("format") == FORMAT_VERSION
        and info.get("sha256") == model.sha256
        and info.get("dtype") == model.save_dtype
    )


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not complete (``None`` if its header matches its length).

    Reads only the header: 8 bytes of little-endian length, then JSON whose tensors'
    ``data_offsets`` end exactly where the file ends.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes, not even a header)"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                return f"{path.name} is truncated or not a safetensors file (header of {n} bytes)"
            header = json.loads(f.read(n))
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{path.name} is unreadable ({type(exc).__name__}: {exc})"
    if size < 8 + n + end:
        return f"{path.name} is truncated ({size:,} of {8 + n + end:,} bytes)"
    if size > 8 + n + end:
        return f"{path.name} has {size:,} bytes, its header describes {8 + n + end:,}"
    return None


@dataclass
class FolderCheck:
    """What :func:`check_folder` found.

    ``state``: ``"absent"`` (no folder or no marker: not prepared), ``"stale"`` (a marker from
    other weights, dtype or layout: converted again by the next prepare), ``"ok"`` or
    ``"damaged"`` (then ``problems`` says what).  ``legacy``: a folder without a manifest
    (prepared by an older ersd), or — when hashes were asked for — whose manifest lacks them.
    """

    state: str
    problems: list[str] = field(default_factory=list)
    legacy: bool = False
    #: files whose modification time changed but whose sha256 still matches (re-stamped)
    touched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def check_folder(folder: Path, model: BundledModel, *, hashes: bool = False) -> FolderCheck:
    """Compare a prepared folder with its marker's manifest (``hashes``: also every sha256)."""
    if not (folder / MARKER).is_file():
        return FolderCheck("absent")
    info = read_marker(folder)
    if not marker_matches(info, model):
        return FolderCheck("stale")
    assert info is not None
    problems: list[str] = []
    touched: list[str] = []
    files = info.get("files")
    legacy = not isinstance(files, dict)
    expected: dict[str, Any]
    if not isinstance(files, dict):
        expected = {name: None for name in REQUIRED_FILES}
        expected.update({p.name: None for p in sorted(folder.glob("*.safetensors"))})
        if not any(name.endswith(".safetensors") for name in expected):
            problems.append("no *.safetensors weight file")
    else:
        expected = {str(k): v for k, v in files.items()}
    for name, record in expected.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if record is not None and size != record.get("size"):
            problems.append(f"{name} has {size:,} bytes, {record.get('size'):,} were written")
            continue
        if name.endswith(".safetensors") and (why := safetensors_problem(path)):
            problems.append(why)
            continue
        recorded = None if record is None else record.get("sha256")
        stamp = None if record is None else record.get("mtime_ns")
        changed = stamp is not None and path.stat().st_mtime_ns != stamp
        if recorded is not None and (hashes or changed):
            if file_sha256(path) != recorded:
                problems.append(f"{name} does not match the sha256 recorded when it was written")
            elif changed:
                touched.append(name)
    if problems:
        return FolderCheck("damaged", problems, legacy)
    # a manifest without hashes or modification times is completed by a verifying prepare
    unstamped = not legacy and any(
        r.get("sha256") is None or r.get("mtime_ns") is None for r in expected.values()
    )
    return FolderCheck("ok", [], legacy or (hashes and unstamped), touched)


def restamp(folder: Path, names: list[str]) -> None:
    """Record the current modification time of files whose sha256 was just checked (so the next
    cheap check does not hash them again); raises ``OSError`` if read-only."""
    info = read_marker(folder)
    if info is None or not isinstance(info.get("files"), dict):
        return
    for name in names:
        info["files"][name]["mtime_ns"] = (folder / name).stat().st_mtime_ns
    write_marker(folder, info)


def adopt_legacy(folder: Path, *, hashes: bool = False) -> None:
    """Record the manifest of an intact folder that has none, or lacks its hashes (raises
    ``OSError`` if read-only).

    Sizes only by default, so that the first load after an upgrade stays cheap; the sha256 of
    each file is recorded by the first ``prepare(verify=True)`` (``ersd models prepare``), which
    trusts the files it finds then (their sizes and safetensors headers were checked).
    """
    info = read_marker(folder) or {}
    info["files"] = describe_files(folder, hashes=hashes)
    write_marker(folder, info)


def write_marker(folder: Path, info: dict[str, Any]) -> None:
    """Write the marker atomically (a temporary file renamed over it)."""
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(folder / MARKER)
