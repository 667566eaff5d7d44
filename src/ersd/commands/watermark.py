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
@click.option(
    "--num-salts",
    type=int,
    default=None,
    help="Distinct texts per prompt (the detector tries each) [default: 256; 1 for vllm-philox].",
)
@click.option(
    "--version",
    "version",
    type=click.IntRange(1, 2),
    default=None,
    help="Windows: 2 = with the prompt's last tokens, 1 = generated tokens only (the first "
    "releases') [default: 2; 1 for vllm-philox].",
)
@click.option("--tokenizer", default=None, help="Name the tokenizer the key is for (optional).")
def keygen(
    out: str,
    scheme: str,
    context_width: int,
    num_salts: int | None,
    version: int | None,
    tokenizer: str | None,
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
            version=version,
        )
    except ErsdError as exc:
        raise _fail(exc) from None
    click.echo(f"wrote {out}: {wm!r}")


#: the detector's and the audit's inputs are texts: a larger one is refused, not read
MAX_INPUT_BYTES = 16 * 1024 * 1024


def _read_text(source: str, what: str = "the text") -> str:
    """SOURCE (a file or ``-``) as UTF-8, read with a size bound (``/dev/zero`` stops at once)."""
    from ersd.errors import ErsdError
    from ersd.watermark.settings import read_bounded

    name = "standard input" if source == "-" else source
    try:
        data = read_bounded(source, MAX_INPUT_BYTES, what)
    except ErsdError as exc:
        raise _fail(exc) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise click.ClickException(f"{name} is not UTF-8 text") from None


def _read_ids(source: str) -> list[int]:
    """Token ids from SOURCE: a JSON list, or ``ersd generate --json``'s object (its
    ``tokens``); anything else is a one-line error."""
    from ersd.errors import ErsdError
    from ersd.validation import check_token_ids
    from ersd.watermark.settings import parse_json

    try:
        value = parse_json(_read_text(source, "the ids file"), "--ids: SOURCE")
        if isinstance(value, dict) and "tokens" in value:
            value = value["tokens"]
        if not isinstance(value, list):
            raise click.ClickException(
                "--ids: SOURCE must be a JSON list of token ids (or `ersd generate --json`'s "
                f"output, whose 'tokens' it reads), got a JSON {type(value).__name__}"
            )
        return check_token_ids(value, None, name="--ids")
    except ErsdError as exc:
        raise _fail(exc) from None


