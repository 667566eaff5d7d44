"""``ersd bench field-multidraft``: the field's multi-draft table in one command
(logic in :mod:`ersd.bench.field`)."""

from __future__ import annotations

from pathlib import Path

import click


def _ints(value: str | None, option: str) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{option} takes comma-separated integers, e.g. 1,2,4") from None


@click.command("field-multidraft")
@click.option(
    "--scale",
    default="cpu",
    show_default=True,
    help="cpu (bundled Qwen2.5-Coder 1.5B <- 0.5B), liu (Liu et al.'s GPU protocol: "
    "Qwen2.5-7B <- 0.5B-Instruct, CNN/DM + ELI5 via `datasets`, n = 1000), smollm, toy.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="JSONL records [default: bench-results/field-multidraft-<scale>.jsonl]; "
    "rerunning with the same file resumes it.",
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write summary.json, tables.md and the figure here when the run ends.",
)
@click.option("--prompts", type=int, default=None, help="Prompts per category.")
@click.option("--max-new-tokens", type=int, default=None)
@click.option("--drafts", default=None, help="Draft counts B, e.g. 1,2,4,6,8.")
@click.option("--methods", default=None, help="Comma-separated subset of the field's methods.")
@click.option("--seeds", default=None, help="Comma-separated seeds.")
@click.option(
    "--exact-contexts",
    type=int,
    default=None,
    help="Contexts per prompt in the exact one-step column (0: none).",
)
@click.option(
    "--calibration-tokens",
    type=int,
    default=None,
    help="Tokens of the calibration run that picks ERSD's equal-budget trees.",
)
@click.option("--dry-run", is_flag=True, help="Print the cells and exit.")
def field_multidraft(
    scale: str,
    out: str | None,
    report_dir: str | None,
    prompts: int | None,
    max_new_tokens: int | None,
    drafts: str | None,
    methods: str | None,
    seeds: str | None,
    exact_contexts: int | None,
    calibration_tokens: int | None,
    dry_run: bool,
) -> None:
    """The multi-draft papers' table: ERSD, GLS, SpecTr, SpecHub, RRS-wor, SpecInfer and SD at
    1-8 drafts of 4 tokens, ERSD's best tree at each node budget, top-k 50, T = 1, block
    efficiency with 95% intervals over prompts, the i.i.d. optimum beside it. Resumable."""
    from ersd.bench.field import describe_plan, preset, run_field, write_report
    from ersd.errors import ErsdError

    try:
        p = preset(scale).replace(
            prompts_per_category=prompts,
            max_new_tokens=max_new_tokens,
            drafts=_ints(drafts, "--drafts"),
            methods=tuple(methods.split(",")) if methods else None,
            seeds=_ints(seeds, "--seeds"),
            exact_contexts=exact_contexts,
            calibration_tokens=calibration_tokens,
        )
        if dry_run:
            for line in describe_plan(p):
                click.echo(line)
            return
        path = Path(out) if out else Path("bench-results") / f"field-multidraft-{scale}.jsonl"
        run_field(p, path, log=lambda m: click.echo(m, err=True))
        click.echo(str(path))
        if report_dir:
            click.echo(str(write_report(path, report_dir)))
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("field-report")
@click.argument("records", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
def field_report(records: tuple[str, ...], out_dir: str) -> None:
    """Tables and figure of field-multidraft RECORDS files, read as one (a partial run works
    too; e.g. a measured run and an exact-column run on the same prompts)."""
    from ersd.bench.field import write_report
    from ersd.errors import ErsdError

    try:
        click.echo(str(write_report(list(records), out_dir)))
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
