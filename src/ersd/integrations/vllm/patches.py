"""The three patches that put ERSD's race into vLLM's V1 model runner (vLLM 0.32).

ERSD requests are greedy at the vLLM level, so vLLM verifies their drafts by comparing each draft
token with the argmax of the target's row and emits that argmax at the first mismatch or as the
bonus token.  The patches make that argmax the ERSD race winner of the row's own context:

1. ``GPUModelRunner._sample`` (the CPU runner inherits it): before vLLM samples, each ERSD row of
   the logits (one per request without drafts; ``k + 1`` per request with ``k`` drafts) becomes a
   one-hot row (0 at the race winner, -inf elsewhere).  Row ``j``'s key is the key of the
   committed context extended by the request's first ``j`` draft tokens.  After sampling, the key
   of each request's new context (committed + emitted tokens) is kept for the drafter.
2. ``GPUModelRunner.propose_draft_token_ids``: hands those per-request keys to the drafter before
   it drafts, and takes them back after.
3. ``SpecDecodeBaseProposer._sample_draft_tokens`` (draft-model and EAGLE proposers): the greedy
   draft token of an ERSD request becomes the race winner of the *draft* probabilities under the
   same key, so the drafter runs the same race as the verifier; the key then advances by the
   drafted token.  vLLM's ngram and suffix drafters need no patch (their proposals are
   deterministic; verification stays exact whatever is proposed).

Ordinary requests in the same batch are left as they are.  Requests are checked (and refused with
:class:`~ersd.integrations.vllm.params.VllmIntegrationError`) in ``InputProcessor._validate_params``
in the front-end process, before they reach the engine.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from ersd.integrations.vllm.params import (
    ErsdRequestParams,
    VllmIntegrationError,
    check_request,
    parse_extra_args,
)
from ersd.integrations.vllm.rows import ContextKeys, race_winners
from ersd.race import extend_key

log = logging.getLogger(__name__)

_MARK = "_ersd_patched"
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID for rejected positions


class _RunnerState:
    """Per-runner ERSD bookkeeping (attached to the runner object)."""

    def __init__(self) -> None:
        self.params: dict[str, ErsdRequestParams | None] = {}
        self.keys = ContextKeys()
        # batch row -> [key of the context after this step's tokens, params], for the drafter
        self.draft_rows: dict[int, list[Any]] = {}


def _state(runner: Any) -> _RunnerState:
    st = runner.__dict__.get("_ersd_state")
    if st is None:
        st = runner.__dict__["_ersd_state"] = _RunnerState()
    return st


def _ersd_requests(runner: Any, st: _RunnerState) -> list[tuple[int, str, ErsdRequestParams]]:
    """(batch index, request id, ERSD settings) of the ERSD requests in the current batch."""
    out = []
    req_ids = runner.input_batch.req_ids
    for i, rid in enumerate(req_ids):
        if rid is None:
            continue
        if rid not in st.params:
            st.params[rid] = parse_extra_args(runner.requests[rid].sampling_params.extra_args)
        p = st.params[rid]
        if p is not None:
            out.append((i, rid, p))
    if len(st.params) > 4 * max(len(req_ids), 16):
        live = set(req_ids)
        st.params = {r: p for r, p in st.params.items() if r in live}
        st.keys.retain(live)
    return out


def row_keys(key: int, drafts: list[int]) -> list[int]:
    """Race keys of one request's verification rows: the committed context's ``key``, then
    extended by each draft token before the row (row ``j`` races the context plus ``j`` drafts)."""
    keys = [key]
    for t in drafts:
        keys.append(extend_key(keys[-1], t))
    return keys


def draft_winners(logits: Any, keys: list[int], params: list[ErsdRequestParams]) -> Any:
    """The drafter's tokens: the verifier's race (:func:`race_winners`) at the same keys."""
    return race_winners(logits, keys, params)


def _committed_key(runner: Any, st: _RunnerState, rid: str, p: ErsdRequestParams) -> int:
    req = runner.requests[rid]
    if req.prompt_token_ids is None:
        raise VllmIntegrationError(
            f"ERSD request {rid} has no prompt token ids (prompt embeddings?); ERSD keys its races "
            "by the token context, so send token or text prompts"
        )
    return st.keys.key(rid, p.seed, req.prompt_token_ids, req.output_token_ids, p.watermark)


def patched_sample(orig: Any) -> Any:
    def _sample(self: Any, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        st = _state(self)
        st.draft_rows = {}
        reqs = _ersd_requests(self, st) if logits is not None else []
        if not reqs:
            return orig(self, logits, spec_decode_metadata)
        assert logits is not None
        if spec_decode_metadata is None:
            n_draft = [0] * self.input_batch.num_reqs
            drafts: list[int] = []
        else:
            n_draft = list(spec_decode_metadata.num_draft_tokens)
            drafts = spec_decode_metadata.draft_token_ids.tolist()
        starts_row, starts_draft = [], []
        r = d = 0
        for n in n_draft:
            starts_row.append(r)
            starts_draft.append(d)
            r += n + 1
            d += n
        if r != logits.shape[0]:
            raise VllmIntegrationError(
                f"ERSD plugin: {logits.shape[0]} logits rows but the batch layout says {r}; "
                "this vLLM build lays out sampling rows differently from vLLM 0.32"
            )
        rows: list[int] = []
        keys: list[int] = []
        params: list[ErsdRequestParams] = []
        base_keys: dict[int, int] = {}
        for i, rid, p in reqs:
            key = _committed_key(self, st, rid, p)
            base_keys[i] = key
            start = starts_draft[i]
            keys.extend(row_keys(key, drafts[start : start + n_draft[i]]))
            rows.extend(range(starts_row[i], starts_row[i] + n_draft[i] + 1))
            params.extend([p] * (n_draft[i] + 1))
        layout = [(i, starts_row[i], starts_draft[i], n_draft[i]) for i, _, _ in reqs]
        idx = torch.tensor(rows, device=logits.device)
        winners = race_winners(logits[idx], keys, params).to(logits.device)
        one_hot = torch.full(
            (len(rows), logits.shape[1]), float("-inf"), dtype=logits.dtype, device=logits.device
        )
        one_hot.scatter_(1, winners.view(-1, 1), 0.0)
        logits[idx] = one_hot
        out = orig(self, logits, spec_decode_metadata)
        _write_verified(out.sampled_token_ids, layout, winners.tolist(), rows, drafts)
        if getattr(self, "speculative_config", None) is not None:
            sampled = out.sampled_token_ids.tolist()
            vocab = logits.shape[1]
            for i, _rid, p in reqs:
                key = base_keys[i]
                for t in sampled[i]:
                    if 0 <= t < vocab:
                        key = extend_key(key, t)
                st.draft_rows[i] = [key, p]
        return out

    return _sample


def _write_verified(
    sampled: torch.Tensor,
    layout: list[tuple[int, int, int, int]],
    winners: list[int],
    rows: list[int],
    drafts: list[int],
) -> None:
    """Write each ERSD request's greedy-verification outcome into vLLM's sampled-token buffer.

    vLLM's own verification of one-hot rows gives the same tokens; writing them makes ERSD
    independent of the CPU build's rejection kernels, which corrupt greedy rows batched with
    random ones under draft-model speculative decoding (docs/vllm.md)."""
    winner_of_row = dict(zip(rows, winners, strict=True))
    width = sampled.shape[1]
    for i, row0, draft0, n in layout:
        emitted = []
        for j in range(n + 1):
            w = winner_of_row[row0 + j]
            emitted.append(w)
            if j == n or drafts[draft0 + j] != w:
                break
        line = emitted + [PLACEHOLDER] * (width - len(emitted))
        sampled[i] = torch.tensor(line, dtype=sampled.dtype, device=sampled.device)


def patched_propose(orig: Any) -> Any:
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        st = _state(self)
        if drafter is None or not st.draft_rows:
            return orig(self, *args, **kwargs)
        drafter._ersd_rows = st.draft_rows
        try:
            return orig(self, *args, **kwargs)
        finally:
            drafter._ersd_rows = None

    return propose_draft_token_ids


def patched_sample_draft_tokens(orig: Any) -> Any:
    def _sample_draft_tokens(self: Any, hidden_states: torch.Tensor, sampling_metadata: Any) -> Any:
        rows: dict[int, list[Any]] | None = getattr(self, "_ersd_rows", None)
        if not rows:
            return orig(self, hidden_states, sampling_metadata)
        if getattr(self, "use_heterogeneous_vocab", False) or getattr(
            self, "parallel_drafting", False
        ):
            raise VllmIntegrationError(
                "ERSD requests need a drafter with the target's vocabulary that drafts one token "
                "per forward (not parallel drafting); use a draft model of the target's family, "
                "EAGLE, or the ngram drafter"
            )
        batch = hidden_states.shape[0]
        mine = sorted(r for r in rows if r < batch)
        if len(mine) < batch:
            ids, probs = orig(self, hidden_states, sampling_metadata)
            ids = ids.clone()
        else:
            ids, probs = torch.empty(batch, dtype=torch.int64, device=hidden_states.device), None
        logits = self.model.compute_logits(hidden_states[mine])
        winners = draft_winners(logits, [rows[r][0] for r in mine], [rows[r][1] for r in mine])
        ids[torch.tensor(mine, device=ids.device)] = winners.to(ids.device, ids.dtype)
        for r, w in zip(mine, winners.tolist(), strict=True):
            rows[r][0] = extend_key(rows[r][0], w)
        return ids, probs

    return _sample_draft_tokens


def patched_validate(orig: Any) -> Any:
    def _validate_params(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, params, *args, **kwargs)
        if hasattr(params, "extra_args"):
            cfg = self.vllm_config
            try:
                ersd = check_request(
                    params, async_scheduling=bool(cfg.scheduler_config.async_scheduling)
                )
                if ersd is not None and getattr(cfg, "use_v2_model_runner", False):
                    raise VllmIntegrationError(
                        "ERSD requests need vLLM's V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER"
                    )
            except VllmIntegrationError as e:
                raise _refusal(str(e)) from None
        return result

    return _validate_params


@functools.cache
def _refusal_class() -> type[Exception]:
    from vllm.exceptions import VLLMValidationError

    def __init__(self: Any, message: str) -> None:
        VLLMValidationError.__init__(self, message, parameter="extra_args")

    return type(
        "ErsdRequestRefused", (VllmIntegrationError, VLLMValidationError), {"__init__": __init__}
    )


def _refusal(message: str) -> Exception:
    """A refusal that is both ours and vLLM's validation error (the server answers 400)."""
    return _refusal_class()(message)


def targets() -> list[tuple[Any, str, Any, tuple[str, ...]]]:
    """(class, attribute, wrapper factory, expected leading parameter names) of every patch."""
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return [
        (GPUModelRunner, "_sample", patched_sample, ("self", "logits", "spec_decode_metadata")),
        (
            GPUModelRunner,
            "propose_draft_token_ids",
            patched_propose,
            ("self", "scheduler_output", "sampled_token_ids", "sampling_metadata"),
        ),
        (
            SpecDecodeBaseProposer,
            "_sample_draft_tokens",
            patched_sample_draft_tokens,
            ("self", "hidden_states", "sampling_metadata"),
        ),
        (InputProcessor, "_validate_params", patched_validate, ("self", "params")),
    ]


def apply() -> None:
    """Install the patches (idempotent)."""
    for cls, name, factory, _ in targets():
        current = getattr(cls, name)
        if getattr(current, _MARK, False):
            continue
        wrapped = factory(current)
        wrapped.__name__ = name
        wrapped.__qualname__ = f"{cls.__name__}.{name}"
        wrapped.__doc__ = current.__doc__
        setattr(wrapped, _MARK, True)
        wrapped._ersd_original = current
        setattr(cls, name, wrapped)
    log.info("ersd: vLLM patches installed")
