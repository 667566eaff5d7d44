"""``ersd serve`` end to end: the real server in a subprocess on SmolLM2-135M (float32, a
layer-truncated draft), driven with the official ``openai`` client over loopback.

Kept small for a busy 2-core machine: a handful of tokens per request; every wait is capped in
count and seconds; the server process is always killed by the fixture's finalizer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

import ersd

pytestmark = pytest.mark.realmodel

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
#: the same models and settings for the server and `ersd generate`
MODEL_ARGS = ["--target", MODEL, "--draft", MODEL, "--draft-layers", "4", "--dtype", "float32"]
TREE = "chain:2"
BATCH, QUEUE = 16, 8
ENV = {
    **os.environ,
    "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
    "OMP_NUM_THREADS": "1",  # the CLI and the server compute with the same thread count
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ersd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from ersd.cli import main; main()", *args]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = _ersd(
        "serve",
        *MODEL_ARGS,
        "--tree",
        TREE,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch-size",
        str(BATCH),
        "--max-queue",
        str(QUEUE),
        "--shutdown-timeout",
        "5",
        "--log-level",
        "warning",
    )
    stderr = log.open("w")
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=stderr)
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
        yield url
        proc.send_signal(signal.SIGTERM)  # graceful shutdown must end the process by itself
        code = proc.wait(timeout=60)
        err = log.read_text()
        # uvicorn re-raises the signal it handled once shut down: -SIGTERM is a clean exit
        assert code in (0, -signal.SIGTERM) and "Traceback" not in err, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        stderr.close()


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def _complete(client: openai.OpenAI, **kw: Any) -> str:
    out = client.completions.create(model=MODEL, **kw)
    return out.choices[0].text


def _streamed(client: openai.OpenAI, **kw: Any) -> str:
    chunks = client.completions.create(model=MODEL, stream=True, **kw)
    return "".join(c.choices[0].text for c in chunks if c.choices)


def _cli(*args: str) -> dict[str, Any]:
    cmd = _ersd("generate", *MODEL_ARGS, "--tree", TREE, "--json", *args)
    res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_completion_and_chat_equal_the_cli_streamed_or_not(
    server: str, client: openai.OpenAI
) -> None:
    settings = dict(prompt=PROMPT, seed=7, max_tokens=6, temperature=1.0)
    out = client.completions.create(model=MODEL, **settings)
    text = out.choices[0].text
    assert _streamed(client, **settings) == text
    assert text == _cli("--seed", "7", "--max-new-tokens", "6", PROMPT)["text"]
    assert out.usage.completion_tokens == out.model_extra["ersd"]["choices"][0]["num_tokens"]
    stats = out.model_extra["ersd"]
    assert stats["tree"] == ersd.parse_tree(TREE).spec and stats["target_calls"] >= 1
    assert stats["block_efficiency"] == pytest.approx(
        out.usage.completion_tokens / stats["target_calls"]
    )

    msgs = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, seed=5, max_tokens=6)
    reply = chat.choices[0].message.content
    stream = client.chat.completions.create(
        model=MODEL, messages=msgs, seed=5, max_tokens=6, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reply
    cli = _cli("--seed", "5", "--max-new-tokens", "6", "--chat", "Name a colour.")
    assert reply == cli["text"]


def test_sixteen_concurrent_clients_each_equal_their_solo_run(
    server: str, client: openai.OpenAI
) -> None:
    rng = random.Random(0)
    variants = [
        dict(method="ersd", tree=TREE),
        dict(method="ersd", tree="none"),
        dict(method="sd", tree="chain:2"),
        dict(method="specinfer", tree="multi:2x1"),
    ]
    specs = [
        dict(
            prompt=rng.choice([PROMPT, "def add(a, b):", "Once upon a time"]),
            seed=100 + i,
            max_tokens=rng.choice([2, 3, 4]),
            temperature=rng.choice([0.0, 0.7, 1.0]),
            extra_body=variants[i % len(variants)],
        )
        for i in range(48)
    ]

    def one_client(c: int) -> list[str]:
        return [_complete(client, **specs[3 * c + j]) for j in range(3)]

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        batched = [t for texts in pool.map(one_client, range(16), timeout=900) for t in texts]
    assert time.monotonic() - t0 < 900
    solo = [_complete(client, **spec) for spec in specs]  # one at a time
    assert batched == solo
    # ERSD is drafter invariant: with the same seed it equals target-only decoding
    for i in range(0, 48, len(variants)):
        twin = dict(specs[i], extra_body=dict(method="ersd", tree="none"))
        assert batched[i] == _complete(client, **twin)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    values = [float(ln.split()[-1]) for ln in lines if ln.startswith(name + "{")]
    assert values, f"{name} is not in /metrics"
    return sum(values)


def test_a_client_leaving_mid_stream_frees_its_row(server: str, client: openai.OpenAI) -> None:
    before = _metric(server, "vllm:generation_tokens_total")
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, seed=1, max_tokens=200, stream=True
    )
    for n, _ in enumerate(stream):
        if n == 1:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while _metric(server, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the row of a gone client was never freed"
        time.sleep(0.2)
    assert _metric(server, "vllm:generation_tokens_total") - before < 100
    assert _complete(client, prompt=PROMPT, seed=2, max_tokens=2)  # still serving


def test_a_burst_beyond_the_queue_gets_429_and_the_server_keeps_serving(
    server: str, client: openai.OpenAI
) -> None:
    long = dict(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)
    running = client.completions.create(n=BATCH, seed=1, **long)  # fills every row
    deadline = time.monotonic() + 60
    while _metric(server, "vllm:num_requests_waiting") > 0:  # admitted into the batch
        assert time.monotonic() < deadline
        time.sleep(0.1)
    waiting = client.completions.create(n=QUEUE, seed=2, **long)  # fills the queue
    try:
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        assert info.value.status_code == 429 and info.value.body["code"] == "queue_full"
        assert "queue is full" in info.value.body["message"]
    finally:
        running.close()
        waiting.close()
    deadline = time.monotonic() + 120
    while True:
        try:
            assert _complete(client, prompt=PROMPT, seed=3, max_tokens=2)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "closed streams never freed their rows"
            time.sleep(0.5)


def _post(url: str, path: str, body: Any, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
BAD = [  # (path, body changes, status, param, words in the message)
    (C, {"model": "gpt-4"}, 404, "model", "/v1/models"),
    (C, {"prompt": None}, 400, "prompt", ""),
    (C, {"prompt": ""}, 400, "prompt", "no tokens"),
    (C, {"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    (C, {"prompt": [1, 10**9]}, 400, "prompt", "token ids"),
    (C, {"max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
    (C, {"max_tokens": "many"}, 400, "max_tokens", "integer"),
    (C, {"max_tokens": 10**6}, 400, "max_tokens", "context window"),
    (C, {"temperature": -1}, 400, "temperature", "greater than or equal to 0"),
    (C, {"top_p": 0}, 400, "top_p", "greater than 0"),
    (C, {"top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
    (C, {"top_k": 0}, 400, "top_k", "greater than or equal to 1"),
    (C, {"min_p": 2}, 400, "min_p", "less than or equal to 1"),
    (C, {"seed": "abc"}, 400, "seed", "integer"),
    (C, {"stop": [""]}, 400, "stop", "non-empty"),
    (C, {"stop": ["x"] * 17}, 400, "stop", "at most 16"),
    (C, {"stream": "yes"}, 400, "stream", "boolean"),
    (C, {"n": 0}, 400, "n", "greater than or equal to 1"),
    (C, {"n": 99}, 400, "n", "less than or equal to 16"),
    (C, {"user": 5}, 400, "user", "string"),
    (C, {"method": "nope"}, 400, "method", "known methods"),
    (C, {"tree": "chain:0"}, 400, "tree", "chain"),
    (C, {"tree": "optimal:4@/etc/passwd"}, 400, "tree", "--tree optimal:K@FILE"),
    (C, {"method": "sd", "tree": "multi:2x2"}, 400, "tree", "cannot verify"),
    (C, {"frequency_penalty": 1.0}, 400, "frequency_penalty", "not supported"),
    (C, {"logprobs": 2}, 400, "logprobs", "not supported"),
    (C, {"echo": True}, 400, "echo", "not supported"),
    (CHAT, {"messages": []}, 400, "messages", "at least 1"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", ""),
    (CHAT, {"max_completion_tokens": -3}, 400, "max_completion_tokens", "greater than"),
]


def test_bad_inputs_get_the_right_status_and_message(server: str) -> None:
    for path, change, status, param, words in BAD:
        body = {**(OK if path == C else OK_CHAT), **change}
        body = {k: v for k, v in body.items() if v is not None}
        code, out = _post(server, path, body)
        assert code == status, (change, out)
        err = out["error"]
        assert err["param"] == param and words in err["message"], (change, err)
        assert err["type"] == "invalid_request_error"
    code, out = _post(server, C, None, raw=b'{"prompt": "x",')
    assert code == 400 and "not valid JSON" in out["error"]["message"]
    code, out = _post(server, C, [1, 2])
    assert code == 400 and out["error"]["message"].startswith("request body")
    code, out = _post(server, "/v1/nowhere", OK)
    assert code == 404 and "error" in out
    code, out = _post(server, C, OK)  # still serving
    assert code == 200 and out["choices"][0]["text"]


def test_models_health_and_metrics(server: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    with urllib.request.urlopen(f"{server}/health", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:prompt_tokens_total",
    ):
        _metric(server, name)  # present and parseable
    assert _metric(server, "vllm:generation_tokens_total") > 0
    assert _metric(server, "vllm:spec_decode_num_draft_tokens_total") > 0


def test_tree_auto_request_gives_the_same_text(client: openai.OpenAI) -> None:
    """``tree="auto"`` (chosen per step by predicted throughput at the live batch size) is a
    request option; ERSD's text does not depend on the tree, so it equals the default tree's."""
    settings = dict(prompt=PROMPT, seed=11, max_tokens=8, temperature=1.0)
    fixed = client.completions.create(model=MODEL, **settings)
    auto = client.completions.create(model=MODEL, extra_body={"tree": "auto"}, **settings)
    assert auto.choices[0].text == fixed.choices[0].text
    assert auto.model_extra["ersd"]["tree"] == "auto"


@pytest.mark.usefixtures("one_torch_thread")
def test_race_scheme_request_field_gives_the_librarys_text(client: openai.OpenAI) -> None:
    """``extra_body={"race_scheme": "v2"}``: the text of ``ersd.generate(...,
    race_scheme="v2")`` with the same seed (target-only: ERSD's text does not depend on the
    draft), not v1's; the extension reports the scheme."""
    from ersd.serve.text import decode

    target = ersd.load_model(MODEL, dtype="float32")
    ids = target.tokenizer.encode(PROMPT)
    settings = dict(prompt=PROMPT, seed=13, max_tokens=8, temperature=1.0)
    texts = {}
    for scheme in ("v1", "v2"):
        res = ersd.generate(
            target, None, ids, max_new_tokens=8, seed=13, eos_token_id=target.eos_token_ids,
            race_scheme=scheme,
        )  # fmt: skip
        texts[scheme] = decode(target.tokenizer, res.tokens)
    assert texts["v1"] != texts["v2"]  # a field that never reached the engine is caught
    v2 = client.completions.create(model=MODEL, extra_body={"race_scheme": "v2"}, **settings)
    assert v2.choices[0].text == texts["v2"]
    assert v2.model_extra["ersd"]["race_scheme"] == "v2"
    v1 = client.completions.create(model=MODEL, **settings)  # the server's default: v1
    assert v1.choices[0].text == texts["v1"]
    assert v1.model_extra["ersd"]["race_scheme"] == "v1"
