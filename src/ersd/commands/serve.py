"""``ersd serve``: the OpenAI-compatible HTTP server (see docs/serve.md)."""

from __future__ import annotations

import logging
import time

import click


@click.command()
@click.option(
    "--target",
    default="qwen2.5-coder-1.5b",
    show_default=True,
    help="Target model: bundled name (see `ersd models list`), local folder or hub id.",
)
@click.option(
    "--draft",
    default="qwen2.5-coder-0.5b",
    show_default=True,
    help="Draft model (same vocabulary as the target), or 'none' for target-only.",
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
    help="Default verification method (a request may pick another).",
)
@click.option(
    "--tree",
    default="multi:2x3",
    show_default=True,
    help="Default draft tree (chain:K, multi:MxL, batch:K, binary:K, optimal:K@FILE).",
)
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="float32: a seeded request equals `ersd generate --dtype float32` bit-exactly.",
)
@click.option(
    "--draft-dtype",
    default=None,
    type=click.Choice(["float32", "bfloat16", "float16", "int8"]),
    help="dtype of the draft (default: --dtype); int8 = dynamic int8 quantization (CPU).",
)
@click.option(
    "--linear",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "onednn", "torch"]),
    help="float32 CPU linear layers.",
)
@click.option("--device", default="cpu", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option(
    "--served-model-name", default=None, help="The model name clients send (default: --target)."
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Sequences decoded together (rows of the continuous batch).",
)
@click.option(
    "--max-queue",
    type=click.IntRange(0),
    default=64,
    show_default=True,
    help="Sequences that may wait for a row; beyond it requests get HTTP 429.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1),
    default=256,
    show_default=True,
    help="Default max_tokens of chat requests that give none.",
)
@click.option(
    "--shutdown-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds in-flight requests may take to finish on shutdown (then cancelled).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def serve(
    target: str,
    draft: str,
    draft_layers: int | None,
    method: str,
    tree: str,
    dtype: str,
    draft_dtype: str | None,
    linear: str,
    device: str,
    host: str,
    port: int,
    served_model_name: str | None,
    max_batch_size: int,
    max_queue: int,
    max_tokens: int,
    shutdown_timeout: float,
    log_level: str,
) -> None:
    """Serve TARGET (speculating with DRAFT) over an OpenAI-compatible HTTP API."""
    import ersd
    from ersd.errors import ErsdError

    try:
        import uvicorn

        from ersd.serve import ServeConfig, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"ersd serve needs the 'serve' extra ({exc.name} is missing): pip install 'ersd[serve]'"
        ) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        ersd.get_method(method)
        shape = ersd.parse_tree(tree) if draft.lower() != "none" else None
        if shape is not None:
            ersd.get_method(method).check_shape(shape)
        t0 = time.perf_counter()
        tmodel = ersd.load_model(target, dtype=dtype, device=device, linear=linear)
        dmodel = None
        if draft.lower() != "none":
            overrides = {"num_hidden_layers": draft_layers} if draft_layers is not None else {}
            dmodel = ersd.load_model(
                draft, dtype=draft_dtype or dtype, device=device, linear=linear, **overrides
            )
            tmodel.check_compatible(dmodel)
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"[loaded in {time.perf_counter() - t0:.1f}s: target {target} ({dtype})"
        + (f", draft {draft} ({draft_dtype or dtype})" if dmodel else ", no draft")
        + f"; serving on http://{host}:{port}/v1]",
        err=True,
    )
    config = ServeConfig(
        model_name=served_model_name or target,
        method=method,
        tree=shape,
        max_batch_size=max_batch_size,
        max_queue=max_queue,
        max_tokens=max_tokens,
        shutdown_timeout=shutdown_timeout,
    )
    app = create_app(tmodel, dmodel, config)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(shutdown_timeout) + 1,
    )
