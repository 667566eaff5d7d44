"""Checking a request and turning it into engine settings (a :class:`Plan`).

Every check happens here, before anything is queued, so a bad request gets a 400 naming the
field and the fix and never reaches the engine.  Seeds: a request's ``seed`` (a random one when
unset) is used as-is for ``n=1``; with ``n>1`` choice ``i`` gets
:func:`ersd.derive_seed` ``(seed, i)``, exactly like ``ersd.generate_batch(seeds=seed)``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from ersd.batch import derive_seed
from ersd.errors import ErsdError
from ersd.methods import get_method
from ersd.probs import SamplingParams
from ersd.serve import protocol as P
from ersd.serve.guard import DEFAULT_MAX_BODY_BYTES
from ersd.tree import MAX_TREE_DEPTH, AutoTree, TreeShape, parse_auto, parse_tree

#: completions' default ``max_tokens`` (as OpenAI's); chat defaults to ServeConfig.max_tokens
COMPLETIONS_MAX_TOKENS = 16


class ApiError(Exception):
    """An error answered with an OpenAI-style error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code, self.headers = type, code, headers


@dataclass
class ServeConfig:
    """Server-wide settings; ``method``/``tree`` are the defaults a request may override."""

    model_name: str
    method: str = "ersd"
    tree: str | TreeShape | AutoTree | None = "multi:2x3"  # None: target-only unless a request asks
    max_batch_size: int = 8
    max_queue: int = 64
    max_tokens: int = 256  # chat's default max_tokens (capped by the context window)
    shutdown_timeout: float = 10.0
    #: largest draft tree a request may ask for (nodes; its depth is bounded by the same number)
    max_tree_nodes: int = 64
    #: requests to /v1 need ``Authorization: Bearer <api_key>`` (None: open; see serve.guard)
    api_key: str | None = None
    #: bodies beyond this many bytes get HTTP 413
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: /health answers 503 when the engine had work but made no progress for this many seconds
    stall_timeout: float = 60.0


@dataclass
class Plan:
    """A checked request: what the engine runs for each choice."""

    model_name: str
    prompt: list[int]
    seeds: list[int]
    max_tokens: int
    method: str
    shape: TreeShape | AutoTree | None  # None: target-only; AutoTree: tree="auto"
    sampling: SamplingParams
    eos: list[int]
    stops: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    def job_params(self, seed: int) -> dict[str, Any]:
        """Keywords of ``BatchEngine.add`` for one choice."""
        return dict(
            max_new_tokens=self.max_tokens,
            seed=seed,
            method=self.method,
            tree=self.shape,
            sampling=self.sampling,
            eos_token_id=self.eos,
        )


def context_window(model: Any) -> int | None:
    """The model's context window in tokens (``max_length``; older adapters: ``max_context``)."""
    window = getattr(model, "max_length", None)
    if window is None:
        window = getattr(model, "max_context", None)
    return int(window) if window is not None else None


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


def plan_request(
    body: P.CompletionRequest | P.ChatCompletionRequest,
    prompt: list[int],
    *,
    target: Any,
    draft: Any,
    config: ServeConfig,
    chat: bool,
) -> Plan:
    """Check ``body`` (whose prompt encodes to ``prompt``) against the served models."""
    if body.model is not None and body.model != config.model_name:
        raise ApiError(
            404,
            f"the model {body.model!r} does not exist; this server serves "
            f"{config.model_name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    bad = body.unsupported()
    if bad is not None:
        raise ApiError(400, bad[1], param=bad[0])
    where = "messages" if chat else "prompt"
    if not prompt:
        raise _bad(where, "the prompt encodes to no tokens; give some text")
    vocab = target.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise _bad(where, f"token ids must lie in [0, {vocab}) for this model")

    temperature = 1.0 if body.temperature is None else body.temperature
    try:
        sampling = SamplingParams(temperature, body.top_k, body.top_p, body.min_p)
    except ErsdError as exc:
        msg = str(exc)
        param = next(
            (f for f in ("top_k", "top_p", "min_p") if f.replace("_", "-") in msg or f in msg),
            "temperature",
        )
        raise _bad(param, msg) from None

    method = body.method or config.method
    try:
        meth = get_method(method)
    except ErsdError as exc:
        raise _bad("method", str(exc)) from None
    shape = _tree(body.tree, draft, config)
    if isinstance(shape, TreeShape):
        try:
            meth.check_shape(shape)
        except ErsdError as exc:
            hint = "" if body.tree else " (the server's default tree; pass a tree it supports)"
            raise _bad("tree", f"{exc}{hint}") from None

    window = context_window(target)
    asked = body.max_completion_tokens if chat else None  # type: ignore[union-attr]
    asked = body.max_tokens if body.max_tokens is not None else asked
    if window is not None and len(prompt) >= window:
        raise _bad(
            where,
            f"the prompt has {len(prompt)} tokens but the context window is {window}; shorten it",
        )
    if asked is None:
        max_tokens = config.max_tokens if chat else COMPLETIONS_MAX_TOKENS
        if window is not None:
            max_tokens = min(max_tokens, window - len(prompt))
    else:
        max_tokens = asked
        if window is not None and len(prompt) + asked > window:
            raise _bad(
                "max_tokens",
                f"the prompt has {len(prompt)} tokens and max_tokens is "
                f"{asked}, beyond the context window of {window} tokens; lower "
                f"max_tokens to at most {window - len(prompt)} or shorten the prompt",
            )

    seed = body.seed if body.seed is not None else secrets.randbits(63)
    seeds = [seed] if body.n == 1 else [derive_seed(seed, i) for i in range(body.n)]
    return Plan(
        model_name=config.model_name,
        prompt=prompt,
        seeds=seeds,
        max_tokens=max_tokens,
        method=meth.name,
        shape=shape,
        sampling=sampling,
        eos=list(getattr(target, "eos_token_ids", []) or []),
        stops=body.stops(),
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def _tree(spec: str | None, draft: Any, config: ServeConfig) -> TreeShape | AutoTree | None:
    """The request's tree: its ``tree`` field, else the server's; ``"none"``: target-only;
    ``"auto"``: chosen per step by predicted throughput at the live batch size."""
    if spec is not None and spec.strip().lower() == "none":
        return None
    if draft is None:
        if spec is not None:
            raise _bad(
                "tree",
                "this server runs without a draft model, so it cannot draft "
                "trees; leave tree unset (or restart it with --draft)",
            )
        return None
    if spec is None:
        if config.tree is None or isinstance(config.tree, TreeShape | AutoTree):
            return config.tree
        return parse_auto(config.tree) or parse_tree(config.tree, **_limits(config))
    if "@" in spec:
        raise _bad(
            "tree",
            "profile files are read on the server only; start the server with "
            "--tree optimal:K@FILE instead",
        )
    try:
        return parse_auto(spec) or parse_tree(spec, **_limits(config))
    except ErsdError as exc:
        raise _bad("tree", f"{exc} (or 'none' for target-only decoding)") from None


def _limits(config: ServeConfig) -> dict[str, int]:
    """The server's tree bound (``--max-tree-nodes``) as :func:`parse_tree` takes it."""
    n = config.max_tree_nodes
    return {"max_nodes": n, "max_depth": min(n, MAX_TREE_DEPTH)}
