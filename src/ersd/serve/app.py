"""The FastAPI application: OpenAI-compatible routes over the :class:`ServingLoop`.

``create_app(target, draft, config)`` takes loaded models (a target with ``.tokenizer`` and
``.eos_token_ids``, e.g. from :func:`ersd.load_model`, and a draft model, drafter or ``None``).
Request checking lives in :mod:`ersd.serve.requests`, a request in flight (jobs, events, the
JSON or SSE response) in :mod:`ersd.serve.respond`, the routes in :mod:`ersd.serve.routes`;
this module wires them with the errors, the guard (API key, body size) and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ersd.serve import protocol as P
from ersd.serve.engine import ServingLoop
from ersd.serve.guard import Guard, redact_access_log
from ersd.serve.metrics import Metrics
from ersd.serve.requests import ApiError, ServeConfig
from ersd.serve.respond import (
    DISCONNECT_POLL,
    FINISH,
    WATERMARK_HEADER,
    error_response,
    validation_error,
    watermark_headers,
    watermark_info,
)
from ersd.serve.routes import chat, completions, health, watermark

log = logging.getLogger("ersd.serve")

__all__ = [
    "DISCONNECT_POLL",
    "FINISH",
    "WATERMARK_HEADER",
    "create_app",
    "error_response",
    "watermark_headers",
    "watermark_info",
]


def create_app(
    target: Any, draft: Any, config: ServeConfig, *, engine_thread: bool = True
) -> FastAPI:
    """The ASGI app serving ``target`` (speculating with ``draft``) under ``config``.

    ``engine_thread``: the app starts its serving loop in a background thread at start-up; with
    False the caller runs ``app.state.serving.run()`` itself (``ersd serve`` does, on the main
    thread)."""
    metrics = Metrics(config.model_name)
    serving = ServingLoop(
        target,
        draft,
        max_batch_size=config.max_batch_size,
        max_queue=config.max_queue,
        on_step=metrics.on_step,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redact_access_log()  # uvicorn has set up its loggers by now
        if engine_thread:
            serving.start()
        yield
        await asyncio.to_thread(serving.close, config.shutdown_timeout)

    app = FastAPI(title="ersd", summary="OpenAI-compatible ERSD server", lifespan=lifespan)
    app.state.target, app.state.draft, app.state.config = target, draft, config
    app.state.serving, app.state.metrics = serving, metrics
    app.state.started = P.now()

    def counted(exc: ApiError) -> JSONResponse:
        if exc.status >= 500:
            metrics.errors.labels(config.model_name).inc()
        elif exc.status >= 400:
            metrics.invalid.labels(config.model_name, str(exc.status)).inc()
        return error_response(exc)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return counted(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return counted(validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return counted(ApiError(exc.status_code, str(exc.detail), code=None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:  # never a plain-text 500
        log.error("internal error answering %s", request.url.path, exc_info=exc)
        return counted(ApiError(500, f"internal error: {exc}", type="server_error"))

    app.add_middleware(
        Guard,
        api_key=config.api_key,
        max_body_bytes=config.max_body_bytes,
        on_refused=lambda status: metrics.invalid.labels(config.model_name, str(status)).inc(),
    )
    for routes in (completions, chat, watermark, health):
        routes.add_routes(app)
    return app
