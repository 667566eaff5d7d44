"""The server on weight-free models (in-process uvicorn, real ``openai`` client): failure
isolation, queue bound, stop strings and n, plus :class:`TextStream` on its own.  The real-model
end-to-end tests are in test_serve.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
import uvicorn

import ersd
from ersd.serve import ServeConfig, create_app
from ersd.serve.text import TextStream

VOCAB = 40
POISON = 39  # a prompt holding this token makes the target raise (an internal failure)
EOS = 0


class CharTokenizer:
    """Characters from " " <-> ids 1..38 (clipped); id 39 is POISON, id 0 EOS (not decoded)."""

    def encode(self, text: str) -> list[int]:
        return [min(max(ord(c) - 31, 1), POISON - 1) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(t + 31) for t in ids if t != EOS)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True):
        text = "".join(f"<{m['role'][0]}>{m['content']}" for m in messages)
        return self.encode(text + ("<a>" if add_generation_prompt else ""))


def _logits(seqs: list[list[int]], salt: int) -> torch.Tensor:
    rows = []
    for s in seqs:
        if POISON in s:
            raise RuntimeError("poisoned context")
        g = torch.Generator().manual_seed(hash((tuple(s[-3:]), salt)) & 0xFFFFFFFF)
        row = torch.randn(VOCAB, generator=g) * 2.0
        row[EOS] -= 4.0  # rare EOS
        row[POISON] = -1e9  # never generated: only a prompt can hold it
        rows.append(row)
    return torch.stack(rows)


def _models() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = ersd.FunctionModel(lambda s: _logits(s, 0), VOCAB, max_length=48)
    target.tokenizer = CharTokenizer()  # type: ignore[attr-defined]
    target.eos_token_ids = [EOS]  # type: ignore[attr-defined]
    draft = ersd.FunctionModel(lambda s: _logits(s, 0) + 0.5 * _logits(s, 1), VOCAB)
    return target, draft


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    target, draft = _models()
    config = ServeConfig(
        model_name="toy", tree="chain:3", max_batch_size=4, max_queue=4, shutdown_timeout=2
    )
    port = _free_port()
    srv = uvicorn.Server(
        uvicorn.Config(create_app(target, draft, config), host="127.0.0.1", port=port,
                       log_level="warning")
    )  # fmt: skip
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start in 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "server did not shut down"


def test_graceful_shutdown_lets_a_stream_in_flight_finish() -> None:
    target, draft = _models()
    slow = ersd.FunctionModel(lambda s: (time.sleep(0.01), _logits(s, 0))[1], VOCAB, max_length=48)
    slow.tokenizer, slow.eos_token_ids = target.tokenizer, [EOS]  # type: ignore[attr-defined]
    app = create_app(
        slow, draft, ServeConfig(model_name="toy", tree="chain:3", shutdown_timeout=10)
    )
    port = _free_port()
    srv = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=11
        )
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    with contextlib.ExitStack() as stack:
        deadline = time.monotonic() + 30
        while not srv.started:
            assert time.monotonic() < deadline, "server did not start in 30 s"
            time.sleep(0.05)
        client = _client(f"http://127.0.0.1:{port}/v1")
        stack.callback(client.close)
        solo = _text(client, "ABC", seed=5, max_tokens=40)
        stream = client.completions.create(
            model="toy", prompt="ABC", seed=5, max_tokens=40, stream=True
        )
        chunks = iter(stream)
        text = next(chunks).choices[0].text
        srv.should_exit = True  # what SIGTERM does
        text += "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == solo  # finished, not cut off
        stream.close()
        stack.callback(thread.join, 30)
        stack.callback(setattr, srv, "should_exit", True)
    assert not thread.is_alive(), "server did not shut down"


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[openai.OpenAI]:
    with _client(server) as c:
        yield c


def _text(client: openai.OpenAI, prompt: str | list[int], **kw) -> str:
    out = client.completions.create(model="toy", prompt=prompt, **kw)
    return out.choices[0].text


def test_failure_in_one_request_leaves_the_others_intact(
    server: str, client: openai.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    specs = [("ABC", 1), ("BAD", 2), ("CE", 3)]
    solo = {s: _text(client, s[0], seed=s[1], max_tokens=40) for s in specs}
    with ThreadPoolExecutor(4) as pool:
        good = [pool.submit(_text, client, p, seed=sd, max_tokens=40) for p, sd in specs]
        bad = pool.submit(_text, client, [34, POISON], seed=9, max_tokens=12)  # token ids
        with pytest.raises(openai.InternalServerError, match="poisoned context"):
            bad.result(timeout=60)
        assert [f.result(timeout=60) for f in good] == [solo[s] for s in specs]
    assert "isolating the failing request" in caplog.text  # it failed inside a shared step
    stream = client.completions.create(model="toy", prompt=[34, POISON], max_tokens=5, stream=True)
    with pytest.raises(openai.APIError, match="poisoned context"):  # an error event in the stream
        list(stream)
    assert _text(client, "ABC", seed=1, max_tokens=40) == solo[("ABC", 1)]  # still serving


def test_queue_bound_answers_429_and_keeps_serving(server: str, client: openai.OpenAI) -> None:
    # 4 rows run, 4 may wait: a request for 4 more sequences than that is refused
    streams = [
        client.completions.create(model="toy", prompt="AB", n=4, max_tokens=40, stream=True,
                                  temperature=1.0, seed=i)
        for i in range(2)
    ]  # fmt: skip
    try:
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="toy", prompt="AB", max_tokens=4)
        assert info.value.body["code"] == "queue_full"
        with pytest.raises(openai.BadRequestError, match="at most 8"):  # can never fit: not a 429
            client.completions.create(model="toy", prompt="AB", max_tokens=4, n=9)
    finally:
        for s in streams:
            s.close()
    deadline = time.monotonic() + 30
    while True:  # the closed streams free their rows
        try:
            assert _text(client, "AB", seed=1, max_tokens=3)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "rows of closed streams were never freed"
            time.sleep(0.1)


def test_stop_strings_and_n(server: str, client: openai.OpenAI) -> None:
    full = _text(client, "BEAD0", seed=4, max_tokens=30)
    stop = full[5:7]
    want = full[: full.find(stop)]
    out = client.completions.create(model="toy", prompt="BEAD0", seed=4, max_tokens=30, stop=stop)
    assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model="toy", prompt="BEAD0", seed=4, max_tokens=30, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == want
    many = client.completions.create(model="toy", prompt="BEAD0", seed=4, n=3, max_tokens=10)
    for i, choice in enumerate(many.choices):
        assert choice.text == _text(client, "BEAD0", seed=ersd.derive_seed(4, i), max_tokens=10)
    assert many.model_extra["ersd"]["choices"][2]["seed"] == ersd.derive_seed(4, 2)


@pytest.mark.parametrize("n", [1, 2])
def test_a_negative_seed_is_refused_for_any_n(client: openai.OpenAI, n: int) -> None:
    """Regression: the request model took seeds in [-2**63, 2**64) and the library [0, 2**64):
    a negative seed failed late with n = 1 and was silently derived away with n > 1."""
    for seed in (-1, 2**64):
        with pytest.raises(openai.BadRequestError, match=r"\[0, 2\*\*64\)") as err:
            client.completions.create(model="toy", prompt="AB", seed=seed, n=n, max_tokens=2)
        assert err.value.param == "seed"  # type: ignore[attr-defined]


def test_library_errors_keep_their_field(client: openai.OpenAI) -> None:
    """The 400's param is the library error's own ``param`` (no message parsing): a temperature
    the request model lets through (>= 0) but the sampler refuses (below 1e-4)."""
    with pytest.raises(openai.BadRequestError, match="greedy") as err:
        client.completions.create(model="toy", prompt="AB", temperature=1e-6, max_tokens=2)
    assert err.value.param == "temperature"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="toy", prompt="AB", max_tokens=2, extra_body={"tree": "dynamic:0"}
        )
    assert err.value.param == "tree"  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["ersd", "sd"])
def test_dynamic_tree_requests_equal_the_library(client: openai.OpenAI, method: str) -> None:
    """``dynamic:K`` is served (batched with other rows) with the tokens ``ersd.generate``
    gives alone."""
    target, draft = _models()
    tok = CharTokenizer()
    extra = {"tree": "dynamic:4", "method": method}
    with ThreadPoolExecutor(3) as pool:
        futures = {
            (p, sd): pool.submit(_text, client, p, seed=sd, max_tokens=12, extra_body=extra)
            for p, sd in (("ABC", 1), ("CE", 2), ("BEAD", 3))
        }
        for (p, sd), fut in futures.items():
            solo = ersd.generate(
                target, draft, tok.encode(p), max_new_tokens=12, seed=sd, tree="dynamic:4",
                method=method, eos_token_id=[EOS],
            )  # fmt: skip
            assert fut.result(timeout=60) == tok.decode(solo.tokens), (p, sd)


def test_chat_uses_the_template(server: str, client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "BE"}]
    out = client.chat.completions.create(model="toy", messages=msgs, seed=3, max_tokens=8)
    assert out.choices[0].message.content == _text(client, "<u>BE<a>", seed=3, max_tokens=8)


@pytest.mark.parametrize(
    ("stop", "pieces", "want"),
    [
        (["BC"], ["A", "B", "C", "D"], "A"),
        (["XY", "CD"], ["AB", "C", "DE"], "AB"),
        (["B"], ["A", "<h>", "<t>", "B", "C"], "A\u00e9"),
        ([], ["A", "<h>", "<t>", "B"], "A\u00e9B"),
    ],
)
def test_text_stream_never_emits_past_a_stop(stop: list[str], pieces: list[str], want: str) -> None:
    class Tok:  # token i decodes to pieces[i]; "<h><t>" is one character split over two tokens
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            text = "".join(pieces[i] for i in ids)
            return text.replace("<h><t>", "\u00e9").replace("<h>", "\ufffd").replace("<t>", "")

    ts = TextStream(Tok(), stop)
    deltas = [ts.add([i]) for i in range(len(pieces))] + [ts.flush()]
    assert "".join(deltas) == ts.text == want
    assert ts.stopped == bool(stop)
    for k in range(1, len(deltas) + 1):  # no prefix of the stream ever shows a stop or U+FFFD
        assert "\ufffd" not in "".join(deltas[:k])
        assert not any(s in "".join(deltas[:k]) for s in stop)


@pytest.mark.parametrize("watermarked", [False, True])
def test_a_rebuilt_row_continues_exactly_watermark_included(watermarked: bool) -> None:
    """The serving loop rebuilds a failed step's rows from prompt + delivered tokens
    (:meth:`Job.continued`): the rebuilt row goes on with exactly the tokens the old one would
    have given -- with a watermark too (the delivered tokens stay generated: same windows)."""
    from ersd.request import Request
    from ersd.serve.engine import Job

    target, draft = _models()
    wm = ersd.Watermark(key=b"k" * 32) if watermarked else None
    req = Request([5, 6, 7], max_new_tokens=30, seed=9, tree="chain:3", watermark=wm)
    full = ersd.BatchEngine(target, draft)
    full.add(req)
    whole: list[int] = []
    for _ in range(100):  # capped: at most one step per token
        if len(whole) >= 30:
            break
        whole += [t for _, rec, _ in full.step() for t in rec.tokens]
    job = Job(req, lambda ev: None, tokens=whole[:11])
    rebuilt = ersd.BatchEngine(target, draft)
    rebuilt.add(job.continued())
    rest: list[int] = []
    for _ in range(100):
        if len(rest) >= 19:
            break
        rest += [t for _, rec, _ in rebuilt.step() for t in rec.tokens]
    assert len(whole) == 30 and whole[:11] + rest == whole
    # (watermark v2, issue 48: windows include the prompt, so a row rebuilt from prompt + tokens
    # sees the same windows with or without ``resumed``; the contrast that checked ``resumed``
    # mattered is gone with the prompt-blind windows it guarded -- a broken continuation, e.g.
    # one that drops or repeats a delivered token, still fails the equality above)


def test_calls_run_on_the_loop_thread_between_steps() -> None:
    """:meth:`ServingLoop.call` (the model-weighted detector's forward): the function runs on
    the loop's own thread, never inside a step; its result or exception reaches the caller; the
    rows stepping meanwhile are untouched; after close it is refused with ShuttingDownError."""
    from ersd.request import Request
    from ersd.serve.engine import Job, ServingLoop, ShuttingDownError

    target, draft = _models()
    loop = ServingLoop(target, draft, max_batch_size=2)
    loop.start()
    try:
        done = threading.Event()
        events: list[object] = []

        def deliver(ev: object) -> None:
            events.append(ev)
            if getattr(ev, "finish_reason", None) or not hasattr(ev, "tokens"):
                done.set()

        loop.submit([Job(Request([5, 6, 7], 24, seed=3, tree="chain:2"), deliver)])
        seen: list[tuple[str, bool]] = []

        def probe() -> str:
            seen.append((threading.current_thread().name, bool(loop._stepping)))
            return "ran"

        assert loop.call(probe).result(timeout=30) == "ran"
        assert seen == [("ersd-engine", False)]  # the loop's thread, between two steps

        def fails() -> None:
            raise ValueError("bad input")

        with pytest.raises(ValueError, match="bad input"):
            loop.call(fails).result(timeout=30)
        assert done.wait(30)
        assert getattr(events[-1], "finish_reason", None) is not None  # the row finished fine
    finally:
        loop.close(timeout=5)
    with pytest.raises(ShuttingDownError):
        loop.call(probe)


@pytest.mark.parametrize("prompt", [None, [3, 4, 5]])
def test_detection_forward_in_chunks_equals_one_forward(prompt: list[int] | None) -> None:
    """The model-weighted detector's probabilities fed ``chunk`` tokens per engine call equal
    :func:`model_token_probs`'s one forward (a function model: exactly), one call per chunk;
    a text within one chunk is that function's own forward, in one call."""
    import numpy as np

    from ersd.serve.routes.watermark import token_probs
    from ersd.watermark.weighted import model_token_probs

    target, _ = _models()
    ids = [
        int(t) for t in torch.randint(1, POISON, (37,), generator=torch.Generator().manual_seed(2))
    ]
    want = model_token_probs(target, ids, prompt, 0.8)
    calls: list[int] = []

    def run(fn):  # the engine's call, counted
        calls.append(1)
        return fn()

    got = token_probs(target, ids, prompt, 0.8, run, chunk=8)
    assert np.array_equal(got, want, equal_nan=True)
    assert len(calls) == -(-(len(ids) - (0 if prompt else 1)) // 8)
    calls.clear()
    assert np.array_equal(
        token_probs(target, ids, prompt, 0.8, run, chunk=64), want, equal_nan=True
    )
    assert len(calls) == 1
