"""The vLLM plugin's torch race noise: the core's :mod:`ersd.race_torch` (one race module serves
the core loop and the plugin; kept under this name for the plugin's callers)."""

from ersd.race_torch import (  # noqa: F401
    _s64,
    philox_blocks,
    race_exponentials_torch,
    ziggurat_tables,
)

__all__ = ["philox_blocks", "race_exponentials_torch", "ziggurat_tables"]
