"""What a generation produced: one :class:`StepRecord` per target call, collected into a
:class:`GenerationResult` with the usual speculative-decoding statistics.

Records are plain data: any loop (the speculative loop of :mod:`ersd.generation`, a baseline
decoder in the bench, a batched engine) builds them and labels the result with its own name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: why a generation stopped: an EOS token, ``max_new_tokens``, or the model's context window
FINISH_REASONS = ("eos", "length", "context")


@dataclass
class StepRecord:
    """What happened in one target call."""

    step: int
    tokens: list[int]  # tokens emitted by this call (after EOS / length truncation)
    num_draft_tokens: int  # nodes in the drafted tree
    num_accepted: int  # accepted draft tokens among ``tokens``
    draft_forwards: int
    tree_depth: int
    ranks: list[int] = field(default_factory=list)  # ERSD: rank of target winner per context
    draft_time: float = 0.0  # seconds in draft model forwards
    target_time: float = 0.0  # seconds in the target model forward
    total_time: float = 0.0  # seconds for the whole step
    finish_reason: str | None = None  # set on the last record: one of FINISH_REASONS
    expected_tokens: float | None = None  # drafter's predicted tokens per call (dynamic trees)
    #: ``tree="auto"``: this step's decision (:class:`ersd.auto.Choice` as a dict: ``tree``
    #: drafted or "none", ``predicted`` / ``target_only`` tokens/s, ``best_tree``, ``batch``)
    choice: dict[str, Any] | None = None

    @property
    def other_time(self) -> float:
        return max(self.total_time - self.draft_time - self.target_time, 0.0)


def _explore_lost(step: StepRecord, choice: dict[str, Any]) -> float:
    """Seconds an exploring step cost beyond what the predicted choice would have taken for the
    tokens it emitted (its rates are over the step's batch: one row's share is rate / batch)."""
    drafted = choice.get("tree", "none") != "none"
    rate = choice.get("target_only") if drafted else choice.get("best_tree_predicted")
    if not rate or rate <= 0:
        return step.total_time
    per_row = float(rate) / max(int(choice.get("batch", 1) or 1), 1)
    return max(step.total_time - len(step.tokens) / per_row, 0.0)


@dataclass
class GenerationResult:
    """Generated tokens (new tokens only, EOS included if hit) and statistics.

    ``block_efficiency`` is tokens emitted per target call, bonus/correction token included
    (the vLLM / EAGLE "mean acceptance length"); ``mean_accepted`` excludes it (gpt-fast).
    """

    tokens: list[int]
    target_calls: int
    draft_forwards: int
    steps: list[StepRecord]
    method: str
    tree: str | None
    finish_reason: str  # one of FINISH_REASONS
    wall_time: float
    #: the race scheme the tokens were drawn under (:data:`ersd.race.RACE_SCHEMES`): the same
    #: request reproduces the tokens only under the same scheme
    race_scheme: str = "v1"

    @property
    def block_efficiency(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def num_draft_tokens(self) -> int:
        return sum(s.num_draft_tokens for s in self.steps)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.num_accepted for s in self.steps)

    @property
    def mean_accepted(self) -> float:
        return self.num_accepted_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        d = self.num_draft_tokens
        return self.num_accepted_tokens / d if d else 0.0

    @property
    def acceptance_histogram(self) -> list[int]:
        """``hist[j]`` = target calls that accepted exactly ``j`` draft tokens."""
        top = max((s.num_accepted for s in self.steps), default=0)
        hist = [0] * (top + 1)
        for s in self.steps:
            hist[s.num_accepted] += 1
        return hist

    @property
    def accepted_per_pos(self) -> list[float]:
        """``P(depth i accepted)`` for i = 1, 2, ...: calls accepting >= i drafts / calls."""
        depth = max((s.tree_depth for s in self.steps), default=0)
        n = len(self.steps) or 1
        return [sum(s.num_accepted >= i for s in self.steps) / n for i in range(1, depth + 1)]

    @property
    def ranks(self) -> list[int]:
        return [r for s in self.steps for r in s.ranks]

    @property
    def draft_time(self) -> float:
        return sum(s.draft_time for s in self.steps)

    @property
    def target_time(self) -> float:
        return sum(s.target_time for s in self.steps)

    @property
    def other_time(self) -> float:
        return max(self.wall_time - self.draft_time - self.target_time, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.wall_time if self.wall_time > 0 else float("inf")

    @classmethod
    def from_steps(
        cls,
        steps: list[StepRecord],
        *,
        method: Any,
        tree: Any,
        wall_time: float,
        eos_token_id: int | Sequence[int] | None = None,
        race_scheme: str = "v1",
    ) -> GenerationResult:
        """Collect the records of a generation loop into a result.

        ``method`` is a label: a method name or object (its ``.name``), or a baseline's own name;
        ``tree`` a parsed tree, shape or auto tree (stored as its label), a label string, or
        ``None`` when nothing was drafted.  The finish reason is the last record's; records
        without one (older producers) fall back to "eos" if the last token is in
        ``eos_token_id`` and "length" otherwise.
        """
        tokens = [t for s in steps for t in s.tokens]
        reason = steps[-1].finish_reason if steps else None
        if reason is None:
            eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
            reason = "eos" if tokens and tokens[-1] in eos else "length"
        return cls(
            tokens=tokens,
            target_calls=len(steps),
            draft_forwards=sum(s.draft_forwards for s in steps),
            steps=steps,
            method=str(getattr(method, "name", method)),
            tree=_tree_spec(tree),
            finish_reason=reason,
            wall_time=wall_time,
            race_scheme=race_scheme,
        )

    @property
    def expected_block_efficiency(self) -> float | None:
        """Mean of the drafter's predicted tokens per call, where it predicted them."""
        vals = [s.expected_tokens for s in self.steps if s.expected_tokens is not None]
        return sum(vals) / len(vals) if vals else None

    @property
    def auto_choices(self) -> dict[str, int]:
        """``tree="auto"``: steps per chosen tree ("none" = no drafting), most frequent first."""
        return dict(Counter(s.choice["tree"] for s in self.steps if s.choice).most_common())

    @property
    def auto_summary(self) -> str | None:
        """``tree="auto"``: what was chosen and why, e.g. ``auto chose: none in 40/40 steps
        (last step: predicted 15.1 tok/s target-only vs 11.2 with best tree chain:2, batch 1)``."""
        picks = [s.choice for s in self.steps if s.choice]
        if not picks:
            return None
        n = len(picks)
        chosen = ", ".join(f"{t} in {k}/{n} steps" for t, k in self.auto_choices.items())
        last = picks[-1]
        if last["tree"] == "none":
            why = f"predicted {last['target_only']:.1f} tok/s target-only"
            if last.get("best_tree"):
                why += f" vs {last['best_tree_predicted']:.1f} with best tree {last['best_tree']}"
        else:
            why = (
                f"predicted {last['predicted']:.1f} tok/s with {last['tree']} vs "
                f"{last['target_only']:.1f} target-only"
            )
        return f"auto chose: {chosen} (last step: {why}, batch {last['batch']})"

    @property
    def auto_finding_out(self) -> dict[str, Any] | None:
        """``tree="auto"``: the time spent finding out what pays: ``measure_s`` (cost curves
        measured during the run; 0 when they came from the store or an earlier run),
        ``explore_steps`` / ``explore_s`` (steps taken against the prediction to measure the
        other kind of step, whole step seconds: a draft's lazy prefill in such a step included)
        and their ``share`` of the run's wall time -- an upper bound, since an exploring step
        emits tokens too; ``lost_s`` / ``lost_share``: what the exploring steps cost beyond the
        time the predicted choice would have taken for the tokens they emitted (a plain step
        against the best tree's predicted rate, a drafting step against plain decoding's)."""
        picks = [(s, s.choice) for s in self.steps if s.choice]
        if not picks:
            return None
        measure = sum(float(c.get("measure_seconds", 0.0)) for _, c in picks)
        explore = [(s, c) for s, c in picks if c.get("explore")]
        explore_s = sum(s.total_time for s, _ in explore)
        lost = measure + sum(_explore_lost(s, c) for s, c in explore)
        wall = self.wall_time
        return {
            "measure_s": measure,
            "explore_steps": len(explore),
            "explore_s": explore_s,
            "share": (measure + explore_s) / wall if wall > 0 else 0.0,
            "lost_s": lost,
            "lost_share": lost / wall if wall > 0 else 0.0,
            "can_pay": bool(picks[-1][1].get("can_pay", True)),
        }

    def summary(self) -> str:
        """A few human-readable lines: tokens, calls, block efficiency, speed, auto's choice."""
        lines = [
            f"{self.method} tree {self.tree}: {len(self.tokens)} tokens in {self.target_calls} "
            f"target calls ({self.block_efficiency:.2f} per call), "
            f"{self.tokens_per_second:.2f} tokens/s, finish {self.finish_reason}"
        ]
        if self.auto_summary:
            lines.append(self.auto_summary)
            f = self.auto_finding_out
            if f is not None:
                lines.append(
                    f"auto finding out: {f['share']:.1%} of the run (measuring "
                    f"{f['measure_s']:.2f} s, {f['explore_steps']} exploring steps "
                    f"{f['explore_s']:.2f} s; lost against the predicted choice "
                    f"{f['lost_share']:.1%})"
                    + ("" if f["can_pay"] else "; drafting cannot pay on these costs")
                )
        return "\n".join(lines)

    def stats(self) -> dict[str, Any]:
        """Summary statistics as a JSON-ready dict (vLLM metric names where one exists)."""
        return {
            "method": self.method,
            "tree": self.tree,
            "num_tokens": len(self.tokens),
            "target_calls": self.target_calls,
            "draft_forwards": self.draft_forwards,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "block_efficiency": self.block_efficiency,
            "mean_accepted": self.mean_accepted,
            "acceptance_rate": self.acceptance_rate,
            "num_accepted_tokens_per_pos": self.accepted_per_pos,
            "acceptance_histogram": self.acceptance_histogram,
            "wall_time": self.wall_time,
            "draft_time": self.draft_time,
            "target_time": self.target_time,
            "other_time": self.other_time,
            "tokens_per_second": self.tokens_per_second,
            "finish_reason": self.finish_reason,
            "race_scheme": self.race_scheme,
            "expected_block_efficiency": self.expected_block_efficiency,
            "auto_choices": self.auto_choices or None,
            "auto_summary": self.auto_summary,
            "auto_finding_out": self.auto_finding_out,
        }

    def to_dict(self) -> dict[str, Any]:
        d = self.stats()
        d["tokens"] = list(self.tokens)
        d["steps"] = [asdict(s) for s in self.steps]
        return d


def _tree_spec(tree: Any) -> str | None:
    """The label of a tree: a parsed tree's ``label``, a shape's or auto tree's canonical
    ``spec``, a string as written (never parsed again here)."""
    if tree is None:
        return None
    return str(getattr(tree, "label", None) or getattr(tree, "spec", tree))
