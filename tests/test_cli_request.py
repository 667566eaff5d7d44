"""``ersd generate`` builds one :class:`ersd.Request` per prompt and passes nothing else, and its
``--race-scheme`` reaches the races (toy models, ms a run; no weights).

* What the command passes: :func:`ersd.generation.generate_request` is wrapped to record its
  arguments; every call (warm-up, run, ``--compare``'s target-only rerun, every line of a prompts
  file) must get a ``Request`` carrying the options, and nothing else.
* ``--race-scheme v2``: the command's tokens equal ``ersd.generate(..., race_scheme="v2")`` and
  differ from ``v1``'s for the same seed (a command that dropped the option fails here), for one
  prompt, ``--compare`` and a prompts file.
* ``--race-scheme v2`` with a watermark: one ``Error:`` line naming the flag, before any load.
* :func:`ersd.generation.generate_request` / :func:`stream_request` equal :func:`ersd.generate`
  / :func:`ersd.generate_stream`, and the examples of docs/python-api.md and docs/cli.md run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result

import ersd
import ersd.batch
import ersd.request
from ersd.cli import main
from ersd.commands import generate as generate_cmd
from ersd.generation import generate_request, stream_request
from ersd.race_v2 import RACE_SCHEMES
from ersd.request import Request

DOCS = Path(__file__).resolve().parents[1] / "docs"
TOY = ["--target", "toy", "--draft", "toy-draft", "--tree", "chain:2"]
PROMPTS = [{"prompt": "def add(a, b):"}, {"prompt": "hello", "seed": 42, "max_new_tokens": 3}]


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, ["generate", *args], catch_exceptions=False)


def _last_json(res: Result) -> dict[str, Any]:
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def _toy_pair() -> tuple[Any, Any]:
    return ersd.load_model("toy"), ersd.load_model("toy-draft")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every ``generate_request`` call the command makes: (target, draft, request, keywords)."""
    seen: list[tuple[Any, ...]] = []

    def recording(target: Any, draft: Any, *args: Any, **kw: Any) -> Any:
        seen.append((target, draft, *args, kw))
        return generate_request(target, draft, *args, **kw)

    monkeypatch.setattr("ersd.generation.generate_request", recording)
    return seen


def test_the_cli_choices_are_the_library_race_schemes() -> None:
    assert generate_cmd.RACE_SCHEMES == RACE_SCHEMES


def test_one_prompt_and_compare_pass_one_request(calls: list[tuple[Any, ...]]) -> None:
    opts = ["--seed", "7", "--temperature", "0.8", "--top-k", "20", "--max-new-tokens", "5"]
    out = _last_json(_run(*TOY, *opts, "--race-scheme", "v2", "--compare", "--json", "hi"))
    # warm-up with and without the draft, the run, the target-only rerun: one request each
    assert [len(c) for c in calls] == [4] * 4
    requests = [c[2] for c in calls]
    assert all(isinstance(r, Request) for r in requests)
    run = requests[2]
    assert (run.seed, run.max_new_tokens, run.race_scheme) == (7, 5, "v2")
    assert (run.sampling.temperature, run.sampling.top_k) == (0.8, 20)
    assert run.tree == ersd.request.parse_tree_spec("chain:2", temperature=0.8)
    assert run.verification.name == "ersd"
    eos = ersd.load_model("toy").eos_token_ids
    assert run.eos == Request([0], max_new_tokens=1, eos_token_id=eos).eos
    assert [r.max_new_tokens for r in requests] == [2, 2, 5, 5]
    assert requests[3] == run and calls[3][1] is None  # --compare: the same request, no draft
    assert all(dataclasses.replace(r, max_new_tokens=5) == run for r in requests)
    assert all(kw.keys() <= {"on_step"} for *_, kw in calls)
    assert out["race_scheme"] == "v2" and out["identical_to_target_only"] is True


