"""The verification-method interface and the generic tree walk.

Every method is a pair of pure rules applied at one tree node (one context ``c``):

* ``draft(draft_probs, num_children, noise)`` — the drafting rule: which ``num_children`` tokens to
  propose as children of ``c`` (ERSD: the top ranks of the shared race; SpecInfer: i.i.d. draws;
  ...).  It may return fewer tokens (e.g. when ``draft_probs`` has fewer non-zero entries).
* ``verify_node(target_probs, draft_probs, children, noise)`` — the verification rule: either
  accept child ``j`` (the emitted token is ``children[j]`` and the walk continues into it) or emit a
  correction token and stop.

plus ``bonus(target_probs, noise)``: the token emitted at a fully accepted leaf.  The rules see
only probability vectors (float64, ``target_probs`` = p, ``draft_probs`` = q), token ids and the
keyed noise of their context (:class:`NodeNoise`): they never call a model or a global RNG.
:func:`verify_tree` walks a drafted tree with these rules.

Temperature 0 is handled outside the methods by :class:`GreedyRule` (children = the draft's top
logits, accept a child iff it is the target's argmax): every method then equals greedy decoding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ersd.errors import UnsupportedTreeError
from ersd.methods.catalog import MethodInfo
from ersd.probs import SamplingParams, first_argmax, logits_to_probs
from ersd.race import STREAM_RACE, RaceNoise, extend_key
from ersd.race_v2 import LogitRow
from ersd.tree import TreeShape


@dataclass(frozen=True)
class NodeNoise:
    """The keyed randomness of one context: a view of :class:`RaceNoise` at ``key``."""

    source: RaceNoise
    key: int

    def exponentials(self, stream: int = STREAM_RACE) -> torch.Tensor:
        return self.source.exponentials(self.key, stream)

    def exponentials_on(self, device: torch.device, stream: int = STREAM_RACE) -> torch.Tensor:
        """:meth:`exponentials` where ``device``'s probabilities are: the NumPy draw on the CPU,
        the bit-identical torch draw on a device (:meth:`RaceNoise.exponentials_many`), so no
        race crosses from the host per node."""
        if device.type == "cpu":
            return self.exponentials(stream)
        return self.source.exponentials_many([self.key], stream, device)[0]

    def uniforms(self, stream: int, n: int) -> list[float]:
        return [float(u) for u in self.source.uniforms(self.key, stream, n)]

    def winner(self, probs: torch.Tensor, stream: int = STREAM_RACE) -> int:
        """The race winner over ``probs`` (:meth:`RaceNoise.winner`: under race scheme v2 only
        the blocks that can win are drawn; the same token as on the whole row)."""
        return self.source.winner(self.key, probs, stream)

    def ranking(self, probs: torch.Tensor, m: int, stream: int = STREAM_RACE) -> list[int]:
        """The race's ``m`` best tokens over ``probs`` (:meth:`RaceNoise.ranking`)."""
        return self.source.ranking(self.key, probs, m, stream)

    def rank(self, probs: torch.Tensor, token: int, stream: int = STREAM_RACE) -> int:
        """``token``'s 1-based rank in the race over ``probs`` (:meth:`RaceNoise.rank`)."""
        return self.source.rank(self.key, probs, token, stream)


@dataclass(frozen=True)
class NodeDecision:
    """Outcome at one node: ``child`` = accepted child's index (or None); ``token`` is emitted."""

    child: int | None
    token: int


class DraftLogits:
    """The drafter's distribution at one context, kept as its logits until someone reads it.

    Where ERSD drafted from the logits (race scheme v2 on the CPU, temperature-only sampling:
    :mod:`ersd.drafting.model`), no float64 softmax was needed to draft, and the batched
    verification counts the rank statistic from the logits too (``row``, a
    :class:`ersd.race_v2.LogitRow`).  :meth:`probs` is :func:`ersd.probs.logits_to_probs` of the
    logits, the bits an eager drafter stores; :class:`DraftProbs` calls it on the first read.
    The logits must not be overwritten in place meanwhile (no backend does: every ``score``
    call returns new rows); a torch in-place write is detected and refused.

    ``ranked``: the tokens drafted there, best first, as
    :func:`ersd.race_v2.v2_ranking_from_logits` answered them: each scores strictly below the
    next and below every other token (it answers only then), so the ``i``-th has race rank
    ``i + 1`` and verification reads that rank without counting."""

    __slots__ = ("_version", "logits", "params", "ranked", "row")

    def __init__(
        self,
        logits: torch.Tensor,
        params: SamplingParams,
        row: LogitRow,
        ranked: Sequence[int] = (),
    ) -> None:
        self.logits, self.params, self.row = logits, params, row
        self.ranked = tuple(ranked)
        self._version = logits._version

    def intact(self) -> bool:
        """Whether the logits are as they were when drafted (no torch in-place write since)."""
        return self.logits._version == self._version

    def probs(self) -> torch.Tensor:
        """``logits_to_probs(logits, params)``: float64, the same bits as an eager draft's."""
        if not self.intact():
            raise RuntimeError(
                "the draft model's logits were overwritten in place after drafting, so the "
                "drafted distribution (DraftTree.draft_probs) is lost; a model's score() must "
                "return logits it does not modify later"
            )
        return logits_to_probs(self.logits, self.params)

    def __repr__(self) -> str:
        return f"DraftLogits(vocab={self.logits.shape[-1]}, params={self.params!r})"


