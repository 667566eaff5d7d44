"""What a request must pass before any route sees it: the API key and the body-size limit.

A plain ASGI middleware (it never wraps a response, so streams are untouched):

* **API key** (``ersd serve --api-key`` / ``$ERSD_API_KEY``): every route under ``/v1``, and
  the API's description (``/docs``, ``/redoc``, ``/openapi.json``), needs
  ``Authorization: Bearer <key>``, compared in constant time (:func:`hmac.compare_digest`); a
  missing or wrong key gets HTTP 401 with an OpenAI error body (``code: invalid_api_key``).
  ``/health`` and ``/metrics`` stay open, as in vLLM: probes and scrapers carry no key, and they
  reveal queue lengths and counters, never prompts or text.
* **Body size** (``--max-body-bytes``): a body longer than the limit gets HTTP 413 naming the
  limit, before it is parsed.  The limit holds for the bytes actually read, whatever the
  headers: an over-limit ``Content-Length`` is refused before the body is read, and every other
  body (chunked, or a ``Content-Length`` beside ``Transfer-Encoding: chunked``, which is not
  believed) is read only up to the limit and refused as soon as it passes it.  The rest of the
  body is read and thrown away first (up to :data:`DRAIN_BYTES` and :data:`DRAIN_SECONDS`; not
  for a body framed both ways, which is answered at once): a client such as ``urllib`` or
  ``httpx`` sends its whole body before it reads the reply, and a server that answers and closes
  mid-body makes that client see "connection reset" instead of the 413.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: default ``--max-body-bytes``: 4 MiB, some 30 times the text of a 32k-token context
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: default ``--max-detect-tokens``: far beyond where detection power saturates (a few hundred
#: tokens); scoring 4,096 tokens under all 256 salts of a default key took 1.3 s on the 2-core
#: test machine (16,384: 5.8 s), with a known salt a few milliseconds
DEFAULT_MAX_DETECT_TOKENS = 4096
#: an over-limit body is read and discarded up to this many bytes before the 413 is sent, so
#: the client gets to read the reply; a bigger body is answered at once (the client may then see
#: a reset connection, the price of not reading gigabytes for it)
DRAIN_BYTES = 64 * 1024 * 1024
#: ... and for at most this many seconds (a client trickling its body is not waited for)
DRAIN_SECONDS = 10.0
#: routes the API key guards (the OpenAI API); /health and /metrics stay open
GUARDED_PREFIX = "/v1"
#: the API's description (FastAPI's pages and schema) is guarded too when a key is set: it
#: lists the routes and extra fields of a server that is not meant to be open
DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def key_matches(header: str | None, api_key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <api_key>`` (constant time)."""
    scheme, _, given = (header or "").partition(" ")
    ok = hmac.compare_digest(given.strip().encode(), api_key.encode())
    return ok and scheme.lower() == "bearer"


async def _error(send: Send, status: int, message: str, code: str, **headers: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive, size: int) -> None:
    """Read and discard the rest of a request body (``size`` bytes of it already read), up to
    :data:`DRAIN_BYTES` in all and :data:`DRAIN_SECONDS`, so the 413 reaches a client that writes
    its whole body before it reads."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while size <= DRAIN_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), timeout=left)
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class Guard:
    """ASGI middleware checking the API key and the body size (see the module docstring).
    ``on_refused(status)`` is called for every refusal (the server counts them)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        max_body_bytes: int,
        on_refused: Callable[[int], None] | None = None,
    ) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key or None, max_body_bytes
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = str(scope.get("path", ""))
        guarded = (
            path == GUARDED_PREFIX or path.startswith(GUARDED_PREFIX + "/") or path in DOC_PATHS
        )
        if self.api_key and guarded and not key_matches(headers.get("authorization"), self.api_key):
            self._refused(401)
            given = "a wrong API key" if headers.get("authorization") else "no API key"
            await _error(
                send,
                401,
                f"this server needs an API key and the request carried {given}: send "
                "'Authorization: Bearer <key>' (the openai client's api_key=) with the key "
                "the server was started with (--api-key or $ERSD_API_KEY)",
                "invalid_api_key",
                **{"WWW-Authenticate": "Bearer"},
            )
            return
        if scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = headers.get("content-length")
        chunked = "transfer-encoding" in headers
        length = int(declared) if declared is not None and declared.strip().isdigit() else None
        if not chunked and length is not None and length > self.max_body_bytes:
            if length <= DRAIN_BYTES:  # refused before a byte is parsed
                await _drain(receive, 0)
            await self._too_large(send, f"{length:,} bytes")
            return
        # the limit holds for the bytes actually read, whatever the headers say (a
        # Content-Length beside Transfer-Encoding: chunked is not believed): read the body up to
        # the limit, then hand it over
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                # a body framed two ways is answered at once; a plain one is drained first
                if message.get("more_body", False) and not (chunked and declared is not None):
                    await _drain(receive, size)
                await self._too_large(send, f"over {size:,} bytes")
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _refused(self, status: int) -> None:
        if self.on_refused is not None:
            self.on_refused(status)

    async def _too_large(self, send: Send, got: str) -> None:
        self._refused(413)
        limit = self.max_body_bytes
        await _error(
            send,
            413,
            f"the request body ({got}) is larger than this server's limit of {limit:,} bytes; "
            "send a shorter prompt, or restart the server with a larger --max-body-bytes",
            "request_too_large",
        )


class RedactQuery(logging.Filter):
    """Drops the query string from uvicorn's access log lines (``GET /v1/models?<redacted>``):
    a client may put a key there (``?api_key=...``) and the server reads none, so the log keeps
    the path only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(a) for a in record.args)
        return True


def _redacted(arg: object) -> object:
    if isinstance(arg, str) and "?" in arg and arg.startswith("/"):
        return arg.partition("?")[0] + "?<redacted>"
    return arg


def redact_access_log() -> None:
    """Install :class:`RedactQuery` on uvicorn's access logger (once; after uvicorn set up its
    logging, which the app's start-up is)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())
