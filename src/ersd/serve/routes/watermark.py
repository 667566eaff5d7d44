"""``POST /v1/watermark/detect``: score a text (or token ids) for this server's watermark key.

Detection is bounded so that no client can starve generation with it (issue 48):

* **tokens per request** (``--max-detect-tokens``): a longer input gets HTTP 413 naming the cap
  and the flag; a text is refused before it is tokenized when it has more than
  :data:`CHARS_PER_TOKEN` characters per allowed token;
* **concurrency** (``--detect-concurrency``): at most that many detections run at once; a request
  beyond them waits up to ``--detect-wait`` seconds for a slot, then gets HTTP 429 with
  ``Retry-After``;
* **off the event loop**: the body is parsed, tokenized and scored in a worker thread (only
  reading it happens on the loop), so streams, ``/health`` and the engine keep going.

**With the model** (``"model": true``, or the served model's name): the model-weighted detector
(:func:`ersd.watermark.weighted.detect_weighted`, docs/watermark-detection.md) weights each token
by the served target's probability of it, after the request's ``prompt`` / ``messages`` when
given, at its ``temperature`` (default 1).  The server's key was checked against the target's
tokenizer at start-up, so the weights are the generator's own.  The one forward over the text
(prompt included, within ``--max-detect-tokens`` and the context window) runs on the engine's
thread between two steps (:meth:`~ersd.serve.engine.ServingLoop.call`), in chunks of
:data:`FORWARD_CHUNK` tokens with decode steps between them; the model-free detector runs first,
so a text it refuses (too short, ids outside the vocabulary, a bad salt) never costs a forward.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from fastapi import FastAPI, Request
from pydantic import ValidationError

from ersd.errors import ErsdError
from ersd.serve import protocol as P
from ersd.serve.engine import ShuttingDownError
from ersd.serve.metrics import Metrics
from ersd.serve.requests import ApiError, ServeConfig, context_window
from ersd.serve.respond import validation_error, watermark_info
from ersd.serve.text import chat_ids, check_text, prompt_ids
from ersd.watermark.detect import detect, encode_text

#: the model-weighted detector's forward feeds at most this many tokens per engine call, so
#: decode steps run between the chunks of a long text (a text this short is one forward, exactly
#: :func:`ersd.watermark.weighted.model_token_probs`'s)
FORWARD_CHUNK = 256

#: a text longer than this many characters per allowed token is refused before it is tokenized
#: (no tokenizer of the catalog averages anywhere near 16 characters per token on real text)
CHARS_PER_TOKEN = 16


class DetectSlots:
    """At most ``concurrency`` detections at once; a caller waits up to ``wait`` seconds for a
    slot, then gets HTTP 429 with ``Retry-After``."""

    def __init__(self, concurrency: int, wait: float) -> None:
        self.concurrency, self.wait = concurrency, wait
        self._sem = asyncio.Semaphore(concurrency)

    async def acquire(self) -> None:
        try:
            await asyncio.wait_for(self._sem.acquire(), timeout=self.wait)
        except TimeoutError:
            raise ApiError(
                429,
                f"the server is already running {self.concurrency} watermark detection(s) "
                f"(--detect-concurrency) and none finished within {self.wait:g} s; retry shortly",
                type="rate_limit_error",
                code="detect_busy",
                headers={"Retry-After": str(max(1, math.ceil(self.wait)))},
            ) from None

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a worker thread, in a slot.  The slot is freed when the thread ends,
        not when the caller goes: a client that disconnects mid-detection does not free a slot
        whose work still runs."""
        await self.acquire()

        def done(task: asyncio.Future[Any]) -> None:
            self._sem.release()
            if not task.cancelled():
                task.exception()  # retrieved: a caller that left never sees it

        task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        task.add_done_callback(done)
        return await asyncio.shield(task)


def _too_many(kind: str, got: str, cap: int) -> ApiError:
    return ApiError(
        413,
        f"{kind}: {got}, more than this server scores per request ({cap:,} tokens, "
        "--max-detect-tokens); score a shorter excerpt (detection power saturates long before "
        "that), or restart the server with a larger --max-detect-tokens",
        param=kind,
        code="too_many_tokens",
    )


