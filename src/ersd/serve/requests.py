"""Checking an HTTP request and turning it into a :class:`Plan` of library requests.

The body becomes one :class:`ersd.request.Request`, checked by the library before anything is
queued, so a bad request gets a 400 naming the field (the error's ``param``) and the fix and
never reaches the engine.  Only the server's own policies live here (the served model's name,
OpenAI fields ersd does not implement, default ``max_tokens``, files in ``tree``).

Seeds: a request's ``seed`` (a random one when unset) is used as-is for ``n=1``; with ``n>1``
choice ``i`` gets :func:`ersd.derive_seed` ``(seed, i)``, exactly like
``ersd.generate_batch(seeds=seed)``; either way the seed itself must lie in ``[0, 2**64)``.

Watermark (``ersd serve --watermark-key-file``): every choice races on the server's keyed race.
``n=1`` uses the salt of its seed (``seed % num_salts``, as ``ersd generate`` with the same key
file), so the same request and seed give the same text as the CLI.  With ``n>1`` choice ``i``
gets salt ``(s0 + i) % num_salts`` (``s0`` the salt of choice 0's seed): distinct salts, so the
choices are different texts even where the seeds' unkeyed noise never comes into play, and each
is detected (the detector tries every salt, or the one a response reports).  More choices than
salts are refused.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from ersd.batch import derive_seed
from ersd.errors import ErsdError
from ersd.methods.catalog import race_winners_only
from ersd.probs import SamplingParams
from ersd.race import DEFAULT_RACE_SCHEME, check_race_scheme
from ersd.request import Request
from ersd.serve import protocol as P
from ersd.serve.guard import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DETECT_TOKENS
from ersd.tree import MAX_TREE_DEPTH, AutoTree, TreeShape
from ersd.tree_spec import ParsedTree, parse_tree_spec
from ersd.watermark.settings import Watermark

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
    #: None: target-only unless a request asks; a string is parsed at each request's temperature
    tree: str | TreeShape | AutoTree | ParsedTree | None = "multi:2x3"
    max_batch_size: int = 8
    max_queue: int = 64
    max_tokens: int = 256  # chat's default max_tokens (capped by the context window)
    shutdown_timeout: float = 10.0
    #: largest draft tree a request may ask for (nodes; its depth is bounded by the same number)
    max_tree_nodes: int = 64
    #: requests to /v1 (and the API docs) need ``Authorization: Bearer <api_key>`` (None: open;
    #: see serve.guard); never shown by ``repr``
    api_key: str | None = field(default=None, repr=False)
    #: bodies beyond this many bytes get HTTP 413
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: /health answers 503 when the engine had work but made no progress for this many seconds
    stall_timeout: float = 60.0
    #: every response is watermarked with this key (None: no watermark, /v1/watermark/* is 404)
    watermark: Watermark | None = None
    #: a request may send ``"watermark": false`` to get an unmarked response
    watermark_opt_out: bool = False
    #: /v1/watermark/detect calls a text watermarked when its p-value is at most this
    detect_threshold: float = 1e-3
    #: most tokens one /v1/watermark/detect request may score (longer: HTTP 413)
    max_detect_tokens: int = DEFAULT_MAX_DETECT_TOKENS
    #: detections that may run at once; more wait up to ``detect_wait`` seconds, then HTTP 429
    detect_concurrency: int = 1
    detect_wait: float = 2.0
    #: the race scheme of a request that names none (docs/race-schemes.md; ``--race-scheme``);
    #: a watermarked response always races on the key's PRF
    race_scheme: str = DEFAULT_RACE_SCHEME

    def __post_init__(self) -> None:
        check_race_scheme(self.race_scheme)  # ValueError naming the schemes
        if (
            self.watermark is not None
            and not self.watermark_opt_out
            and self.race_scheme != DEFAULT_RACE_SCHEME
        ):
            raise ValueError(
                f"race_scheme={self.race_scheme!r} applies to unwatermarked responses only, and "
                "this server watermarks every response (its races are the key's PRF); leave "
                f"the race scheme at {DEFAULT_RACE_SCHEME!r}, or allow opting out of the watermark"
            )


@dataclass
class Plan:
    """A checked HTTP request: the :class:`~ersd.request.Request` of its first choice and the
    seeds of all its choices."""

    model_name: str
    request: Request
    seeds: list[int]
    stops: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    #: each choice's watermark salt (empty: not watermarked)
    salts: list[int] = field(default_factory=list)

    @property
    def watermark(self) -> Watermark | None:
        return self.request.watermark

    @property
    def prompt(self) -> tuple[int, ...]:
        return tuple(self.request.prompt)

    @property
    def max_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def method(self) -> str:
        return self.request.verification.name

    @property
    def shape(self) -> ParsedTree | None:
        """The tree drafted (None: target-only); its ``label`` names it."""
        return self.request.parsed_tree

    def request_for(self, choice: int) -> Request:
        """The request of choice ``choice`` (already checked: only its seed and watermark salt
        differ from choice 0's)."""
        req = replace(self.request, seed=self.seeds[choice])
        if self.salts and len(self.seeds) > 1:
            assert req.watermark is not None
            req = replace(req, watermark=req.watermark.with_salt(self.salts[choice]))
        return req


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
    """Check ``body`` (whose prompt encodes to ``prompt``) against the served models.

    The body becomes one :class:`~ersd.request.Request` (checked once, by the library); an
    :class:`~ersd.ErsdError` becomes a 400 whose ``param`` is the error's own ``param`` (the
    request's ``prompt`` is the body's ``prompt`` or ``messages``)."""
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
    tree = _tree(body.tree, draft, config)

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

    watermark = _watermark(body, config)
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    try:
        request = Request(
            prompt,
            max_new_tokens=max_tokens,
            seed=seed,
            method=body.method or config.method,
            tree=tree,
            sampling=SamplingParams(
                1.0 if body.temperature is None else body.temperature,
                body.top_k,
                body.top_p,
                body.min_p,
            ),
            eos_token_id=list(getattr(target, "eos_token_ids", []) or []),
            watermark=watermark,
            race_scheme=_race_scheme(body, watermark, config),
        )
        request.check_models(target, draft if tree is not None else None)
        _check_growable(request, target, draft)
    except ErsdError as exc:
        param = where if exc.param == "prompt" else exc.param or "request"
        hint = ""
        if param == "watermark" or (param == "race_scheme" and watermark is not None):
            hint = " (this server watermarks every response)"
        if param == "tree":
            hint = (
                " (or 'none' for target-only decoding)"
                if body.tree
                else " (the server's default tree; pass a tree it supports)"
            )
        raise _bad(param, f"{exc}{hint}") from None
    info = request.verification.info
    if watermark is not None and tree is not None and not race_winners_only(info):
        raise _bad(
            "method",
            f"method {request.verification.name!r} does not mark every token with the keyed "
            "race (the engines' watermark schemes are benchmark baselines; this server's "
            "detector scores the ERSD race); use method 'ersd', or tree 'none'",
        )
    # a negative or oversized seed failed above for every n: choice i's seed is derived from it
    seeds = [seed] if body.n == 1 else [derive_seed(seed, i) for i in range(body.n)]
    salts: list[int] = []
    if watermark is not None:
        if body.n > watermark.num_salts:
            raise _bad(
                "n",
                f"n={body.n} watermarked choices need {body.n} distinct salts but this server's "
                f"key has num_salts={watermark.num_salts}; ask for at most "
                f"{watermark.num_salts} choices (or raise num_salts in the key file)",
            )
        first = watermark.salt_for(seeds[0])
        salts = [(first + i) % watermark.num_salts for i in range(body.n)]
    return Plan(
        model_name=config.model_name,
        request=replace(request, seed=seeds[0]),
        seeds=seeds,
        stops=body.stops(),
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        salts=salts,
    )


def _check_growable(request: Request, target: Any, draft: Any) -> None:
    """Refuse a ``dynamic:K`` tree the request's method cannot grow here, before anything is
    queued (the engine would refuse it only when it admits the job: a stream would already
    have answered 200)."""
    tree = request.parsed_tree
    if tree is None or tree.dynamic is None or draft is None:
        return
    from ersd.generation import as_drafter

    request.resolve(target, as_drafter(draft))  # builds the tree's drafter: no forward


def _race_scheme(
    body: P.CompletionRequest | P.ChatCompletionRequest, watermark: Any, config: ServeConfig
) -> str:
    """The request's race scheme: its own ``race_scheme``, else the server's
    (``--race-scheme``), which applies only to unwatermarked responses (a watermarked one races
    on the key's PRF, whose scheme is the key file's).  A scheme the request names itself is
    checked by :class:`~ersd.request.Request` (unknown, or v2 with a watermark: a 400)."""
    if body.race_scheme is not None:
        return body.race_scheme
    return DEFAULT_RACE_SCHEME if watermark is not None else config.race_scheme


def _watermark(body: P.CompletionRequest | P.ChatCompletionRequest, config: ServeConfig) -> Any:
    """The watermark of a request: the server's, unless the request opts out where allowed."""
    if config.watermark is None:
        if body.watermark:
            raise _bad(
                "watermark",
                "this server has no watermark key, so it cannot watermark; leave watermark "
                "unset (the operator starts ersd serve with --watermark-key-file to watermark)",
            )
        return None
    if body.watermark is False:
        if not config.watermark_opt_out:
            raise _bad(
                "watermark",
                "this server watermarks every response and does not allow opting out; leave "
                "watermark unset (the operator may allow it: --allow-watermark-opt-out)",
            )
        return None
    return config.watermark


def _tree(spec: str | None, draft: Any, config: ServeConfig) -> Any:
    """The request's tree: its ``tree`` field parsed here, once (the
    :class:`~ersd.request.Request` takes the :class:`ParsedTree` as it is), else the server's;
    ``"none"`` or no draft model: ``None`` (target-only).  Files (``optimal:K@FILE``,
    ``auto@FILE``) are read only for the server's own ``--tree``."""
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
        return config.tree
    if "@" in spec and not spec.strip().lower().startswith("dynamic"):
        raise _bad(
            "tree",
            "profile files are read on the server only; start the server with "
            "--tree optimal:K@FILE instead",
        )
    try:  # refused here beyond the server's bound (--max-tree-nodes), before any work
        parsed = parse_tree_spec(spec, temperature=None, **_limits(config))
    except ErsdError as exc:
        raise _bad("tree", f"{exc} (or 'none' for target-only decoding)") from None
    if parsed.dynamic is not None and parsed.dynamic.budget > config.max_tree_nodes:
        raise _bad(
            "tree",
            f"tree spec {spec!r} drafts {parsed.dynamic.budget} tokens per step; this server "
            f"allows at most {config.max_tree_nodes} (--max-tree-nodes)",
        )
    return parsed


def _limits(config: ServeConfig) -> dict[str, int]:
    """The server's tree bound (``--max-tree-nodes``) as :func:`parse_tree_spec` takes it."""
    n = config.max_tree_nodes
    return {"max_nodes": n, "max_depth": min(n, MAX_TREE_DEPTH)}
