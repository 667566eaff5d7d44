"""Deliberately broken variants of the vLLM plugin, for the tests that must catch them.

Each replaces one named function of the plugin (``monkeypatch.setattr``); nothing of this lives
in the library.

* ``row_keys`` — every verification row of a request races with the committed context's key
  (the draft tokens before the row are left out);
* ``draft_noise`` — the drafter races other noise than the verifier;
* ``gumbel_sign`` — ``argmax(log p + log E)``, the Gumbel form with the noise's sign flipped;
* ``stale_key`` — the committed context's key ignores the tokens generated so far.
"""

from __future__ import annotations

from typing import Any

import torch

from ersd.integrations.vllm import patches, rows


def _row_keys(key: int, drafts: list[int]) -> list[int]:
    return [key] * (len(drafts) + 1)


def _draft_winners(logits: Any, keys: list[int], params: list[Any]) -> Any:
    return rows.race_winners(logits, [k ^ 1 for k in keys], params)


def _gumbel_sign(probs: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return torch.argmax(torch.log(probs) + torch.log(e), dim=-1).cpu()


def _stale_key(runner: Any, st: Any, rid: str, p: Any) -> int:
    req = runner.requests[rid]
    return int(st.keys.key(rid, p.seed, req.prompt_token_ids, []))


#: mutant name -> (module, attribute, replacement)
MUTANTS: dict[str, tuple[Any, str, Any]] = {
    "row_keys": (patches, "row_keys", _row_keys),
    "draft_noise": (patches, "draft_winners", _draft_winners),
    "gumbel_sign": (rows, "race_argmin", _gumbel_sign),
    "stale_key": (patches, "_committed_key", _stale_key),
}
