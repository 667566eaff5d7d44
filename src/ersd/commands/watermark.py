"""``ersd watermark keygen|detect`` and ``ersd audit``: the watermark's key files, the model-free
detector and the transcript audit (docs/watermark.md)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ersd.commands._loading import ModelArgs, load_pair, model_options


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group()
def watermark() -> None:
    """Watermark key files and detection (docs/watermark.md)."""


@watermark.command()
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True, help="Key file.")
@click.option(
    "--scheme",
    type=click.Choice(["ersd-v1", "vllm-philox"]),
    default="ersd-v1",
    show_default=True,
    help="ersd-v1: 256-bit key, keyed BLAKE2b; vllm-philox: vLLM's 64-bit Philox key.",
)
@click.option("--context-width", type=int, default=4, show_default=True)
@click.option("--num-salts", type=int, default=None, help="[default: 8; 1 for vllm-philox]")
@click.option("--tokenizer", default=None, help="Name the tokenizer the key is for (optional).")
def keygen(
    out: str, scheme: str, context_width: int, num_salts: int | None, tokenizer: str | None
) -> None:
    """Write a new random watermark key to a private file (mode 600, never overwritten)."""
    from ersd.errors import ErsdError
    from ersd.watermark import write_key_file

    try:
        wm = write_key_file(
            out,
            scheme=scheme,
            context_width=context_width,
            num_salts=num_salts,
            tokenizer=tokenizer,
        )
    except ErsdError as exc:
        raise _fail(exc) from None
    click.echo(f"wrote {out}: {wm!r}")


def _read_text(source: str) -> str:
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise click.ClickException(f"cannot read {source}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise click.ClickException(
            f"{'standard input' if source == '-' else source} is not UTF-8 text"
        ) from None


@watermark.command()
@click.argument("source", default="-", required=False)
@click.option("--key-file", type=click.Path(), required=True, help="The watermark key file.")
@click.option("--tokenizer", required=True, help="Tokenizer: a bundled model name, folder or id.")
@click.option("--context-width", type=int, default=None, help="Override the key file's width.")
@click.option("--salt", type=int, default=None, help="The sample's salt, if known.")
@click.option("--threshold", type=float, default=0.01, show_default=True, help="p-value cut.")
@click.option("--ids", is_flag=True, help="SOURCE holds token ids (JSON list), not text.")
@click.option("--per-token", is_flag=True, help="With --json: each scored token's score.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def detect(
    source: str,
    key_file: str,
    tokenizer: str,
    context_width: int | None,
    salt: int | None,
    threshold: float,
    ids: bool,
    per_token: bool,
    as_json: bool,
) -> None:
    """Is SOURCE (a file of generated text, or - for stdin) watermarked with this key?

    Give only the generated text (the detector keys each token by the tokens before it within
    the text). Exit status 0 either way; the verdict is in the output."""
    from ersd.errors import ErsdError
    from ersd.models.hf_load import load_tokenizer
    from ersd.watermark import detect as run_detect
    from ersd.watermark import load_watermark
    from ersd.watermark.detect import encode_text

    try:
        wm = load_watermark(key_file, context_width=context_width)
        if wm.tokenizer is not None and wm.tokenizer != tokenizer:
            raise click.ClickException(
                f"the key file is for tokenizer {wm.tokenizer!r}, not {tokenizer!r}: text "
                "tokenized otherwise has other windows and never matches; pass --tokenizer "
                f"{wm.tokenizer}"
            )
        tok = load_tokenizer(tokenizer)
        raw = _read_text(source)
        if ids:
            try:
                token_ids = json.loads(raw)
            except json.JSONDecodeError:
                raise click.ClickException(
                    "--ids: SOURCE must be a JSON list of token ids"
                ) from None
        else:
            token_ids = encode_text(tok, raw)
        res = run_detect(
            token_ids,
            wm,
            salt=salt,
            threshold=threshold,
            vocab_size=len(tok),
            per_token=per_token,
        )
    except ErsdError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(res.as_dict()))
        return
    verdict = "WATERMARKED" if res.watermarked else "not watermarked"
    click.echo(
        f"{verdict} (p = {res.p_value:.3g} at threshold {threshold:g}; score {res.score:.2f} "
        f"over {res.scored} scored tokens, {res.skipped} repeated windows skipped; best salt "
        f"{res.salt} of {res.salts_tried} tried)"
    )


@click.command()
@model_options(dtype="float32")
@click.option("--prompt", required=True, help="The prompt the text answered.")
@click.option("--text", default=None, help="The generated text (or --text-file).")
@click.option("--text-file", type=click.Path(), default=None, help="File with the text.")
@click.option("--chat", is_flag=True, help="The prompt was wrapped in the chat template.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--watermark-key-file", type=click.Path(), default=None)
@click.option("--watermark-context", type=int, default=None)
@click.option("--tie-tolerance", type=float, default=None, help="[default: 1e-3 in float32]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit(
    models: ModelArgs,
    prompt: str,
    text: str | None,
    text_file: str | None,
    chat: bool,
    seed: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    watermark_key_file: str | None,
    watermark_context: int | None,
    tie_tolerance: float | None,
    as_json: bool,
) -> None:
    """Check that TEXT is exactly what the target samples after PROMPT with this seed (and key):
    one forward re-derives every race; prints the first token that is not its race's winner.

    Exit status 1 when a token is not its race winner (beyond a near tie)."""
    from ersd.commands.generate import _encode
    from ersd.errors import ErsdError
    from ersd.watermark import audit as run_audit
    from ersd.watermark import load_watermark
    from ersd.watermark.audit import DEFAULT_TIE_TOLERANCE
    from ersd.watermark.detect import encode_text

    if (text is None) == (text_file is None):
        raise click.UsageError("give the generated text as --text or --text-file (one of them)")
    body = text if text is not None else _read_text(str(text_file))
    try:
        wm = (
            load_watermark(watermark_key_file, context_width=watermark_context)
            if watermark_key_file
            else None
        )
        if watermark_context is not None and wm is None:
            raise click.UsageError("--watermark-context goes with --watermark-key-file")
        pair = load_pair(ModelArgs(**{**models.__dict__, "draft": "none"}))
        tmodel = pair.target
        prompt_ids = _encode(tmodel.tokenizer, prompt, chat)
        text_ids = encode_text(tmodel.tokenizer, body)
        tol = tie_tolerance
        if tol is None:
            tol = DEFAULT_TIE_TOLERANCE if pair.dtype in ("float32", "gguf") else 0.05
        rep = run_audit(
            tmodel,
            prompt_ids,
            text_ids,
            seed=seed,
            watermark=wm,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            tie_tolerance=tol,
        )
    except ErsdError as exc:
        raise _fail(exc) from None
    out: dict[str, Any] = rep.as_dict()
    if as_json:
        click.echo(json.dumps(out))
    elif rep.verified:
        click.echo(
            f"verified: all {out['tokens']} tokens are their race's winners"
            + (f" (near ties at {rep.near_ties})" if rep.near_ties else "")
        )
    else:
        p = rep.positions[rep.first_forgery or 0]
        click.echo(
            f"NOT verified: token {p.index} is {p.token}, the race's winner was {p.winner} "
            f"(margin {p.margin:.3g}); mismatches at {rep.mismatches}"
        )
    if not rep.verified:
        sys.exit(1)
