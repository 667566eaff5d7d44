"""Benchmark prompts shipped in ``ersd/data`` (provenance and licences in its PROVENANCE.md).

Each set has an evaluation split (``*_eval.jsonl``) and a disjoint calibration split
(``*_calib.jsonl``) used only to measure rank profiles and forward costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from ersd.bench.config import PROMPT_SETS, BenchConfigError
from ersd.errors import ErsdError

if TYPE_CHECKING:
    from ersd.models.base import Tokenizer

_FILES = {"humaneval": "humaneval", "mtbench": "mtbench", "math": "math", "grounded": "grounded"}


@dataclass(frozen=True)
class Prompt:
    id: str
    set: str
    domain: str  # code, chat, math
    split: str  # eval or calib
    text: str


def load_prompts(sets: list[str], split: str, count: int, file: str = "") -> list[Prompt]:
    """The first ``count`` prompts of each set's ``split`` ("eval" or "calib"), then those of a
    user's prompt ``file`` (all of them; used for calibration only when no set is given)."""
    if split not in ("eval", "calib"):
        raise BenchConfigError(f"prompt split must be 'eval' or 'calib', got {split!r}")
    out: list[Prompt] = []
    for name in sets:
        if name not in PROMPT_SETS:
            raise BenchConfigError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
        path = resources.files("ersd") / "data" / f"{_FILES[name]}_{split}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows[:count]:
            out.append(Prompt(row["id"], name, row["domain"], row["split"], row["prompt"]))
    if file and (split == "eval" or not sets):
        from ersd.bench.drafters import load_prompt_file

        for row in load_prompt_file(file)[: None if split == "eval" else count]:
            out.append(Prompt(row["id"], "file", row["domain"], split, row["prompt"]))
    return out


def encode_prompt(
    tokenizer: Tokenizer, prompt: Prompt, template: str, max_tokens: int
) -> list[int]:
    """Token ids of a prompt: code raw (completion), chat and math through the chat template
    when the tokenizer has one (``template = "auto"``); the last ``max_tokens`` are kept."""
    use_chat = template == "chat" or (template == "auto" and prompt.domain != "code")
    ids: list[int] | None = None
    if use_chat:
        try:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
        except ErsdError:  # no chat template: the plain text
            ids = None
    if ids is None:
        ids = tokenizer.encode(prompt.text)
    return [int(t) for t in ids][-max_tokens:]
