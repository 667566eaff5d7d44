"""``ersd generate``: speculative sampling from the command line, streaming accepted text."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ersd.commands._loading import ModelArgs, load_pair, model_options
from ersd.commands._precision import (
    apply_config_auto,
    choose_llamacpp_policy,
    identity_before_run,
    margins_after_run,
)
from ersd.methods.catalog import METHOD_NAMES

if TYPE_CHECKING:
    from ersd.request import Request

#: the race schemes of ``--race-scheme`` (:data:`ersd.race_v2.RACE_SCHEMES`, which imports torch;
#: a test keeps the two equal)
RACE_SCHEMES = ("v1", "v2")

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def _encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Prompt ids through the :class:`ersd.Tokenizer` protocol (the chat template if ``chat``)."""
    from ersd.errors import ErsdError

    if chat:
        try:
            return tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        except ErsdError as exc:
            raise click.UsageError(f"--chat: {exc}") from None
    return [int(t) for t in tokenizer.encode(prompt)]


def _check_utf8(prompt: str) -> str:
    """PROMPT as given, refused with a one-line error when it is not valid UTF-8 (Python hands
    such argv bytes over as lone surrogates, which no tokenizer can encode)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = prompt[exc.start].encode("utf-8", "surrogateescape")
        raise click.BadParameter(
            f"the prompt is not valid UTF-8 (byte 0x{raw.hex()} at character {exc.start}); "
            "convert it first (e.g. `iconv -f latin1 -t utf-8`) or put it in a UTF-8 "
            "--prompts-file",
            param_hint="PROMPT",
        ) from None
    return prompt


class _Streamer:
    """Prints the decoded text of a growing token list, only the part not printed yet."""

    def __init__(self, tokenizer: Any, enabled: bool) -> None:
        self.tokenizer = tokenizer
        self.enabled = enabled
        self.tokens: list[int] = []
        self.printed = ""

    def add(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        if not self.enabled:
            return
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for more
            return
        sys.stdout.write(text[len(self.printed) :])
        sys.stdout.flush()
        self.printed = text


def _stats_block(res: Any) -> str:
    per_pos = ", ".join(f"{a:.2f}" for a in res.accepted_per_pos) or "-"
    wall = res.wall_time
    lines = [
        f"  tokens              {len(res.tokens)}",
        f"  target calls        {res.target_calls}",
        f"  draft forwards      {res.draft_forwards}",
        f"  drafted tokens      {res.num_draft_tokens}",
        f"  accepted tokens     {res.num_accepted_tokens} "
        f"(acceptance rate {res.acceptance_rate:.2f})",
        f"  block efficiency    {res.block_efficiency:.2f} tokens per target call",
        f"  acceptance by depth {per_pos}",
        f"  tokens/s            {res.tokens_per_second:.2f}",
        f"  time split          draft {res.draft_time / wall:.0%}, "
        f"target {res.target_time / wall:.0%}, other {res.other_time / wall:.0%}",
    ]
    if res.auto_summary:  # --tree auto: what it chose and why
        lines.append(f"  {res.auto_summary}")
    return "\n".join(lines)


@click.command()
@click.argument("prompt", required=False)
@model_options(dtype="bfloat16")
@click.option(
    "--method",
    default="ersd",
    show_default=True,
    help=f"Verification method: {', '.join(METHOD_NAMES)}.",
)
@click.option(
    "--tree",
    default="multi:2x3",
    show_default=True,
    help="Draft tree: chain:K, multi:MxL, batch:K, binary:K, optimal:K@FILE (a calibration "
    "or rank-profile file), paths:[[0],[1],[0,0]], (ERSD) dynamic:K[@D], or auto[@FILE] (each "
    "step the tree, or no drafting, of highest predicted tokens/s; docs/auto-tree.md).",
)
@click.option(
    "--draft-sharpness",
    type=float,
    default=1.0,
    show_default=True,
    help="ERSD: the drafter races q**BETA instead of q (1 = the paper's rule; > 1 for a target "
    "more confident than its draft, e.g. 1.15 on the Qwen pair). Never changes the text, only "
    "how much is accepted; fit it with `ersd bench calibrate` (docs/dynamic-trees.md).",
)
@click.option(
    "--config",
    type=click.Choice(["auto"]),
    default=None,
    help="auto: target/draft dtypes and tree chosen among the configurations that keep ERSD's "
    "text equal to target-only sampling on this machine, by its stored measurements (`ersd "
    "models calibrate`), not CPU flags; docs/models.md#choosing-a-configuration.",
)
@click.option("--temperature", type=float, default=1.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option(
    "--chat",
    is_flag=True,
    help="Wrap the prompt in the model's chat template (with --prompts-file: every 'prompt').",
)
@click.option(
    "--compare",
    is_flag=True,
    help="Also run target-only sampling (same seed/settings) and print the speedup.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="No streaming; the last stdout line is a JSON object (with --prompts-file: JSON Lines, "
    "one object per prompt).",
)
@click.option(
    "--prompts-file",
    type=click.Path(),
    default=None,
    help='Generate for every prompt of a JSON Lines file ({"prompt": ...} or {"messages": '
    '[...]} per line, optional "seed" and "max_new_tokens"), batched; see docs/batching.md.',
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="With --prompts-file: at most N prompts decoded together (continuous batching) "
    "[default: 8].",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="With --prompts-file: write the JSON Lines here instead of stdout (implies --json).",
)
@click.option("--no-progress", is_flag=True, help="With --prompts-file: no progress bar.")
@click.option(
    "--watermark-key-file",
    type=click.Path(),
    default=None,
    help="Watermark every token with the secret key in this private file (ERSD or target-only; "
    "`ersd watermark keygen --out F` makes one; docs/watermark.md).",
)
@click.option(
    "--race-scheme",
    type=click.Choice(RACE_SCHEMES),
    default="v1",
    show_default=True,
    help="How the races are drawn: v1 (NumPy's Philox; every earlier seed's text) or v2 (the "
    "faster blocked race: same law, other texts; not with a watermark); docs/race-schemes.md.",
)
@click.option(
    "--watermark-context",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens of context that key each race (default: the key file's, else 4).",
)
def generate(
    prompt: str | None,
    models: ModelArgs,
    method: str,
    tree: str,
    draft_sharpness: float,
    config: str | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    seed: int,
    max_new_tokens: int,
    chat: bool,
    compare: bool,
    as_json: bool,
    prompts_file: str | None,
    batch_size: int | None,
    out: str | None,
    no_progress: bool,
    race_scheme: str,
    watermark_key_file: str | None,
    watermark_context: int | None,
) -> None:
    """Generate text from PROMPT with speculative sampling (default: ERSD on the Qwen pair).

    With --prompts-file, generate for every prompt of a JSON Lines file at once (batched).
    """
    from ersd.commands._prompts_file import read_prompts, run_prompts_file
    from ersd.errors import ErsdError

    _check_option_mix(prompt, prompts_file, compare, batch_size, out)
    as_json = as_json or out is not None
    prompt = _check_utf8(prompt) if prompt is not None else DEFAULT_PROMPT
    log = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    try:
        if config == "auto":
            models, tree = apply_config_auto(models, tree, temperature, log)
        wm = _load_watermark(watermark_key_file, watermark_context)
        template = _request_template(
            method=ersd_method(method, draft_sharpness),
            tree=tree,
            has_draft=models.has_draft,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            max_new_tokens=max_new_tokens,
            watermark=wm,
            race_scheme=race_scheme,
        )
        lines = read_prompts(prompts_file) if prompts_file is not None else None
        pair = load_pair(models)
        if config == "auto" and models.backend == "llamacpp":
            pair, tree = choose_llamacpp_policy(pair, temperature, log)
            if pair.draft is None:  # the fast policy, target-only
                template = replace(template, tree=None)
        if wm is not None:  # a key made for another tokenizer would mark text no reader matches
            from ersd.watermark.settings import check_tokenizer

            check_tokenizer(wm, pair.target.tokenizer, models.target)
        log(f"[loaded in {pair.seconds:.1f}s: {pair.summary()}]")
        # said before the run, not after
        identity = identity_before_run(pair, template.verification, log)
        template = replace(template, eos_token_id=pair.target.eos_token_ids)
        if wm is not None:
            log(f"[watermark: {wm!r}, salt {wm.salt_for(seed)} for seed {seed}]")
        if lines is not None:
            run_prompts_file(
                pair,
                lines,
                template,
                path=str(prompts_file),
                chat=chat,
                batch_size=batch_size or 8,
                as_json=as_json,
                out=out,
                progress=not no_progress,
                log=log,
            )
            return
        request = replace(template, prompt=_encode(pair.target.tokenizer, prompt, chat))
        out_obj = _generate_one(pair, request, tree, compare=compare, as_json=as_json, log=log)
        out_obj.update(margins_after_run(pair, request, out_obj["tokens"], identity, log))
    except ErsdError as exc:
        message = str(exc)
        if exc.param == "race_scheme":  # the library names the keyword; say the flag too
            message = f"--race-scheme {race_scheme}: {message}"
        raise click.ClickException(message) from None
    if as_json:
        click.echo(json.dumps(out_obj))


def _check_option_mix(
    prompt: str | None,
    prompts_file: str | None,
    compare: bool,
    batch_size: int | None,
    out: str | None,
) -> None:
    """Refuse options that do not go together (PROMPT or --prompts-file and their options)."""
    if prompts_file is not None:
        if prompt is not None:
            raise click.UsageError(
                "give either PROMPT or --prompts-file, not both (add the prompt to the file as "
                'a line {"prompt": "..."})'
            )
        if compare:
            raise click.UsageError("--compare runs one prompt; drop it or give PROMPT instead")
    else:
        for flag, value in (("--batch-size", batch_size), ("--out", out)):
            if value is not None:
                raise click.UsageError(f"{flag} goes with --prompts-file FILE.jsonl")


def _load_watermark(key_file: str | None, context: int | None) -> Any:
    """The watermark of ``--watermark-key-file`` (None without one)."""
    import ersd

    if context is not None and key_file is None:
        raise click.UsageError("--watermark-context goes with --watermark-key-file FILE")
    return ersd.load_watermark(key_file, context_width=context) if key_file is not None else None


def _request_template(
    *,
    method: Any,
    tree: str,
    has_draft: bool,
    watermark: Any,
    **fields: Any,
) -> Request:
    """The :class:`ersd.request.Request` of the command's options, checked before any model
    loads: every prompt's request is this one with its token ids (and, from a prompts file, its
    seed and length), made by ``dataclasses.replace``, which checks again.  Its prompt is a
    placeholder until then.  ``tree`` is parsed even without a draft (a typo is an error), and
    carried only with one (target-only sampling checks no tree against the method)."""
    from ersd.auto import CurveCache, sharing
    from ersd.request import Request
    from ersd.tree_spec import parse_tree_spec

    # every tree kind parses once, at the request's temperature (ersd.tree_spec): fixed
    # shapes, optimal:K@FILE, auto (chosen per step) and dynamic:K[@D] (grown per step)
    shape = parse_tree_spec(tree, temperature=fields["temperature"])
    if shape.auto is not None:  # the warm-up's measured cost curves serve the real run
        shape = replace(shape, auto=sharing(shape.auto, CurveCache()))
    placeholder = [0]
    return Request.of(
        placeholder,
        method=method,
        tree=shape if has_draft else None,
        watermark=watermark,
        **fields,
    )


def ersd_method(method: str, draft_sharpness: float) -> Any:
    """The method to run: ``method``'s registered object, or ERSD with its draft sharpness."""
    import ersd
    from ersd.methods.ersd import ERSD, with_sharpness

    meth = ersd.get_method(method)
    if draft_sharpness != 1.0 and not isinstance(meth, ERSD):
        raise click.UsageError(
            f"--draft-sharpness {draft_sharpness:g} sharpens ERSD's draft race; method "
            f"{method!r} has no shared race (drop the option or use --method ersd)"
        )
    return with_sharpness(meth, draft_sharpness)


