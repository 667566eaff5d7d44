"""ERSD requests for vLLM: building them, reading them back, refusing what ERSD cannot honour.

An ERSD request is an ordinary vLLM request with **greedy** vLLM settings (``temperature=0``) and
flat ``extra_args`` (the OpenAI server's ``vllm_xargs`` only carries flat values)::

    ersd_seed         int, required: marks the request as ERSD and keys its races
    ersd_temperature  float >= 0 (default 1.0; 0 = greedy)
    ersd_top_k        int >= 1 (optional)
    ersd_top_p        float in (0, 1] (optional)
    ersd_watermark_key_file  path of a private watermark key file (optional): every token is the
                      winner of the secret-keyed race, exactly as ``ersd.generate(...,
                      watermark=ersd.load_watermark(path))`` (docs/watermark.md#vllm)
    ersd_watermark_context   int (optional): the watermark's context width, overriding the file's
    ersd_race_scheme  "v1" (default) or "v2" (optional): how the races are drawn, as
                      ``ersd.generate(..., race_scheme=)`` (docs/race-schemes.md); not with a
                      watermark (its races are the key's PRF)

vLLM's greedy verification then performs ERSD's check on race-perturbed rows (docs/vllm.md).
This module imports vLLM lazily: the request helpers need it, the parsing and checks do not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ersd.errors import ErsdError
from ersd.probs import SamplingParams as ErsdSamplingParams
from ersd.watermark.settings import Watermark, load_watermark

#: The flat extra-argument names an ERSD request may carry.
EXTRA_KEYS = (
    "ersd_seed",
    "ersd_temperature",
    "ersd_top_k",
    "ersd_top_p",
    "ersd_watermark_key_file",
    "ersd_watermark_context",
    "ersd_race_scheme",
)


class VllmIntegrationError(ErsdError):
    """The vLLM plugin cannot serve this request or this vLLM installation."""


@dataclass(frozen=True)
class ErsdRequestParams:
    """What the plugin reads from one request's ``extra_args``."""

    seed: int
    sampling: ErsdSamplingParams
    #: the secret-keyed race this request's tokens win (None: the plain race of the seed)
    watermark: Watermark | None = None
    #: how the plain race's noise is drawn (:data:`ersd.race.RACE_SCHEMES`)
    race_scheme: str = "v1"

    @property
    def group(self) -> tuple[float, int | None, float | None]:
        """Requests with equal groups share one ``logits_to_probs`` call."""
        s = self.sampling
        return (s.temperature, s.top_k, s.top_p)


def parse_extra_args(extra_args: dict[str, Any] | None) -> ErsdRequestParams | None:
    """The ERSD settings in ``extra_args``, or None for an ordinary request.

    Raises :class:`VllmIntegrationError` on ERSD keys without ``ersd_seed`` or on bad values.
    """
    if not extra_args:
        return None
    present = [k for k in extra_args if isinstance(k, str) and k.startswith("ersd_")]
    if not present:
        return None
    unknown = [k for k in present if k not in EXTRA_KEYS]
    if unknown:
        raise VllmIntegrationError(
            f"unknown ERSD extra argument(s) {unknown}; the known ones are {list(EXTRA_KEYS)}"
        )
    if "ersd_seed" not in extra_args:
        raise VllmIntegrationError(
            f"ERSD settings {present} were given without ersd_seed; add ersd_seed=<int> to "
            "extra_args (vllm_xargs with the OpenAI client) to make the request an ERSD request"
        )
    seed = extra_args["ersd_seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise VllmIntegrationError(f"ersd_seed must be an integer >= 0, got {seed!r}")
    temperature = extra_args.get("ersd_temperature", 1.0)
    top_k = extra_args.get("ersd_top_k")
    top_p = extra_args.get("ersd_top_p")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise VllmIntegrationError(f"ersd_temperature must be a number, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise VllmIntegrationError(f"ersd_top_k must be an integer >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, int | float)):
        raise VllmIntegrationError(f"ersd_top_p must be a number in (0, 1], got {top_p!r}")
    try:
        sampling = ErsdSamplingParams(
            temperature=float(temperature),
            top_k=top_k,
            top_p=None if top_p is None else float(top_p),
        )
    except ErsdError as e:
        raise VllmIntegrationError(f"bad ERSD sampling settings in extra_args: {e}") from e
    watermark = _watermark(extra_args, sampling)
    return ErsdRequestParams(
        seed=seed,
        sampling=sampling,
        watermark=watermark,
        race_scheme=_race_scheme(extra_args, watermark),
    )


def _race_scheme(extra_args: dict[str, Any], watermark: Watermark | None) -> str:
    from ersd.race import DEFAULT_RACE_SCHEME, check_race_scheme

    scheme = extra_args.get("ersd_race_scheme", DEFAULT_RACE_SCHEME)
    try:
        check_race_scheme(scheme)
    except ValueError as e:
        raise VllmIntegrationError(f"ersd_{e}") from None
    if watermark is not None and scheme != DEFAULT_RACE_SCHEME:
        raise VllmIntegrationError(
            f"ersd_race_scheme={scheme!r} does not apply to a watermarked request (its races are "
            f"the key's PRF); leave ersd_race_scheme unset (or {DEFAULT_RACE_SCHEME!r}) with "
            "ersd_watermark_key_file"
        )
    return str(scheme)


