"""``race_scheme`` on the server: the request field and ``ersd serve --race-scheme``.

The real CLI in a subprocess on 127.0.0.1 over the toy models (``tests/serve_harness.py``),
driven with the official ``openai`` client: a server started with ``--race-scheme v2`` draws
every request that names no scheme with v2, exactly ``ersd.generate(..., race_scheme="v2")``'s
text for the same seed; a request's own ``race_scheme`` overrides it (v1 there is exactly the
v1 text, and the two differ, so a field that never reached the engine is caught); bad values
are a 400 naming ``race_scheme``; the flag is refused with a watermark that covers every
response, before any model loads.  (SmolLM2 through the same path: tests/test_serve.py.)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

import ersd
from ersd.cli import main
from tests.serve_harness import start, stop

PROMPT = "hello race"
SEEDS = (3, 4)
MAX_TOKENS = 12
TREE = "multi:2x3"  # ersd serve's default tree


@pytest.fixture(scope="module")
def v2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "v2.log"
    proc, url = start("--race-scheme", "v2", log=log)
    try:
        yield url
    finally:
        stop(proc)


def _library(race_scheme: str, seed: int) -> str:
    target, draft = ersd.load_model("toy"), ersd.load_model("toy-draft")
    res = ersd.generate(
        target,
        draft,
        target.tokenizer.encode(PROMPT),
        max_new_tokens=MAX_TOKENS,
        seed=seed,
        tree=TREE,
        eos_token_id=target.eos_token_ids,
        race_scheme=race_scheme,
    )
    assert res.race_scheme == race_scheme
    return str(target.tokenizer.decode(res.tokens))


def _complete(url: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        out = c.completions.create(
            model="toy", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, **extra
        )
    return out.choices[0].text, out.model_extra["ersd"]


def test_the_server_default_and_the_request_field_give_the_librarys_text(v2_server: str) -> None:
    for seed in SEEDS:
        v2, v1 = _library("v2", seed), _library("v1", seed)
        assert v2 != v1, seed  # the schemes draw other races: a dropped scheme is caught
        text, info = _complete(v2_server, seed=seed)  # the server's --race-scheme v2
        assert (text, info["race_scheme"]) == (v2, "v2"), seed
        text, info = _complete(v2_server, seed=seed, extra_body={"race_scheme": "v1"})
        assert (text, info["race_scheme"]) == (v1, "v1"), seed
        # drafter invariance holds under v2 too: target-only decoding gives the same text
        text, info = _complete(v2_server, seed=seed, extra_body={"tree": "none"})
        assert (text, info["race_scheme"]) == (v2, "v2"), seed
    # streamed: the same text, the scheme on the last chunk
    with openai.OpenAI(base_url=f"{v2_server}/v1", api_key="u", max_retries=0, timeout=60) as c:
        chunks = list(
            c.completions.create(
                model="toy", prompt=PROMPT, max_tokens=MAX_TOKENS, seed=SEEDS[0], stream=True
            )
        )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == _library("v2", SEEDS[0])
    assert chunks[-1].model_extra["ersd"]["race_scheme"] == "v2"


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("value", "words"),
    [("v3", "must be one of 'v1', 'v2'"), (2, "valid string"), ("", "must be one of")],
)
def test_a_bad_race_scheme_is_a_400_naming_it(v2_server: str, value: Any, words: str) -> None:
    body = {"model": "toy", "prompt": PROMPT, "max_tokens": 2, "race_scheme": value}
    code, out = _post(v2_server, body)
    assert code == 400, out
    err = out["error"]
    assert err["param"] == "race_scheme" and words in err["message"], err
    assert "\n" not in err["message"]


def test_the_flag_is_checked_before_anything_loads(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--target", "toy", "--race-scheme", "v3"])
    assert res.exit_code == 2 and "'v3' is not one of 'v1', 'v2'" in res.output, res.output
    key = tmp_path / "absent.key"  # never read: the flags are refused first
    res = runner.invoke(
        main,
        ["serve", "--target", "toy", "--race-scheme", "v2", "--watermark-key-file", str(key)],
    )
    assert res.exit_code == 2, res.output
    assert "--race-scheme v2 applies to unwatermarked responses only" in res.output
    assert "--allow-watermark-opt-out" in res.output and "loaded in" not in res.output


def test_the_flags_choices_are_the_librarys_schemes() -> None:
    from ersd.commands import serve
    from ersd.race import DEFAULT_RACE_SCHEME, RACE_SCHEMES
    from ersd.serve.requests import ServeConfig

    assert serve.RACE_SCHEMES == RACE_SCHEMES
    assert serve.DEFAULT_RACE_SCHEME == DEFAULT_RACE_SCHEME == ServeConfig("m").race_scheme
    with pytest.raises(ValueError, match="race_scheme must be one of"):
        ServeConfig("m", race_scheme="v9")
    mark = ersd.Watermark(key=bytes(range(32)))
    with pytest.raises(ValueError, match="applies to unwatermarked responses only"):
        ServeConfig("m", race_scheme="v2", watermark=mark)
    # where a request may opt out of the watermark, v2 is the scheme of its unmarked responses
    assert ServeConfig("m", race_scheme="v2", watermark=mark, watermark_opt_out=True).race_scheme
