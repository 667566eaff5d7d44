"""``ersd generate --prompts-file FILE.jsonl``: many prompts through the batched engine.

Each line of the file is a JSON object with ``"prompt"`` (a string) or ``"messages"`` (a chat:
a list of ``{"role", "content"}``, encoded with the model's chat template), and optionally
``"seed"`` and ``"max_new_tokens"``; other fields are ignored.  A line without ``"seed"`` gets
``ersd.derive_seed(--seed, index)`` (index: the prompt's 0-based position among the file's
prompts), like :func:`ersd.generate_batch` with one seed.  Lines with different
``max_new_tokens`` run as separate batches, one per value (in order of first appearance).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ersd.errors import ErsdError, InputFileError

if TYPE_CHECKING:
    from ersd.request import Request

_EXAMPLE = 'e.g. {"prompt": "def add(a, b):", "seed": 1}'


@dataclass(frozen=True)
class PromptLine:
    """One prompt of the file."""

    index: int  # position among the file's prompts (0-based)
    line: int  # line number in the file (1-based)
    prompt: str | None
    messages: list[dict[str, str]] | None
    seed: int | None
    max_new_tokens: int | None

    def source(self) -> dict[str, Any]:
        """The prompt as the input gave it, for the output object."""
        if self.messages is not None:
            return {"messages": self.messages}
        return {"prompt": self.prompt}


def read_prompts(path: str) -> list[PromptLine]:
    """The prompts of a JSON Lines file; :class:`InputFileError` names the file, the line and
    the fix for a missing or empty file and for every malformed line."""
    p = Path(path)
    if not p.exists():
        raise InputFileError(
            f"--prompts-file {path} does not exist; give a JSON Lines file with one object per "
            f"line, {_EXAMPLE}"
        )
    if p.is_dir():
        raise InputFileError(f"--prompts-file {path} is a directory; give a .jsonl file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"--prompts-file {path} cannot be read ({exc})") from None
    out: list[PromptLine] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            out.append(_parse_line(path, number, raw, len(out)))
    if not out:
        raise InputFileError(
            f"--prompts-file {path} has no prompts (it is empty or blank); write one JSON object "
            f"per line, {_EXAMPLE}"
        )
    return out


def _parse_line(path: str, number: int, raw: str, index: int) -> PromptLine:
    where = f"{path} line {number}"
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            f"{where} is not JSON ({exc.msg}); each line must be one JSON object, {_EXAMPLE}"
        ) from None
    if not isinstance(row, dict):
        raise InputFileError(f"{where} is a JSON {type(row).__name__}, not an object; {_EXAMPLE}")
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is not None and messages is not None:
        raise InputFileError(f'{where} has both "prompt" and "messages"; keep one of them')
    if prompt is None and messages is None:
        raise InputFileError(
            f'{where} has no "prompt" (a string) or "messages" (a list of {{"role", "content"}}); '
            f"{_EXAMPLE}"
        )
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise InputFileError(f'{where}: "prompt" must be a non-empty string, got {prompt!r}')
    if messages is not None and not _is_chat(messages):
        raise InputFileError(
            f'{where}: "messages" must be a non-empty list of objects with string "role" and '
            '"content", e.g. [{"role": "user", "content": "Hi"}]'
        )
    seed, limit = row.get("seed"), row.get("max_new_tokens")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**64):
        raise InputFileError(f'{where}: "seed" must be an integer in [0, 2**64), got {seed!r}')
    if limit is not None and not (_is_int(limit) and limit >= 1):
        raise InputFileError(f'{where}: "max_new_tokens" must be an integer >= 1, got {limit!r}')
    return PromptLine(index, number, prompt, messages, seed, limit)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_chat(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def encode(tokenizer: Any, line: PromptLine, chat: bool, path: str = "") -> list[int]:
    """The line's token ids (chat template for ``messages``, or for ``prompt`` with ``chat``)."""
    try:
        if line.messages is not None:
            return [int(t) for t in tokenizer.apply_chat_template(line.messages)]
        assert line.prompt is not None
        if chat:
            msgs = [{"role": "user", "content": line.prompt}]
            return [int(t) for t in tokenizer.apply_chat_template(msgs)]
        return [int(t) for t in tokenizer.encode(line.prompt)]
    except ErsdError as exc:
        raise InputFileError(f"{path} line {line.line}: {exc}") from None