@watermark.command()
@click.argument("source", default="-", required=False)
@click.option("--key-file", type=click.Path(), required=True, help="The watermark key file.")
@click.option("--tokenizer", required=True, help="Tokenizer: a bundled model name, folder or id.")
@click.option("--context-width", type=int, default=None, help="Override the key file's width.")
@click.option("--salt", type=int, default=None, help="The sample's salt, if known.")
@click.option("--threshold", type=float, default=0.01, show_default=True, help="p-value cut.")
@click.option(
    "--ids",
    is_flag=True,
    help="SOURCE holds token ids: a JSON list, or `ersd generate --json`'s output.",
)
@click.option(
    "--prompt",
    default=None,
    help="The prompt the text answered: a version-2 key then scores the opening tokens too.",
)
@click.option("--chat", is_flag=True, help="With --prompt: it was wrapped in the chat template.")
@click.option("--per-token", is_flag=True, help="With --json: each scored token's score.")
@click.option(
    "--model",
    "model_name",
    default=None,
    help="Weight each token by this model's probability of it (same tokenizer; the target is "
    "best): the model-weighted detector, with an exact p-value and 'not enough signal' for "
    "low-entropy text (docs/watermark-detection.md).",
)
@click.option(
    "--temperature",
    type=float,
    default=1.0,
    show_default=True,
    help="With --model: the generation's temperature, when known.",
)
@click.option(
    "--spans",
    is_flag=True,
    help="Scan windows for the spans that carry the mark (mixed documents); prints the text "
    "with them in [[ ]] (docs/watermark-detection.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def detect(
    source: str,
    key_file: str,
    tokenizer: str,
    context_width: int | None,
    salt: int | None,
    threshold: float,
    ids: bool,
    prompt: str | None,
    chat: bool,
    per_token: bool,
    model_name: str | None,
    temperature: float,
    spans: bool,
    as_json: bool,
) -> None:
    """Is SOURCE (a file of generated text, or - for stdin) watermarked with this key?

    Give only the generated text (the detector keys each token by the tokens before it within
    the text; with a version-2 key and without --prompt the first context-width tokens are not
    scored). Exit status 0 either way; the verdict is in the output."""
    from ersd.commands.generate import _encode
    from ersd.errors import ErsdError
    from ersd.models.hf_load import load_tokenizer
    from ersd.watermark import detect as run_detect
    from ersd.watermark import load_watermark
    from ersd.watermark.detect import encode_text
    from ersd.watermark.settings import check_tokenizer

    if chat and prompt is None:
        raise click.UsageError("--chat goes with --prompt")
    if spans and model_name is not None:
        raise click.UsageError("--spans scans with the model-free score: drop --model")
    try:
        wm = load_watermark(key_file, context_width=context_width)
        # the input first: a bad one is refused before the tokenizer loads
        token_ids: list[int] | str = _read_ids(source) if ids else _read_text(source)
        tok = load_tokenizer(tokenizer)
        check_tokenizer(wm, tok, tokenizer)
        if isinstance(token_ids, str):
            token_ids = encode_text(tok, token_ids)
        prompt_ids = None
        if prompt is not None:
            from ersd.models.hf import HFTokenizer

            prompt_ids = _encode(HFTokenizer(tok), prompt, chat)
        if spans or model_name is not None:
            _detect_more(
                token_ids, wm, tok, salt, threshold, prompt_ids, model_name, temperature, as_json
            )
            return
        res = run_detect(
            token_ids,
            wm,
            salt=salt,
            threshold=threshold,
            vocab_size=len(tok),
            per_token=per_token,
            prompt=prompt_ids,
        )
    except ErsdError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(res.as_dict()))
        return
    verdict = "WATERMARKED" if res.watermarked else "not watermarked"
    click.echo(
        f"{verdict} (p = {res.p_value:.3g} at threshold {threshold:g}; score {res.score:.2f} "
        f"over {res.scored} scored tokens, {res.skipped} repeated windows skipped"
        + (f", the first {res.opening} unscored (no --prompt)" if res.opening else "")
        + f"; best salt {res.salt} of {res.salts_tried} tried)"
    )


def _detect_more(
    token_ids: list[int],
    wm: Any,
    tok: Any,
    salt: int | None,
    threshold: float,
    prompt_ids: list[int] | None,
    model_name: str | None,
    temperature: float,
    as_json: bool,
) -> None:
    """``detect --model`` (model-weighted) or ``detect --spans`` (localized)."""
    if model_name is None:
        from ersd.models.hf import HFTokenizer
        from ersd.watermark.localize import highlight, scan

        hf = HFTokenizer(tok)
        loc = scan(
            token_ids, wm, salt=salt, threshold=threshold, vocab_size=len(tok),
            prompt=prompt_ids, tokenizer=hf,
        )  # fmt: skip
        if as_json:
            click.echo(json.dumps(loc.as_dict()))
            return
        verdict = "WATERMARKED SPANS" if loc.watermarked else "no marked span"
        click.echo(
            f"{verdict} (p = {loc.p_value:.3g} at threshold {threshold:g}, corrected for "
            f"{loc.windows} windows and {loc.salts_tried} salts; {len(loc.spans)} span(s))"
        )
        if loc.spans:
            click.echo(highlight(hf.decode(token_ids), loc.spans))
        return
    from ersd.models.loading import load_model
    from ersd.watermark.weighted import detect_with_model

    model = load_model(model_name, dtype="float32")
    if model.vocab_size < len(tok):
        raise click.ClickException(
            f"--model {model_name} has {model.vocab_size} token ids, the tokenizer {len(tok)}: "
            "use a model with the key's tokenizer"
        )
    res = detect_with_model(
        token_ids, wm, model, temperature=temperature, prompt=prompt_ids, salt=salt,
        threshold=threshold, vocab_size=len(tok),
    )  # fmt: skip
    if as_json:
        click.echo(json.dumps(res.as_dict()))
        return
    click.echo(
        f"{res.verdict.upper() if res.watermarked else res.verdict} (p = {res.p_value:.3g} at "
        f"threshold {threshold:g}, model-weighted by {model_name} at T = {temperature:g}; "
        f"{res.weighted} of {res.scored} scored tokens weighted; expected power "
        f"{res.expected_power:.2f}; best salt {res.salt} of {res.salts_tried} tried)"
    )


