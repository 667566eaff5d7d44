"""``ersd serve`` against the issue-48 abuses (server items): a body framed two ways, detection
without bounds, the API docs without the key, the key in a repr or the access log, a key with a
trailing newline, a stream refused only after its 200, coerced numbers.

The real CLI in a subprocess on 127.0.0.1 over the toy models (``tests/serve_harness.py``), the
official ``openai`` client on the OpenAI routes, raw sockets for malformed HTTP, ``urllib`` for
the rest.  Every loop is capped by count and by seconds; every server is killed in a finally.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ersd.serve.requests import ServeConfig
from tests.serve_harness import ENV, ROOT, start, stop
from tests.test_serve_safety import get, post

KEY = "k3y-ab12cd"
WM_KEY_HEX = "7e" * 32
LIMIT = 100_000
DETECT_CAP = 2000


def _key_file(folder: Path) -> Path:
    path = folder / "wm.json"
    path.write_text(json.dumps({"key": WM_KEY_HEX}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A toy server whose key comes from $ERSD_API_KEY *with a trailing newline* (as
    ``export ERSD_API_KEY="$(cat f; echo)"`` or a secrets file mounted with one gives), a small
    body limit, a watermark key and a small detection cap."""
    folder = tmp_path_factory.mktemp("limits")
    log = folder / "server.log"
    proc, url = start(
        "--max-body-bytes", str(LIMIT), "--tree", "chain:3",
        "--watermark-key-file", str(_key_file(folder)),
        "--max-detect-tokens", str(DETECT_CAP), "--allow-watermark-opt-out",
        env={"ERSD_API_KEY": KEY + "\n"}, log=log,
    )  # fmt: skip
    try:
        yield url, log
    finally:
        stop(proc)
        assert KEY not in log.read_text()  # the key never reaches the log


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


# ---------------------------------------------------------------- body limit on the bytes read


def _raw_post(url: str, head: list[str], total: int, chunk: int = 65536) -> tuple[int, int]:
    """POST a chunked body of ``total`` bytes over a raw socket with the header lines ``head``,
    reading the reply as soon as one comes: (HTTP status, bytes of body sent by then).  Capped
    at ``total`` bytes and 60 s."""
    host, port = url.removeprefix("http://").split(":")
    lines = [
        "POST /v1/completions HTTP/1.1",
        f"Host: {host}:{port}",
        f"Authorization: Bearer {KEY}",
        "Content-Type: application/json",
        *head,
    ]
    sent = 0
    reply = b""
    deadline = time.monotonic() + 60
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        piece = b"x" * chunk
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([s], [s], [], 1.0)
            if readable:
                break
            if writable:
                try:
                    s.sendall(f"{chunk:x}\r\n".encode() + piece + b"\r\n")
                except OSError:  # the server answered and closed: read what it said
                    break
                sent += chunk
        if sent >= total:
            s.sendall(b"0\r\n\r\n")
        for _ in range(200):  # the reply (bounded: 200 reads, 30 s)
            if b"\r\n\r\n" in reply or time.monotonic() > deadline + 30:
                break
            try:
                got = s.recv(65536)
            except OSError:
                break
            if not got:
                break
            reply += got
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return status, sent


def test_content_length_beside_chunked_is_not_believed(server: tuple[str, Path]) -> None:
    """Before: ``Content-Length: 10`` with ``Transfer-Encoding: chunked`` let a 20 MB body past
    the limit (it was read and scored: 39.8 s, +1 GB).  Now the bytes read count: 413 long
    before the body ends, and nothing after it is read."""
    url, _ = server
    total = 20 * 1024 * 1024
    status, sent = _raw_post(url, ["Content-Length: 10", "Transfer-Encoding: chunked"], total)
    assert status == 413, (status, sent)
    assert sent < total // 4, f"{sent:,} bytes sent before the 413"
    r = get(f"{url}/health", timeout=10)  # the server is fine
    assert r.status_code == 200