def _generate_one(
    pair: Any, request: Request, tree: str, *, compare: bool, as_json: bool, log: Any
) -> dict[str, Any]:
    """One prompt's ``request``, streamed (unless ``as_json``); returns the --json object
    (``tree``: the spec as the user wrote it, for the statistics header)."""
    from ersd.generation import generate_request

    tmodel, dmodel = pair.target, pair.draft
    # warm-up: first forwards pay one-time costs (kernels, allocator); keep them out of timings
    warm = replace(request, max_new_tokens=2)
    generate_request(tmodel, dmodel, warm)
    if compare and dmodel is not None:
        generate_request(tmodel, None, warm)

    streamer = _Streamer(tmodel.tokenizer, enabled=not as_json)
    res = generate_request(tmodel, dmodel, request, on_step=lambda rec: streamer.add(rec.tokens))
    text = tmodel.tokenizer.decode(res.tokens, skip_special_tokens=True)
    out: dict[str, Any] = {"text": text, **res.stats(), "tokens": res.tokens}
    wm = request.watermark
    if wm is not None:  # which key (by fingerprint, never the key) and salt marked the text
        out["watermark"] = {
            "scheme": wm.scheme,
            "version": wm.version,
            "num_salts": wm.num_salts,
            "key_fingerprint": wm.fingerprint,
            "context_width": wm.context_width,
            "salt": wm.salt_for(request.seed),
        }
    if not as_json:
        click.echo("")
        label = f"{out['method']} {tree}" if dmodel is not None else "target-only"
        click.echo(
            f"\n--- statistics ({label}, T={request.sampling.temperature}, seed {request.seed}"
            + (f", race scheme {request.race_scheme}" if request.race_scheme != "v1" else "")
            + ") ---"
        )
        click.echo(_stats_block(res))
    if compare and dmodel is not None:
        out.update(_compare(pair, request, res, log))
    return out


