"""SpecInfer recursive rejection sampling with replacement (Miao et al. 2024), any tree.

The children of a node are i.i.d. draws from ``q`` (child ``k`` by inverse CDF with the uniform of
draft lane ``k``, stream ``STREAM_DRAFT + k``).  They are tried in order: child ``x_j`` is
accepted with probability ``min(1, p_j(x_j) / q(x_j))`` (coin ``j`` of ``STREAM_VERIFY``); after a
rejection ``p_{j+1} = norm(max(p_j - q, 0))`` with ``q`` unchanged.  If every child is rejected
the emitted token is drawn from the last residual (``STREAM_RESIDUAL``).  Called "GSD" in the ERSD
paper's figure.  With one child per node it is standard speculative sampling.

Hooks (see :class:`ersd.methods.rejection.RecursiveRejection`): ``acceptance_probability``,
``residual``, ``next_draft_probs``, ``verify_uniforms``, ``sample_residual``, ``draft``.
"""

from __future__ import annotations

from ersd.methods.catalog import CATALOG
from ersd.methods.rejection import RecursiveRejection


class SpecInfer(RecursiveRejection):
    info = CATALOG["specinfer"]
