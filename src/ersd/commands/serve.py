"""``ersd serve``: the OpenAI-compatible HTTP server (see docs/serve.md)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from ersd.commands._loading import ModelArgs, load_pair, model_options
from ersd.serve.guard import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DETECT_TOKENS
from ersd.tree import MAX_TREE_DEPTH, MAX_TREE_NODES

#: ``--race-scheme``'s choices (:data:`ersd.race.RACE_SCHEMES`, whose module imports torch; a
#: test keeps the two equal) and the default, v1
RACE_SCHEMES = ("v1", "v2")
DEFAULT_RACE_SCHEME = "v1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


@click.command()
@model_options(
    dtype="float32",
    dtype_help="float32: a seeded request equals `ersd generate --dtype float32` bit-exactly.",
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
    help=(
        "Default draft tree (chain:K, multi:MxL, batch:K, binary:K, optimal:K@FILE, or auto / "
        "auto@FILE: chosen per step by predicted throughput at the live batch size)."
    ),
)
@click.option(
    "--race-scheme",
    type=click.Choice(RACE_SCHEMES),
    default=DEFAULT_RACE_SCHEME,
    show_default=True,
    help="How races are drawn when a request names no race_scheme (docs/race-schemes.md): v1 "
    "(every earlier text) or v2 (the faster blocked race; other texts). Unwatermarked "
    "responses only.",
)
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
    "--max-tree-nodes",
    type=click.IntRange(1, MAX_TREE_NODES),
    default=64,
    show_default=True,
    help="Largest draft tree (nodes, and depth) a request or --tree may ask for; larger: HTTP 400.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024),
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Largest request body; larger bodies get HTTP 413 before they are read.",
)
@click.option(
    "--api-key",
    envvar="ERSD_API_KEY",
    default=None,
    help=(
        "Require 'Authorization: Bearer KEY' on every /v1 route (401 otherwise); /health and "
        "/metrics stay open. Default: $ERSD_API_KEY (prefer it: a flag shows in `ps`)."
    ),
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="/health answers 503 when the engine has work but finished no step for this long.",
)
@click.option(
    "--watermark-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help=(
        "Watermark every response with this secret key (a private key file: mode 600; "
        "`ersd watermark keygen --out F` makes one). Adds POST /v1/watermark/detect."
    ),
)
@click.option(
    "--watermark-context",
    type=int,
    default=None,
    help="Generated tokens that key each race (default: the key file's, else 4).",
)
@click.option(
    "--allow-watermark-opt-out",
    is_flag=True,
    default=False,
    help='Let a request send "watermark": false for an unmarked response (default: refused).',
)
@click.option(
    "--watermark-threshold",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=1e-3,
    show_default=True,
    help="p-value at or below which /v1/watermark/detect calls a text watermarked.",
)
@click.option(
    "--max-detect-tokens",
    type=click.IntRange(1),
    default=DEFAULT_MAX_DETECT_TOKENS,
    show_default=True,
    help="Most tokens one POST /v1/watermark/detect may score; longer inputs get HTTP 413.",
)
@click.option(
    "--detect-concurrency",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Watermark detections run at once (in worker threads, off the generation path).",
)
@click.option(
    "--detect-wait",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="Seconds a detection waits for a free slot before HTTP 429 with Retry-After.",
)
@click.option(
    "--auto-learn",
    is_flag=True,
    help="tree=auto: keep what the server measures and learns (cost curves, the pair's rank "
    "profile, step-time corrections) in the cost store for later runs; off, it only reads it.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def serve(
    models: ModelArgs,
    method: str,
    tree: str,
    race_scheme: str,
    host: str,
    port: int,
    served_model_name: str | None,
    max_batch_size: int,
    max_queue: int,
    max_tokens: int,
    shutdown_timeout: float,
    max_tree_nodes: int,
    max_body_bytes: int,
    api_key: str | None,
    stall_timeout: float,
    watermark_key_file: str | None,
    watermark_context: int | None,
    allow_watermark_opt_out: bool,
    watermark_threshold: float,
    max_detect_tokens: int,
    detect_concurrency: int,
    detect_wait: float,
    auto_learn: bool,
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
    api_key = _clean_key(api_key)
    try:
        from ersd.methods.catalog import race_winners_only
        from ersd.tree_spec import parse_tree_spec

        if watermark_key_file is None and (
            watermark_context is not None or allow_watermark_opt_out
        ):
            raise click.UsageError(
                "--watermark-context and --allow-watermark-opt-out go with --watermark-key-file"
            )
        if (
            watermark_key_file is not None
            and not allow_watermark_opt_out
            and race_scheme != DEFAULT_RACE_SCHEME
        ):
            raise click.UsageError(
                f"--race-scheme {race_scheme} applies to unwatermarked responses only, and with "
                "--watermark-key-file every response is watermarked (its races are the key's "
                f"PRF); drop --race-scheme (or add --allow-watermark-opt-out)"
            )
        # the key is read once, before the models load (a bad or readable key file fails fast)
        watermark = (
            ersd.load_watermark(watermark_key_file, context_width=watermark_context)
            if watermark_key_file is not None
            else None
        )
        meth = ersd.get_method(method)
        # every kind (dynamic:K and auto included); optimal:K@FILE is read once, here
        limits = {"max_nodes": max_tree_nodes, "max_depth": min(max_tree_nodes, MAX_TREE_DEPTH)}
        shape = parse_tree_spec(tree, temperature=None, **limits) if models.has_draft else None
        if shape is not None and shape.shape is not None:
            meth.check_shape(shape.shape)
        info = meth.info
        if watermark is not None and shape is not None and not race_winners_only(info):
            raise ErsdError(
                f"--method {method} with a draft does not mark every token (its accepted drafts "
                "and corrections are not the keyed race's winners); serve a watermark with "
                "--method ersd, or without --draft"
            )
        pair = load_pair(models)
        if watermark is not None:  # refuse a key made for another tokenizer before serving
            from ersd.watermark.settings import check_tokenizer

            check_tokenizer(watermark, pair.target.tokenizer, models.target)
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"[loaded in {pair.seconds:.1f}s: {pair.summary()}; serving on http://{host}:{port}/v1]",
        err=True,
    )
    config = ServeConfig(
        model_name=served_model_name or models.target,
        method=method,
        tree=shape,
        max_batch_size=max_batch_size,
        max_queue=max_queue,
        max_tokens=max_tokens,
        shutdown_timeout=shutdown_timeout,
        max_tree_nodes=max_tree_nodes,
        api_key=api_key or None,
        max_body_bytes=max_body_bytes,
        stall_timeout=stall_timeout,
        watermark=watermark,
        watermark_opt_out=allow_watermark_opt_out,
        detect_threshold=watermark_threshold,
        max_detect_tokens=max_detect_tokens,
        detect_concurrency=detect_concurrency,
        detect_wait=detect_wait,
        race_scheme=race_scheme,
    )
    if watermark is not None:  # its fingerprint and settings, never the key
        logging.getLogger("ersd.serve").info(
            "watermarking every response: %r%s; detection at p <= %g on POST /v1/watermark/detect",
            watermark,
            " (requests may opt out)" if allow_watermark_opt_out else "",
            watermark_threshold,
        )
    if not api_key and not is_loopback(host):
        logging.getLogger("ersd.serve").warning(
            "listening on %s without an API key: anyone who can reach this port can run "
            "requests on this machine; set $ERSD_API_KEY (or --api-key), or bind 127.0.0.1",
            host,
        )
    # The engine runs on the main thread and the HTTP server in a thread: torch forwards were
    # measured ~1.6x slower in a worker thread on this CPU (docs/serve.md, "Threads").
    app = create_app(pair.target, pair.draft, config, engine_thread=False)
    app.state.serving.engine.curves.learn = auto_learn  # tree=auto writes the store if asked
    if shape is not None and shape.auto is not None:
        _prepare_auto(pair, app.state.serving.engine.curves, max_batch_size)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            # in-flight work has --shutdown-timeout, then 5 s to send its last event or 503
            timeout_graceful_shutdown=int(shutdown_timeout) + 5,
        )
    )
    web = threading.Thread(target=server.run, name="ersd-http", daemon=True)

    def _exit(sig: int, frame: Any) -> None:  # first signal: graceful; second: immediate
        if server.should_exit:
            server.force_exit = True
            return
        server.should_exit = True
        # new requests get 503 at once; in-flight ones finish within --shutdown-timeout or end
        # with an explicit 503 (a JSON error, or an error event and [DONE] for a stream)
        closer = threading.Thread(
            target=app.state.serving.close, args=(shutdown_timeout,), name="ersd-shutdown"
        )
        closer.daemon = True
        closer.start()

    previous = {sig: signal.signal(sig, _exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        web.start()
        app.state.serving.run(keep_going=web.is_alive)
        web.join(timeout=shutdown_timeout + 30)
    finally:  # a caller in the same process (tests, notebooks) gets its own handlers back
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise click.ClickException(
            f"the HTTP server did not start on {host}:{port} (see the log above: a port in use?)"
        )


def _clean_key(api_key: str | None) -> str | None:
    """The API key without surrounding whitespace: ``ERSD_API_KEY=$(cat f)`` keeps none, but a
    key exported from a file with its newline used to make every request 401 (clients never send
    it).  Stripped with a warning (the key itself is never shown); an empty key or one with
    characters a header cannot carry is refused."""
    if api_key is None:
        return None
    key = api_key.strip()
    if not key:
        raise click.UsageError(
            "the API key (--api-key or $ERSD_API_KEY) is empty or only whitespace; set a key, or "
            "unset ERSD_API_KEY to serve without one"
        )
    if any(not c.isprintable() or c.isspace() for c in key):
        raise click.UsageError(
            "the API key (--api-key or $ERSD_API_KEY) contains spaces or control characters, "
            "which an 'Authorization: Bearer' header cannot carry; use printable characters only "
            "(e.g. `ersd watermark keygen`-style hex: python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    if key != api_key:
        logging.getLogger("ersd.serve").warning(
            "the API key (--api-key or $ERSD_API_KEY) had %d whitespace character(s) around it "
            "(a trailing newline from a file?); they were stripped: clients send the key "
            "without them",
            len(api_key) - len(key),
        )
    return key


def _prepare_auto(pair: Any, curves: Any, max_batch_size: int) -> None:
    """``--tree auto``: the cost curves of every batch size up to ``--max-batch-size``, read
    from the cost store or measured now, at start-up -- never inside a client's request."""
    import time

    from ersd.auto import draft_model_of, prepare_costs

    t0 = time.perf_counter()
    ids = pair.target.tokenizer.encode("def fibonacci(n):\n    " * 8)
    prepare_costs(pair.target, draft_model_of(pair.draft), ids, max_batch_size, curves)
    stored = curves.store.hits if curves.store is not None else 0
    click.echo(
        f"[tree auto: cost curves for batch 1..{max_batch_size} ready in "
        f"{time.perf_counter() - t0:.1f}s ({curves.measurements} measured, {stored} from the "
        "cost store)]",
        err=True,
    )
