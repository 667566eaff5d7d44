"""A step's ERSD verification for many rows at once, as tensor work where the logits are.

:func:`ersd.methods.verify_tree` walks one row's tree node by node: per context a float64
``logits_to_probs``, the race noise, the race's argmin and a scalar read.  :func:`verify_many`
gives the same :class:`~ersd.methods.TreeVerification` for every row of a step (the same bits:
same probabilities, same noise, same first-minimum winners and rank statistics) with the per-node
work batched over rows:

* **on a device** (``"all"``: every context of every row at once): the probabilities of all
  contexts (one :func:`ersd.probs.logits_to_probs` per group of like sampling settings), the
  races of all contexts (:meth:`ersd.race.RaceNoise.exponentials_many`: the torch Philox of
  :mod:`ersd.race_torch` on the device, bit-identical to the NumPy reference), the winners
  ``argmin E / p`` and the rank statistics of every context that has children; then **one**
  transfer of the winners and ranks (plus the noise draw's one small transfer for its tail
  values), and the walk down each tree is plain Python over those integers.  Nothing is read per
  node (``tests/test_verify_batch.py`` counts the reads).
* **on the CPU** (``"levels"``: the walk's contexts level by level): work only where a walk
  arrives, as the node-by-node walk does (a rejected node's subtree is never scored), each level
  batched over the rows still walking.  On the CPU reads cost nothing, and the all-at-once
  schedule would score every context, ~1.8x the contexts a chain:4 walk at ERSD's acceptance
  visits.

Float64 is kept where exactness needs it, as in :mod:`ersd.race`: probabilities, noise and the
scores ``E / p``.  In float32 a probability under ~1e-38 (reachable with ~90 nats of logit range)
would flush to 0 and its token could never win, two scores closer than 2^-24 relative would tie
and change the winner, and the NumPy reference's texts would no longer be reproduced bit for bit.

Which rules: ERSD (:func:`batches`: the rule must be :class:`ersd.methods.ERSD` with its own
verification, rank and bonus rules, any draft sharpness).  Every other rule, a subclass that
overrides them (the exactness suite's mutants), and temperature 0 keep the node-by-node walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ersd.methods import DraftTree, Method, TreeVerification
from ersd.methods.base import DraftProbs
from ersd.methods.base import Method as _Method
from ersd.methods.ersd import ERSD
from ersd.probs import SamplingParams, logits_to_probs, plain_temperature
from ersd.race import STREAM_RACE, RaceNoise
from ersd.race_v2 import v2_rank_from_logits

#: find the target's v2 race winners from its logits where the sampling is temperature only
#: (:func:`ersd.race_v2.v2_winner_from_logits`); False: from float64 probabilities (the
#: reference path the tests and ``research/profile_batch.py`` compare with; the same tokens)
FROM_LOGITS = True


#: a drafted token's rank statistic read from the order it was drafted in
#: (:attr:`ersd.methods.base.DraftLogits.ranked`) instead of counted; False: counted (the
#: reference ``research/profile_batch.py --compare-prune`` compares with; the same ranks)
DRAFTED_RANKS = True


def batches(rule: Method) -> bool:
    """Whether :func:`verify_many` verifies ``rule``: ERSD with its own node rules."""
    cls: Any = type(rule)
    return (
        isinstance(rule, ERSD)
        and cls.verify_node is ERSD.verify_node
        and cls.rank is ERSD.rank
        and cls.bonus is _Method.bonus
        and cls.race_probs is ERSD.race_probs
    )


def default_mode(device: torch.device) -> str:
    """``"levels"`` on the CPU, ``"all"`` on a device (module docstring)."""
    return "levels" if device.type == "cpu" else "all"


def verify_many(
    rules: Sequence[ERSD],
    params: Sequence[SamplingParams],
    noises: Sequence[RaceNoise],
    trees: Sequence[DraftTree],
    logits: Sequence[torch.Tensor],
    mode: str | None = None,
    *,
    noise_via_torch: bool | None = None,
) -> list[TreeVerification]:
    """Verify every row's tree (``logits[i]``: ``[1 + num_nodes, V]``, row ``ctx`` = the target's
    logits at context ``ctx``); equal to ``verify_tree(rules[i], trees[i], probs, noises[i])`` row
    by row.  Every rule must pass :func:`batches`.  ``mode``: ``"all"`` or ``"levels"`` (default:
    :func:`default_mode` of the logits' device).  ``noise_via_torch``: draw the races with
    :mod:`ersd.race_torch` (default: on a device), as
    :meth:`~ersd.race.RaceNoise.exponentials_many`'s ``via_torch``."""
    n = len(trees)
    if not n:
        return []
    for rule in rules:
        if not batches(rule):
            raise TypeError(f"verify_many verifies ERSD rules only, got {rule!r}")
    if mode is None:
        mode = default_mode(logits[0].device)
    if mode == "all":
        return _verify_all(rules, params, noises, trees, logits, noise_via_torch)
    if mode == "levels":
        return _verify_levels(rules, params, noises, trees, logits)
    raise ValueError(f"mode must be 'all' or 'levels', got {mode!r}")


def _groups(params: Sequence[SamplingParams], noises: Sequence[RaceNoise]) -> list[list[int]]:
    """Row indices grouped by (sampling settings, noise): one probability and one noise call
    per group."""
    out: dict[tuple[SamplingParams, int], list[int]] = {}
    for i, (p, nz) in enumerate(zip(params, noises, strict=True)):
        out.setdefault((p, id(nz)), []).append(i)
    return list(out.values())


def _probs(rows: list[torch.Tensor], params: SamplingParams) -> torch.Tensor:
    """``logits_to_probs`` of the stacked rows, each row the bits of its own call."""
    return logits_to_probs(torch.stack(rows), params, rowwise_sum=True)


def _verify_all(
    rules: Sequence[ERSD],
    params: Sequence[SamplingParams],
    noises: Sequence[RaceNoise],
    trees: Sequence[DraftTree],
    logits: Sequence[torch.Tensor],
    via_torch: bool | None,
) -> list[TreeVerification]:
    """Every context at once, one host transfer (module docstring)."""
    dev = logits[0].device
    winners: dict[tuple[int, int], int] = {}
    ranks: dict[tuple[int, int], int] = {}
    parts: list[torch.Tensor] = []
    order: list[list[tuple[int, int]]] = []  # per part: the (row, ctx) of each entry
    for idx in _groups(params, noises):
        ctxs = [(i, c) for i in idx for c in range(1 + trees[i].num_nodes)]
        p = _probs([logits[i][c] for i, c in ctxs], params[idx[0]])
        e = noises[idx[0]].exponentials_many(
            [trees[i].keys[c] for i, c in ctxs], STREAM_RACE, device=dev, via_torch=via_torch
        )
        scores = e / p
        w = torch.argmin(scores, dim=-1)  # the first minimum: lowest id on ties, as race_winner
        parts.append(w)
        order.append(ctxs)
        # rank statistics where the walk may need them: contexts with children
        inner = [j for j, (i, c) in enumerate(ctxs) if trees[i].children[c]]
        if inner:
            sel = torch.tensor(inner, device=dev)
            q = torch.stack(
                [
                    rules[ctxs[j][0]].race_probs(_draft_probs(trees[ctxs[j][0]], ctxs[j][1]))
                    for j in inner
                ]
            ).to(device=dev, dtype=torch.float64)
            sq = e[sel] / q
            s = sq.gather(1, w[sel].unsqueeze(1))
            r = (sq < s).sum(dim=1) + 1
            r = torch.where(torch.isinf(s.squeeze(1)), sq.shape[1] + 1, r)
            parts.append(r)
            order.append([(-1 - ctxs[j][0], ctxs[j][1]) for j in inner])  # rank entries
    flat = torch.cat(parts).tolist()  # the one transfer of the step's verification
    pos = 0
    for entries in order:
        for i, c in entries:
            if i >= 0:
                winners[(i, c)] = int(flat[pos])
            else:
                ranks[(-1 - i, c)] = int(flat[pos])
            pos += 1
    return [_walk(trees[i], lambda c, i=i: winners[(i, c)], ranks, i) for i in range(len(trees))]


def _draft_probs(tree: DraftTree, ctx: int) -> torch.Tensor:
    q = tree.draft_probs[ctx]
    assert q is not None, "a context with children must have draft probabilities"
    return q


def _walk(
    tree: DraftTree, winner: Any, ranks: dict[tuple[int, int], int], row: int
) -> TreeVerification:
    """The node-by-node walk of :func:`ersd.methods.verify_tree` for ERSD over known winners."""
    accepted: list[int] = []
    got: list[int] = []
    ctx = 0
    while True:
        kids = tree.children[ctx]
        y = winner(ctx)
        if not kids:
            break
        got.append(ranks[(row, ctx)])
        hit = next((k for k in kids if tree.tokens[k] == y), None)
        if hit is None:
            break
        accepted.append(hit)
        ctx = tree.context_of(hit)
    toks = [tree.tokens[n] for n in accepted] + [y]
    return TreeVerification(accepted=accepted, next_token=y, tokens=toks, ranks=got)


def _verify_levels(
    rules: Sequence[ERSD],
    params: Sequence[SamplingParams],
    noises: Sequence[RaceNoise],
    trees: Sequence[DraftTree],
    logits: Sequence[torch.Tensor],
) -> list[TreeVerification]:
    """The walks level by level, each level batched over the rows still walking (CPU)."""
    n = len(trees)
    ctx = [0] * n
    accepted: list[list[int]] = [[] for _ in range(n)]
    got: list[list[int]] = [[] for _ in range(n)]
    token: list[int | None] = [None] * n
    walking = list(range(n))
    groups = _groups(params, noises)
    while walking:
        live = set(walking)
        for idx in groups:
            rows = [i for i in idx if i in live]
            if not rows:
                continue
            noise = noises[rows[0]]
            keys = [trees[i].keys[ctx[i]] for i in rows]
            e = None
            if noise.lazy():  # race scheme v2: only the blocks that can win, row by row
                w = _lazy_winners(noise, params[rows[0]], keys, [logits[i][ctx[i]] for i in rows])
            else:
                p = _probs([logits[i][ctx[i]] for i in rows], params[rows[0]])
                e = torch.stack([noise.exponentials(k) for k in keys])
                w = (e / p).numpy().argmin(axis=1)  # NumPy's first minimum, as race_winner
            for r, i in enumerate(rows):
                tree, c, y = trees[i], ctx[i], int(w[r])
                kids = tree.children[c]
                if not kids:
                    token[i] = y
                    continue
                if e is None:
                    got[i].append(_lazy_rank(rules[i], noise, tree, c, keys[r], y))
                else:
                    got[i].append(_rank(rules[i], _draft_probs(tree, c), e[r], y))
                hit = next((k for k in kids if tree.tokens[k] == y), None)
                if hit is None:
                    token[i] = y
                    continue
                accepted[i].append(hit)
                ctx[i] = tree.context_of(hit)
        walking = [i for i in walking if token[i] is None]
    out = []
    for i in range(n):
        last = token[i]
        assert last is not None
        toks = [trees[i].tokens[k] for k in accepted[i]] + [last]
        out.append(
            TreeVerification(accepted=accepted[i], next_token=last, tokens=toks, ranks=got[i])
        )
    return out


def _lazy_winners(
    noise: RaceNoise, params: SamplingParams, keys: list[int], rows: list[torch.Tensor]
) -> list[int]:
    """The v2 race winners of the target at one level: from the logits where the sampling is
    temperature only (:meth:`RaceNoise.winner_from_logits`, no float64 probabilities), else (or
    where rounding could decide) from each row's own ``logits_to_probs``: the same tokens."""
    t = plain_temperature(params, noise.vocab_size) if FROM_LOGITS else None
    out: list[int] = []
    for key, row in zip(keys, rows, strict=True):
        y = noise.winner_from_logits(key, row, t) if t is not None else None
        out.append(y if y is not None else noise.winner(key, logits_to_probs(row, params)))
    return out


def _lazy_rank(rule: ERSD, noise: RaceNoise, tree: DraftTree, ctx: int, key: int, y: int) -> int:
    """:meth:`ERSD.rank` of the target's winner ``y`` under v2: where the drafter kept its logits
    (:class:`~ersd.methods.base.DraftLogits`, sharpness 1), a drafted ``y``'s place in the order
    it was drafted in (:attr:`~ersd.methods.base.DraftLogits.ranked`), else counted from the
    logits where rounding cannot decide (:func:`ersd.race_v2.v2_rank_from_logits`); else over
    ``q``."""
    probs = tree.draft_probs
    held = probs.pending(ctx) if isinstance(probs, DraftProbs) else None
    if held is not None and rule.draft_sharpness == 1.0 and held.intact():
        if DRAFTED_RANKS and y in held.ranked:  # a drafted token: its place in the strict order
            return held.ranked.index(y) + 1
        r = v2_rank_from_logits(noise.lazy_race(key, STREAM_RACE), held.row, y)
        if r is not None:
            return r
    return noise.rank(key, rule.race_probs(_draft_probs(tree, ctx)), y)


def _rank(rule: ERSD, q: torch.Tensor, e: torch.Tensor, token: int) -> int:
    """:meth:`ERSD.rank` (``race_rank`` of the draft's race), on the CPU."""
    sq = (e / rule.race_probs(q).to(torch.float64)).numpy()
    s = float(sq[token])
    if s == float("inf"):
        return sq.shape[0] + 1
    return int(np.count_nonzero(sq < s)) + 1
