"""Text in and out of the server: prompt encoding (plain and chat) and streamed decoding with
stop strings.

Prompt encoding is exactly the one of ``ersd generate`` (plain: ``tokenizer.encode(text)``;
chat: the model's chat template with the generation prompt appended), so a request and the CLI
with the same settings see the same token ids.  :func:`chat_ids` is the one place that talks to
the tokenizer's chat API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ersd.errors import ErsdError
from ersd.serve.requests import ApiError


class NoChatTemplateError(ErsdError):
    """The served model's tokenizer has no chat template."""


def check_text(param: str, text: str) -> str:
    """``text`` if it can be encoded as UTF-8; a lone surrogate (``"\\ud800"`` in JSON) is
    refused with HTTP 400 naming the field and the position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            f"{param}: character {exc.start} is a lone UTF-16 surrogate "
            f"({text[exc.start]!r}), which is not text; send valid Unicode (a surrogate pair "
            "must be complete)",
            param=param,
        ) from None
    return text


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a plain (completions) prompt, as ``ersd generate`` encodes it."""
    return [int(t) for t in tokenizer.encode(text)]


def chat_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a chat, through the model's chat template with the generation prompt.

    Works with a transformers tokenizer (``tokenize=True``; it may return a mapping) and with an
    :class:`ersd.Tokenizer`-protocol object whose ``apply_chat_template`` returns ids.
    """
    if hasattr(tokenizer, "chat_template") and not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplateError(
            "the served model's tokenizer has no chat template; use /v1/completions with a plain "
            "prompt, or serve a chat model"
        )
    msgs = [dict(m) for m in messages]
    if hasattr(tokenizer, "chat_template"):  # transformers: content encoded as text
        from ersd.models.chat import chat_template_ids

        out: Any = chat_template_ids(tokenizer, msgs, add_generation_prompt=True)
    else:  # ersd's HFTokenizer encodes content as text itself (ersd.models.chat)
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(t) for t in out]


def decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    """Text of generated tokens, special tokens (EOS) left out, as ``ersd generate`` prints it."""
    return str(tokenizer.decode(list(tokens), skip_special_tokens=True))


class TextStream:
    """One choice's text as its tokens arrive: cut at the first stop string, streamed safely.

    :meth:`add` returns the new text that may be sent now: never a partial UTF-8 character
    (trailing U+FFFD) and never text that could still turn out to start a stop string, so a
    stream never emits past a stop.  ``text`` is the full text so far (cut at the stop once one
    is found, ``stopped`` then True); the concatenated deltas of :meth:`add` and :meth:`flush`
    equal the final ``text``.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0  # characters of ``text`` already handed out
        self.stopped = False

    def add(self, tokens: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self.tokens.extend(int(t) for t in tokens)
        text = decode(self.tokenizer, self.tokens)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[: max(cut, self.sent)], True
            return self.flush()
        self.text = text
        end = len(text.rstrip("\ufffd"))
        hold = 0  # a tail that may be the start of a stop string waits for more text
        for s in self.stop:
            for k in range(min(len(s) - 1, end), 0, -1):
                if text.endswith(s[:k], 0, end):
                    hold = max(hold, k)
                    break
        return self._emit(end - hold)

    def flush(self) -> str:
        """Everything not sent yet (the choice is finished)."""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        delta = self.text[self.sent : upto]
        self.sent = upto
        return delta
