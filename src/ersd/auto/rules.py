"""The tuning of ``tree="auto"``, in one value: every rule's constant, and a switch for the rules
that have none.  ``docs/auto-tree.md`` says per rule what goes wrong without it and which
measurement shows it; a chooser takes a :class:`Rules` (default :data:`RULES`), so a test or a
replay changes one rule by passing ``replace(RULES, ...)``, never by patching a module.

Removed on the replay of ``docs/results/auto-rules-2026-12-06/`` (their removal moved no cell
beyond its noise): the "cannot pay" verdict kept 32 steps, the plain exploration steps, and the
stale decay of undrafted depths.  The draft's prefill paying off over the request's length was
removed on the same replay and restored on the live llama.cpp run (the replay did not charge
the draft's lazy prefill; the live run paid it and lost 12% on one prompt)."""

from __future__ import annotations

from dataclasses import dataclass

#: ranks counted individually by the online estimate (deeper ranks are never drafted by auto)
MAX_RANK = 8
#: chain lengths among the candidates
CHAIN_LENGTHS = range(1, 9)
#: node counts of the optimal trees among the candidates (ERSD at T > 0)
TREE_SIZES = (2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class Rules:
    """The constants of auto's rules (``docs/auto-tree.md``, one row each)."""

    # --- the acceptance estimate (observe.OnlineProfile) ---------------------------------------
    #: prior per-depth rank profile: P(R = 1), P(R = 2), ... (sub-probability)
    prior_rank_probs: tuple[float, ...] = (0.6, 0.1, 0.05, 0.03, 0.02)
    #: weight of the prior and of each pool an estimate is shrunk towards, in observations
    prior_weight: float = 4.0
    #: the root after a full acceptance is estimated from the roots seen in that state
    markov_root: bool = True
    #: the bonus token below a fully accepted path counts as an observation of that depth
    beyond: bool = True
    # --- the step-time correction (observe.StepTiming) -----------------------------------------
    #: weight of the newest step in the timing correction (exponential moving average)
    timing_ema: float = 0.25
    #: pseudo-steps of the all-sizes target ratio behind a forward size's own ratio
    size_prior_steps: float = 0.5
    # --- the decision (decide.decide) ----------------------------------------------------------
    #: the smallest tree whose predicted rate is within this share of the best one's is drafted
    smaller_tree_within: float = 0.03
    #: ... except below a tree whose every depth rests on this many observations, at batch 1
    #: (inf: off)
    trusted_after: float = 8
    #: never draft where even full acceptance would not beat plain decoding (the ceiling)
    cannot_pay: bool = True
    #: a batch starts its draft only if drafting beats plain decoding by this share
    batch_start_margin: float = 0.10
    #: with a horizon, the draft's catch-up (its lazy prefill) must pay over the rest of the run
    prefill_pays_off: bool = True
    #: after this many plain steps in a row, draft the best tree once (exploration)
    explore_after: int = 16
    #: exploration may lose at most this share of the run's (projected) time
    explore_budget: float = 0.02
    # --- a batch's rows (chooser.TreeChooser.finish_rates) -------------------------------------
    #: rows' own acceptance and the spread of rows decide a batch's finish time
    row_factors: bool = True
    #: pseudo-tokens of the pool's rate behind a row's own acceptance factor
    row_prior_tokens: float = 4.0
    #: rows with at least this many predicted drafted tokens count in the kept spread
    row_spread_after: float = 8.0
    #: spread of rows' factors before any run measured it, weighted as ``prior_rows`` rows
    default_row_spread: float = 0.25
    row_spread_prior_rows: float = 8.0
    #: at most this many rows' weight behind a kept spread
    row_spread_max_rows: float = 256.0
    # --- what a learning run keeps in the cost store (only with ``CurveCache(learn=True)``) ----
    #: drafting steps observed before a run's rank observations are kept
    keep_profile_after: int = 8
    #: steps of a kind timed at one batch size before the run's timing correction is kept
    keep_timing_after: int = 4


RULES = Rules()

__all__ = ["CHAIN_LENGTHS", "MAX_RANK", "RULES", "TREE_SIZES", "Rules"]
