"""The engines' speculative watermark schemes as baselines in our loop (docs/watermark.md).

Watermarked ERSD marks every emitted token: each is the target's keyed race winner.  The schemes
vLLM and SynthID ship for speculative decoding keep rejection sampling and mark less, or mark
with two keys.  Implemented here on the same loop, models and keyed PRFs, so the comparison is
like for like (catalog entries :data:`ersd.methods.catalog.WATERMARK_BASELINES`, with sources):

* :class:`TargetOnlyWatermarkSD` / :class:`TargetOnlyWatermarkSpecInfer` (``sd-wm-target``,
  ``specinfer-wm-target``) -- vLLM's ``allow_target_only_watermarking``: drafts are unkeyed
  i.i.d. draws from ``q`` accepted with an unkeyed coin ``min(1, p/q)``, so accepted drafts carry
  no mark; the correction (the last residual ``norm(max(p - q, 0))``) and the bonus token are the
  winners of the watermark's keyed race (stream 0) over their distribution.  The detector is the
  ordinary one (:func:`ersd.watermark.detect`); its power falls with the accepted share.
* :class:`DualKeySD` (``sd-dual-key``) -- vLLM's ``dual_key_gumbel`` / SynthID's speculative
  scheme: the draft at a context is the winner of the race keyed by derived key A over ``q``
  (:data:`~ersd.race.STREAM_KEY_A`), accepted with an unkeyed coin ``min(1, p/q)``; the correction
  (residual) and bonus are winners of the race keyed by derived key B
  (:data:`~ersd.race.STREAM_KEY_B`).  Every token is marked, but under one of two keys: the
  detector scores both (:func:`ersd.watermark.detect_dual`).

Each stays an exact sampler of the target: a keyed race over a distribution is an exact sample of
it when its noise is fresh (over a uniformly random key, :mod:`ersd.watermark.keyed`), the draft
and the coin are independent, and rejection sampling does the rest.  Without a watermark the
keyed streams are plain race noise, so each method is then SD / SpecInfer with race-drawn
residuals (exact too).  The third baseline, watermarked autoregressive sampling, is target-only
decoding with a watermark (no method of its own).
"""

from __future__ import annotations

import torch

from ersd.methods.base import NodeNoise
from ersd.methods.catalog import WATERMARK_BASELINES
from ersd.methods.rejection import RecursiveRejection
from ersd.race import STREAM_KEY_A, STREAM_KEY_B, STREAM_RACE, race_winner


class _KeyedResidual(RecursiveRejection):
    """Recursive rejection whose last residual is drawn by the race of ``residual_stream``."""

    residual_stream: int = STREAM_RACE

    def sample_residual(self, residual_probs: torch.Tensor, noise: NodeNoise) -> int:
        return race_winner(residual_probs, noise.exponentials(self.residual_stream))


class TargetOnlyWatermarkSD(_KeyedResidual):
    info = WATERMARK_BASELINES["sd-wm-target"]


class TargetOnlyWatermarkSpecInfer(_KeyedResidual):
    info = WATERMARK_BASELINES["specinfer-wm-target"]


class DualKeySD(_KeyedResidual):
    info = WATERMARK_BASELINES["sd-dual-key"]
    residual_stream = STREAM_KEY_B

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        """The key-A race's winner over ``q`` (one child: the scheme is a chain's)."""
        if num_children < 1:
            return []
        return [race_winner(draft_probs, noise.exponentials(STREAM_KEY_A))]

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        """The key-B race's winner over ``p``."""
        return race_winner(target_probs, noise.exponentials(STREAM_KEY_B))


BASELINE_CLASSES = (TargetOnlyWatermarkSD, TargetOnlyWatermarkSpecInfer, DualKeySD)