def score(raw: bytes, target: Any, config: ServeConfig, serving: Any = None) -> P.Detection:
    """Parse, tokenize and score one request body (in a worker thread).  Raises
    :class:`ApiError` for a bad body, one over the token cap, or a model-weighted request this
    server cannot run; ``serving`` (the :class:`~ersd.serve.engine.ServingLoop`) runs the
    model-weighted detector's forward."""
    try:
        body = P.DetectRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    try:
        kind, source = body.source()
    except ValueError as exc:
        raise ApiError(400, f"request body: {exc}") from None
    weighted = _wants_model(body, config)
    cap = config.max_detect_tokens
    if kind == "text":
        text = check_text("text", str(source))
        if len(text) > cap * CHARS_PER_TOKEN:
            raise _too_many("text", f"{len(text):,} characters", cap)
        ids = encode_text(target.tokenizer, text)
    else:
        ids = [int(t) for t in source]
    if len(ids) > cap:
        raise _too_many(kind, f"{len(ids):,} tokens", cap)
    prompt = _prompt_ids(body, target)
    if weighted and prompt is not None and len(prompt) + len(ids) > cap:
        param = "messages" if body.messages is not None else "prompt"
        raise _too_many(param, f"{len(prompt):,} prompt + {len(ids):,} text tokens", cap)
    wm = config.watermark
    assert wm is not None
    info = watermark_info(wm)
    assert info is not None
    try:
        found = detect(
            ids,
            wm,
            salt=body.salt,
            threshold=config.detect_threshold,
            vocab_size=target.vocab_size,
            prompt=prompt,
        )
    except ErsdError as exc:  # too short, ids outside the vocabulary, a salt out of range
        param = "salt" if str(exc).startswith("salt") else kind
        if exc.param == "prompt":
            param = "messages" if body.messages is not None else "prompt"
        raise ApiError(400, f"{param}: {exc}", param=param) from None
    common: dict[str, Any] = {
        "threshold": found.threshold,
        "num_tokens": len(ids),
        "num_scored_tokens": found.scored,
        "num_skipped_tokens": found.skipped,
        "salts_tried": found.salts_tried,
        "watermark": info,
    }
    if not weighted:
        return P.Detection(
            verdict="watermarked" if found.watermarked else "not watermarked",
            watermarked=found.watermarked,
            p_value=found.p_value,
            score=found.score,
            salt=found.salt,
            **common,
        )
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    where = kind if prompt is None else ("messages" if body.messages is not None else "prompt")
    res = _weighted(ids, prompt, where, temperature, body.salt, target, config, serving)
    return P.Detection(
        detector="model-weighted",
        verdict=res.verdict,
        watermarked=res.watermarked,
        p_value=res.p_value,
        score=res.score,
        salt=res.salt,
        num_weighted_tokens=res.weighted,
        expected_power=res.expected_power,
        temperature=temperature,
        model_free_p_value=found.p_value,
        **common,
    )


def _wants_model(body: P.DetectRequest, config: ServeConfig) -> bool:
    """Whether the request asks for the model-weighted detector (``model``: true or the served
    model's name); ``temperature`` goes with it."""
    model = body.model
    if isinstance(model, str):
        if model != config.model_name:
            raise ApiError(
                404,
                f"model: this server weights with its own model {config.model_name!r}, not "
                f'{model!r}; send "model": true (or {config.model_name!r}), or run `ersd '
                "watermark detect --model NAME` with another model",
                param="model",
                code="model_not_found",
            )
        return True
    if not model and body.temperature is not None:
        raise ApiError(
            400,
            "temperature: the temperature weights the model-weighted detector; send it with "
            '"model": true (the model-free detector needs none)',
            param="temperature",
        )
    return bool(model)


def _prompt_ids(body: P.DetectRequest, target: Any) -> list[int] | None:
    """The ids of the request's ``prompt`` (as /v1/completions encodes it) or ``messages`` (as
    /v1/chat/completions renders them); None when neither is given."""
    if body.prompt is not None and body.messages is not None:
        raise ApiError(400, "request body: give at most one of prompt and messages")
    if body.messages is not None:
        try:
            messages = [
                {"role": m.role, "content": check_text(f"messages[{i}].content", m.text())}
                for i, m in enumerate(body.messages)
            ]
            return chat_ids(target.tokenizer, messages)
        except ApiError:
            raise
        except Exception as exc:  # template errors, non-text parts
            raise ApiError(400, f"messages: {exc}", param="messages") from None
    if body.prompt is None:
        return None
    if isinstance(body.prompt, str):
        ids = prompt_ids(target.tokenizer, check_text("prompt", body.prompt))
    else:
        ids = [int(t) for t in body.prompt]
        bad = [t for t in ids if not 0 <= t < target.vocab_size]
        if bad:
            raise ApiError(
                400,
                f"prompt: token ids must lie in [0, {target.vocab_size}) (the served model's "
                f"vocabulary), got {bad[0]}; send the prompt's text or its ids from this tokenizer",
                param="prompt",
            )
    if not ids:
        raise ApiError(
            400, "prompt: it encodes to no tokens; give the prompt or leave it out", param="prompt"
        )
    return ids


