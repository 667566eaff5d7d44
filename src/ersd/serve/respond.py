"""A generation request in flight: its jobs on the :class:`ServingLoop`, their events, and the
OpenAI response built from them (a JSON body, or an SSE stream via ``sse-starlette``).

The routes (:mod:`ersd.serve.routes`) check a body into a :class:`~ersd.serve.requests.Plan` and
hand it to :func:`respond`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from ersd.results import GenerationResult, StepRecord
from ersd.serve import protocol as P
from ersd.serve.engine import Failed, Job, QueueFullError, ServingLoop, ShuttingDownError
from ersd.serve.metrics import Metrics
from ersd.serve.requests import ApiError, Plan
from ersd.serve.text import TextStream
from ersd.watermark.settings import Watermark

log = logging.getLogger("ersd.serve")

#: seconds between checks for a non-streaming client that left
DISCONNECT_POLL = 0.25

#: response header naming a watermarked response's scheme and key fingerprint
WATERMARK_HEADER = "X-Ersd-Watermark"

#: OpenAI finish reasons for ERSD's (the context window counts as "length", as in vLLM)
FINISH = {"eos": "stop", "length": "length", "context": "length", "stop": "stop"}


def error_response(exc: ApiError) -> JSONResponse:
    body = P.ErrorResponse(
        error=P.ErrorDetail(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
    )
    return JSONResponse(body.model_dump(), status_code=exc.status, headers=exc.headers)


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The 400 of a body that does not validate (pydantic's first error, its field named)."""
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {err.get('msg')}")
    param = ".".join(loc) or None
    got = err.get("input")
    shown = "" if got is None or isinstance(got, dict) else f" (got {got!r:.80})"
    where = f"{param}: " if param else "request body: "
    hint = " See the API reference in docs/serve.md." if param is None else ""
    return ApiError(400, f"{where}{err.get('msg')}{shown}.{hint}", param=param)


class _Choice:
    """Handler-side state of one choice: its text stream, records and finish reason."""

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.text = TextStream(tokenizer, stops)
        self.records: list[StepRecord] = []
        self.finish: str | None = None  # ERSD's reason: eos, length, context, stop


