"""The ``ersd`` command line: a thin layer over the library (no logic lives here).

Sub-commands live in :mod:`ersd.commands` and are imported only when used, so ``ersd --help``
stays fast and never imports transformers.
"""

from __future__ import annotations

import importlib

import click

#: sub-command name -> "module:attribute" of its click command
COMMANDS: dict[str, str] = {
    "generate": "ersd.commands.generate:generate",
    "models": "ersd.commands.models:models",
    "theory": "ersd.commands.theory:theory",
    "bench": "ersd.commands.bench:bench",
    "serve": "ersd.commands.serve:serve",
    "watermark": "ersd.commands.watermark:watermark",
    "audit": "ersd.commands.watermark:audit",
    "transformers": "ersd.commands.transformers:transformers",
}

_HELP = {
    "generate": "Generate text with speculative sampling (ERSD or a baseline).",
    "models": "List and prepare the bundled offline model weights.",
    "theory": "Acceptance, rank distributions, bounds and optimal trees (tables and figures).",
    "bench": "Run benchmarks and report them.",
    "serve": "Serve a model over an OpenAI-compatible HTTP API (streaming, continuous batching).",
    "watermark": "Watermark key files and the model-free detector (docs/watermark.md).",
    "audit": "Check that a text is exactly what a target samples with a seed (and key).",
    "transformers": "Run ersd inside transformers' generate: export the custom_generate folder.",
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        cmd: click.Command = getattr(importlib.import_module(module), attr)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="ersd")
def main() -> None:
    """ersd: speculative sampling via exponential races, and its baselines."""


if __name__ == "__main__":
    main()
