"""A write failure *during* the conversion of a bundled model is a one-line error (issue 29,
item 6).  Before: a full disk while ``save_pretrained`` wrote the weights gave a 40-line
traceback, because safetensors reports ``No space left on device (os error 28)`` as its own
``SafetensorError``, not an ``OSError`` (seen for real on a 200 MB tmpfs).  Here the kernel
refuses the write for real: the subprocess may not write files over 50 MB (``RLIMIT_FSIZE``,
``File too large (os error 27)``), so the 540 MB weights fail mid-write."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ersd.models.bundled.convert import as_os_error

ROOT = Path(__file__).resolve().parents[1]


def _small_files() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (50 * 2**20, 50 * 2**20))


@pytest.mark.realmodel
def test_write_failure_while_converting_is_one_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ["models", "prepare", "--quiet", "--cache-dir", str(cache), "smollm2-135m"]
    res = subprocess.run(
        [sys.executable, "-c", "from ersd.cli import main; main()", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_small_files,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.stderr[-3000:]
    assert "could not prepare bundled model 'smollm2-135m'" in errors[0]
    assert "File too large" in errors[0] and "ERSD_CACHE" in errors[0]
    models = cache / "models"
    assert not models.exists() or not any(models.iterdir())  # nothing half-written kept


def test_os_error_inside_a_writer_error() -> None:
    err = as_os_error(
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
        Path("/cache/x"),
    )
    assert isinstance(err, OSError) and err.errno == 28 and err.filename == "/cache/x"
    assert as_os_error(RuntimeError("header too large"), Path("/x")) is None