class _Call:
    """One request in flight: its jobs, their event queue and the per-choice state."""

    def __init__(self, app: FastAPI, plan: Plan, kind: str) -> None:
        self.app, self.plan, self.kind = app, plan, kind
        self.id = P.new_id("cmpl" if kind == "completion" else "chatcmpl")
        self.created = P.now()
        self.t0 = time.perf_counter()
        self.first_token: float | None = None
        self.queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        tok = app.state.target.tokenizer
        self.choices = [_Choice(tok, plan.stops) for _ in plan.seeds]
        loop = asyncio.get_running_loop()

        def sink(i: int) -> Any:
            return lambda ev: loop.call_soon_threadsafe(self.queue.put_nowait, (i, ev))

        self.jobs = [Job(plan.request_for(i), sink(i)) for i in range(len(plan.seeds))]

    def submit(self) -> None:
        serving: ServingLoop = self.app.state.serving
        metrics: Metrics = self.app.state.metrics
        capacity = serving.max_batch_size + serving.max_queue
        if len(self.jobs) > capacity:
            raise ApiError(
                400,
                f"n: {len(self.jobs)} choices can never fit this server ({serving.max_batch_size} "
                f"rows + {serving.max_queue} queued); ask for at most {capacity}",
                param="n",
            )
        try:
            serving.submit(self.jobs)
        except QueueFullError as exc:
            metrics.rejected.labels(metrics.model_name, "queue_full").inc()
            raise ApiError(
                429,
                str(exc),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            ) from None
        except ShuttingDownError as exc:
            metrics.rejected.labels(metrics.model_name, "shutting_down").inc()
            raise ApiError(
                503, str(exc), type="service_unavailable", code="shutting_down"
            ) from None
        metrics.prompt_tokens.labels(metrics.model_name).inc(len(self.plan.prompt) * len(self.jobs))

    async def left(self, request: Request) -> bool:
        """Whether the client has gone; then counts and logs the request as cancelled."""
        if not await request.is_disconnected():
            return False
        m: Metrics = self.app.state.metrics
        m.cancelled.labels(m.model_name).inc()
        log.info("%s: client disconnected; request cancelled, its rows freed", self.id)
        return True

    async def events(self, request: Request | None) -> AsyncIterator[tuple[int, str, str | None]]:
        """``(choice, new text, OpenAI finish reason or None)`` as steps arrive.  ``request``:
        poll it for a client that left (non-streaming; SSE watches that itself), at least every
        :data:`DISCONNECT_POLL` seconds, also while steps keep arriving; the ``finally`` then
        cancels the jobs, so their rows are freed at the engine's next step."""
        serving: ServingLoop = self.app.state.serving
        pending = set(range(len(self.jobs)))
        polled = time.monotonic()
        try:
            while pending:
                if request is not None and time.monotonic() - polled >= DISCONNECT_POLL:
                    polled = time.monotonic()
                    if await self.left(request):
                        return
                try:
                    i, ev = await asyncio.wait_for(self.queue.get(), timeout=DISCONNECT_POLL)
                except TimeoutError:
                    continue
                if i not in pending:
                    continue
                if isinstance(ev, Failed):
                    raise ApiError(ev.status, ev.message, type=_error_type(ev.status))
                ch = self.choices[i]
                if self.first_token is None and ev.tokens:
                    self.first_token = time.perf_counter() - self.t0
                ch.records.append(ev)
                delta = ch.text.add(ev.tokens)
                if ch.text.stopped:
                    ch.finish = "stop"
                    serving.cancel([self.jobs[i]])
                elif ev.finish_reason is not None:
                    ch.finish = ev.finish_reason
                    delta += ch.text.flush()
                if ch.finish is not None:
                    pending.discard(i)
                yield i, delta, (FINISH[ch.finish] if ch.finish else None)
        finally:
            serving.cancel(self.jobs)  # frees the rows of a client that left (no-op if done)

    def results(self) -> list[GenerationResult]:
        p = self.plan
        return [
            GenerationResult.from_steps(
                ch.records,
                method=p.method,
                tree=p.shape,
                wall_time=time.perf_counter() - self.t0,
            )
            for ch in self.choices
        ]

    def usage(self) -> P.Usage:
        done = sum(len(ch.text.tokens) for ch in self.choices)
        prompt = len(self.plan.prompt)
        return P.Usage(prompt_tokens=prompt, completion_tokens=done, total_tokens=prompt + done)

    def info(self) -> P.ErsdInfo:
        """The ``ersd`` extension; also logs the request and records its metrics."""
        res = self.results()
        latency = time.perf_counter() - self.t0
        stats = [
            P.ChoiceStats(
                index=i,
                seed=seed,
                finish_reason=ch.finish or "unfinished",
                num_tokens=len(r.tokens),
                target_calls=r.target_calls,
                num_draft_tokens=r.num_draft_tokens,
                num_accepted_tokens=r.num_accepted_tokens,
                block_efficiency=r.block_efficiency,
                acceptance_rate=r.acceptance_rate,
                salt=self.plan.salts[i] if self.plan.salts else _salt(self.plan, seed),
            )
            for i, (ch, r, seed) in enumerate(zip(self.choices, res, self.plan.seeds, strict=True))
        ]
        tokens = sum(len(r.tokens) for r in res)
        calls = sum(r.target_calls for r in res)
        drafted = sum(r.num_draft_tokens for r in res)
        accepted = sum(r.num_accepted_tokens for r in res)
        info = P.ErsdInfo(
            method=self.plan.method,
            tree=res[0].tree,
            race_scheme=self.plan.request.race_scheme,
            target_calls=calls,
            num_draft_tokens=drafted,
            num_accepted_tokens=accepted,
            block_efficiency=tokens / calls if calls else 0.0,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            latency=latency,
            choices=stats,
            watermark=watermark_info(self.plan.watermark),
        )
        m: Metrics = self.app.state.metrics
        for ch in self.choices:
            m.success.labels(m.model_name, FINISH.get(ch.finish or "", "abort")).inc()
        m.e2e.labels(m.model_name).observe(latency)
        if self.first_token is not None:
            m.ttft.labels(m.model_name).observe(self.first_token)
        log.info(
            "%s %s n=%d prompt=%d tokens=%d target_calls=%d block_efficiency=%.2f "
            "ttft=%.3fs latency=%.3fs finish=%s",
            self.id,
            self.kind,
            len(self.jobs),
            len(self.plan.prompt),
            tokens,
            calls,
            info.block_efficiency,
            self.first_token or 0.0,
            latency,
            ",".join(ch.finish or "-" for ch in self.choices),
        )
        return info


async def encode(fn: Callable[..., list[int]], tokenizer: Any, text: Any) -> list[int]:
    """Tokenize in a worker thread: a long prompt never blocks the event loop (other routes,
    streams, /health) while it is encoded; its size is bounded by ``--max-body-bytes``."""
    return await asyncio.to_thread(fn, tokenizer, text)


def _salt(plan: Plan, seed: int) -> int | None:
    wm = plan.watermark
    return None if wm is None else wm.salt_for(seed)


