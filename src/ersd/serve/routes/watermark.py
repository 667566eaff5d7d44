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
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from fastapi import FastAPI, Request
from pydantic import ValidationError

from ersd.errors import ErsdError
from ersd.serve import protocol as P
from ersd.serve.metrics import Metrics
from ersd.serve.requests import ApiError, ServeConfig
from ersd.serve.respond import validation_error, watermark_info
from ersd.serve.text import check_text
from ersd.watermark.detect import detect, encode_text

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


def score(raw: bytes, target: Any, config: ServeConfig) -> tuple[Any, int]:
    """Parse, tokenize and score one request body (in a worker thread): (the detection, the
    number of tokens).  Raises :class:`ApiError` for a bad body or one over the token cap."""
    try:
        body = P.DetectRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    try:
        kind, source = body.source()
    except ValueError as exc:
        raise ApiError(400, f"request body: {exc}") from None
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
    assert config.watermark is not None
    try:
        found = detect(
            ids,
            config.watermark,
            salt=body.salt,
            threshold=config.detect_threshold,
            vocab_size=target.vocab_size,
        )
    except ErsdError as exc:  # too short, ids outside the vocabulary, a salt out of range
        param = "salt" if str(exc).startswith("salt") else kind
        raise ApiError(400, f"{param}: {exc}", param=param) from None
    return found, len(ids)


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
        found, n = await slots.run(score, raw, target, config)
        metrics.detections.labels(config.model_name, str(found.watermarked).lower()).inc()
        info = watermark_info(wm)
        assert info is not None
        return P.Detection(
            watermarked=found.watermarked,
            p_value=found.p_value,
            threshold=found.threshold,
            score=found.score,
            num_tokens=n,
            num_scored_tokens=found.scored,
            num_skipped_tokens=found.skipped,
            salt=found.salt,
            salts_tried=found.salts_tried,
            watermark=info,
        )
