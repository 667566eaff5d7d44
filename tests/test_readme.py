"""The README's commands run as written.

Every ```bash / ```python block of README.md is preceded by a decision the test reads:

* ``<!-- readme-test: run -->`` — run here, in CI (in a scratch folder, with this venv's tools);
* ``<!-- readme-test: slow (why) -->`` — run by the slow suite (``bash scripts/test.sh --slow``),
  for blocks that load the bundled Qwen pair (~8 GB);
* ``<!-- readme-test: skip (why) -->`` — not run, with the reason written beside it (the set-up
  commands themselves, which CI runs as ``.ci/run``).

A block without a decision fails the test, so a new block cannot go untested by accident. The
complete ``ersd ...`` commands quoted inline in the README (no ``...`` or placeholder in them)
run too: the cheap ones here, the ones on the Qwen pair in the slow suite; ``ersd serve`` starts a
server that never returns and is run by ``tests/test_serve.py`` instead, and an ``ersd bench``
preset runs for hours, so its tests run it small (``tests/test_field_multidraft.py`` and the
other bench tests).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DECISION = re.compile(r"<!--\s*readme-test:\s*(run|slow|skip)\s*(?:\((.+)\))?\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


def code_blocks(text: str) -> list[tuple[int, str, str, str | None, str | None]]:
    """(line, language, code, decision, reason) for every fenced block."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        d = DECISION.search(prev)
        code = "\n".join(lines[start + 1 : j])
        blocks.append((start + 1, lang, code, d.group(1) if d else None, d and d.group(2)))
        i = j + 1
    return blocks


def inline_commands(text: str) -> list[str]:
    """Complete ``ersd ...`` commands quoted inline in the quick start (no ``...``, no upper-case
    placeholder); the results table names the benchmarks that produced its numbers, which take
    hours, and is not run."""
    if "## Quick start" in text:
        text = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    found = []
    for cmd in re.findall(r"`(ersd [^`]+)`", text):
        if "..." in cmd or re.search(r"\b[A-Z]{3,}\b", cmd):
            continue
        found.append(cmd)
    return list(dict.fromkeys(found))


BLOCKS = [b for b in code_blocks(README.read_text(encoding="utf-8")) if b[1] in ("bash", "python")]
SLOW_MODELS = ("qwen2.5-coder",)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(lang: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = (
        [sys.executable, "-c", code]
        if lang == "python"
        else ["bash", "-euo", "pipefail", "-c", code]
    )
    return subprocess.run(
        cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1500, check=False
    )


def test_every_block_has_a_decision_and_every_skip_a_reason() -> None:
    assert BLOCKS, "no bash/python blocks found in README.md"
    for line, lang, _, decision, reason in BLOCKS:
        assert decision is not None, (
            f"README.md line {line}: the ```{lang} block has no <!-- readme-test: ... --> line "
            "before it (run, slow (why) or skip (why))"
        )
        if decision in ("skip", "slow"):
            assert reason, f"README.md line {line}: readme-test: {decision} needs a (reason)"


def test_the_decision_parser_reads_what_it_should() -> None:
    text = "<!-- readme-test: skip (setup) -->\n```bash\necho hi\n```\n\n```python\nx = 1\n```\n"
    assert code_blocks(text) == [
        (2, "bash", "echo hi", "skip", "setup"),
        (6, "python", "x = 1", None, None),
    ]
    assert inline_commands("`ersd a b` and `ersd generate ... x` and `ersd bench run CONFIG`") == [
        "ersd a b"
    ]
    quick = "## Quick start\n`ersd a b`\n## Results\n`ersd bench serve`\n"
    assert inline_commands(quick) == ["ersd a b"]


def _params(decisions: tuple[str, ...]) -> list[object]:
    out = []
    for line, lang, code, decision, _ in BLOCKS:
        if decision == "run" and "run" in decisions:
            out.append(pytest.param(lang, code, id=f"line{line}-{lang}"))
        if decision == "slow" and "slow" in decisions:
            out.append(pytest.param(lang, code, id=f"line{line}-{lang}", marks=pytest.mark.slow))
    return out


@pytest.mark.parametrize(("lang", "code"), _params(("run", "slow")))
def test_readme_block_runs(lang: str, code: str, tmp_path: Path) -> None:
    proc = _run(lang, code, tmp_path)
    assert proc.returncode == 0, (
        f"README block failed:\n{code}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )


def _inline_params() -> list[object]:
    out = []
    for cmd in inline_commands(README.read_text(encoding="utf-8")):
        if cmd.startswith("ersd serve"):
            continue  # a server: started and driven by tests/test_serve.py
        if cmd.startswith("ersd bench"):
            continue  # a benchmark of hours: its presets are run small by tests/test_*bench*.py
        marks = [pytest.mark.slow] if any(m in cmd for m in SLOW_MODELS) else []
        out.append(pytest.param(cmd, id=cmd[:60], marks=marks))
    return out


@pytest.mark.parametrize("cmd", _inline_params())
def test_readme_inline_command_runs(cmd: str, tmp_path: Path) -> None:
    proc = _run("bash", cmd, tmp_path)
    assert proc.returncode == 0, f"README command failed: {cmd}\n{proc.stderr[-3000:]}"