def line_requests(
    template: Request,
    lines: list[PromptLine],
    target: Any,
    drafter: Any,
    *,
    chat: bool,
    path: str,
) -> list[Request]:
    """One request per line: ``template`` with the line's ids, its seed (else
    ``derive_seed(template.seed, index)``) and its ``max_new_tokens`` (else the template's),
    every one checked against the models before anything runs; errors name the line."""
    from ersd.batch import derive_seed

    requests: list[Request] = []
    for ln in lines:
        ids = encode(target.tokenizer, ln, chat, path)  # its errors name the line already
        try:
            req = replace(
                template,
                prompt=ids,
                seed=ln.seed if ln.seed is not None else derive_seed(template.seed, ln.index),
                max_new_tokens=ln.max_new_tokens or template.max_new_tokens,
            )
            req.check_models(target, drafter)
        except ErsdError as exc:
            raise type(exc)(f"{path} line {ln.line}: {exc}", param=exc.param) from None
        requests.append(req)
    return requests


def run_prompts_file(
    pair: Any,
    lines: list[PromptLine],
    template: Request,
    *,
    path: str,
    chat: bool,
    batch_size: int,
    as_json: bool,
    out: str | None,
    progress: bool,
    log: Callable[[str], None],
) -> None:
    """Generate for every line and print/write the results in input order as each is ready.
    ``template``: the command's :class:`ersd.request.Request`, whose ``seed`` and
    ``max_new_tokens`` are the lines' defaults; each line's request is it with the line's ids,
    seed and length, every one checked against the models before anything runs."""
    from tqdm import tqdm

    from ersd.batch import run_requests
    from ersd.generation import as_drafter, generate_request

    tmodel = pair.target
    drafter = as_drafter(pair.draft)
    requests = line_requests(template, lines, tmodel, drafter, chat=chat, path=path)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, req in enumerate(requests):
        groups[req.max_new_tokens].append(i)
    # warm-up: first forwards pay one-time costs (kernels, allocator); keep them out of timings
    generate_request(tmodel, drafter, replace(requests[0], max_new_tokens=2))
    sink: IO[str] | None = None
    if out:
        try:
            sink = open(out, "w", encoding="utf-8")  # noqa: SIM115 (closed in the finally below)
        except OSError as exc:
            raise InputFileError(f"--out {out}: cannot write it ({exc.strerror})") from None
    printer = _InOrder(lines, [r.seed for r in requests], tmodel.tokenizer, as_json, sink)
    t0 = time.perf_counter()
    try:
        with tqdm(
            total=len(lines), desc="prompts", unit="prompt", file=sys.stderr, disable=not progress
        ) as bar:
            for members in groups.values():  # one batch per max_new_tokens, in order
                group = [requests[i] for i in members]
                for j, _, res in run_requests(tmodel, drafter, group, batch_size):
                    if res is not None:  # a row's time: the sum of its steps'
                        printer.done(
                            members[j],
                            replace(res, wall_time=sum(r.total_time for r in res.steps)),
                        )
                        bar.update()
    finally:
        if sink is not None:
            sink.close()
    wall = time.perf_counter() - t0
    tokens = printer.tokens
    drafted = f" {template.tree}" if drafter is not None else ", target-only"
    log(
        f"\n--- {len(lines)} prompts, {tokens} tokens in {wall:.1f}s: {tokens / wall:.2f} "
        f"tokens/s (batch size {batch_size}, {template.verification.name}{drafted}) ---"
    )
    if out:
        log(f"[wrote {len(lines)} JSON lines to {out}]")


class _InOrder:
    """Prints (or writes) results in input order: result ``i`` goes out once 0..i-1 have."""

    def __init__(
        self, lines: list[PromptLine], seeds: list[int], tokenizer: Any, as_json: bool, sink: Any
    ) -> None:
        self.lines, self.seeds, self.tokenizer = lines, seeds, tokenizer
        self.as_json, self.sink = as_json, sink
        self.ready: dict[int, Any] = {}
        self.next = 0
        self.tokens = 0

    def done(self, index: int, res: Any) -> None:
        self.ready[index] = res
        while self.next in self.ready:
            self._emit(self.next, self.ready.pop(self.next))
            self.next += 1

    def _emit(self, i: int, res: Any) -> None:
        import click

        self.tokens += len(res.tokens)
        line = self.lines[i]
        text = self.tokenizer.decode(res.tokens, skip_special_tokens=True)
        if self.as_json:
            obj = {"index": i, **line.source(), "seed": self.seeds[i], "text": text}
            obj.update(res.stats(), tokens=res.tokens)
            if self.sink is not None:
                self.sink.write(json.dumps(obj) + "\n")
                self.sink.flush()
            else:
                click.echo(json.dumps(obj))
            return
        click.echo(f"=== prompt {i} (line {line.line}, seed {self.seeds[i]}) ===")
        click.echo(text)
        click.echo(
            f"--- {len(res.tokens)} tokens, {res.target_calls} target calls, block efficiency "
            f"{res.block_efficiency:.2f}, acceptance rate {res.acceptance_rate:.2f}, "
            f"{res.tokens_per_second:.2f} tokens/s, finish {res.finish_reason}\n"
        )
