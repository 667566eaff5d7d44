"""``ersd bench``: calibrate, run and report benchmarks (logic lives in :mod:`ersd.bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ersd.commands._loading import ModelArgs, model_options

if TYPE_CHECKING:
    from ersd.bench.config import BenchConfig


def _echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def _load(
    config: str,
    quick: bool,
    prompts: int | None,
    max_new_tokens: int | None,
    temperatures: str | None,
    seeds: str | None,
    dtype: str | None = None,
    threads: int | None = None,
    draft_dtype: str | None = None,
    batch_sizes: str | None = None,
) -> BenchConfig:
    from ersd.bench.config import BenchConfigError, _validate, load_config

    cfg = load_config(config, quick=quick)
    try:
        if prompts is not None:
            cfg.prompts.count = prompts
        if max_new_tokens is not None:
            cfg.run.max_new_tokens = max_new_tokens
        if temperatures:
            cfg.run.temperatures = [float(t) for t in temperatures.split(",")]
        if seeds:
            cfg.run.seeds = [int(s) for s in seeds.split(",")]
        if dtype:
            cfg.models.dtype = dtype
        if draft_dtype:
            cfg.models.draft_dtype = draft_dtype
        if threads is not None:
            cfg.models.threads = threads
        if batch_sizes:
            cfg.run.batch_sizes = [int(b) for b in batch_sizes.split(",")]
    except ValueError as exc:
        raise BenchConfigError(
            f"bad command-line override ({exc}); use e.g. --temperatures 0,0.7,1 --seeds 0,1 "
            "--batch-sizes 1,4,8"
        ) from None
    _validate(cfg)
    return cfg


_overrides = [
    click.option("--quick", is_flag=True, help="Apply the config's [quick] overrides."),
    click.option("--prompts", type=int, default=None, help="Evaluation prompts per set."),
    click.option("--max-new-tokens", type=int, default=None),
    click.option("--temperatures", default=None, help="Comma-separated, e.g. 0,0.7,1."),
    click.option("--seeds", default=None, help="Comma-separated, e.g. 0,1."),
    click.option(
        "--dtype",
        type=click.Choice(["bfloat16", "float32", "float16"]),
        default=None,
        help="Override models.dtype (bfloat16 is slow on CPUs without AVX-512 bf16).",
    ),
    click.option(
        "--draft-dtype",
        type=click.Choice(["bfloat16", "float32", "float16", "int8"]),
        default=None,
        help="Override models.draft_dtype (int8: dynamically quantized CPU draft).",
    ),
    click.option("--threads", type=int, default=None, help="Override models.threads."),
    click.option(
        "--batch-sizes",
        default=None,
        help="Override run.batch_sizes, comma-separated, e.g. 1,4,8 (beyond 1: batched runs).",
    ),
]


def _with_overrides(f: Any) -> Any:
    for opt in reversed(_overrides):
        f = opt(f)
    return f


@click.group()
def bench() -> None:
    """Benchmarks: `calibrate` a rank profile, `run` a config, `report` its records, `serve`:
    load-test the HTTP server.

    Configs are TOML files; bundled ones are found by name (`ersd bench configs`).
    """


@bench.command("configs")
def configs() -> None:
    """List the bundled benchmark configs."""
    from ersd.bench.config import bundled_configs, load_config

    for name in bundled_configs():
        click.echo(f"{name:16s} {load_config(name).description}")


@bench.command("run")
@click.argument("config")
@_with_overrides
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    help="JSONL records file [default: bench-results/<config>.jsonl].",
)
@click.option(
    "--profile",
    default=None,
    help="Calibration file (from `ersd bench calibrate`) instead of calibrating here.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and exit.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--prompts-file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Your own prompts (JSONL with a 'prompt' field, or text with blank-line-separated "
    "prompts), run after the config's sets (prompts.file).",
)
def run(
    config: str,
    quick: bool,
    prompts: int | None,
    max_new_tokens: int | None,
    temperatures: str | None,
    seeds: str | None,
    dtype: str | None,
    draft_dtype: str | None,
    threads: int | None,
    batch_sizes: str | None,
    out: str | None,
    profile: str | None,
    dry_run: bool,
    no_progress: bool,
    prompts_file: str | None,
) -> None:
    """Run the benchmark CONFIG (bundled name or .toml path); one JSON line per run."""
    from ersd.errors import ErsdError

    try:
        cfg = _load(
            config,
            quick,
            prompts,
            max_new_tokens,
            temperatures,
            seeds,
            dtype,
            threads,
            draft_dtype,
            batch_sizes,
        )
        if profile:
            cfg.run.profile = profile
        if prompts_file:
            cfg.prompts.file = prompts_file
        path = Path(out) if out else Path("bench-results") / f"{cfg.name}.jsonl"
        if dry_run:
            from ersd.bench.calibration import Calibration
            from ersd.bench.planning import plan

            cal = Calibration.load(cfg.run.profile) if cfg.run.profile else None
            if cfg.run.batch_sizes != [1]:
                click.echo(f"batch sizes {cfg.run.batch_sizes}: every configuration runs batched")
            for t in cfg.run.temperatures:
                entries = plan(cfg, t, cal)
                click.echo(f"T={t}: {len(entries)} configurations")
                for e in entries:
                    click.echo(f"  {e.label}" + (f"  [{e.choice}]" if e.choice else ""))
            if cal is None:
                click.echo("(optimal, cost-aware and dynamic trees are added after calibration)")
            return
        from ersd.bench.running import run_bench

        run_bench(cfg, path, progress=not no_progress, log=_echo_err)
        click.echo(str(path))
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None


@bench.command("calibrate")
@click.argument("config")
@click.option("--quick", is_flag=True, help="Apply the config's [quick] overrides.")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    required=True,
    help="Calibration JSON file (rank profiles, cost curves, tree choices).",
)
@click.option("--no-costs", is_flag=True, help="Only the rank profile; skip timing forwards.")
def calibrate_cmd(config: str, quick: bool, out: str, no_costs: bool) -> None:
    """Measure the ERSD rank profile (per depth) and forward costs on the calibration split."""
    from ersd.bench.calibration import calibrate
    from ersd.bench.config import load_config
    from ersd.errors import ErsdError

    try:
        cfg = load_config(config, quick=quick)
        cal = calibrate(cfg, log=_echo_err, measure_cost=not no_costs, progress=True)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        cal.save(out)
        click.echo(json.dumps({"out": out, **cal.meta.get("stats", {})}))
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None


@bench.command("report")
@click.argument("records", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where report.md, summary.json and the PNGs go [default: next to RECORDS].",
)
def report(records: tuple[str, ...], out_dir: str | None) -> None:
    """Aggregate RECORDS (JSONL) into a markdown table with 95% intervals and PNG figures."""
    from ersd.bench.report import write_report
    from ersd.errors import ErsdError

    try:
        target = out_dir or str(Path(records[0]).with_suffix("")) + "-report"
        paths = write_report(list(records), target)
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(paths["report"].read_text())
    click.echo(json.dumps({k: str(v) for k, v in paths.items()}))


@bench.command("pairs")
@click.argument("records", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--against",
    multiple=True,
    default=["target-only"],
    show_default=True,
    help="Reference configuration (repeatable), e.g. 'hf-prompt-lookup' or 'sd chain:{k}' "
    "({k}: each configuration's own budget).",
)
def pairs(records: tuple[str, ...], against: tuple[str, ...]) -> None:
    """Paired ratios of RECORDS (JSONL): every configuration against a reference on the same
    prompt, temperature and seed, with 95% intervals over the runs."""
    from ersd.bench.aggregate import read_all
    from ersd.bench.pairs import pairs_report
    from ersd.errors import ErsdError

    try:
        _, results, _ = read_all(list(records))
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(pairs_report(results, against), nl=False)


def _concurrency(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        levels = [int(c) for c in value.split(",")]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter(
            f"{value!r}: give client counts >= 1 separated by commas, e.g. 1,4,8"
        )
    return levels


@bench.command("serve")
@model_options(dtype="float32", dtype_help="dtype of the started server (as `ersd serve`).")
@click.option(
    "--url",
    default=None,
    help="Load-test a running server (the model options are then ignored) [default: start "
    "`ersd serve` with the model options on a free loopback port, stopped at the end].",
)
@click.option("--method", default="ersd", show_default=True, help="Method of the ERSD rows.")
@click.option(
    "--tree",
    default=None,
    help="Tree of the speculative requests (and of a started server) [default: the server's].",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Rows of a started server's continuous batch.",
)
@click.option(
    "--concurrency",
    default="1,4,8",
    show_default=True,
    callback=_concurrency,
    help="Concurrent clients per level, comma-separated.",
)
@click.option(
    "--requests", type=click.IntRange(1), default=3, show_default=True, help="Per client."
)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=1.0, show_default=True)
@click.option(
    "--warmup", type=click.IntRange(0), default=1, show_default=True, help="Unmeasured requests."
)
@click.option("--no-baseline", is_flag=True, help="Skip the target-only rows (tree 'none').")
@click.option(
    "--library",
    is_flag=True,
    help="Before starting the server, run the concurrency-1 level through the library in this "
    "process (same prompts, seeds and settings): the batch-1 figure the server is held against.",
)
@click.option(
    "--watermark-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Start the server watermarking with this key (and --allow-watermark-opt-out) and run "
    'every level watermarked and with "watermark": false side by side; with --detect-texts, '
    "also time POST /v1/watermark/detect.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Rounds over every level and mode (the modes' order reversed every other round).",
)
@click.option(
    "--detect-texts",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="With a watermark: texts (HumanEval prompts) scored by /v1/watermark/detect, timed.",
)
@click.option(
    "--startup-timeout",
    type=float,
    default=900.0,
    show_default=True,
    help="Seconds a started server may take to load.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="bench-results/serve.jsonl",
    show_default=True,
    help="JSONL file: one row per (level, mode).",
)
def serve_load(
    models: ModelArgs,
    url: str | None,
    method: str,
    tree: str | None,
    max_batch_size: int,
    concurrency: list[int],
    requests: int,
    max_tokens: int,
    temperature: float,
    warmup: int,
    no_baseline: bool,
    library: bool,
    watermark_key_file: str | None,
    repeats: int,
    detect_texts: int,
    startup_timeout: float,
    out: str,
) -> None:
    """Load-test `ersd serve` with concurrent streaming clients: throughput, TTFT and ITL of the
    speculative server against target-only decoding on the same server (docs/serve.md)."""
    from contextlib import nullcontext

    from ersd.bench.serve_load import (
        TABLE_HEADER,
        LoadSettings,
        detect_throughput,
        load_prompts,
        local_server,
        run_load,
        table_row,
        watermark_ratios,
    )
    from ersd.errors import ErsdError

    try:
        settings = LoadSettings(
            concurrency=concurrency,
            requests=requests,
            max_tokens=max_tokens,
            temperature=temperature,
            method=method,
            tree=tree,
            baseline=not no_baseline,
            warmup=warmup,
            watermark_compare=watermark_key_file is not None,
            repeats=repeats,
        )
        if detect_texts and watermark_key_file is None:
            raise click.UsageError("--detect-texts goes with --watermark-key-file")
        serve_args = [
            *models.cli_args(),
            "--method",
            method,
            "--max-batch-size",
            str(max_batch_size),
        ]
        serve_args += ["--tree", tree] if tree else []
        if watermark_key_file is not None:
            serve_args += ["--watermark-key-file", watermark_key_file, "--allow-watermark-opt-out"]
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        server = nullcontext(url) if url else local_server(serve_args, timeout=startup_timeout)
        lib_rows: list[dict[str, Any]] = []
        if library:  # before the server exists: the two never share the CPU
            import gc

            from ersd.bench.serve_load import library_rows
            from ersd.commands._loading import load_pair

            pair = load_pair(models)
            _echo_err(f"[library run in this process: {pair.summary()}]")
            lib_rows = library_rows(pair.target, pair.draft, settings)
            del pair
            gc.collect()
        with server as base, path.open("w") as f:
            _echo_err(f"[load test of {base}]")
            click.echo(TABLE_HEADER)

            def on_row(row: dict[str, Any]) -> None:
                click.echo(table_row(row))
                f.write(json.dumps(row) + "\n")
                f.flush()

            for row in lib_rows:
                on_row(row)
            root = base.rstrip("/").removesuffix("/v1")
            rows = run_load(root, settings, on_row=on_row)
            for r in watermark_ratios(rows):
                click.echo(
                    f"watermarked / unwatermarked tokens/s at concurrency {r['concurrency']}: "
                    f"median {r['median']:.3f} over {len(r['ratios'])} round(s) "
                    f"[{r['min']:.3f}, {r['max']:.3f}]"
                )
                f.write(json.dumps({"kind": "watermark_ratio", **r}) + "\n")
            if detect_texts:
                texts = [t * 3 for t in load_prompts(detect_texts)]
                d = detect_throughput(root, texts)
                click.echo(
                    f"/v1/watermark/detect: {d['tokens_per_s']:.0f} tokens/s, "
                    f"{d['requests_per_s']:.1f} requests/s ({d['texts']} texts, "
                    f"{d['tokens']} tokens, median of 3 rounds)"
                )
                f.write(json.dumps({"kind": "detect_throughput", **d}) + "\n")
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


@bench.command("watermark")
@click.argument("parts", nargs=-1, required=True)
@model_options(dtype="float32")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder.")
@click.option("--prompts", type=int, default=40, show_default=True, help="Per prompt set.")
@click.option("--seeds", default="0,1", show_default=True, help="Seeds per prompt.")
@click.option("--temperatures", default="0.7,1", show_default=True)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--human-texts", type=int, default=2000, show_default=True, help="fpr: texts.")
@click.option("--speed-prompts", type=int, default=8, show_default=True)
@click.option("--speed-tokens", type=int, default=64, show_default=True)
@click.option("--trees", default="chain:6,multi:2x3", show_default=True, help="speed, identity.")
@click.option("--compare-prompts", type=int, default=12, show_default=True, help="compare.")
@click.option(
    "--compare-batch",
    type=int,
    default=1,
    show_default=True,
    help="compare: > 1 generates in batches (detection and tokens/call only, no timings).",
)
@click.option(
    "--attacks",
    "attack_names",
    default="all",
    show_default=True,
    help="attacks: among replace, insert, delete, cut-paste, paraphrase (comma-separated).",
)
@click.option("--attack-texts", type=int, default=40, show_default=True, help="attacks: texts.")
@click.option(
    "--attack-rates",
    default="0.1,0.2,0.3,0.5",
    show_default=True,
    help="attacks: fractions of tokens replaced / inserted / deleted.",
)
@click.option(
    "--span-tokens", default="64,256", show_default=True, help="cut-paste: marked span lengths."
)
@click.option(
    "--human-tokens",
    default="1024,4096",
    show_default=True,
    help="cut-paste: human text around the span.",
)
@click.option(
    "--paraphraser",
    default="qwen2.5-coder-0.5b",
    show_default=True,
    help="paraphrase: a local instruct model (name as --target).",
)
@click.option("--paraphrase-temperature", type=float, default=0.7, show_default=True)
@click.option(
    "--paraphrase-texts",
    type=int,
    default=None,
    help="paraphrase: only the first N texts (default: all; the paraphraser is the slow part).",
)
@click.option("--report-only", is_flag=True, help="Rewrite report.md from the records in --out.")
def watermark_bench(
    parts: tuple[str, ...],
    models: ModelArgs,
    out_dir: str,
    prompts: int,
    seeds: str,
    temperatures: str,
    max_new_tokens: int,
    batch_size: int,
    human_texts: int,
    speed_prompts: int,
    speed_tokens: int,
    trees: str,
    compare_prompts: int,
    compare_batch: int,
    attack_names: str,
    attack_texts: int,
    attack_rates: str,
    span_tokens: str,
    human_tokens: str,
    paraphraser: str,
    paraphrase_temperature: float,
    paraphrase_texts: int | None,
    report_only: bool,
) -> None:
    """The watermark benchmark: PARTS among fpr, detect, robust, speed, compare, attacks (or all).

    fpr needs only the target's tokenizer; detect/robust sample from the target (batched
    target-only, which gives the same text as watermarked ERSD; checked on a subset with the
    draft); speed runs watermarked and unwatermarked ERSD side by side; attacks edits, pastes
    and paraphrases watermarked texts and scores them (docs/watermark-detection.md#attacks).
    See docs/watermark.md."""
    import shlex
    import sys

    from ersd.bench import watermark as wb
    from ersd.commands._loading import load_pair
    from ersd.errors import ErsdError

    chosen = list(wb.PARTS) if parts == ("all",) else list(parts)
    bad = [p for p in chosen if p not in wb.PARTS]
    if bad:
        raise click.UsageError(f"unknown part(s) {bad}; choose among {', '.join(wb.PARTS)}, all")
    out = Path(out_dir)
    if report_only:
        click.echo(wb.write_report(out).read_text())
        return
    try:
        tree_list = [t.strip() for t in trees.split(",") if t.strip()]
        temps = [float(t) for t in temperatures.split(",")]
        seed_list = [int(s) for s in seeds.split(",")]
    except ValueError:
        raise click.UsageError("--temperatures and --seeds are comma-separated numbers") from None
    attack_settings = None
    if "attacks" in chosen:
        from ersd.bench.watermark_attacks import parse_settings

        try:  # before any model loads: a bad option is a one-line error at once
            attack_settings = parse_settings(
                attack_names,
                attack_rates,
                span_tokens,
                human_tokens,
                attack_texts,
                paraphraser,
                paraphrase_temperature,
                paraphrase_texts,
            )
        except ErsdError as exc:
            raise click.UsageError(str(exc)) from None
    try:
        needs_model = any(p in chosen for p in ("detect", "robust", "speed", "compare", "attacks"))
        if needs_model:
            pair = load_pair(models)
            target, draft, tok = pair.target, pair.draft, pair.target.tokenizer
            setup = pair.summary()
        else:
            from ersd.models.hf_load import load_tokenizer

            target, draft, tok, setup = None, None, load_tokenizer(models.target), models.target
        out.mkdir(parents=True, exist_ok=True)
        (out / "meta.json").write_text(
            json.dumps({"command": shlex.join(["ersd", *sys.argv[1:]]), "setup": setup})
        )
        path = wb.run(
            chosen,
            out,
            target=target,
            draft=draft,
            tokenizer=tok,
            prompts=prompts,
            seeds=seed_list,
            temperatures=temps,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            human_texts_max=human_texts,
            speed_prompts=speed_prompts,
            speed_tokens=speed_tokens,
            trees=tree_list,
            compare_prompts=compare_prompts,
            compare_batch=compare_batch,
            attacks=attack_settings,
            log=_echo_err,
        )
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(path.read_text())


from ersd.commands.bench_field import field_multidraft, field_report  # noqa: E402

bench.add_command(field_multidraft)
bench.add_command(field_report)
