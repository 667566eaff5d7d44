"""``ersd serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

``create_app(target, draft, ServeConfig(model_name=...))`` builds the FastAPI app (run it with
uvicorn); ``ersd serve --target ... --draft ...`` does both.  Needs the ``serve`` extra
(fastapi, uvicorn, sse-starlette, prometheus-client).  See docs/serve.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ersd.serve.app import create_app
    from ersd.serve.requests import ServeConfig

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # lazy, so that the CLI can read ersd.serve.guard's defaults without the serve extra
    if name == "create_app":
        from ersd.serve.app import create_app

        return create_app
    if name == "ServeConfig":
        from ersd.serve.requests import ServeConfig

        return ServeConfig
    raise AttributeError(f"module 'ersd.serve' has no attribute {name!r}")