def test_prompts_file_passes_one_request_per_line(
    tmp_path: Path, calls: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    seen: list[list[Request]] = []
    real = ersd.batch.run_requests

    def recording(target: Any, drafter: Any, requests: Any, *rest: Any) -> Any:
        seen.append(list(requests))
        return real(target, drafter, requests, *rest)

    monkeypatch.setattr("ersd.batch.run_requests", recording)
    res = _run(*TOY, "--prompts-file", str(path), "--seed", "5", "--max-new-tokens", "4",
               "--race-scheme", "v2", "--json", "--no-progress")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(calls) == 1 and calls[0][2].max_new_tokens == 2  # the warm-up
    by_line = [r for group in seen for r in group]  # one batch per max_new_tokens
    assert [(r.seed, r.max_new_tokens) for r in by_line] == [(ersd.derive_seed(5, 0), 4), (42, 3)]
    assert {r.race_scheme for r in by_line} == {"v2"}


def _library_tokens(prompt: str, seed: int, n: int, scheme: str, draft: bool = True) -> list[int]:
    target, dmodel = _toy_pair()
    ids = target.tokenizer.encode(prompt)
    res = ersd.generate(target, dmodel if draft else None, ids, max_new_tokens=n, seed=seed,
                        tree="chain:2", eos_token_id=target.eos_token_ids,
                        race_scheme=scheme)  # fmt: skip
    return res.tokens


@pytest.mark.parametrize("extra", [[], ["--draft", "none"], ["--method", "sd"]])
def test_race_scheme_reaches_the_races(extra: list[str]) -> None:
    """v2's text through the CLI is the library's v2 text and not v1's (a dropped flag fails)."""
    base = [*TOY, *extra, "--seed", "3", "--max-new-tokens", "12", "--json", "hi"]
    v1, v2 = (_last_json(_run(*base, "--race-scheme", s)) for s in ("v1", "v2"))
    assert (v1["race_scheme"], v2["race_scheme"]) == ("v1", "v2")
    assert v1["tokens"] != v2["tokens"]
    if extra != ["--method", "sd"]:  # ERSD and target-only: the target's race winners
        draft = extra != ["--draft", "none"]
        for out, scheme in ((v1, "v1"), (v2, "v2")):
            assert out["tokens"] == _library_tokens("hi", 3, 12, scheme, draft)


def test_race_scheme_in_a_prompts_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    args = [*TOY, "--prompts-file", str(path), "--seed", "5", "--max-new-tokens", "8", "--json"]
    rows = [json.loads(x) for x in _run(*args, "--race-scheme", "v2").stdout.splitlines() if x]
    assert [r["race_scheme"] for r in rows] == ["v2", "v2"]
    for row, src in zip(rows, PROMPTS, strict=True):
        n = src.get("max_new_tokens", 8)
        assert row["tokens"] == _library_tokens(src["prompt"], row["seed"], n, "v2")
        assert row["tokens"] != _library_tokens(src["prompt"], row["seed"], n, "v1")


def test_race_scheme_v2_with_a_watermark_is_one_line_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "k.json"
    assert CliRunner().invoke(main, ["watermark", "keygen", "--out", str(key)]).exit_code == 0

    def no_load(*_: Any, **__: Any) -> Any:
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(generate_cmd, "load_pair", no_load)
    res = CliRunner().invoke(
        main,
        ["generate", *TOY, "--race-scheme", "v2", "--watermark-key-file", str(key), "hi"],
    )
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit)
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: --race-scheme v2: "), res.output
    assert "watermark" in errors[0]
    res = CliRunner().invoke(main, ["generate", *TOY, "--race-scheme", "v3", "hi"])
    assert res.exit_code == 2 and "'v3' is not one of 'v1', 'v2'" in res.output
    res = CliRunner().invoke(main, ["generate", *TOY, "--watermark-context", "3", "hi"])
    assert res.exit_code == 2 and "goes with --watermark-key-file" in res.output


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--temperature", "-1", "temperature"),
        ("--top-p", "0", "top_p"),
        ("--max-new-tokens", "0", "max_new_tokens"),
        ("--seed", "-1", "seed"),
        ("--tree", "chain:0", "chain:4"),
        ("--method", "nope", "known methods"),
    ],
)
def test_bad_options_fail_before_any_model_loads(
    monkeypatch: pytest.MonkeyPatch, flag: str, value: str, fragment: str
) -> None:
    """The request is checked before loading: no load, one ``Error:`` line naming the field."""

    def no_load(*_: Any, **__: Any) -> Any:
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(generate_cmd, "load_pair", no_load)
    res = CliRunner().invoke(main, ["generate", *TOY, flag, value, "hi"])
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and fragment in errors[0], res.output


def _function_pair() -> tuple[Any, Any]:
    table = torch.randn(40, 40, generator=torch.Generator().manual_seed(3))
    target = ersd.FunctionModel(lambda s: torch.stack([table[x[-1]] for x in s]), 40)
    draft = ersd.FunctionModel(lambda s: torch.stack([0.7 * table[x[-1]] for x in s]), 40)
    return target, draft


