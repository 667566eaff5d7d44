"""The benchmark harness's own error (its own module, so every part of the harness can raise it
without importing the config parser)."""

from __future__ import annotations

from ersd.errors import ErsdError


class BenchConfigError(ErsdError):
    """A benchmark config file is missing, malformed, or holds an unknown key or a bad value."""


__all__ = ["BenchConfigError"]