def _compare(pair: Any, request: Request, res: Any, log: Any) -> dict[str, Any]:
    """--compare: target-only sampling of the same request (same seed and settings), and the
    speedup."""
    from ersd.generation import generate_request

    base = generate_request(pair.target, None, request)
    speedup = res.tokens_per_second / base.tokens_per_second
    identical = base.tokens == res.tokens
    log("\n--- compare: target-only sampling, same seed and settings ---")
    log(
        f"  target-only tokens/s {base.tokens_per_second:.2f} "
        f"({len(base.tokens)} tokens, {base.target_calls} target calls)"
    )
    log(f"  speedup             {speedup:.2f}x")
    if res.method != "ersd":
        log("  (texts are not compared: only ERSD is drafter invariant)")
    elif identical:
        log("  identical text      yes: ERSD output equals target-only race sampling")
    else:
        first = next(
            (i for i, (a, b) in enumerate(zip(base.tokens, res.tokens, strict=False)) if a != b),
            min(len(base.tokens), len(res.tokens)),
        )
        log(
            f"  identical text      NO: differs from token {first}. "
            + (
                "In reduced precision a batched tree forward and a one-token forward "
                "round differently and a near-tie can flip; rerun with --dtype float32 "
                "for the bit-exact check."
                if pair.dtype not in ("float32", "gguf")
                else "In float32 only a race within rounding error of a tie can flip (see "
                "the identity line and the race margins); with llama.cpp's exact batch policy "
                "this should not happen: please report it."
            )
        )
    return dict(
        baseline_tokens_per_second=base.tokens_per_second,
        baseline_target_calls=base.target_calls,
        speedup=speedup,
        identical_to_target_only=identical,
    )
