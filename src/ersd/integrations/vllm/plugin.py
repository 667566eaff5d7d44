"""The ``vllm.general_plugins`` entry point ``ersd`` (pyproject.toml).

vLLM calls :func:`register` in every process it starts (front end, engine core, workers).  It
checks the vLLM version against the tested minor versions, checks that every internal the plugin
patches is still there with the expected signature, runs a small self-test of the row race against
:func:`ersd.race.race_winner`, and only then patches.  On an unknown vLLM it raises
:class:`~ersd.integrations.vllm.params.VllmIntegrationError` instead of patching blindly; set
``ERSD_VLLM_DISABLE=1`` (or leave ``ersd`` out of ``VLLM_PLUGINS``) to run vLLM without ERSD.
"""

from __future__ import annotations

import inspect
import logging
import os

import torch

from ersd.integrations.vllm.params import VllmIntegrationError, parse_extra_args
from ersd.probs import logits_to_probs
from ersd.race import RaceNoise, extend_key, race_winner, root_key

log = logging.getLogger(__name__)

#: vLLM minor versions the patches were written against and tested with.
SUPPORTED_VLLM = ("0.32",)


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def check_version(version: str) -> None:
    minor = ".".join(version.split("+")[0].split(".")[:2])
    if minor not in SUPPORTED_VLLM:
        raise VllmIntegrationError(
            f"the ersd vLLM plugin supports vLLM {', '.join(SUPPORTED_VLLM)}.x but found "
            f"vLLM {version}; install a supported vLLM (CPU: bash scripts/setup-vllm.sh), or run "
            "vLLM without the plugin (ERSD_VLLM_DISABLE=1, or VLLM_PLUGINS without 'ersd')"
        )


def check_targets() -> None:
    from ersd.integrations.vllm.patches import targets

    for cls, name, _, expected in targets():
        fn = getattr(cls, name, None)
        if fn is None:
            raise VllmIntegrationError(
                f"vLLM {vllm_version()} has no {cls.__name__}.{name}; the ersd plugin cannot "
                "patch it"
            )
        fn = getattr(fn, "_ersd_original", fn)
        names = tuple(inspect.signature(fn).parameters)[: len(expected)]
        if names != expected:
            raise VllmIntegrationError(
                f"vLLM {vllm_version()}'s {cls.__name__}.{name} takes {names}, the ersd plugin "
                f"expects {expected}; this vLLM is not one the plugin was tested with"
            )


def self_test() -> None:
    """The batched row race must pick exactly ``ersd.race.race_winner``'s tokens."""
    from ersd.integrations.vllm.rows import race_winners

    params = parse_extra_args({"ersd_seed": 7, "ersd_temperature": 0.8, "ersd_top_k": 50})
    assert params is not None
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 257, generator=gen, dtype=torch.float32) * 3
    key = root_key(7, [1, 2, 3])
    keys = [key, extend_key(key, 5), extend_key(extend_key(key, 5), 9)]
    got = race_winners(logits, keys, [params] * 3).tolist()
    noise = RaceNoise(257)
    want = [
        race_winner(logits_to_probs(logits[r], params.sampling), noise.exponentials(k))
        for r, k in enumerate(keys)
    ]
    if got != want:
        raise VllmIntegrationError(
            f"ersd vLLM plugin self-test failed: row race gave {got}, ersd.race gave {want}"
        )


def register() -> None:
    """Entry point: guard, self-test, patch (safe to call more than once)."""
    if os.environ.get("ERSD_VLLM_DISABLE", "") not in ("", "0"):
        log.info("ersd: vLLM plugin disabled by ERSD_VLLM_DISABLE")
        return
    check_version(vllm_version())
    check_targets()
    self_test()
    from ersd.integrations.vllm.patches import apply

    apply()