def _watermark(extra_args: dict[str, Any], sampling: ErsdSamplingParams) -> Watermark | None:
    path = extra_args.get("ersd_watermark_key_file")
    width = extra_args.get("ersd_watermark_context")
    if path is None:
        if width is not None:
            raise VllmIntegrationError(
                "ersd_watermark_context goes with ersd_watermark_key_file; add the key file"
            )
        return None
    if not isinstance(path, str) or not path:
        raise VllmIntegrationError(
            f"ersd_watermark_key_file must be a file path (a string), got {type(path).__name__}"
        )
    if width is not None and (isinstance(width, bool) or not isinstance(width, int)):
        raise VllmIntegrationError(f"ersd_watermark_context must be an integer, got {width!r}")
    if sampling.greedy:
        raise VllmIntegrationError(
            "a watermark needs sampling: at ersd_temperature 0 the text is the target's argmax "
            "and carries no mark; use ersd_temperature > 0 (e.g. 0.7 or 1)"
        )
    try:
        stat = os.stat(path)
    except OSError:
        raise VllmIntegrationError(
            f"watermark key file {path} does not exist or cannot be read; make one with "
            "`ersd watermark keygen --out FILE`"
        ) from None
    try:  # read once per file version: a request costs a dict lookup, not a file read
        return _load(path, width, stat.st_mtime_ns, stat.st_size)
    except ErsdError as e:
        raise VllmIntegrationError(f"ersd_watermark_key_file: {e}") from None


@lru_cache(maxsize=64)
def _load(path: str, width: int | None, mtime_ns: int, size: int) -> Watermark:
    return load_watermark(path, context_width=width)


def check_request(params: Any, *, async_scheduling: bool = False) -> ErsdRequestParams | None:
    """Refuse vLLM settings that would silently change an ERSD request's distribution.

    ``params`` is a ``vllm.SamplingParams``. Returns the ERSD settings (None: ordinary request).
    """
    ersd = parse_extra_args(getattr(params, "extra_args", None))
    if ersd is None:
        return None
    problems: list[str] = []
    if params.temperature != 0:
        problems.append(
            f"temperature={params.temperature} (must be 0: vLLM's greedy verification runs the "
            "race; give ERSD's temperature as ersd_temperature)"
        )
    if params.top_k not in (0, -1) or params.top_p != 1.0 or params.min_p != 0.0:
        problems.append("vLLM top_k/top_p/min_p (use ersd_top_k / ersd_top_p instead)")
    if (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    ):
        problems.append("presence/frequency/repetition penalties")
    if params.logit_bias:
        problems.append("logit_bias")
    if params.allowed_token_ids:
        problems.append("allowed_token_ids")
    if params.bad_words:
        problems.append("bad_words")
    if params.min_tokens:
        problems.append("min_tokens (it masks EOS in the verification rows)")
    if params.structured_outputs is not None:
        problems.append("structured outputs / guided decoding")
    if params.logprobs is not None:
        problems.append("logprobs (the rows vLLM sees are the race's, not the model's)")
    if params.n != 1:
        problems.append(
            f"n={params.n} (all samples would share one seed; send n requests with "
            "different ersd_seed values)"
        )
    if async_scheduling:
        problems.append("async scheduling (start vLLM with --no-async-scheduling)")
    if problems:
        raise VllmIntegrationError(
            "this ERSD request cannot be served exactly; remove or change: " + "; ".join(problems)
        )
    return ersd


def ersd_extra_args(
    seed: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    watermark_key_file: str | os.PathLike[str] | None = None,
    watermark_context: int | None = None,
    race_scheme: str | None = None,
) -> dict[str, Any]:
    """The flat extra arguments of an ERSD request (``vllm_xargs`` for the OpenAI client);
    ``watermark_key_file``: watermark it with that key (a path the vLLM process can read);
    ``race_scheme``: ``"v1"`` (the default) or ``"v2"`` (docs/race-schemes.md)."""
    out: dict[str, Any] = {"ersd_seed": int(seed), "ersd_temperature": float(temperature)}
    if top_k is not None:
        out["ersd_top_k"] = int(top_k)
    if top_p is not None:
        out["ersd_top_p"] = float(top_p)
    if watermark_key_file is not None:
        out["ersd_watermark_key_file"] = os.fspath(watermark_key_file)
    if watermark_context is not None:
        out["ersd_watermark_context"] = watermark_context
    if race_scheme is not None:
        out["ersd_race_scheme"] = race_scheme
    parse_extra_args(out)  # validate now, not in the engine
    return out


def ersd_sampling_params(
    seed: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    watermark_key_file: str | os.PathLike[str] | None = None,
    watermark_context: int | None = None,
    race_scheme: str | None = None,
    **vllm_kwargs: Any,
) -> Any:
    """A ``vllm.SamplingParams`` for an ERSD request (other vLLM settings via ``vllm_kwargs``,
    e.g. ``max_tokens``, ``stop``, ``ignore_eos``); ``watermark_key_file`` and ``race_scheme``
    as :func:`ersd_extra_args`."""
    from vllm import SamplingParams

    if "temperature" in vllm_kwargs or "extra_args" in vllm_kwargs:
        raise VllmIntegrationError(
            "ersd_sampling_params sets vLLM's temperature (0) and extra_args itself; pass ERSD's "
            "temperature as temperature= and no extra_args"
        )
    sp = SamplingParams(
        temperature=0.0,
        extra_args=ersd_extra_args(
            seed,
            temperature,
            top_k,
            top_p,
            watermark_key_file=watermark_key_file,
            watermark_context=watermark_context,
            race_scheme=race_scheme,
        ),
        **vllm_kwargs,
    )
    check_request(sp)
    return sp
