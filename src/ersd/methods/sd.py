"""Standard speculative sampling (Leviathan, Kalman & Matias 2023; Chen et al. 2023), chains only.

At each node the drafter proposes one token ``x ~ q`` (inverse CDF with the uniform of draft lane
0, stream ``STREAM_DRAFT``).  The verifier accepts it with probability ``min(1, p(x) / q(x))``
(coin from ``STREAM_VERIFY``); on rejection it emits a token drawn from
``norm(max(p - q, 0))`` (uniform from ``STREAM_RESIDUAL``) and stops.  After a fully accepted
chain the bonus token is the target's race winner (stream 0).  The per-token acceptance rate is
``sum_x min(p(x), q(x)) = 1 - TV(p, q)``.

Hooks (see :class:`ersd.methods.rejection.RecursiveRejection`): ``acceptance_probability``,
``residual``, ``verify_uniforms``, ``sample_residual``, ``draft``.
"""

from __future__ import annotations

from ersd.methods.catalog import CATALOG
from ersd.methods.rejection import RecursiveRejection


class SpeculativeSampling(RecursiveRejection):
    info = CATALOG["sd"]