@pytest.mark.parametrize("scheme", ["v1", "v2"])
@pytest.mark.parametrize("tree", ["chain:3", "multi:2x2", "dynamic:4"])
def test_generate_request_equals_generate(scheme: str, tree: str) -> None:
    target, draft = _function_pair()
    kw: dict[str, Any] = dict(max_new_tokens=24, seed=9, tree=tree, race_scheme=scheme)
    want = ersd.generate(target, draft, [1, 2], temperature=0.9, **kw)
    request = Request.of([1, 2], temperature=0.9, **kw)
    records: list[Any] = []
    got = generate_request(target, draft, request, on_step=records.append)
    assert got.tokens == want.tokens and got.race_scheme == scheme
    strip = ("wall_time", "draft_time", "target_time", "other_time", "tokens_per_second")
    assert {k: v for k, v in got.stats().items() if k not in strip} == {
        k: v for k, v in want.stats().items() if k not in strip
    }
    assert [r.tokens for r in records] == [r.tokens for r in got.steps]
    streamed = list(stream_request(target, draft, request))
    assert [r.tokens for r in streamed] == [
        r.tokens for r in ersd.generate_stream(target, draft, [1, 2], temperature=0.9, **kw)
    ]
    alone = generate_request(target, None, request, label="plain")  # the tree is not used
    assert alone.tokens == got.tokens and alone.method == "plain" and alone.tree is None


def test_generate_request_checks_the_models() -> None:
    target, _ = _function_pair()
    with pytest.raises(ersd.GenerationInputError, match="prompt"):
        generate_request(target, None, Request([45], max_new_tokens=2))  # id past the vocab
    with pytest.raises(ersd.VocabularyMismatchError):
        generate_request(target, ersd.FunctionModel(lambda s: torch.zeros(len(s), 7), 7),
                         Request([1], max_new_tokens=2))  # fmt: skip


def _section_block(path: Path, heading: str, fence: str) -> str:
    text = path.read_text()
    section = text[text.index(heading) :]
    match = re.search(rf"```{fence}\n(.*?)```", section, re.S)
    assert match is not None, f"no ```{fence} block under {heading!r} in {path}"
    return match.group(1)


def test_python_api_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code = _section_block(DOCS / "python-api.md", "## Generating a built request", "python")
    exec(compile(code, "docs/python-api.md", "exec"), {})
    assert capsys.readouterr().out.count("[") >= 1  # on_step printed the records' tokens


def test_cli_doc_example_runs() -> None:
    text = (DOCS / "cli.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("ersd generate --target toy"))
    res = CliRunner().invoke(main, shlex.split(line)[1:], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "race scheme v2" in res.output and "identical text      yes" in res.output


def test_margins_read_the_request_and_are_not_replayed_under_v2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The margin report takes its seed and sampling from the request; under v2 (whose races the
    v1 replay would not redraw) it says it is not computed instead of reporting v1's margins."""
    from ersd.commands._precision import margins_after_run

    target, _ = _function_pair()
    pair = SimpleNamespace(target=target)
    check = SimpleNamespace(identical=False, max_abs_diff=0.01, to_dict=lambda: {"x": 0})
    seen: list[dict[str, Any]] = []

    def fake_margins(model: Any, prompt: Any, tokens: Any, **kw: Any) -> Any:
        seen.append(dict(kw, prompt=list(prompt)))
        return SimpleNamespace(summary=lambda: "ok", to_dict=lambda: {"m": 1})

    monkeypatch.setattr("ersd.precision.race_margins", fake_margins)
    logs: list[str] = []
    request = Request.of([4, 5], max_new_tokens=3, seed=11, temperature=0.7, top_p=0.9)
    out = margins_after_run(pair, request, [1, 2, 3], check, logs.append)
    assert out["margins"] == {"m": 1} and len(seen) == 1
    assert seen[0]["seed"] == 11 and seen[0]["prompt"] == [4, 5]
    assert (seen[0]["temperature"], seen[0]["top_p"], seen[0]["error"]) == (0.7, 0.9, 0.01)
    v2 = dataclasses.replace(request, race_scheme="v2")
    out = margins_after_run(pair, v2, [1, 2, 3], check, logs.append)
    assert out["margins"] is None and len(seen) == 1
    assert "not computed" in logs[-1] and "v2" in logs[-1]


@pytest.mark.realmodel
def test_race_scheme_v2_on_smollm2() -> None:
    """On a real HF pair: --race-scheme v2's ERSD text is v2's target-only text (--compare) and
    the library's v2 text for the same seed, and not v1's."""
    args = ["--target", "smollm2-135m", "--draft", "smollm2-135m", "--draft-layers", "6"]
    args += ["--dtype", "float32", "--tree", "chain:3", "--max-new-tokens", "10", "--seed", "4"]
    prompt = "The capital of France is"
    v2 = _last_json(_run(*args, "--race-scheme", "v2", "--compare", "--json", prompt))
    assert v2["race_scheme"] == "v2" and v2["identical_to_target_only"] is True
    target = ersd.load_model("smollm2-135m", dtype="float32")
    ids = target.tokenizer.encode(prompt)
    kw: dict[str, Any] = dict(max_new_tokens=10, seed=4, eos_token_id=target.eos_token_ids)
    assert v2["tokens"] == ersd.generate(target, None, ids, race_scheme="v2", **kw).tokens
    assert v2["tokens"] != ersd.generate(target, None, ids, race_scheme="v1", **kw).tokens
