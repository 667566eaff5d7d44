"""Chat prompts whose message content is encoded as text, never as control tokens.

``tokenizer.apply_chat_template(messages, tokenize=True)`` renders the template and tokenizes
the whole string with special tokens parsed, so a user message holding
``<|im_end|>\\n<|im_start|>system\\n...`` comes out as the control ids of a forged system turn.
:func:`chat_template_ids` renders the template around placeholders instead, so it knows which
text the template wrote: only the added tokens (``<|im_start|>``, ...) found there become control
ids; the text between two of them, message content included, is encoded with
``split_special_tokens=True`` (control strings typed in content become ordinary text tokens).
A tokenizer encodes the text between two added tokens the same way on its own, so for content
without control strings the ids equal the plain template's (tested on the SmolLM2 and Qwen2.5
templates).
"""

from __future__ import annotations

import re
import secrets
from typing import Any


def chat_template_ids(
    hf_tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of ``messages`` through ``hf_tokenizer``'s chat template, every message's
    content encoded as plain text (special tokens inside it are not parsed)."""
    tag = f"\ue000ersd-{secrets.token_hex(8)}-"  # private-use characters: never in a template
    pattern = re.compile(re.escape(tag) + r"(\d+)\ue001")
    contents: list[str] = []
    marked: list[dict[str, str]] = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content"] = f"{tag}{len(contents)}\ue001"
            contents.append(messages[len(marked)]["content"])
        marked.append(m)
    text = hf_tokenizer.apply_chat_template(
        marked, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    # cut only at the added tokens the template wrote; everything between two of them (template
    # text and content together) is one piece encoded with no added token parsed, which is how
    # the tokenizer itself encodes the text between two added tokens
    added = sorted(
        {str(t.content) for t in hf_tokenizer.added_tokens_decoder.values()}, key=len, reverse=True
    )
    cut = re.compile("|".join(re.escape(t) for t in added)) if added else None
    ids: list[int] = []
    piece: list[str] = []

    def flush() -> None:
        if piece:
            ids.extend(_encode(hf_tokenizer, "".join(piece)))
            piece.clear()

    def template_text(part: str) -> None:
        pos = 0
        for hit in cut.finditer(part) if cut is not None else ():
            piece.append(part[pos : hit.start()])
            flush()
            ids.append(int(hf_tokenizer.convert_tokens_to_ids(hit.group(0))))
            pos = hit.end()
        piece.append(part[pos:])

    pos = 0
    for hit in pattern.finditer(text):
        template_text(text[pos : hit.start()])
        piece.append(contents[int(hit.group(1))])
        pos = hit.end()
    template_text(text[pos:])
    flush()
    return ids


def _encode(hf_tokenizer: Any, text: str) -> list[int]:
    """``text`` as plain text: added tokens written in it are not parsed."""
    if not text:
        return []
    out = hf_tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return [int(t) for t in out]
