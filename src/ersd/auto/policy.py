"""The whole of ``tree="auto"``'s policy: one pure function from predictions and the run's
state to this step's tree and why.  No clock, no file, no model, no hidden state: the caller
(:class:`ersd.auto.TreeChooser`) predicts each candidate's tokens and seconds from the cost
curves and the acceptance estimate, keeps the run's state, and applies the decision.

The rules, in the order they are applied (constants in :class:`~ersd.auto.rules.Rules`; the
table in ``docs/auto-tree.md`` says what each one earns and which replay shows it):

1. **best**: the candidate with the highest predicted rate -- or rather the smallest tree
   within ``smaller_tree_within`` of it -- is drafted if it beats plain decoding; **trusted
   depths**: at batch 1, a tree whose every depth has ``trusted_after`` observations is not
   given up for a smaller one that is slower (the margin guards against thinly observed deep
   estimates);
2. **cannot pay**: never draft (nor explore) where even every drafted token accepted would not
   beat plain decoding;
3. **batch start**: a batch starts its draft only on a gain of ``batch_start_margin``;
4. **prefill pays off**: with a known horizon, the draft's catch-up (its lazy prefill of the
   prompt on the first drafting step) must be repaid over the tokens the run has left;
5. **explore**: after ``explore_after`` plain steps in a row, draft the best tree once, if what
   exploring is predicted to lose stays within ``explore_budget`` of the run's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ersd.auto.rules import RULES, Rules
from ersd.tree import TreeShape


class Candidate(NamedTuple):
    """A drafting candidate's prediction: new tokens over the batch and seconds of one step
    (in a batch, tokens restated so that tokens / seconds is the rate to the batch's end);
    ``observed``: the fewest observations behind any of its depths' acceptance estimates
    (0: unknown, e.g. a fixed profile)."""

    spec: str
    shape: TreeShape
    tokens: float
    seconds: float
    observed: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class RunState:
    """What the run has done so far, as the policy needs it (kept by the caller)."""

    batch: int = 1
    plain_run: int = 0  # steps in a row without drafting
    ever_drafted: bool = False  # the draft session has been fed
    explore_spent: float = 0.0  # predicted seconds lost to exploration so far
    run_seconds: float = 0.0  # the run's time so far, or its projected time if larger
    catchup_seconds: float = 0.0  # the draft's catch-up if this step drafts (0: nothing to feed)
    tokens_left: float | None = None  # tokens the batch may still emit (None: no horizon)


@dataclass(frozen=True)
class Decision:
    """This step's tree (None: no drafting) and why; ``best`` the best drafting candidate."""

    shape: TreeShape | None
    spec: str
    why: str
    best: Candidate | None
    plain: float  # predicted tokens/s over the batch without drafting
    can_pay: bool = True
    explore: bool = False
    lost: float = 0.0  # predicted seconds an exploration step loses


def smallest_near_best(
    candidates: list[Candidate],
    plain: float,
    within: float = RULES.smaller_tree_within,
    trusted_after: float = RULES.trusted_after,
) -> Candidate | None:
    """The smallest tree whose predicted rate is within ``within`` of the best one's (and above
    ``plain``, if the best is), and not below any candidate whose every depth rests on
    ``trusted_after`` observations or more (the margin is for thinly observed estimates: a
    well-observed deep chain is not given up for a slower short one); None without
    candidates."""
    if not candidates:
        return None
    top = max(c.rate for c in candidates)
    trusted = max((c.rate for c in candidates if c.observed >= trusted_after), default=0.0)
    floor = max((1 - within) * top, plain, trusted) if top > plain else top
    near = [c for c in candidates if c.rate >= floor]
    return min(near, key=lambda c: (c.shape.num_nodes, -c.rate))


def decide(
    candidates: list[Candidate], plain: float, state: RunState, rules: Rules = RULES
) -> Decision:
    """This step's tree for predicted ``candidates`` against plain decoding's rate ``plain``
    (tokens/s over the batch) in the run's ``state``."""
    b = state.batch
    # trusted depths at batch 1 only: a batch's depths pool its rows' observations, while what
    # its finish time hangs on -- each row's own acceptance -- stays thin (replayed: at batch 8
    # the exemption lost 2-4%, docs/results/auto-rules-2026-12-06)
    trusted_after = rules.trusted_after if b == 1 else math.inf
    best = smallest_near_best(candidates, plain, rules.smaller_tree_within, trusted_after)
    ceiling = max((b * (1 + c.shape.depth) / c.seconds for c in candidates), default=-math.inf)
    can_pay = ceiling > plain or not rules.cannot_pay

    def out(draft: bool, why: str, explore: bool = False, lost: float = 0.0) -> Decision:
        chosen = best if draft else None
        spec = chosen.spec if chosen else "none"
        shape = chosen.shape if chosen else None
        return Decision(shape, spec, why, best, plain, can_pay, explore, max(lost, 0.0))

    if best is None:
        return out(False, "no candidate")
    if not can_pay:
        return out(False, "cannot pay: full acceptance would not beat plain decoding")
    if best.rate <= plain:
        why = "plain decoding predicted faster"
    elif b > 1 and not state.ever_drafted and best.rate < (1 + rules.batch_start_margin) * plain:
        why = "batch start: gain under the margin"
    elif (
        rules.prefill_pays_off
        and state.tokens_left is not None
        and state.catchup_seconds + state.tokens_left / best.rate >= state.tokens_left / plain
    ):
        why = "the draft's catch-up does not pay over the rest of the run"
    else:
        return out(True, "best predicted rate")
    if state.plain_run >= rules.explore_after:  # draft once, to measure drafting again
        lost = best.seconds + state.catchup_seconds - best.tokens / plain
        if state.explore_spent + max(lost, 0.0) <= rules.explore_budget * state.run_seconds:
            return out(True, "explore: re-measure drafting", explore=True, lost=lost)
    return out(False, why)


__all__ = ["Candidate", "Decision", "RunState", "decide", "smallest_near_best"]
