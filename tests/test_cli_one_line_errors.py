"""Bad input on the command line is a one-line error (issue 29, item 6), checked through a real
subprocess, so an escaped exception's traceback would show (click's test runner never prints
one).  Each run is capped at 2 GB of address space: ``@/dev/zero`` used to read until memory ran
out.  Before: a non-UTF-8 PROMPT gave a 41-line traceback; profile files with the right format
tag but wrong fields gave TypeError / AttributeError / ValueError / KeyError tracebacks.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ersd.theory.profile import CALIBRATION_FORMAT, PROFILE_FORMAT

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
TOY = ["--target", "toy", "--draft", "toy-draft", "--max-new-tokens", "2"]


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


def _ersd(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from ersd.cli import main; main()", *args],
        env=ENV,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        preexec_fn=_limit,
    )


def _one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode in (1, 2), (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


def test_non_utf8_prompt() -> None:
    line = _one_line_error(_ersd("generate", *TOY, b"caf\xe9 au lait"))
    assert "PROMPT: the prompt is not valid UTF-8 (byte 0xe9 at character 3)" in line


PROFILE = {"format": PROFILE_FORMAT, "version": 1, "counts": [5, 3, 1]}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({**PROFILE, "counts": "abc"}, "counts must be a list"),
        ({**PROFILE, "meta": 5}, 'field "meta" must be a JSON object'),
        ({**PROFILE, "depth_counts": 7}, 'field "depth_counts" must be a JSON list'),
        ({**PROFILE, "meta": {"temperature": "hot"}}, 'meta "temperature" is not a number'),
        ({"format": CALIBRATION_FORMAT}, 'has no "profiles" object'),
        ({"format": CALIBRATION_FORMAT, "profiles": [1]}, 'has no "profiles" object'),
        ({"format": CALIBRATION_FORMAT, "profiles": {"hot": PROFILE}}, "'hot' is not a temp"),
        ({"format": CALIBRATION_FORMAT, "profiles": {"0.7": {}}}, "temperature 0.7: not a rank"),
    ],
    ids=[
        "counts",
        "meta",
        "depth-counts",
        "meta-temperature",
        "cal-no-profiles",
        "cal-list",
        "cal-key",
        "cal-entry",
    ],
)
def test_profile_with_the_right_tag_but_wrong_fields(
    tmp_path: Path, content: dict, fragment: str
) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(content))
    line = _one_line_error(_ersd("generate", *TOY, "--tree", f"optimal:4@{path}", "hi"))
    assert fragment in line and str(path) in line, line


def test_character_device_as_profile() -> None:
    line = _one_line_error(_ersd("generate", *TOY, "--tree", "optimal:4@/dev/zero", "hi"))
    assert "'/dev/zero' is not a regular file" in line
