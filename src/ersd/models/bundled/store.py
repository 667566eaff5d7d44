"""The cache on disk: where things live, the per-model lock, disk and permission errors, and the
sweep of temporary leftovers of interrupted prepares.

Layout under the cache root (``cache_dir``, else ``$ERSD_CACHE``, else ``~/.cache/ersd``)::

    models/<name>-<sha256[:16]>/          a prepared folder (marker file written last)
    models/.tmp-<name>-<sha16>-<pid>-<r>/ a conversion in progress (renamed into place when done)
    gguf/<gguf_file>                      an assembled multi-part GGUF (kept on request)
    gguf/.<gguf_file>.<pid>.<r>.partial   an assembly in progress
    gguf/<gguf_file>.verified.json        size, mtime and sha256 of a verified GGUF
    locks/<name>.lock                     held (flock) while a process prepares <name>
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ersd.errors import ModelLoadError
from ersd.models.bundled.catalog import BUNDLED, BundledModel
from ersd.models.memory import available_memory  # noqa: F401  (one copy, used via store.)

#: environment variable that overrides the cache root
CACHE_ENV = "ERSD_CACHE"
#: cache root used when neither ``cache_dir`` nor ``$ERSD_CACHE`` is given
DEFAULT_CACHE = Path("~/.cache/ersd")
#: a temporary folder or file older than this whose model nobody is preparing is removed
STALE_AFTER_S = 3600.0
#: prefix of a conversion in progress under ``models/``
TMP_PREFIX = ".tmp-"

GB = 1_000_000_000

_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


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


def assembled_path(model: BundledModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the assembled GGUF of a multi-part ``model`` lives in the cache."""
    return cache_root(cache_dir) / "gguf" / model.gguf_file


def lock_path(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return cache_root(cache_dir) / "locks" / f"{name}.lock"


def say(progress: bool, message: str) -> None:
    """A progress message on stderr (only when ``progress``; the CLI's ``--quiet`` turns it off)."""
    if progress:
        print(message, file=sys.stderr, flush=True)


def cache_error(exc: OSError, root: Path, what: str) -> ModelLoadError:
    """The :class:`ModelLoadError` for an ``OSError`` met while writing the cache."""
    where = exc.filename or root
    if exc.errno in _FULL:
        problem = f"the disk holding the model cache is full ({where})"
        fix = "free some space, or point"
    elif exc.errno in _NOT_WRITABLE:
        problem = f"the model cache {root} is not writable ({exc.strerror}: {where})"
        fix = "point"
    else:
        problem = f"the model cache {root} could not be written ({exc.strerror or exc}: {where})"
        fix = "check the folder, or point"
    return ModelLoadError(
        f"could not {what}: {problem}. {fix.capitalize()} ${CACHE_ENV} at a writable folder "
        f"with space, e.g. `export {CACHE_ENV}=/tmp/ersd-cache` (or pass cache_dir= / "
        "--cache-dir)."
    )


@contextlib.contextmanager
def translate_os_errors(root: Path, what: str) -> Iterator[None]:
    """Turn a read-only, full or otherwise unwritable cache into a :class:`ModelLoadError`."""
    try:
        yield
    except ModelLoadError:
        raise
    except OSError as exc:
        raise cache_error(exc, root, what) from exc


def _flock_module() -> Any:
    try:
        import fcntl
    except ImportError:  # Windows: no locking (documented)
        return None
    return fcntl


@contextlib.contextmanager
def exclusive(path: Path, waiting: str, progress: bool) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``) while the block runs.

    Two processes preparing the same model (parallel test workers, two benchmark runs) would
    otherwise both convert it, doubling the memory peak, and one could delete the assembled
    GGUF while the other still reads it.  Without ``fcntl`` (Windows) this does not lock.
    """
    fcntl = _flock_module()
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(progress, waiting)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _lock_is_free(path: Path) -> bool:
    """Whether no process holds the flock on ``path`` right now (probed, released at once)."""
    fcntl = _flock_module()
    if fcntl is None or not path.is_file():
        return fcntl is not None  # no lock file: nobody is preparing; no fcntl: cannot tell
    try:
        with open(path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True
    except OSError:
        return False


def check_disk(folder: Path, needed: int, what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelLoadError(
            f"not enough disk space to {what}: about {needed / GB:.1f} GB needed under {folder}, "
            f"{free / GB:.1f} GB free. Free some space or point ${CACHE_ENV} (or cache_dir=) at "
            "a larger disk."
        )


# ----------------------------------------------------------------------------- leftovers


def _owner(entry: Path) -> str | None:
    """The bundled model a temporary entry belongs to (``None`` if it cannot be told)."""
    name = entry.name
    if entry.parent.name == "models" and name.startswith(TMP_PREFIX):
        parts = name[len(TMP_PREFIX) :].rsplit("-", 3)  # <name>-<sha16>-<pid>-<random>
        return parts[0] if len(parts) == 4 else None
    if entry.parent.name == "gguf" and name.startswith(".") and name.endswith(".partial"):
        gguf_file = name[1:].rsplit(".", 3)[0]  # .<gguf_file>.<pid>.<random>.partial
        return next((m.name for m in BUNDLED.values() if m.gguf_file == gguf_file), None)
    return None


def leftovers(cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Temporary folders and files of prepares in progress or interrupted, oldest first."""
    root = cache_root(cache_dir)
    found: list[Path] = []
    for sub, match in (
        ("models", lambda n: n.startswith(TMP_PREFIX)),
        ("gguf", lambda n: n.startswith(".") and n.endswith(".partial")),
    ):
        folder = root / sub
        with contextlib.suppress(OSError):  # an unreadable cache has no leftovers to show
            found.extend(p for p in folder.iterdir() if match(p.name))

    def age_key(p: Path) -> float:
        try:
            return p.lstat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=age_key)


def sweep_stale(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    min_age_s: float = STALE_AFTER_S,
    held: str | None = None,
) -> list[Path]:
    """Remove leftovers of interrupted prepares; return what was removed.

    An entry is removed only when no running prepare can own it: its model's lock is free (or is
    ``held`` by the caller, who is inside that lock), and it was last modified more than
    ``min_age_s`` seconds ago (the caller's own model: any age, since the lock proves nobody
    else is writing it).  Entries whose model cannot be told are removed on age alone; without
    ``flock`` (Windows) nothing younger than a day is touched.
    """
    removed = []
    now = time.time()
    have_locks = _flock_module() is not None
    for entry in leftovers(cache_dir):
        owner = _owner(entry)
        try:
            age = now - entry.lstat().st_mtime
        except OSError:
            continue
        if owner is not None and owner == held and have_locks:
            needed_age = 0.0
        elif have_locks:
            if owner is not None and not _lock_is_free(lock_path(owner, cache_dir)):
                continue
            needed_age = min_age_s
        else:
            needed_age = max(min_age_s, 86400.0)
        if age < needed_age:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # read-only cache, or removed by someone else meanwhile
        removed.append(entry)
    return removed