class DraftProbs(list):
    """:attr:`DraftTree.draft_probs`: a list of float64 tensors (or None) whose entries may be
    held as :class:`DraftLogits` until read; indexing and iteration return the tensors (computed
    once, on the first read, and kept).  :meth:`pending` looks at an entry without computing."""

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = super().__getitem__(i)
        if isinstance(item, DraftLogits):
            item = item.probs()
            super().__setitem__(i, item)
        return item

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __reversed__(self) -> Iterator[Any]:
        for i in range(len(self) - 1, -1, -1):
            yield self[i]

    def copy(self) -> DraftProbs:
        return DraftProbs(list.__getitem__(self, i) for i in range(len(self)))

    def pending(self, i: int) -> DraftLogits | None:
        """Entry ``i`` if it is still held as logits (nothing computed), else None."""
        item = super().__getitem__(i)
        return item if isinstance(item, DraftLogits) else None


@dataclass
class DraftTree:
    """A drafted tree below the current context.

    ``tokens[i]``/``parents[i]`` describe node ``i`` (parent ``-1`` = root).  Contexts are numbered
    ``0`` (root) and ``i + 1`` (after node ``i``); ``keys[ctx]`` is the race key of that context and
    ``draft_probs[ctx]`` the drafter's distribution there (None where nothing was drafted below it).
    ``children[ctx]`` lists the node indices drafted below context ``ctx`` in child-index order.

    ``draft_probs`` is a :class:`DraftProbs` list: reading an entry gives the float64
    probabilities, but where ERSD drafted from the logits (race scheme v2, temperature only, on
    the CPU) they are computed on the first read, not when drafting.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    draft_probs: list[torch.Tensor | None] = field(default_factory=DraftProbs)
    children: list[list[int]] = field(default_factory=list)

    #: the context of the root (the committed sequence)
    ROOT = 0

    def __post_init__(self) -> None:
        if not isinstance(self.draft_probs, DraftProbs):
            self.draft_probs = DraftProbs(self.draft_probs)

    @classmethod
    def empty(cls, key: int) -> DraftTree:
        """A tree with only the root context, whose race key is ``key``."""
        return cls(tokens=[], parents=[], keys=[key], draft_probs=[None], children=[[]])

    @staticmethod
    def context_of(node: int) -> int:
        """The context right after node ``node`` (``-1``, the root's parent slot, gives ROOT)."""
        return node + 1

    @staticmethod
    def node_of(ctx: int) -> int:
        """The node whose token ends context ``ctx`` (``-1`` for the root)."""
        return ctx - 1

    def add_child(self, ctx: int, token: int) -> int:
        """Append a node holding ``token`` below context ``ctx``; returns the new node's context.

        The new context's race key extends ``ctx``'s key by ``token``.
        """
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(self.node_of(ctx))
        self.keys.append(extend_key(self.keys[ctx], token))
        self.draft_probs.append(None)
        self.children.append([])
        self.children[ctx].append(node)
        return self.context_of(node)

    def parent_context(self, ctx: int) -> int:
        """The context ``ctx`` hangs below (ROOT for the root's children)."""
        return self.context_of(self.parents[self.node_of(ctx)])

    def token_ending(self, ctx: int) -> int:
        """The token of the node that ends context ``ctx``."""
        return self.tokens[self.node_of(ctx)]

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def depth_of(self, node: int) -> int:
        d = 0
        while node >= 0:
            d += 1
            node = self.parents[node]
        return d


@dataclass
class TreeVerification:
    """Result of verifying a tree: the accepted nodes (root-down) and the emitted tokens.

    ``tokens`` = the accepted nodes' tokens followed by ``next_token`` (correction or bonus).
    ``ranks[j]`` (ERSD only, else empty) is the 1-based rank of the target's race winner in the
    drafter's race at the j-th verified context that had children.
    """

    accepted: list[int]
    next_token: int
    tokens: list[int]
    ranks: list[int] = field(default_factory=list)


class Method(ABC):
    """A verification method: a drafting rule, a node verification rule and a bonus rule.

    A registered method sets ``info`` to its :mod:`ersd.methods.catalog` entry; ``name``,
    ``summary`` and ``supported_shapes`` default to the entry's (a subclass may still set its own
    ``name``, as the exactness suite's mutants do).
    """

    info: ClassVar[MethodInfo | None] = None
    name: str = ""
    summary: str = ""
    #: human-readable list of supported shapes, for error messages
    supported_shapes: str = "any tree"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        info = cls.__dict__.get("info")
        if info is not None:
            for attr in ("name", "summary", "supported_shapes"):
                if attr not in cls.__dict__:
                    setattr(cls, attr, getattr(info, attr))

    def check_shape(self, shape: TreeShape) -> None:
        """Raise :class:`UnsupportedTreeError` when this method cannot verify ``shape``.

        The default enforces the catalog's ``max_children``; methods with other restrictions
        override it.
        """
        limit = self.info.max_children if self.info is not None else None
        if limit is not None and shape.max_children > limit:
            raise self._unsupported(
                shape, f"a node has {shape.max_children} children (at most {limit} per node)"
            )

    def _unsupported(self, shape: TreeShape, why: str) -> UnsupportedTreeError:
        return UnsupportedTreeError(
            f"method {self.name!r} cannot verify tree {shape.spec}: {why}. "
            f"It supports {self.supported_shapes}."
        )

    @abstractmethod
    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        """Tokens to draft below a context whose draft distribution is ``draft_probs``."""

    def draft_children(
        self, logits: torch.Tensor, params: SamplingParams, num_children: int, noise: NodeNoise
    ) -> tuple[list[int], torch.Tensor]:
        """Draft below a context from the drafter's raw ``logits``: (tokens, draft probabilities).

        The probabilities are the ones :meth:`verify_node` later divides by, computed by the one
        logits-to-probabilities path (:func:`ersd.probs.logits_to_probs`).
        """
        q = logits_to_probs(logits, params)
        return self.draft(q, num_children, noise), q

    @abstractmethod
    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        """Accept one of ``children`` or emit a correction token."""

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        """Token emitted at a context with no drafted children: the target's race winner."""
        return noise.winner(target_probs)

    def rank(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int, noise: NodeNoise
    ) -> int | None:
        """Rank statistic of ``token`` in this method's drafting order (ERSD); None otherwise."""
        return None


class GreedyRule(Method):
    """Temperature 0, for every method: draft the top logits, accept a child iff it is the argmax.

    :func:`rule_for` swaps it in for the chosen method when the sampling settings are greedy, so
    every method then equals greedy decoding of the target.  Ties go to the lowest token id.
    """

    name = "greedy"
    summary = "temperature 0: draft the drafter's top tokens, accept the target's argmax"

    @staticmethod
    def top_tokens(draft_logits: torch.Tensor, num_children: int) -> list[int]:
        """The ``num_children`` largest logits, best first (ties: lowest id; ``-inf`` never)."""
        m = min(num_children, draft_logits.numel())
        vals, idx = torch.topk(draft_logits.to(torch.float64), m)
        pairs = sorted(zip((-vals).tolist(), idx.tolist(), strict=True))
        return [int(i) for v, i in pairs if v != float("inf")]

    def draft_children(
        self, logits: torch.Tensor, params: SamplingParams, num_children: int, noise: NodeNoise
    ) -> tuple[list[int], torch.Tensor]:
        return self.top_tokens(logits, num_children), logits_to_probs(logits, params)

    def draft(self, draft_probs: torch.Tensor, num_children: int, noise: NodeNoise) -> list[int]:
        return self.top_tokens(draft_probs, num_children)

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        y = int(first_argmax(target_probs.reshape(-1)))
        for j, c in enumerate(children):
            if c == y:
                return NodeDecision(j, y)
        return NodeDecision(None, y)

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        return int(first_argmax(target_probs.reshape(-1)))


GREEDY = GreedyRule()


def rule_for(method: Method, params: SamplingParams) -> Method:
    """The rule that verifies under ``params``: :data:`GREEDY` at temperature 0, else ``method``."""
    return GREEDY if params.greedy else method


def verify_tree(
    method: Method,
    tree: DraftTree,
    target_probs: torch.Tensor,
    noise: RaceNoise,
) -> TreeVerification:
    """Walk ``tree`` from the root with ``method``'s rules (see :func:`rule_for` for T = 0).

    ``target_probs`` is ``[1 + num_nodes, V]``: row ``ctx`` is the target's distribution at context
    ``ctx`` (0 = root, ``i + 1`` = after node ``i``).
    """
    accepted: list[int] = []
    ranks: list[int] = []
    ctx = 0
    while True:
        kids = tree.children[ctx]
        p = target_probs[ctx]
        node_noise = NodeNoise(noise, tree.keys[ctx])
        if not kids:
            token = method.bonus(p, node_noise)
            break
        kid_tokens = [tree.tokens[k] for k in kids]
        q = tree.draft_probs[ctx]
        assert q is not None, "a context with children must have draft probabilities"
        decision = method.verify_node(p, q, kid_tokens, node_noise)
        r = method.rank(p, q, decision.token, node_noise)
        if r is not None:
            ranks.append(r)
        if decision.child is None:
            token = decision.token
            break
        node = kids[decision.child]
        accepted.append(node)
        ctx = tree.context_of(node)
    toks = [tree.tokens[n] for n in accepted] + [token]
    return TreeVerification(accepted=accepted, next_token=token, tokens=toks, ranks=ranks)
