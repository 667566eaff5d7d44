"""``POST /v1/chat/completions``: messages rendered with the model's chat template."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ersd.serve import protocol as P
from ersd.serve.requests import ApiError, plan_request
from ersd.serve.respond import encode, respond
from ersd.serve.text import chat_ids, check_text


def add_routes(app: FastAPI) -> None:
    target, draft, config = app.state.target, app.state.draft, app.state.config

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: P.ChatCompletionRequest, request: Request) -> Any:
        try:
            messages = [
                {"role": m.role, "content": check_text(f"messages[{i}].content", m.text())}
                for i, m in enumerate(body.messages)
            ]
            ids = await encode(chat_ids, target.tokenizer, messages)
        except ApiError:
            raise
        except Exception as exc:  # template errors (e.g. roles that must alternate)
            raise ApiError(400, f"messages: {exc}", param="messages") from None
        plan = plan_request(body, ids, target=target, draft=draft, config=config, chat=True)
        return await respond(app, request, plan, "chat")
