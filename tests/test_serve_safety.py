"""``ersd serve`` as an unfriendly client meets it (issue 29, items 2-8): the real CLI in a
subprocess on 127.0.0.1 over the toy models (``tests/serve_harness.py`` slows them down where
time must pass), the official ``openai`` client for the OpenAI routes, ``urllib`` for raw bodies
and the others.  Every wait is bounded in count and seconds; every server is killed in a finally.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ersd.commands.serve import is_loopback
from tests.serve_harness import metric, start, stop

M = '{model_name="toy"}'


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status_code, self.headers, self.text = status, headers, body.decode()

    def json(self) -> Any:
        return json.loads(self.text)


def _request(
    method: str,
    url: str,
    *,
    json_body: Any = None,
    content: Any = None,
    headers: Any = None,
    timeout: float = 30,
) -> Reply:
    """One HTTP request through urllib; an error status is a reply, not an exception."""
    head = dict(headers or {})
    if json_body is not None:
        content = json.dumps(json_body).encode()
        head.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=content, headers=head, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers, exc.read())


def post(url: str, **kw: Any) -> Reply:
    return _request("POST", url, **kw)


def get(url: str, **kw: Any) -> Reply:
    return _request("GET", url, **kw)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A quick toy server with an API key from the environment and a small body limit."""
    log = tmp_path_factory.mktemp("guarded") / "server.log"
    proc, url = start(
        "--max-body-bytes", "100000", "--tree", "chain:3", env={"ERSD_API_KEY": "s3cret"}, log=log
    )
    try:
        yield url
    finally:
        stop(proc)