def test_chunked_body_without_length_over_the_limit_gets_413(server: tuple[str, Path]) -> None:
    url, _ = server
    status, sent = _raw_post(url, ["Transfer-Encoding: chunked"], 2 * 1024 * 1024)
    assert status == 413, (status, sent)


def test_small_chunked_body_with_a_false_length_is_served(server: tuple[str, Path]) -> None:
    """The framing the server uses is the chunked one (RFC 9112 6.3): a small chunked body with a
    wrong Content-Length is read whole and answered normally (here a 400 for the bad JSON, not
    a 413 and not a hang)."""
    url, _ = server
    status, _ = _raw_post(url, ["Content-Length: 10", "Transfer-Encoding: chunked"], 2, chunk=8)
    assert status == 400


# ---------------------------------------------------------------- detection bounds


def test_detection_over_the_token_cap_is_413_naming_the_flag(server: tuple[str, Path]) -> None:
    url, _ = server
    for body in (
        {"token_ids": [5] * (DETECT_CAP + 1)},
        {"text": "ab" * DETECT_CAP},  # the toy tokenizer: one token per byte
        {"text": "a" * (16 * DETECT_CAP + 1)},  # refused before it is tokenized
    ):
        r = post(f"{url}/v1/watermark/detect", json_body=body, headers=_auth())
        assert r.status_code == 413, r.text
        msg = r.json()["error"]["message"]
        assert f"{DETECT_CAP:,} tokens" in msg and "--max-detect-tokens" in msg, msg
    r = post(
        f"{url}/v1/watermark/detect",
        json_body={"token_ids": [(i * 7) % 50 + 3 for i in range(200)]},
        headers=_auth(),
    )
    assert r.status_code == 200 and r.json()["num_tokens"] == 200


def test_excess_detections_get_429_with_retry_after(tmp_path: Path) -> None:
    """Each detection holds its slot 1.5 s here (a slowed tokenizer); with one slot and 0.3 s of
    waiting, of 4 simultaneous requests one is scored and the others are told to retry -- and
    /health answers meanwhile.  Before: no bound, all four ran at once."""
    proc, url = start(
        "--watermark-key-file", str(_key_file(tmp_path)),
        "--detect-concurrency", "1", "--detect-wait", "0.3",
        encode_delay=1.5, log=tmp_path / "server.log",
    )  # fmt: skip
    try:
        replies: list[Any] = []

        def one() -> None:
            body = {"text": "the quick brown fox jumps over the lazy dog " * 4}
            replies.append(post(f"{url}/v1/watermark/detect", json_body=body, timeout=60))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        assert get(f"{url}/health", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 1.0
        for t in threads:
            t.join(timeout=60)
        codes = sorted(r.status_code for r in replies)
        assert codes.count(200) >= 1 and codes.count(429) >= 2, codes
        busy = next(r for r in replies if r.status_code == 429)
        assert busy.headers["Retry-After"] == "1"
        assert "--detect-concurrency" in busy.json()["error"]["message"]
    finally:
        stop(proc)


# ---------------------------------------------------------------- the Lows


def test_api_docs_need_the_key(server: tuple[str, Path]) -> None:
    url, _ = server
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert get(f"{url}{path}", timeout=10).status_code == 401, path
        assert get(f"{url}{path}", headers=_auth(), timeout=10).status_code == 200, path
    spec = get(f"{url}/openapi.json", headers=_auth(), timeout=10).json()
    body = spec["paths"]["/v1/watermark/detect"]["post"]["requestBody"]
    assert "token_ids" in json.dumps(body)  # the detect route still documents its body


def test_repr_of_the_config_never_shows_a_key() -> None:
    """Before: ``repr(ServeConfig)`` showed ``api_key='...'``."""
    from ersd.watermark.settings import Watermark

    wm = Watermark(key=bytes.fromhex(WM_KEY_HEX))
    shown = repr(ServeConfig(model_name="m", api_key="s3cret-value-42", watermark=wm))
    assert "s3cret-value-42" not in shown and "api_key" not in shown
    assert WM_KEY_HEX not in shown and WM_KEY_HEX[:16] not in shown
    assert wm.fingerprint in shown  # the watermark is named by its fingerprint


def test_access_log_never_records_the_query_string(server: tuple[str, Path]) -> None:
    url, log = server
    secret = "qs-" + KEY
    r = get(f"{url}/v1/models?api_key={secret}&x=1", headers=_auth(), timeout=10)
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while "/v1/models?<redacted>" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    assert "/v1/models?<redacted>" in text  # the access log is on, and redacted
    assert secret not in text and "api_key=" not in text


def test_a_trailing_newline_in_the_env_key_is_stripped_with_a_warning(
    server: tuple[str, Path],
) -> None:
    """Before: every request got 401 (clients never send the newline) and nothing said why."""
    url, log = server
    with _client(url) as client:
        models = client.models.list()
    assert [m.id for m in models.data] == ["toy"]
    assert "whitespace character(s) around it" in log.read_text()


def test_an_empty_key_is_refused_at_start() -> None:
    cmd = [sys.executable, "-c", "from ersd.cli import main; main()", "serve", "--target", "toy"]
    out = subprocess.run(
        cmd, cwd=ROOT, env={**ENV, "ERSD_API_KEY": " \n"}, capture_output=True, timeout=120
    )
    assert out.returncode == 2, out
    assert b"API key" in out.stderr and b"empty" in out.stderr
    assert b"Traceback" not in out.stderr


def test_a_stream_with_a_tree_its_method_cannot_grow_is_refused_before_it_starts(
    server: tuple[str, Path],
) -> None:
    """Before: HTTP 200, then an error event inside the stream."""
    url, _ = server
    with _client(url) as client, pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="toy",
            prompt="hi",
            max_tokens=4,
            stream=True,
            extra_body={"method": "gls", "tree": "dynamic:4", "watermark": False},
        )
    assert err.value.status_code == 400
    assert "tree" in str(err.value) and "gls" in str(err.value)