def watermark_info(wm: Watermark | None) -> P.WatermarkInfo | None:
    """What a response says about its watermark: scheme, key fingerprint, width -- no key."""
    if wm is None:
        return None
    return P.WatermarkInfo(
        scheme=wm.scheme,
        key_fingerprint=wm.fingerprint,
        context_width=wm.context_width,
        num_salts=wm.num_salts,
    )


def watermark_headers(plan: Plan) -> dict[str, str]:
    """``X-Ersd-Watermark: <scheme>; key=<fingerprint>`` on a watermarked response."""
    wm = plan.watermark
    return {} if wm is None else {WATERMARK_HEADER: f"{wm.scheme}; key={wm.fingerprint}"}


def _error_type(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"


async def respond(app: FastAPI, request: Request, plan: Plan, kind: str) -> Any:
    call = _Call(app, plan, kind)
    call.submit()
    if plan.stream:
        return EventSourceResponse(
            _stream(call, plan),
            shutdown_grace_period=app.state.config.shutdown_timeout,
            headers=watermark_headers(plan),
        )
    texts = [""] * len(call.jobs)
    finish: list[str | None] = [None] * len(call.jobs)
    async for i, delta, reason in call.events(request):
        texts[i] += delta
        finish[i] = reason or finish[i]
    if any(f is None for f in finish):  # the client left; nobody reads this
        return Response(status_code=499)
    common: dict[str, Any] = dict(
        id=call.id, created=call.created, model=plan.model_name, usage=call.usage()
    )
    body: P.Completion | P.ChatCompletion
    if kind == "completion":
        body = P.Completion(
            **common,
            choices=[
                P.CompletionChoice(index=i, text=t, finish_reason=f)
                for i, (t, f) in enumerate(zip(texts, finish, strict=True))
            ],
            ersd=call.info(),
        )
    else:
        body = P.ChatCompletion(
            **common,
            choices=[
                P.ChatChoice(index=i, message=P.AssistantMessage(content=t), finish_reason=f)
                for i, (t, f) in enumerate(zip(texts, finish, strict=True))
            ],
            ersd=call.info(),
        )
    return JSONResponse(body.model_dump(), headers=watermark_headers(plan))


async def _stream(call: _Call, plan: Plan) -> AsyncIterator[dict[str, str]]:
    chat = call.kind == "chat"
    head: dict[str, Any] = dict(id=call.id, created=call.created, model=plan.model_name)

    def chunk(i: int, text: str | None, reason: str | None, *, role: bool = False) -> Any:
        if chat:
            delta = P.Delta(role="assistant" if role else None, content=text)
            return P.ChatCompletionChunk(
                **head, choices=[P.ChatChunkChoice(index=i, delta=delta, finish_reason=reason)]
            )
        return P.Completion(
            **head, choices=[P.CompletionChoice(index=i, text=text or "", finish_reason=reason)]
        )

    metrics: Metrics = call.app.state.metrics
    ended = False  # False in the finally: the client left mid-stream (the task was cancelled)
    try:
        if chat:
            for i in range(len(call.jobs)):
                yield {"data": chunk(i, "", None, role=True).model_dump_json(exclude_none=True)}
        left = len(call.jobs)
        async for i, delta, reason in call.events(None):
            if not delta and reason is None:
                continue
            c = chunk(i, delta or None, reason)
            left -= reason is not None
            if reason is not None and left == 0:  # the last chunk carries the statistics
                c.ersd = call.info()
            yield {"data": c.model_dump_json(exclude_none=True)}
        if plan.include_usage:
            cls: Any = P.ChatCompletionChunk if chat else P.Completion
            yield {"data": cls(**head, choices=[], usage=call.usage()).model_dump_json()}
        ended = True
    except ApiError as exc:
        ended = True
        if exc.status >= 500:
            metrics.errors.labels(metrics.model_name).inc()
        err = P.ErrorDetail(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
        yield {"data": P.ErrorResponse(error=err).model_dump_json()}
    except Exception as exc:
        ended = True
        metrics.errors.labels(metrics.model_name).inc()
        log.exception("%s: stream failed", call.id)
        err = P.ErrorDetail(message=f"internal error: {exc}", type="server_error")
        yield {"data": P.ErrorResponse(error=err).model_dump_json()}
    finally:  # a client gone before the first event still frees its rows
        if not ended:
            metrics.cancelled.labels(metrics.model_name).inc()
            log.info("%s: client disconnected; stream cancelled, its rows freed", call.id)
        call.app.state.serving.cancel(call.jobs)
    yield {"data": "[DONE]"}