@click.command()
@model_options(dtype="float32")
@click.option("--prompt", required=True, help="The prompt the text answered.")
@click.option("--text", default=None, help="The generated text (or --text-file).")
@click.option("--text-file", type=click.Path(), default=None, help="File with the text.")
@click.option(
    "--ids",
    "ids_file",
    type=click.Path(allow_dash=True),
    default=None,
    help="File (or -) with the generated token ids: a JSON list or `ersd generate --json`'s "
    "output. Audits the ids themselves: no re-tokenization.",
)
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
    ids_file: str | None,
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

    Exit status 0: verified; 1: a token is not its race's winner (beyond a near tie) and its
    characters differ from the winner's -- not what this run wrote; 3: the text re-tokenizes to
    other ids than were generated and the audit cannot tell which (audit the ids with --ids)."""
    from ersd.commands.generate import _encode
    from ersd.errors import ErsdError
    from ersd.watermark import audit as run_audit
    from ersd.watermark import load_watermark
    from ersd.watermark.audit import DEFAULT_TIE_TOLERANCE, audit_text
    from ersd.watermark.settings import check_tokenizer

    if sum(x is not None for x in (text, text_file, ids_file)) != 1:
        raise click.UsageError(
            "give the generated text as --text or --text-file, or its ids as --ids (one of them)"
        )
    body = text if text is not None or text_file is None else _read_text(str(text_file))
    text_ids = _read_ids(ids_file) if ids_file is not None else None
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
        if wm is not None:
            check_tokenizer(wm, tmodel.tokenizer, models.target)
        prompt_ids = _encode(tmodel.tokenizer, prompt, chat)
        tol = tie_tolerance
        if tol is None:
            tol = DEFAULT_TIE_TOLERANCE if pair.dtype in ("float32", "gguf") else 0.05
        settings: dict[str, Any] = dict(
            seed=seed,
            watermark=wm,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            tie_tolerance=tol,
        )
        if text_ids is not None:
            rep = run_audit(tmodel, prompt_ids, text_ids, **settings)
        else:
            assert body is not None
            rep = audit_text(tmodel, tmodel.tokenizer, prompt_ids, body, **settings)
    except ErsdError as exc:
        raise _fail(exc) from None
    out: dict[str, Any] = rep.as_dict()
    if as_json:
        click.echo(json.dumps(out))
    elif rep.verified:
        click.echo(
            f"verified: all {out['tokens']} tokens are their race's winners"
            + (f" (near ties at {rep.near_ties})" if rep.near_ties else "")
            + (
                f"; the text re-tokenizes otherwise than generated at {rep.realigned}, "
                "re-aligned on the winners"
                if rep.realigned
                else ""
            )
        )
    elif rep.status == "retokenized":
        p = rep.positions[rep.undecided or 0]
        click.echo(
            f"undecided: the text re-tokenizes to other ids than the race's winners from token "
            f"{p.index} (id {p.token}, the winner {p.winner}) and its characters cannot tell an "
            "edit from a re-tokenization; audit the generated ids with --ids (ersd generate "
            "--json prints them)"
        )
    else:
        p = rep.positions[rep.first_forgery or 0]
        click.echo(
            f"NOT verified: token {p.index} is {p.token}, the race's winner was {p.winner} "
            f"(margin {p.margin:.3g}); mismatches at {rep.mismatches}"
        )
    if rep.status == "retokenized":
        sys.exit(3)
    if not rep.verified:
        sys.exit(1)