@pytest.mark.parametrize("value", ["0.7", True, "1"])
def test_numbers_are_not_coerced(server: tuple[str, Path], value: Any) -> None:
    url, _ = server
    with _client(url) as client:
        for field in ("temperature", "top_p"):
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(
                    model="toy", prompt="hi", max_tokens=2, extra_body={field: value}
                )
            assert f"{field}: Input should be a valid number" in str(err.value)
        ok = client.completions.create(
            model="toy", prompt="hi", max_tokens=2, extra_body={"temperature": 1}
        )
    assert ok.choices[0].text is not None


@pytest.mark.parametrize("tree", ["chain:3", "multi:2x2", "dynamic:4"])
def test_a_request_tree_is_parsed_once(monkeypatch: pytest.MonkeyPatch, tree: str) -> None:
    """Issue 49: the server parsed a request's tree twice (its own bound check, then the
    ``Request``); now the ``Request`` takes the parsed tree."""
    import ersd.tree_spec as tree_spec
    from ersd.models import toy
    from ersd.serve import protocol as P
    from ersd.serve.requests import plan_request

    target, draft = toy.load("toy"), toy.load("toy-draft")
    calls: list[str] = []
    for name in ("parse_tree", "parse_dynamic", "parse_auto"):
        real = getattr(tree_spec, name)

        def counted(spec: Any, *a: Any, _real: Any = real, **kw: Any) -> Any:
            found = _real(spec, *a, **kw)
            if found is not None:
                calls.append(str(spec))
            return found

        monkeypatch.setattr(tree_spec, name, counted)
    body = P.CompletionRequest(prompt="hi", max_tokens=2, tree=tree, seed=1)
    plan = plan_request(
        body, [5, 6], target=target, draft=draft, config=ServeConfig("toy"), chat=False
    )
    assert plan.shape is not None
    assert calls == [tree]  # before: [tree, tree]
