"""``POST /v1/completions``: one prompt (a string, or token ids) and ``n`` choices."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ersd.serve import protocol as P
from ersd.serve.requests import ApiError, plan_request
from ersd.serve.respond import encode, respond
from ersd.serve.text import check_text, prompt_ids


def add_routes(app: FastAPI) -> None:
    target, draft, config = app.state.target, app.state.draft, app.state.config

    @app.post("/v1/completions", response_model=None)
    async def completions(body: P.CompletionRequest, request: Request) -> Any:
        tok = target.tokenizer
        if isinstance(body.prompt, str):
            ids = await encode(prompt_ids, tok, check_text("prompt", body.prompt))
        elif body.prompt and all(isinstance(p, str) for p in body.prompt):
            if len(body.prompt) != 1:
                raise ApiError(
                    400,
                    f"prompt: one prompt per request, got {len(body.prompt)}; "
                    "send one request per prompt (or use n for several samples)",
                    param="prompt",
                )
            ids = await encode(prompt_ids, tok, check_text("prompt", str(body.prompt[0])))
        else:
            ids = [int(t) for t in body.prompt]
        plan = plan_request(body, ids, target=target, draft=draft, config=config, chat=False)
        return await respond(app, request, plan, "completion")
