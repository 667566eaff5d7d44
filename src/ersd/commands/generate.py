"""``ersd generate``: speculative sampling from the command line, streaming accepted text."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from ersd.methods.catalog import METHOD_NAMES

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


def _draft_dtype(dmodel: Any, default: str) -> str:
    """The draft's dtype as loaded (a model-free drafter has none: 'model-free')."""
    describe = getattr(dmodel, "describe", None)
    if describe is None:
        return "model-free" if not hasattr(dmodel, "model") else default
    return str(describe().get("dtype", default))


def _stats_block(res: Any, elapsed: float) -> str:
    per_pos = ", ".join(f"{a:.2f}" for a in res.accepted_per_pos) or "-"
    wall = res.wall_time or elapsed
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
@click.option(
    "--target",
    default="qwen2.5-coder-1.5b",
    show_default=True,
    help="Target model: bundled name (see `ersd models list`), local folder, hub id, or a "
    "weight-free stand-in (toy, tiny-qwen2).",
)
@click.option(
    "--draft",
    default="qwen2.5-coder-0.5b",
    show_default=True,
    help="Draft model (same vocabulary as the target), 'none' for target-only, or a drafter: "
    "'lookup' (prompt lookup), 'suffix', 'lookup:n=3,k=8,branches=2', 'lookup+<draft model>' "
    "(hybrid); see docs/drafters.md.",
)
@click.option(
    "--draft-layers",
    type=int,
    default=None,
    help="Keep only the first K layers of the draft (a layer-truncated draft).",
)
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
@click.option("--temperature", type=float, default=1.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option(
    "--dtype",
    default="bfloat16",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="bfloat16 is fast on CPUs with AVX-512-bf16; float32 for bit-exact checks.",
)
@click.option(
    "--draft-dtype",
    default=None,
    type=click.Choice(["float32", "bfloat16", "float16", "int8"]),
    help="dtype of the draft (default: --dtype). int8 (CPU): dynamic int8 quantization, the "
    "cheapest draft; with a float32 target ERSD's identity check stays bit-exact.",
)
@click.option(
    "--linear",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "onednn", "torch"]),
    help="float32 CPU linear layers: onednn stores weights prepacked (scoring k tokens costs "
    "little more than 1); torch = stock nn.Linear; auto = onednn where available.",
)
@click.option("--device", default="cpu", show_default=True)
@click.option(
    "--backend",
    default="hf",
    show_default=True,
    type=click.Choice(["hf", "llamacpp"]),
    help="hf: PyTorch/transformers; llamacpp: the GGUF weights run by llama.cpp (needs the "
    "extra: pip install 'ersd[llamacpp]'; --dtype/--linear/--device do not apply).",
)
@click.option("--threads", type=int, default=None, help="llamacpp: CPU threads (default: all).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option(
    "--compare",
    is_flag=True,
    help="Also run target-only sampling (same seed/settings) and print the speedup.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="No streaming; the last stdout line is a JSON object."
)
def generate(
    prompt: str | None,
    target: str,
    draft: str,
    draft_layers: int | None,
    method: str,
    tree: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    seed: int,
    max_new_tokens: int,
    dtype: str,
    draft_dtype: str | None,
    linear: str,
    device: str,
    backend: str,
    threads: int | None,
    chat: bool,
    compare: bool,
    as_json: bool,
) -> None:
    """Generate text from PROMPT with speculative sampling (default: ERSD on the Qwen pair)."""
    import ersd
    from ersd.drafting import parse_drafter
    from ersd.drafting.dynamic import parse_dynamic
    from ersd.errors import ErsdError
    from ersd.tree import parse_auto

    prompt = prompt if prompt is not None else DEFAULT_PROMPT
    log = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    try:
        ersd.get_method(method)
        # dynamic:K[@D] trees are grown by ersd.generate itself (ersd.drafting.dynamic), auto
        # trees chosen by it per step (ersd.auto)
        if parse_dynamic(tree):
            shape: Any = tree
        else:
            shape = parse_auto(tree) or ersd.parse_tree(tree, temperature=temperature)
        ersd.SamplingParams(temperature, top_k, top_p, min_p)
        t0 = time.perf_counter()
        if backend == "llamacpp":
            if draft_layers is not None:
                raise click.UsageError("--draft-layers needs --backend hf")

            def load_target(name: str) -> Any:
                return ersd.load_model(name, backend="llamacpp", threads=threads)

            load_draft_model = load_target
        else:
            overrides: dict[str, Any] = (
                {"num_hidden_layers": draft_layers} if draft_layers is not None else {}
            )

            def load_target(name: str) -> Any:
                return ersd.load_model(name, dtype=dtype, device=device, linear=linear)

            def load_draft_model(name: str) -> Any:
                return ersd.load_model(
                    name, dtype=draft_dtype or dtype, device=device, linear=linear, **overrides
                )

        tmodel = load_target(target)
        dmodel = None
        if draft.lower() != "none":

            def load_draft(name: str) -> Any:
                m = load_draft_model(name)
                tmodel.check_compatible(m)
                return m

            # a model name, 'lookup', 'suffix:...' or 'lookup+<model>' (ersd.drafting.spec)
            dmodel = parse_drafter(draft, load_model=load_draft, tokenize=tmodel.tokenizer.encode)
        if backend == "llamacpp":
            dtype = draft_dtype = "gguf"
            device = f"llama.cpp, {tmodel.threads} threads"
        about = tmodel.describe()
        onednn = " oneDNN" if about.get("linear") == "onednn" else ""
        log(
            f"[loaded in {time.perf_counter() - t0:.1f}s: target {target}"
            + f" ({about.get('dtype', dtype)}{onednn})"
            + (
                f", draft {draft} ({_draft_dtype(dmodel, draft_dtype or dtype)})"
                if dmodel
                else ", no draft"
            )
            + f", {about.get('device', device)}]"
        )
        ids = _encode(tmodel.tokenizer, prompt, chat)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            method=method,
            tree=shape,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            eos_token_id=tmodel.eos_token_ids,
        )
        # warm-up: first forwards pay one-time costs (kernels, allocator); keep them out of timings
        warm = dict(kwargs, max_new_tokens=2)
        ersd.generate(tmodel, dmodel, ids, **warm)
        if compare and dmodel is not None:
            ersd.generate(tmodel, None, ids, **warm)

        streamer = _Streamer(tmodel.tokenizer, enabled=not as_json)
        t1 = time.perf_counter()
        steps = []
        for rec in ersd.generate_stream(tmodel, dmodel, ids, **kwargs):
            steps.append(rec)
            streamer.add(rec.tokens)
        wall = time.perf_counter() - t1
        res = ersd.GenerationResult.from_steps(
            steps,
            method=method,
            tree=shape if dmodel is not None else None,
            eos_token_id=kwargs["eos_token_id"],
            wall_time=wall,
        )
        text = tmodel.tokenizer.decode(res.tokens, skip_special_tokens=True)
        out: dict[str, Any] = {"text": text, **res.stats(), "tokens": res.tokens}
        if not as_json:
            click.echo("")
            label = f"{out['method']} {tree}" if dmodel is not None else "target-only"
            click.echo(f"\n--- statistics ({label}, T={temperature}, seed {seed}) ---")
            click.echo(_stats_block(res, wall))
        if compare and dmodel is not None:
            base = ersd.generate(tmodel, None, ids, **kwargs)
            speedup = res.tokens_per_second / base.tokens_per_second
            identical = base.tokens == res.tokens
            out.update(
                baseline_tokens_per_second=base.tokens_per_second,
                baseline_target_calls=base.target_calls,
                speedup=speedup,
                identical_to_target_only=identical,
            )
            log("\n--- compare: target-only sampling, same seed and settings ---")
            log(
                f"  target-only tokens/s {base.tokens_per_second:.2f} "
                f"({len(base.tokens)} tokens, {base.target_calls} target calls)"
            )
            log(f"  speedup             {speedup:.2f}x")
            if out["method"] == "ersd":
                if identical:
                    log("  identical text      yes: ERSD output equals target-only race sampling")
                else:
                    first = next(
                        (
                            i
                            for i, (a, b) in enumerate(zip(base.tokens, res.tokens, strict=False))
                            if a != b
                        ),
                        min(len(base.tokens), len(res.tokens)),
                    )
                    log(
                        f"  identical text      NO: differs from token {first}. "
                        + (
                            "In reduced precision a batched tree forward and a one-token forward "
                            "round differently and a near-tie can flip; rerun with --dtype float32 "
                            "for the bit-exact check."
                            if dtype not in ("float32", "gguf")
                            else "This should not happen in float32 or with llama.cpp's exact "
                            "batch policy: please report it."
                        )
                    )
            else:
                log("  (texts are not compared: only ERSD is drafter invariant)")
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out))
