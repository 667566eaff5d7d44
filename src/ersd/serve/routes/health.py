"""``GET /health``, ``GET /metrics`` (Prometheus) and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from ersd.serve import protocol as P
from ersd.serve.engine import ServingLoop
from ersd.serve.metrics import CONTENT_TYPE, Metrics
from ersd.serve.requests import ServeConfig, context_window


def health_body(serving: ServingLoop, config: ServeConfig) -> tuple[dict[str, object], int]:
    """``/health``'s body and status.  ``ok`` / ``prefilling`` (200): the engine loop runs and
    makes progress -- a long prompt's prefill counts as progress while the model reports it
    layer by layer (``progress_inside_steps``); ``stalled`` (503): it had work but reported no
    progress for ``stall_timeout`` seconds (a hung forward, a dead device); ``unavailable``
    (503): the loop stopped."""
    p = serving.progress()
    status = "ok"
    if not serving.alive:
        status = "unavailable"
    elif p.stalled_for > config.stall_timeout:
        status = "stalled"
    elif p.phase == "prefill":
        status = "prefilling"
    body: dict[str, object] = {
        "status": status,
        "running": serving.num_running,
        "waiting": serving.num_waiting,
        "seconds_since_progress": round(p.stalled_for, 3),
        "phase": p.phase,
        "step_seconds": round(p.step_seconds, 3),
        "prefill_tokens": p.prefill_tokens,
        "progress_inside_steps": serving.progress_inside_steps,
    }
    return body, 200 if status in ("ok", "prefilling") else 503


def add_routes(app: FastAPI) -> None:
    config: ServeConfig = app.state.config
    serving: ServingLoop = app.state.serving
    metrics: Metrics = app.state.metrics
    target = app.state.target

    @app.get("/v1/models")
    async def models() -> P.ModelList:
        card = P.ModelCard(
            id=config.model_name, created=app.state.started, max_model_len=context_window(target)
        )
        return P.ModelList(data=[card])

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine loop runs and makes progress (``prefilling`` during a long
        prompt's prefill); 503 when it stopped, or had work but made no progress for
        ``--stall-timeout`` seconds."""
        body, status = health_body(serving, config)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.set_queue(serving.num_running, serving.num_waiting)
        return Response(metrics.render(), media_type=CONTENT_TYPE)
