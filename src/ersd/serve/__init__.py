"""``ersd serve``: an OpenAI-compatible HTTP server over the continuous-batching engine.

``create_app(target, draft, ServeConfig(model_name=...))`` builds the FastAPI app (run it with
uvicorn); ``ersd serve --target ... --draft ...`` does both.  Needs the ``serve`` extra
(fastapi, uvicorn, sse-starlette, prometheus-client).  See docs/serve.md.
"""

from __future__ import annotations

from ersd.serve.app import create_app
from ersd.serve.requests import ServeConfig

__all__ = ["ServeConfig", "create_app"]
