"""Standard speculative sampling (Leviathan, Kalman & Matias 2023; Chen et al. 2023), chains only.

At each node the drafter proposes one token ``x ~ q`` (inverse CDF with the uniform of draft lane
0, stream ``STREAM_DRAFT``).  The verifier accepts it with probability ``min(1, p(x) / q(x))``
(coin from ``STREAM_VERIFY``); on rejection it emits a token drawn from
``norm(max(p - q, 0))`` (uniform from ``STREAM_RESIDUAL``) and stops.  After a fully accepted
chain the bonus token is the target's race winner (stream 0).  The per-token acceptance rate is
``sum_x min(p(x), q(x)) = 1 - TV(p, q)``.

Hooks (see :class:`ersd.methods._common.RecursiveRejection`): ``acceptance_probability``,
``residual``, ``verify_uniforms``, ``sample_residual``, ``draft``.
"""

from __future__ import annotations

from ersd.methods._common import RecursiveRejection
from ersd.tree import TreeShape


class SpeculativeSampling(RecursiveRejection):
    name = "sd"
    summary = "standard speculative sampling: accept w.p. min(1, p/q), else sample max(p-q, 0)"
    supported_shapes = "chains only (every node has at most one child, e.g. 'chain:4')"

    def check_shape(self, shape: TreeShape) -> None:
        if not shape.is_chain:
            raise self._unsupported(
                shape, f"a node has {shape.max_children} children (standard SD verifies one draft)"
            )
