"""GGUF -> a Hugging Face folder (safetensors + tokenizer), written atomically with its manifest."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

from ersd.errors import ModelLoadError
from ersd.models.bundled import store
from ersd.models.bundled.catalog import BundledModel
from ersd.models.bundled.manifest import FORMAT_VERSION, check_folder, describe_files, write_marker


def as_os_error(exc: Exception, path: Path) -> OSError | None:
    """The ``OSError`` inside a writer's error (safetensors: ``... (os error 28)``), so the cache
    code names a full disk and the fix; ``None`` for other errors."""
    m = re.search(r"\(os error (\d+)\)", str(exc))
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code), str(path))


def convert(model: BundledModel, gguf: Path, dest: Path, progress: bool) -> None:
    """Convert ``gguf`` into a prepared folder at ``dest``.

    Everything is written into ``models/.tmp-<dest>-<pid>-<random>``; the marker, holding the
    manifest (size and sha256 of every file written), comes last, then the folder is renamed
    into place, so a crash never leaves a folder that looks prepared.
    """
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            f"preparing {model.name!r} needs transformers, gguf and accelerate ({exc}). "
            "Install them with: pip install 'ersd[hf]'"
        ) from exc

    dest.parent.mkdir(parents=True, exist_ok=True)
    store.check_disk(dest.parent, model.converted_bytes, f"convert {model.name}")
    tmp = dest.parent / f"{store.TMP_PREFIX}{dest.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    hf_logging = transformers.utils.logging
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    available = store.available_memory()
    if available is not None and available < model.convert_peak_bytes:
        store.say(
            progress,
            f"note: converting {model.name} peaks near {model.convert_peak_bytes / store.GB:.1f} "
            f"GB of memory and only {available / store.GB:.1f} GB is available; if it gets "
            "killed, close other programs and run `ersd models prepare` again",
        )
    start = time.perf_counter()
    try:
        store.say(
            progress,
            f"converting {model.name} to safetensors ({model.save_dtype}); "
            "this takes a minute or so, once ...",
        )
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            lm = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, model.save_dtype)
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(
                f"transformers could not read the GGUF file of {model.name!r} ({gguf}): "
                f"{type(exc).__name__}: {exc}. Its checksum matched, so the installed "
                f"transformers/gguf may be too old: pip install -U 'ersd[hf]'"
            ) from exc
        # the GGUF quantizer stays attached after dequantising and makes save_pretrained refuse
        lm.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        tmp.mkdir(parents=True)
        try:
            lm.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        except OSError:
            raise
        except Exception as exc:  # safetensors reports a full disk as its own error type
            err = as_os_error(exc, tmp)
            if err is None:
                raise
            raise err from exc
        del lm
        seconds = time.perf_counter() - start
        marker = {
            "format": FORMAT_VERSION,
            "name": model.name,
            "upstream": model.upstream,
            "sha256": model.sha256,
            "gguf_file": model.gguf_file,
            "dtype": model.save_dtype,
            "packages": [f"{p}=={model.version}" for p in model.packages],
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "convert_seconds": round(seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": describe_files(tmp),
        }
        write_marker(tmp, marker)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not check_folder(dest, model).ok:  # not another process finishing first
                raise
        store.say(progress, f"converted {model.name} in {seconds:.0f} s -> {dest}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if bars_were_on and not progress:
            hf_logging.enable_progress_bar()
