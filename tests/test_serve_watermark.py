"""``ersd serve --watermark-key-file``: the real server in a subprocess on SmolLM2-135M (float32,
a layer-truncated draft, ERSD chain:4), driven with the official ``openai`` client over loopback.

* a watermarked response is detected (p < 1e-6 at 128 tokens) by ``POST /v1/watermark/detect``
  and by :func:`ersd.watermark.detect` on the same text; an unwatermarked server's is not;
* the same request and seed give the same text as ``ersd generate`` with the same key file;
* ``n = 4`` gives 4 different texts, each detected with its reported salt;
* the key never appears in a response body, a header, the server's log or ``/metrics``;
* a readable key file stops the server before it loads anything; opting out needs the operator's
  flag; bad detection requests get a 400 naming the field.

Every wait is capped in count and seconds; servers are always killed by their fixture.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from ersd.models.hf_load import load_tokenizer
from ersd.watermark import detect, load_watermark
from ersd.watermark.detect import encode_text
from tests.serve_harness import free_port

pytestmark = pytest.mark.realmodel

MODEL = "smollm2-135m"
MODEL_ARGS = ["--target", MODEL, "--draft", MODEL, "--draft-layers", "10", "--dtype", "float32"]
TREE = "chain:4"
PROMPT = "Tell me a story about a dragon who collects teapots."
#: a fixed key and seed: with them SmolLM2 writes all 128 tokens without stopping at EOS
KEY_HEX = "5c" * 16 + "a3" * 16
SEED = 6
ENV = {
    **os.environ,
    "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
    "OMP_NUM_THREADS": "1",  # the CLI and the server compute with the same thread count
}


def _ersd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from ersd.cli import main; main()", *args]


def _key_forms(path: Path) -> list[str]:
    """The key as it could leak: hex (whole, first half), base64 (its first 16 characters)."""
    raw = load_watermark(path).key
    assert isinstance(raw, bytes)
    return [raw.hex(), raw.hex()[:16], base64.b64encode(raw).decode()[:16]]


@dataclass
class Server:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=600
        )

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read()), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), dict(e.headers)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as r:
            return str(r.read().decode())


def _start(log: Path, *args: str) -> Iterator[Server]:
    port = free_port()
    cmd = _ersd(
        "serve", *MODEL_ARGS, "--tree", TREE, "--host", "127.0.0.1", "--port", str(port),
        "--max-batch-size", "4", "--shutdown-timeout", "5", "--log-level", "info", *args,
    )  # fmt: skip
    stderr = log.open("w")
    proc = subprocess.Popen(cmd, env=ENV, stdout=stderr, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        for _ in range(3000):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not come up in 300 s"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield Server(url, log, proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code in (0, -signal.SIGTERM) and "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        stderr.close()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wm") / "key.json"
    path.write_text(json.dumps({"key": KEY_HEX, "tokenizer": MODEL}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory, key_file: Path) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "marked.log"
    yield from _start(log, "--watermark-key-file", str(key_file))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "plain.log"
    yield from _start(log)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(MODEL)


#: every response body and header the tests saw, grepped for the key at the end
SEEN: list[str] = []


def _completion(server: Server, **kw: Any) -> tuple[Any, dict[str, str]]:
    with server.client() as c:
        raw = c.completions.with_raw_response.create(model=MODEL, **kw)
    SEEN.append(raw.text)
    SEEN.append(json.dumps(dict(raw.headers)))
    return raw.parse(), dict(raw.headers)


def test_a_readable_key_file_stops_the_server_before_loading(tmp_path: Path) -> None:
    path = tmp_path / "open.key"
    path.write_text(KEY_HEX)
    path.chmod(0o644)
    t0 = time.monotonic()
    res = subprocess.run(
        _ersd("serve", *MODEL_ARGS, "--port", str(free_port()), "--watermark-key-file", str(path)),
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode != 0 and "chmod 600" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and KEY_HEX not in res.stderr + res.stdout
    assert "loaded in" not in res.stderr  # refused before the models load
    assert time.monotonic() - t0 < 120


def test_watermarked_response_is_detected_and_equals_the_cli(
    marked: Server, key_file: Path, tokenizer: Any
) -> None:
    kw = dict(prompt=PROMPT, seed=SEED, max_tokens=128, temperature=1.0)
    out, headers = _completion(marked, **kw)
    text = out.choices[0].text
    info = out.model_extra["ersd"]
    wm = load_watermark(key_file)
    assert info["watermark"] == {
        "scheme": "ersd-v1",
        "key_fingerprint": wm.fingerprint,
        "context_width": 4,
        "num_salts": 8,
    }
    assert info["choices"][0]["salt"] == SEED % 8
    assert headers["x-ersd-watermark"] == f"ersd-v1; key={wm.fingerprint}"
    assert out.usage.completion_tokens == 128, text  # this key and seed write all 128 tokens
    assert info["num_accepted_tokens"] > 0  # the drafter's tokens were accepted, and marked

    # the operator's detection endpoint, and the library on the same text
    status, found, _ = marked.post("/v1/watermark/detect", {"text": text})
    SEEN.append(json.dumps(found))
    assert status == 200, found
    assert found["watermarked"] and found["p_value"] < 1e-6 and found["num_scored_tokens"] >= 100
    local = detect(encode_text(tokenizer, text), wm)
    assert local.p_value == pytest.approx(found["p_value"], rel=1e-9, abs=1e-300)

    # the same request as `ersd generate` with the same key file: the same text
    res = subprocess.run(
        _ersd(
            "generate", *MODEL_ARGS, "--tree", TREE, "--temperature", "1", "--max-new-tokens",
            "128", "--seed", str(SEED), "--watermark-key-file", str(key_file), "--json", PROMPT,
        ),
        env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    cli = json.loads(res.stdout.strip().splitlines()[-1])
    assert cli["text"] == text
    assert detect(cli["tokens"], wm, salt=SEED % 8).p_value < 1e-6

    # streamed: the same text, the header, and the extension on the last chunk
    with marked.client() as c:
        raw = c.completions.with_raw_response.create(model=MODEL, stream=True, **kw)
        assert raw.headers["x-ersd-watermark"] == headers["x-ersd-watermark"]
        chunks = list(raw.parse())
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert chunks[-1].model_extra["ersd"]["watermark"]["key_fingerprint"] == wm.fingerprint


def test_n4_gives_four_different_texts_each_detected(marked: Server, key_file: Path) -> None:
    out, _ = _completion(marked, prompt=PROMPT, seed=11, n=4, max_tokens=64, temperature=1.0)
    texts = [ch.text for ch in out.choices]
    salts = [c["salt"] for c in out.model_extra["ersd"]["choices"]]
    assert len(set(texts)) == 4, texts
    assert len(set(salts)) == 4
    for text, salt in zip(texts, salts, strict=True):
        status, found, _ = marked.post("/v1/watermark/detect", {"text": text, "salt": salt})
        SEEN.append(json.dumps(found))
        assert status == 200 and found["salts_tried"] == 1, found
        assert found["p_value"] < 1e-3, (text, found)
    # more choices than the key's salts: refused, naming n and the fix
    with marked.client() as c, pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model=MODEL, prompt=PROMPT, n=9, max_tokens=4)
    assert err.value.body["param"] == "n" and "num_salts=8" in err.value.body["message"]


def test_policies_and_bad_detection_requests(marked: Server, plain: Server) -> None:
    with marked.client() as c:
        with pytest.raises(openai.BadRequestError) as err:  # the operator allows no opt-out
            c.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"watermark": False}
            )
        assert err.value.body["param"] == "watermark"
        assert "--allow-watermark-opt-out" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:  # greedy text carries no mark
            c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
        assert "temperature" in err.value.body["message"]
        SEEN.append(json.dumps(err.value.body))
        with pytest.raises(openai.BadRequestError) as err:  # the key's PRF draws the races
            c.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"race_scheme": "v2"}
            )
        assert err.value.body["param"] == "race_scheme"
        assert "this server watermarks every response" in err.value.body["message"]
        for method in ("sd", "sd-dual-key"):  # not every token is the keyed race's winner
            with pytest.raises(openai.BadRequestError) as err:
                c.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"method": method}
                )
            assert err.value.body["param"] == "method" and "'ersd'" in err.value.body["message"]
    for body, param in [
        ({"text": "a b", "token_ids": [1, 2]}, None),  # both
        ({}, None),  # neither
        ({"text": "Hi"}, "text"),  # too short to score
        ({"token_ids": [10**9] * 20}, "token_ids"),  # outside the vocabulary
        ({"token_ids": list(range(100, 140)), "salt": 8}, "salt"),  # beyond num_salts
        ({"text": "x" * 50, "key": "guess"}, "key"),  # unknown field
    ]:
        status, found, _ = marked.post("/v1/watermark/detect", body)
        SEEN.append(json.dumps(found))
        assert status == 400, (body, found)
        assert found["error"]["param"] == param, (body, found)
    # an unwatermarked server: nothing to detect, and it cannot watermark on request
    status, found, _ = plain.post("/v1/watermark/detect", {"text": PROMPT * 3})
    assert status == 404 and "--watermark-key-file" in found["error"]["message"]
    with plain.client() as c, pytest.raises(openai.BadRequestError) as err:
        c.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"watermark": True}
        )
    assert err.value.body["param"] == "watermark"


@pytest.fixture(scope="module")
def smol() -> Any:
    import ersd

    return ersd.load_model(MODEL, dtype="float32")


def _weighted(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    status, found, _ = server.post("/v1/watermark/detect", body)
    SEEN.append(json.dumps(found))
    assert status == 200, found
    return found


def test_detection_with_the_servers_model(
    marked: Server, key_file: Path, tokenizer: Any, smol: Any
) -> None:
    """``"model": true``: the model-weighted detector on the server's own target, exactly
    :func:`detect_with_model`'s answer on the same ids (with the prompt, or the chat messages,
    rendered as the server renders them); a short predictable text is "not enough signal"."""
    from ersd.serve.text import chat_ids
    from ersd.watermark.weighted import detect_with_model

    wm = load_watermark(key_file)
    out, _ = _completion(marked, prompt=PROMPT, seed=SEED, max_tokens=48, temperature=0.7)
    text = out.choices[0].text
    ids = encode_text(tokenizer, text)
    prompt = smol.tokenizer.encode(PROMPT)
    body = {"text": text, "model": True, "prompt": PROMPT, "temperature": 0.7}
    found = _weighted(marked, body)
    local = detect_with_model(
        ids, wm, smol, temperature=0.7, prompt=prompt, threshold=1e-3, vocab_size=smol.vocab_size
    )
    assert found["detector"] == "model-weighted" and found["verdict"] == "watermarked", found
    assert found["watermarked"] and found["p_value"] < 1e-6
    assert found["p_value"] == pytest.approx(local.p_value, rel=1e-6, abs=1e-300)
    assert found["expected_power"] == pytest.approx(local.expected_power, rel=1e-6)
    assert found["num_weighted_tokens"] == local.weighted > 0
    assert found["num_tokens"] == len(ids) and found["temperature"] == 0.7
    free = detect(ids, wm)
    assert found["model_free_p_value"] == pytest.approx(free.p_value, rel=1e-9, abs=1e-300)
    assert found["num_skipped_tokens"] == free.skipped
    # the served model's name means the same; token ids the same as the text
    named = _weighted(marked, {**body, "model": MODEL})
    assert named["p_value"] == found["p_value"]
    as_ids = _weighted(
        marked, {"token_ids": ids, "model": True, "prompt": prompt, "temperature": 0.7}
    )
    assert as_ids["p_value"] == found["p_value"]
    # without a prompt: weighted over the text alone (its first token has no probability)
    alone = _weighted(marked, {"text": text, "model": True, "temperature": 0.7})
    bare = detect_with_model(ids, wm, smol, temperature=0.7, threshold=1e-3)
    assert alone["p_value"] == pytest.approx(bare.p_value, rel=1e-6, abs=1e-300)
    assert alone["p_value"] != found["p_value"]  # the prompt reached the forward
    # chat messages are rendered with the chat template, as /v1/chat/completions renders them
    msgs = [{"role": "user", "content": PROMPT}]
    chat = _weighted(marked, {"text": text, "model": True, "messages": msgs, "temperature": 0.7})
    rendered = detect_with_model(
        ids, wm, smol, temperature=0.7, prompt=chat_ids(smol.tokenizer, msgs), threshold=1e-3
    )
    assert chat["p_value"] == pytest.approx(rendered.p_value, rel=1e-6, abs=1e-300)
    # the model-free answer is unchanged and says so
    free_found = _weighted(marked, {"text": text})
    assert free_found["detector"] == "model-free" and free_found["verdict"] == "watermarked"
    assert free_found["num_weighted_tokens"] is None and free_found["expected_power"] is None

    # a short, near-deterministic human text: the model cannot tell, and says so
    counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16"
    low = _weighted(marked, {"text": counting, "model": True, "prompt": "Count: "})
    again = detect_with_model(
        encode_text(tokenizer, counting), wm, smol, prompt=smol.tokenizer.encode("Count: "),
        threshold=1e-3,
    )  # fmt: skip
    assert low["verdict"] == again.verdict == "not enough signal", low
    assert not low["watermarked"] and low["expected_power"] < 0.9


def test_detection_with_the_model_refusals(marked: Server, plain: Server) -> None:
    text = "The lighthouse keeper counted the ships that passed in the night, one by one."
    for body, status, param, words in [
        ({"text": text, "model": "gpt-4"}, 404, "model", "'smollm2-135m'"),
        ({"text": text, "temperature": 0.7}, 400, "temperature", '"model": true'),
        ({"text": text, "model": True, "temperature": 0}, 400, "temperature", "greater than 0"),
        ({"text": text, "model": True, "prompt": "a", "messages": [{"role": "user"}]}, 400,
         None, "at most one of prompt and messages"),
        ({"text": "Hi", "model": True}, 400, "text", "too short"),
        ({"text": text, "model": True, "prompt": [10**9]}, 400, "prompt", "prompt"),
        ({"text": text, "model": 1}, 400, "model", ""),
    ]:  # fmt: skip
        code, found, _ = marked.post("/v1/watermark/detect", body)
        SEEN.append(json.dumps(found))
        assert code == status, (body, found)
        err = found["error"]
        assert err["param"] == param and words in err["message"], (body, err)
        assert "\n" not in err["message"]
    code, found, _ = plain.post("/v1/watermark/detect", {"text": text, "model": True})
    assert code == 404 and "--watermark-key-file" in found["error"]["message"]


def test_an_unwatermarked_servers_text_is_not_detected(
    plain: Server, key_file: Path, tokenizer: Any
) -> None:
    out, headers = _completion(plain, prompt=PROMPT, seed=SEED, max_tokens=128, temperature=1.0)
    assert "x-ersd-watermark" not in headers
    assert out.model_extra["ersd"]["watermark"] is None
    assert out.model_extra["ersd"]["choices"][0]["salt"] is None
    # one fixed text, tested at alpha = 0.01 (p is uniform under the null, tests/test_watermark.py)
    found = detect(encode_text(tokenizer, out.choices[0].text), load_watermark(key_file))
    assert found.p_value > 0.01, found


def test_the_key_never_leaks(marked: Server, key_file: Path) -> None:
    """Last in the file: every body and header above, plus /metrics and the server's log."""
    assert len(SEEN) >= 10  # the tests above ran and recorded what they saw
    metrics = marked.get("/metrics")
    assert 'ersd:watermark_detections_total{model_name="smollm2-135m",watermarked="true"}' in (
        metrics
    )
    log = marked.log.read_text()
    assert load_watermark(key_file).fingerprint in log  # the log names the key by fingerprint
    haystack = "\n".join([*SEEN, metrics, log, marked.get("/v1/models"), marked.get("/health")])
    for form in _key_forms(key_file):
        assert form not in haystack and form.upper() not in haystack


def test_detection_forward_in_chunks_matches_one_forward_on_smollm2(smol: Any) -> None:
    """A long text's probabilities fed in chunks through one session (the server's path for texts
    over FORWARD_CHUNK tokens) agree with one forward to float32 rounding on SmolLM2."""
    import numpy as np

    from ersd.serve.routes.watermark import token_probs
    from ersd.watermark.weighted import model_token_probs

    ids = smol.tokenizer.encode(PROMPT * 6)
    prompt = smol.tokenizer.encode("Once more:")
    for head in (prompt, None):
        want = model_token_probs(smol, ids, head, 0.7)
        got = token_probs(smol, ids, head, 0.7, lambda fn: fn(), chunk=16)
        assert np.allclose(got, want, rtol=1e-4, atol=1e-7, equal_nan=True)
        assert np.isnan(got[0]) == (head is None)
