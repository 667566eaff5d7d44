"""``ersd transformers export DIR``: the folder form of ersd's transformers integration.

A thin layer over :func:`ersd.integrations.transformers.export_folder` (docs/transformers.md).
"""

from __future__ import annotations

import click


@click.group()
def transformers() -> None:
    """ersd inside Hugging Face transformers' generate (docs/transformers.md)."""


@transformers.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace the files if they exist.")
def export(directory: str, force: bool) -> None:
    """Write DIRECTORY/custom_generate/{generate.py,requirements.txt}: then
    model.generate(custom_generate=DIRECTORY, trust_remote_code=True, draft_model=...) runs ersd
    (a folder you can also push to the Hugging Face Hub)."""
    from ersd.errors import ErsdError
    from ersd.integrations.transformers import export_folder

    try:
        written = export_folder(directory, overwrite=force)
    except (ErsdError, OSError) as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    for path in written:
        click.echo(str(path))
