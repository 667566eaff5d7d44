"""``ersd generate --prompts-file FILE.jsonl --batch-size N`` on the toy models (ms a run).

Every batched line must equal ``ersd generate PROMPT`` alone with the seed the line reports (batch
invariance through the CLI); bad files and option mixes are refused with a message naming the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import ersd
from ersd.cli import main

TOY = ["--target", "toy", "--draft", "toy-draft", "--tree", "chain:2"]
PROMPTS = [
    {"prompt": "def add(a, b):"},
    {"prompt": "The capital of France is", "seed": 42, "task_id": "ignored"},
    {"prompt": "Once upon a time", "max_new_tokens": 3},
    {"prompt": "hello"},
    {"prompt": "x = [1, 2, 3]"},
]


def _write(tmp_path: Path, rows: list[object] | str, name: str = "p.jsonl") -> str:
    path = tmp_path / name
    text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    return str(path)


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, ["generate", *args], catch_exceptions=False)


def _jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("ersd", []),
        ("sd", []),
        ("ersd", ["--draft", "lookup"]),
        ("ersd", ["--draft", "none"]),
        ("ersd", ["--tree", "dynamic:4"]),
        ("sd", ["--tree", "dynamic:3"]),
    ],
    ids=["ersd", "sd", "lookup", "target-only", "dynamic", "sd-dynamic"],
)
def test_each_line_equals_its_single_prompt_run(
    tmp_path: Path, method: str, extra: list[str]
) -> None:
    path = _write(tmp_path, PROMPTS)
    common = [*TOY, *extra, "--method", method, "--max-new-tokens", "6", "--temperature", "1"]
    res = _run(*common, "--prompts-file", path, "--batch-size", "2", "--seed", "5", "--json")
    assert res.exit_code == 0, res.output
    rows = _jsonl(res.stdout)  # every stdout line is one JSON object, in input order
    assert [r["index"] for r in rows] == list(range(len(PROMPTS)))
    for i, (row, src) in enumerate(zip(rows, PROMPTS, strict=True)):
        assert row["prompt"] == src["prompt"]
        assert row["seed"] == src.get("seed", ersd.derive_seed(5, i))
        n = src.get("max_new_tokens", 6)
        assert row["num_tokens"] == len(row["tokens"]) == n  # toy models have no EOS
        assert row["block_efficiency"] == pytest.approx(n / row["target_calls"])
        single = ["--seed", str(row["seed"]), "--max-new-tokens", str(n), "--json", src["prompt"]]
        solo = _run(*common, *single)
        assert solo.exit_code == 0, solo.output
        one = json.loads(solo.stdout.strip().splitlines()[-1])
        assert (row["tokens"], row["text"]) == (one["tokens"], one["text"]), i
    assert "5 prompts" in res.stderr and "batch size 2" in res.stderr


def test_out_file_and_human_output(tmp_path: Path) -> None:
    path = _write(tmp_path, PROMPTS[:3])
    out = tmp_path / "out" / "r.jsonl"
    out.parent.mkdir()
    args = [*TOY, "--prompts-file", path, "--max-new-tokens", "4"]
    res = _run(*args, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # --out implies --json; the summary goes to stderr
    written = _jsonl(out.read_text())
    on_stdout = _jsonl(_run(*args, "--json", "--no-progress").stdout)
    strip = ("wall_time", "draft_time", "target_time", "other_time", "tokens_per_second")
    assert [{k: v for k, v in r.items() if k not in strip} for r in written] == [
        {k: v for k, v in r.items() if k not in strip} for r in on_stdout
    ]
    assert "3/3" in res.stderr  # the tqdm bar

    human = _run(*args, "--no-progress")
    assert human.exit_code == 0, human.output
    heads = [line for line in human.stdout.splitlines() if line.startswith("=== prompt")]
    assert [h.split()[2] for h in heads] == ["0", "1", "2"]
    assert "(line 2, seed 42)" in heads[1]
    for row in on_stdout:
        assert row["text"] in human.stdout
    assert "3 prompts, 11 tokens" in human.stdout  # 4 + 4 + 3


def test_blank_lines_are_skipped_and_numbered_in_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, '\n{"prompt": "a"}\n\n{"prompt": "b"}\n')
    res = _run(*TOY, "--prompts-file", path, "--max-new-tokens", "2", "--json")
    assert res.exit_code == 0, res.output
    assert [r["prompt"] for r in _jsonl(res.stdout)] == ["a", "b"]
    bad = _write(tmp_path, '\n{"prompt": "a"}\n\n{"text": "b"}\n', "bad.jsonl")
    res = _run(*TOY, "--prompts-file", bad)
    assert res.exit_code != 0 and "bad.jsonl line 4" in res.output


BAD_FILES = [
    pytest.param("", "has no prompts", id="empty"),
    pytest.param("\n  \n", "has no prompts", id="blank"),
    pytest.param('{"prompt": "a"}\n{prompt: b}\n', "line 2 is not JSON", id="not-json"),
    pytest.param('{"text": "a"}\n', 'no "prompt"', id="no-prompt"),
    pytest.param('["a"]\n', "not an object", id="list"),
    pytest.param('{"prompt": 3}\n', "non-empty string", id="prompt-int"),
    pytest.param('{"prompt": ""}\n', "non-empty string", id="prompt-empty"),
    pytest.param('{"prompt": "a", "messages": []}\n', "keep one", id="both"),
    pytest.param('{"messages": [{"role": "user"}]}\n', '"content"', id="messages-bad"),
    pytest.param('{"prompt": "a", "seed": -1}\n', '"seed"', id="seed-neg"),
    pytest.param('{"prompt": "a", "seed": 1.5}\n', '"seed"', id="seed-float"),
    pytest.param('{"prompt": "a", "max_new_tokens": 0}\n', '"max_new_tokens"', id="max-new-0"),
    pytest.param(
        '{"messages": [{"role": "user", "content": "hi"}]}\n', "chat template", id="no-template"
    ),
]


@pytest.mark.parametrize(("content", "fragment"), BAD_FILES)
def test_bad_prompts_files_name_the_line_and_the_fix(
    tmp_path: Path, content: str, fragment: str
) -> None:
    path = _write(tmp_path, content)
    res = _run(*TOY, "--prompts-file", path, "--json")
    assert res.exit_code == 1, res.output
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert res.stdout == "" and last.startswith("Error:"), res.output
    assert fragment in last and path in last, res.stderr


BAD_OPTIONS = [
    pytest.param(["--prompts-file", "{missing}"], "does not exist", id="missing"),
    pytest.param(["--prompts-file", "{dir}"], "is a directory", id="directory"),
    pytest.param(["--prompts-file", "{file}", "hello"], "not both", id="prompt-too"),
    pytest.param(["--prompts-file", "{file}", "--batch-size", "0"], "x>=1", id="batch-0"),
    pytest.param(["--batch-size", "4", "hello"], "goes with --prompts-file", id="batch-alone"),
    pytest.param(["--out", "{dir}/o.jsonl", "hi"], "goes with --prompts-file", id="out-alone"),
    pytest.param(["--prompts-file", "{file}", "--compare"], "--compare runs one", id="compare"),
]


@pytest.mark.parametrize(("args", "fragment"), BAD_OPTIONS)
def test_bad_option_mixes_are_refused(tmp_path: Path, args: list[str], fragment: str) -> None:
    names = {"missing": tmp_path / "nope.jsonl", "dir": tmp_path, "file": _write(tmp_path, PROMPTS)}
    res = _run(*TOY, *[a.format(**{k: str(v) for k, v in names.items()}) for a in args])
    # catch_exceptions=False: an escaped exception fails here; a clean error exits via click
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit)
    assert fragment in res.stderr, res.stderr
