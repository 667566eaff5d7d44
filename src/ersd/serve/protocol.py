"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Standard fields follow the OpenAI API; ERSD's own knobs are extra body fields (``method``,
``tree``, ``top_k``, ``min_p``, ``race_scheme``; with the ``openai`` client pass them in
``extra_body``).
Types are strict (a number is a JSON number: ``"temperature": "0.7"`` or ``true`` is a 400, not
coerced). Fields OpenAI defines but ERSD does not implement are accepted only at their neutral
value, so a request never silently means something else. Responses carry the usual ``usage`` and an
``ersd`` extension with the speculation statistics (and, on a watermarking server, the watermark's
scheme, key fingerprint and each choice's salt -- never the key). ``POST /v1/watermark/detect``
takes a :class:`DetectRequest` and answers a :class:`Detection`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

#: most stop strings one request may give
MAX_STOP = 16
#: most choices (``n``) one request may ask for
MAX_N = 16


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Request(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0.0)
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    seed: StrictInt | None = None  # its range: ersd.validation.check_seed, as everywhere
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    user: str | None = None
    # ERSD's extra body fields
    method: str | None = None
    tree: str | None = None
    top_k: StrictInt | None = Field(default=None, ge=1)
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    #: False: no watermark on this response (only where the operator allows opting out)
    watermark: StrictBool | None = None
    #: how the races are drawn (docs/race-schemes.md): "v1" or "v2"; None: the server's
    #: ``--race-scheme``.  A watermarked response races on the key's PRF (v2 is refused there)
    race_scheme: str | None = None
    # OpenAI fields accepted only at their neutral value (see unsupported())
    frequency_penalty: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    logit_bias: dict[str, StrictFloat] | None = None
    logprobs: Any = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else list(v)
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def stops(self) -> list[str]:
        return list(self.stop or [])

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) of the first field set to a value ERSD does not implement."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name, f"{name} is not supported by ersd serve; leave it unset or 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by ersd serve; leave it unset"
        if self.logprobs not in (None, False, 0):
            return "logprobs", "logprobs are not supported by ersd serve; leave it unset"
        return None


class CompletionRequest(_Request):
    """``POST /v1/completions``: one prompt (a string, or a list of token ids)."""

    prompt: str | list[str] | list[StrictInt]
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.echo:
            return "echo", "echo is not supported by ersd serve; leave it unset or false"
        if self.suffix:
            return "suffix", "suffix is not supported by ersd serve; leave it unset"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of is not supported by ersd serve; use n instead"
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text (content parts of type ``text`` joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``: messages rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)


# --- responses -------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChoiceStats(BaseModel):
    """Speculation statistics of one choice (the ``ersd`` extension)."""

    index: int
    seed: int
    finish_reason: str  # ERSD's: eos, length, context, stop
    num_tokens: int
    target_calls: int
    num_draft_tokens: int
    num_accepted_tokens: int
    block_efficiency: float
    acceptance_rate: float
    #: the choice's watermark salt (None: not watermarked); detect with it for an exact p-value
    salt: int | None = None


class WatermarkInfo(BaseModel):
    """How a response was watermarked (the key itself is never sent)."""

    scheme: str
    key_fingerprint: str
    context_width: int
    num_salts: int


class ErsdInfo(BaseModel):
    """The ``ersd`` extension field: settings used and speculation statistics."""

    method: str
    tree: str | None
    #: the race scheme the choices were drawn with (a text reproduces only under its own)
    race_scheme: str
    target_calls: int
    num_draft_tokens: int
    num_accepted_tokens: int
    block_efficiency: float  # tokens per target call, over all choices
    acceptance_rate: float
    latency: float  # seconds from arrival to the last choice's end
    choices: list[ChoiceStats]
    #: set when the response is watermarked (docs/watermark.md#serving)
    watermark: WatermarkInfo | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    ersd: ErsdInfo | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    ersd: ErsdInfo | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    ersd: ErsdInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ersd"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class DetectRequest(BaseModel):
    """``POST /v1/watermark/detect``: a generated text, or its token ids, to score.

    ``model``: ``true`` (or the served model's name) weights each token by the served target's
    probability of it -- the model-weighted detector (docs/watermark-detection.md), with the
    verdict *not enough signal* for a text too short or too predictable to tell; ``prompt`` or
    ``messages``: what the text answered (a completions prompt, or chat messages rendered with
    the chat template), when known; ``temperature``: the generation's (with ``model``)."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    token_ids: list[StrictInt] | None = None
    #: the sample's salt when known (a response's ``ersd.choices[i].salt``): no correction
    salt: StrictInt | None = Field(default=None, ge=0)
    model: StrictBool | str | None = None
    prompt: str | list[StrictInt] | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    temperature: StrictFloat | None = Field(default=None, gt=0.0)

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool | str):
            return v
        raise ValueError(
            "model must be true (weight by the served model), false, or the served model's name"
        )

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, list) and all(type(t) is int for t in v):
            return v
        raise ValueError("prompt must be a string, or a list of token ids")

    def source(self) -> tuple[str, str | list[int]]:
        """``("text", str)`` or ``("token_ids", ids)``; raises ValueError unless exactly one."""
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("give exactly one of text and token_ids")
        if self.text is not None:
            return "text", self.text
        assert self.token_ids is not None
        return "token_ids", self.token_ids


class Detection(BaseModel):
    """The detector's answer (:func:`ersd.watermark.detect`, or with ``model``
    :func:`ersd.watermark.weighted.detect_with_model`)."""

    object: Literal["watermark.detection"] = "watermark.detection"
    #: "model-free", or "model-weighted" (the request's ``model``)
    detector: Literal["model-free", "model-weighted"] = "model-free"
    #: "watermarked", "not watermarked", or (model-weighted) "not enough signal": the text could
    #: not have been told apart even had it been watermarked (expected power below 0.9)
    verdict: str
    watermarked: bool  # p_value <= threshold
    p_value: float
    threshold: float
    score: float
    num_tokens: int
    num_scored_tokens: int
    num_skipped_tokens: int  # repeated windows, not scored
    salt: int
    salts_tried: int
    watermark: WatermarkInfo
    #: model-weighted only: positions with a weight kept, the chance this text would have been
    #: detected had it been watermarked, the temperature of the weights, and the model-free
    #: detector's p-value on the same tokens
    num_weighted_tokens: int | None = None
    expected_power: float | None = None
    temperature: float | None = None
    model_free_p_value: float | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
