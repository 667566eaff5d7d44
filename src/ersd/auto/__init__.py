"""``tree="auto"``: each step's draft tree chosen for predicted throughput at the batch size.

The package, in the order a reader needs it:

* :mod:`~ersd.auto.policy` -- the policy: one pure function from the candidates' predicted
  tokens and seconds, plain decoding's rate and the run's state to this step's tree and why;
* :mod:`~ersd.auto.rules` -- its constants, one :class:`Rules` value (``docs/auto-tree.md``
  says what each rule earns and which measurement shows it);
* :mod:`~ersd.auto.observe` -- what a run learns: the per-depth acceptance estimate and the
  step-time correction, explicit state updated by small methods;
* :mod:`~ersd.auto.predict` -- expected tokens of a tree, optimal trees, a batch's finish time;
* :mod:`~ersd.auto.curves` -- the measured cost curves, in a cache the caller owns, read from
  the cost store it names and written back only when asked (``CurveCache(learn=True)``);
* :mod:`~ersd.auto.chooser` -- :class:`TreeChooser`, which wires them for one generation.
"""

from ersd.auto.chooser import Choice, TreeChooser
from ersd.auto.curves import (
    MEASURE_PROMPT_TOKENS,
    CurveCache,
    draft_model_of,
    measure_prompt,
    measured_costs,
    prepare_costs,
    sharing,
)
from ersd.auto.observe import OnlineProfile, StepTiming
from ersd.auto.policy import Candidate, Decision, RunState, decide, smallest_near_best
from ersd.auto.predict import (
    batch_finish_seconds,
    expected_tokens,
    order_statistics,
    tunstall_order,
)
from ersd.auto.rules import CHAIN_LENGTHS, MAX_RANK, RULES, TREE_SIZES, Rules

__all__ = [
    "CHAIN_LENGTHS",
    "MAX_RANK",
    "MEASURE_PROMPT_TOKENS",
    "RULES",
    "TREE_SIZES",
    "Candidate",
    "Choice",
    "CurveCache",
    "Decision",
    "OnlineProfile",
    "Rules",
    "RunState",
    "StepTiming",
    "TreeChooser",
    "batch_finish_seconds",
    "decide",
    "draft_model_of",
    "expected_tokens",
    "measure_prompt",
    "measured_costs",
    "order_statistics",
    "prepare_costs",
    "sharing",
    "smallest_near_best",
    "tunstall_order",
]
