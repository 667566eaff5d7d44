"""ERSD inside vLLM: a ``vllm.general_plugins`` plugin and request helpers (docs/vllm.md).

Importing this package does not import vLLM; :func:`ersd_sampling_params` does.
"""

from ersd.integrations.vllm.params import (
    EXTRA_KEYS,
    ErsdRequestParams,
    VllmIntegrationError,
    check_request,
    ersd_extra_args,
    ersd_sampling_params,
    parse_extra_args,
)

__all__ = [
    "EXTRA_KEYS",
    "ErsdRequestParams",
    "VllmIntegrationError",
    "check_request",
    "ersd_extra_args",
    "ersd_sampling_params",
    "parse_extra_args",
]
