"""Theory of ERSD as a library: acceptance, rank distributions, the speed-up bound, optimal trees.

Kobus & Gündüz, "Speculative Sampling via Exponential Races" (arXiv 2504.15475, ACL Findings
2025).  numpy/scipy only — importing :mod:`ersd.theory` never imports torch.  Inputs are 1-D
probability vectors (lists or numpy arrays): ``target_probs`` = p, ``draft_probs`` = q; bad ones
raise :class:`InvalidDistributionError` (an :class:`ersd.errors.ErsdError`).  Entropies are in
nats.

Public API::

    acceptance_probability(target_probs, draft_probs, num_drafts, method="ersd") -> float
    rank_distribution(target_probs, draft_probs) -> np.ndarray      # [r-1] = P(R = r)
    block_efficiency_bound(rank_probs, num_draft_tokens, vocab_size) -> float
    optimal_tree(rank_probs, num_draft_tokens) -> list[tuple[int, ...]]
    expected_block_efficiency(paths, rank_probs) -> float

plus TV / KL / entropy, the i.i.d.-draft optimum and lower bounds, the large-k asymptote,
standard tree shapes, per-method curves (:mod:`ersd.theory.curves`), synthetic families
(:mod:`ersd.theory.families`) and empirical rank profiles with a JSON format
(:mod:`ersd.theory.profile`).
"""

from __future__ import annotations

from ersd.theory.acceptance import (
    ACCEPTANCE_METHODS,
    acceptance_probability,
    child_index_distribution,
    ersd_match_probability,
    ersd_one_draft_lower_bound,
    ersd_rank_joint,
    gls_acceptance,
    iid_optimal_acceptance,
    rank_cdf_lower_bound,
    rank_distribution,
    rrs_wor_acceptance,
    spechub_acceptance,
    specinfer_acceptance,
    spectr_acceptance,
    spectr_rho,
)
from ersd.theory.distributions import (
    InvalidDistributionError,
    entropy,
    kl_divergence,
    rank_entropy,
    total_variation,
)
from ersd.theory.profile import (
    ProfileFile,
    RankProfile,
    RankProfileError,
    load_profiles,
    merge_profiles,
    nearest_temperature,
    tree_depth_probs,
)
from ersd.theory.trees import (
    batch_paths,
    block_efficiency_bound,
    bound_asymptote,
    chain_paths,
    expected_block_efficiency,
    expected_block_efficiency_by_depth,
    multi_paths,
    optimal_tree,
    optimal_tree_by_depth,
    per_node_block_efficiency,
)

__all__ = [
    "ACCEPTANCE_METHODS",
    "InvalidDistributionError",
    "ProfileFile",
    "RankProfile",
    "RankProfileError",
    "acceptance_probability",
    "batch_paths",
    "block_efficiency_bound",
    "bound_asymptote",
    "chain_paths",
    "child_index_distribution",
    "entropy",
    "ersd_match_probability",
    "ersd_one_draft_lower_bound",
    "ersd_rank_joint",
    "expected_block_efficiency",
    "expected_block_efficiency_by_depth",
    "gls_acceptance",
    "iid_optimal_acceptance",
    "kl_divergence",
    "load_profiles",
    "merge_profiles",
    "multi_paths",
    "nearest_temperature",
    "optimal_tree",
    "optimal_tree_by_depth",
    "per_node_block_efficiency",
    "rank_cdf_lower_bound",
    "rank_distribution",
    "rank_entropy",
    "rrs_wor_acceptance",
    "spechub_acceptance",
    "specinfer_acceptance",
    "spectr_acceptance",
    "spectr_rho",
    "total_variation",
    "tree_depth_probs",
]