def _openai(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


# ------------------------------------------------------------------ item 8: API key


def test_api_key_right_key_works_wrong_or_missing_gets_401(guarded: str) -> None:
    with _openai(guarded, "s3cret") as client:
        out = client.completions.create(model="toy", prompt="hello", max_tokens=4, seed=1)
        assert out.usage is not None and out.usage.completion_tokens == 4
        assert [m.id for m in client.models.list()] == ["toy"]
    with _openai(guarded, "wrong") as client, pytest.raises(openai.AuthenticationError) as info:
        client.completions.create(model="toy", prompt="hello", max_tokens=4)
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key" and "wrong API key" in info.value.message
    r = post(f"{guarded}/v1/completions", json_body={"model": "toy", "prompt": "x"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and "no API key" in err["message"]
    assert "s3cret" not in r.text
    # the documented policy: probes and scrapers carry no key
    assert get(f"{guarded}/health", timeout=30).status_code == 200
    assert get(f"{guarded}/metrics", timeout=30).status_code == 200
    assert metric(guarded, 'ersd:requests_invalid_total{model_name="toy",status="401"}') >= 2


def test_loopback_hosts() -> None:
    """`ersd serve` warns when it listens beyond these without a key."""
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.com"):
        assert not is_loopback(host), host


# ------------------------------------------------------------------ item 3: body size


def test_body_over_the_limit_gets_413_with_the_limit(guarded: str) -> None:
    head = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    body = json.dumps({"model": "toy", "prompt": "x" * 200_000, "max_tokens": 1}).encode()
    r = post(f"{guarded}/v1/completions", content=body, headers=head, timeout=30)
    assert r.status_code == 413, r.text
    assert "limit of 100,000 bytes" in r.json()["error"]["message"]
    assert "--max-body-bytes" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(body), 16384):
            yield body[i : i + 16384]

    r = post(f"{guarded}/v1/completions", content=chunks(), headers=head, timeout=30)
    assert r.status_code == 413 and "limit of 100,000 bytes" in r.text
    small = json.dumps({"model": "toy", "prompt": "x" * 1000, "max_tokens": 2}).encode()
    r = post(f"{guarded}/v1/completions", content=small, headers=head, timeout=30)
    assert r.status_code == 200, r.text
    assert metric(guarded, 'ersd:requests_invalid_total{model_name="toy",status="413"}') == 2


def test_a_big_body_still_reads_its_413_not_a_reset(guarded: str) -> None:
    """A client that writes its whole body before reading (urllib, httpx) used to see
    'connection reset' for a body well over the limit: the server answered and closed mid-body.
    Before the drain, a 3 MB chunked post failed this way 20 times in 20, a declared one 6 in 20."""
    head = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    body = json.dumps({"model": "toy", "prompt": "x" * 3_000_000, "max_tokens": 1}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    for _ in range(5):
        for content in (body, chunks()):
            r = post(f"{guarded}/v1/completions", content=content, headers=head, timeout=30)
            assert r.status_code == 413 and "limit of 100,000 bytes" in r.text


# ------------------------------------------------------------------ items 2 and 6: bad input


def test_tree_beyond_the_server_limit_is_refused_with_it(guarded: str) -> None:
    with _openai(guarded, "s3cret") as client:
        t0 = time.monotonic()
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(
                model="toy", prompt="hi", max_tokens=2, extra_body={"tree": "chain:1500"}
            )
        assert time.monotonic() - t0 < 10  # before: the server stalled ~150 s
        assert info.value.status_code == 400
        assert "1500 nodes (limit 64)" in info.value.message
        assert "--max-tree-nodes" in info.value.message
        for tree in ("multi:1000x1000", "paths:" + json.dumps([[0] * d for d in range(1, 70)])):
            with pytest.raises(openai.BadRequestError, match="limit 64"):
                client.completions.create(
                    model="toy", prompt="hi", max_tokens=2, extra_body={"tree": tree}
                )
        out = client.completions.create(
            model="toy", prompt="hi", max_tokens=2, extra_body={"tree": "chain:64"}
        )
        assert out.choices[0].finish_reason == "length"


def test_lone_surrogate_is_a_400_counted_by_the_metrics(guarded: str) -> None:
    """Before: a plain-text 500, not counted by the error metric."""
    head = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    before = metric(guarded, 'ersd:requests_invalid_total{model_name="toy",status="400"}')
    raw = b'{"model": "toy", "prompt": "ab\\ud800c", "max_tokens": 2}'
    r = post(f"{guarded}/v1/completions", content=raw, headers=head, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and "character 2 is a lone UTF-16 surrogate" in err["message"]
    raw = b'{"model": "toy", "messages": [{"role": "user", "content": "\\udc00"}]}'
    r = post(f"{guarded}/v1/chat/completions", content=raw, headers=head, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    after = metric(guarded, 'ersd:requests_invalid_total{model_name="toy",status="400"}')
    assert after == before + 2


def test_server_refuses_a_default_tree_beyond_its_limit(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(AssertionError, match="exited with 1") as info:
        proc, _ = start("--tree", "chain:65", log=log)
        stop(proc)
    assert "65 nodes (limit 64)" in str(info.value) and "Traceback" not in log.read_text()


# ------------------------------------------------------------------ item 3: tokenize off the loop


def test_tokenizing_does_not_block_other_routes(tmp_path: Path) -> None:
    """The toy tokenizer's encode takes 3 s here; /health must answer meanwhile (before: every
    route waited for the encode, as a 20 MB prompt froze them for 28 s)."""
    proc, url = start(encode_delay=3.0, log=tmp_path / "server.log")
    try:
        done: list[int] = []

        def slow_request() -> None:
            r = post(
                f"{url}/v1/completions",
                json_body={"model": "toy", "prompt": "hello", "max_tokens": 2},
                timeout=60,
            )
            done.append(r.status_code)

        worker = threading.Thread(target=slow_request)
        worker.start()
        time.sleep(0.5)  # the request is encoding now
        latencies = []
        for _ in range(5):
            t0 = time.monotonic()
            assert get(f"{url}/health", timeout=30).status_code == 200
            latencies.append(time.monotonic() - t0)
        busy = not done
        worker.join(timeout=60)
        assert busy and done == [200]
        assert max(latencies) < 1.0, latencies
    finally:
        stop(proc)


# ------------------------------------------------------------------ item 4: client disconnect


def test_non_streaming_client_that_leaves_is_cancelled(tmp_path: Path) -> None:
    """Before: decoding went on for 20.9 s for nobody and was logged as a success."""
    log = tmp_path / "server.log"
    proc, url = start("--tree", "chain:2", step_delay=0.05, log=log)
    try:
        with pytest.raises(TimeoutError):  # the client gives up and closes its connection
            post(
                f"{url}/v1/completions",
                json_body={"model": "toy", "prompt": "hello", "max_tokens": 5000},
                timeout=1.5,
            )
        deadline = time.monotonic() + 10
        for _ in range(100):
            if metric(url, f"ersd:requests_cancelled_total{M}") == 1:
                break
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        deadline = time.monotonic() + 10  # its row is freed at the next step ...
        while metric(url, f"vllm:num_requests_running{M}") != 0:
            assert time.monotonic() < deadline, "the row was not freed"
            time.sleep(0.05)
        steps = metric(url, f"ersd:engine_steps_total{M}")
        time.sleep(1.0)  # ... and no step runs after it
        assert metric(url, f"ersd:engine_steps_total{M}") == steps
        assert metric(url, f'vllm:request_success_total{{finished_reason="length",{M[1:]}') == 0
        assert "client disconnected; request cancelled" in log.read_text()
        # a stream whose client leaves after its first event: cancelled and counted too
        body = {"model": "toy", "prompt": "hey", "max_tokens": 5000, "stream": True}
        req = urllib.request.Request(
            f"{url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.readline().startswith(b"data:")
        deadline = time.monotonic() + 10
        while metric(url, f"ersd:requests_cancelled_total{M}") < 2:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while metric(url, f"vllm:num_requests_running{M}") != 0:
            assert time.monotonic() < deadline, "the stream's row was not freed"
            time.sleep(0.1)
    finally:
        stop(proc)


# ------------------------------------------------------------------ item 7: /health


def test_health_reports_a_stalled_engine(tmp_path: Path) -> None:
    """Each target call takes 2.5 s here, beyond --stall-timeout 1: /health must say so while
    the engine has work, and recover once it is idle (before: "ok" throughout)."""
    proc, url = start("--stall-timeout", "1", step_delay=2.5, log=tmp_path / "server.log")
    try:
        worker = threading.Thread(
            target=post,
            args=(f"{url}/v1/completions",),
            kwargs={"json_body": {"model": "toy", "prompt": "hi", "max_tokens": 1}, "timeout": 60},
        )
        worker.start()
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(s["status"] == "stalled" for s in seen):
            r = get(f"{url}/health", timeout=30)
            seen.append({**r.json(), "code": r.status_code})
            time.sleep(0.2)
        stalled = [s for s in seen if s["status"] == "stalled"]
        assert stalled and stalled[0]["code"] == 503, seen
        assert stalled[0]["seconds_since_progress"] > 1.0
        worker.join(timeout=60)
        deadline = time.monotonic() + 10
        while get(f"{url}/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "health did not recover"
            time.sleep(0.2)
    finally:
        stop(proc)


# ------------------------------------------------------------------ item 5: SIGTERM under load


def test_sigterm_under_load_ends_every_request_explicitly(tmp_path: Path) -> None:
    """Before: non-streaming requests got a plain-text 500, streams were cut without an error,
    a finish_reason or [DONE].  Now: within --shutdown-timeout a request finishes; past it, a
    JSON 503, and a stream gets an error event then [DONE]; the process exits cleanly."""
    log = tmp_path / "server.log"
    proc, url = start("--shutdown-timeout", "2", "--tree", "chain:2", step_delay=0.05, log=log)
    try:
        results: dict[str, Any] = {}

        def long_plain() -> None:
            r = post(
                f"{url}/v1/completions",
                json_body={"model": "toy", "prompt": "a", "max_tokens": 100000},
                timeout=60,
            )
            results["plain"] = (r.status_code, r.headers.get("content-type"), r.text)

        def long_stream() -> None:
            lines = []
            body = {"model": "toy", "prompt": "b", "max_tokens": 100000, "stream": True}
            req = urllib.request.Request(
                f"{url}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        lines.append(line[5:].strip())
            results["stream"] = lines

        def short() -> None:
            r = post(
                f"{url}/v1/completions",
                json_body={"model": "toy", "prompt": "c", "max_tokens": 30},
                timeout=60,
            )
            results["short"] = r.status_code

        workers = [threading.Thread(target=f) for f in (long_plain, long_stream, short)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 20
        while metric(url, f"vllm:num_requests_running{M}") < 3:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        for w in workers:
            w.join(timeout=60)
        code = proc.wait(timeout=60)
        status, ctype, text = results["plain"]
        assert status == 503 and ctype == "application/json", text
        assert "shut down before this request finished" in json.loads(text)["error"]["message"]
        events = results["stream"]
        assert events[-1] == "[DONE]", events[-3:]
        assert (
            "shut down before this request finished" in json.loads(events[-2])["error"]["message"]
        )
        assert results["short"] == 200  # it finished within the shutdown timeout
        assert code in (0, -signal.SIGTERM), log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()
        assert "client disconnected" not in log.read_text()  # ended by the server, not the client
    finally:
        stop(proc)