def _weighted(
    ids: list[int],
    prompt: list[int] | None,
    param: str,
    temperature: float,
    salt: int | None,
    target: Any,
    config: ServeConfig,
    serving: Any,
) -> Any:
    """The model-weighted detection: the target's probabilities of ``ids`` (one forward, on the
    engine's thread), then :func:`~ersd.watermark.weighted.detect_weighted`; ``param`` names
    the input an error blames."""
    from ersd.watermark.weighted import detect_weighted

    if temperature > 1e3 or temperature < 1e-3:
        raise ApiError(
            400,
            f"temperature: the generation's temperature, in [0.001, 1000], got {temperature:g}",
            param="temperature",
        )
    window = context_window(target)
    total = len(prompt or ()) + len(ids)
    if window is not None and total > window:
        raise ApiError(
            400,
            f"{param}: {total} tokens (prompt and text) do not fit the model's context window "
            f"of {window}; score a shorter excerpt (or leave the prompt out)",
            param=param,
        )
    if serving is None:
        raise ApiError(
            400,
            "model: this server cannot run its model for detection here; leave model unset",
            param="model",
        )

    try:
        probs = token_probs(target, ids, prompt, temperature, lambda f: serving.call(f).result())
    except ShuttingDownError as exc:
        raise ApiError(503, str(exc), type="service_unavailable", code="shutting_down") from None
    except ErsdError as exc:
        raise ApiError(400, f"{param}: {exc}", param=param) from None
    assert config.watermark is not None
    try:
        return detect_weighted(
            ids,
            config.watermark,
            probs,
            prompt=prompt,
            salt=salt,
            threshold=config.detect_threshold,
            vocab_size=target.vocab_size,
        )
    except ErsdError as exc:
        raise ApiError(400, f"{param}: {exc}", param=param) from None


def token_probs(
    model: Any,
    ids: list[int],
    prompt: list[int] | None,
    temperature: float,
    run: Any,
    chunk: int = FORWARD_CHUNK,
) -> Any:
    """Each token's probability under ``model``, as
    :func:`~ersd.watermark.weighted.model_token_probs` computes it (after ``prompt``, else after
    the text's first token, whose probability is then ``nan``), with the forwards handed to
    ``run(fn)`` (the engine's thread) ``chunk`` tokens at a time: a text of at most ``chunk``
    scored tokens is that function's one forward; a longer one is fed in chunks through one
    session (each chunk scored, then committed), so decode steps run in between."""
    import numpy as np
    import torch

    from ersd.watermark.weighted import model_token_probs

    head = prompt if prompt else ids[:1]
    rest = ids if prompt else ids[1:]
    if len(rest) <= chunk:
        return run(lambda: model_token_probs(model, ids, prompt, temperature))
    state: dict[str, Any] = {}

    def piece(part: list[int]) -> Any:
        if "session" not in state:
            state["session"] = model.start(head)
        session = state["session"]
        with torch.no_grad():
            logits = session.score(part, list(range(-1, len(part) - 1)))
            session.commit(part, list(range(len(part))))
        logp = torch.log_softmax(logits[: len(part)].float() / temperature, dim=-1)
        taken = logp.gather(1, torch.tensor(part, dtype=torch.long).view(-1, 1)).exp()
        return taken.view(-1).cpu().numpy().astype(np.float64)

    parts = [run(lambda p=rest[i : i + chunk]: piece(p)) for i in range(0, len(rest), chunk)]
    out = np.concatenate(parts)
    return out if prompt else np.concatenate([[np.nan], out])


def add_routes(app: FastAPI) -> None:
    config: ServeConfig = app.state.config
    metrics: Metrics = app.state.metrics
    target = app.state.target
    slots = DetectSlots(config.detect_concurrency, config.detect_wait)
    app.state.detect_slots = slots
    schema = {"content": {"application/json": {"schema": P.DetectRequest.model_json_schema()}}}

    @app.post(
        "/v1/watermark/detect",
        response_model=P.Detection,
        openapi_extra={"requestBody": {"required": True, **schema}},
    )
    async def watermark_detect(request: Request) -> P.Detection:
        """Score a text (or token ids) for this server's watermark key (docs/watermark.md)."""
        wm = config.watermark
        if wm is None:
            raise ApiError(
                404,
                "this server has no watermark key, so it has nothing to detect; start it with "
                "--watermark-key-file FILE (or run `ersd watermark detect --key-file FILE`)",
                code="watermark_off",
            )
        raw = await request.body()  # bounded by --max-body-bytes (serve.guard)
        found = await slots.run(score, raw, target, config, app.state.serving)
        metrics.detections.labels(config.model_name, str(found.watermarked).lower()).inc()
        return found
