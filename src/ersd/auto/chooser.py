"""``tree="auto"``'s chooser for one generation (or one group of batch rows): it predicts each
candidate tree's tokens and seconds, asks the pure policy (:func:`ersd.auto.policy.decide`) for
this step's tree, and learns from the steps it is shown (:mod:`ersd.auto.observe`).  It reads
no clock and no file of its own: step times come from the caller (``observe_times``), stored
curves and profiles from the cost store of the :class:`~ersd.auto.curves.CurveCache` it is
given, which it writes to only when that cache was built with ``learn=True``.

Before every step it predicts, for each candidate -- no drafting (one target forward, one
token), chains of 1..8 tokens and (ERSD at temperature > 0) the optimal trees of a few sizes
under the current rank profile -- the throughput over the batch of ``B`` live rows::

    rate(tree, B) = B · E[tokens per call | tree, profile] / step_time(tree, B)
    rate(none, B) = B / (target(B, 1) + overhead_plain · B)

In a batch the rates are over the rest of the run, until its slowest row is done (each row's own
acceptance, rows leaving one by one: :meth:`TreeChooser._finish_rates`).  The rank profile is a
file's (``auto@FILE``) or the online estimate (:class:`~ersd.auto.observe.OnlineProfile`,
starting from the stored profile of the pair if there is one); the cost curves an explicit
:class:`~ersd.costs.CostModel`, a calibration file's, or the curves of the
:class:`~ersd.auto.curves.CurveCache`, corrected online by the run's own step times
(:class:`~ersd.auto.observe.StepTiming`).

The choice depends only on the costs and on steps already verified, never on the current step's
randomness, so every method stays exact and ERSD's text stays the target-only text (it is tree-
and batch-invariant); other methods' tokens depend on the trees chosen, hence on the batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import pstdev
from typing import Any

import numpy as np

from ersd.auto.curves import CurveCache, draft_model_of, measured_costs, process_curves
from ersd.auto.observe import OnlineProfile, StepTiming
from ersd.auto.policy import Candidate, RunState, decide
from ersd.auto.predict import (
    batch_finish_seconds,
    expected_tokens,
    order_statistics,
    tunstall_order,
)
from ersd.auto.rules import CHAIN_LENGTHS, RULES, TREE_SIZES, Rules
from ersd.costs import CostModel, CostModelError
from ersd.errors import ErsdError, InvalidTreeSpecError, UnsupportedTreeError
from ersd.theory import expected_block_efficiency_by_depth
from ersd.theory.profile import RankProfileError, load_profiles, tree_depth_probs
from ersd.tree import AutoTree, TreeShape


@dataclass
class Choice:
    """One step's decision: the tree drafted (``"none"``: no drafting) and the predictions."""

    tree: str
    predicted: float  # tokens/s over the batch of the chosen candidate
    target_only: float  # tokens/s over the batch without drafting
    best_tree: str | None  # the best drafting candidate (chosen or not)
    best_tree_predicted: float | None
    batch: int
    #: the prediction's two parts for the chosen candidate: new tokens of the batch
    #: (``batch · E[tokens per call]``) and seconds of the step (``predicted`` is their ratio)
    predicted_tokens: float = 0.0
    predicted_seconds: float = 0.0
    #: an exploration step (drafting although it is predicted not to pay, to re-measure it)
    explore: bool = False
    #: seconds this decision spent measuring cost curves (0: read from memory or the store)
    measure_seconds: float = 0.0
    #: whether drafting could pay at all (if every drafted token were accepted)
    can_pay: bool = True
    #: the chosen tree's expected tokens per row and step under the pooled profile (in a
    #: batch ``predicted_tokens`` is restated for the rest of the run; this is not)
    step_tokens: float = 1.0
    #: the rule that decided (:func:`ersd.auto.policy.decide`)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # flat fields: no need for dataclasses.asdict's deep copy


def _method_name(method: Any) -> str:
    return str(getattr(method, "name", "") or method)


class TreeChooser:
    """Chooses each step's tree for one sequence (module docstring); built from an
    :class:`~ersd.tree.AutoTree` by :meth:`ersd.request.Request.resolve`.  ``curves``: where
    measured cost curves are kept (a batch engine's; ``auto.costs`` when that is a
    :class:`CurveCache`; else the chooser's own)."""

    def __init__(
        self,
        auto: AutoTree,
        target: Any,
        drafter: Any,
        method: Any,
        rule: Any,
        temperature: float | None,
        curves: CurveCache | None = None,
        horizon: int | None = None,
        rules: Rules = RULES,
    ) -> None:
        from ersd.methods.ersd import ERSD

        self.auto = auto
        self.rules = rules
        self.method = method
        self.target = target
        self.draft_model = draft_model_of(drafter)
        self.ranked = isinstance(rule, ERSD)
        self.temperature = float(temperature or 0.0)  # the stored profile's key
        costs = auto.costs
        if isinstance(costs, CurveCache):  # measured, into the cache the caller shares
            curves, costs = costs, None
        self.curves = curves if curves is not None else process_curves()
        self.fixed_probs: list[Any] | None = None
        if auto.profile is not None:
            source = auto.profile
            try:
                if isinstance(source, str):
                    f = load_profiles(source)
                    source = f.profiles
                    if costs is None:
                        costs = f.data.get("costs")
                self.fixed_probs = tree_depth_probs(source, temperature)
                expected_block_efficiency_by_depth([(0,)], self.fixed_probs)  # checks the vectors
            except RankProfileError as exc:
                raise InvalidTreeSpecError(f"tree {auto.spec!r}: {exc}") from None
            except (ErsdError, TypeError, ValueError) as exc:
                raise InvalidTreeSpecError(
                    f"tree {auto.spec!r}: the rank profile must be a profile or calibration file, "
                    f"a RankProfile or per-depth rank-probability vectors ({exc})"
                ) from None
        try:
            self.costs = CostModel.from_dict(costs) if costs is not None else None
        except CostModelError as exc:
            raise InvalidTreeSpecError(f"tree {auto.spec!r}: cost model: {exc}") from None
        self.online: OnlineProfile | None = None
        self.stored_prior = False  # the online estimate starts from a stored profile
        if self.fixed_probs is None:
            stored = None
            store = self.curves.store
            if store is not None and self.draft_model is not None:
                stored = store.profile_entry(
                    target, self.draft_model, _method_name(method), self.temperature
                )
            self.stored_prior = stored is not None
            prior_probs, prior_trials = stored if stored is not None else (None, None)
            self.online = OnlineProfile(self.ranked, prior_probs, prior_trials, rules=rules)
        self.chains: dict[str, TreeShape] = {}
        for k in CHAIN_LENGTHS:
            chain = TreeShape.chain(k)
            if k <= auto.max_nodes and self._supported(chain):
                self.chains[f"chain:{k}"] = chain
        self.last: Choice | None = None
        self._measured: dict[int, CostModel] = {}  # measured costs per batch size
        # predicted (target, draft) forward seconds per (tree, batch size), before correction
        self._parts: dict[tuple[Any, int], tuple[float, float]] = {}
        self.timing = {"plain": StepTiming(rules=rules), "spec": StepTiming(rules=rules)}
        self._seeded: set[int] = set()  # batch sizes whose stored timing was looked up
        self._timed: dict[tuple[str, int], int] = {}  # steps timed in this run, per kind, batch
        self._timed_kept: dict[str, tuple[int, int]] = {}  # per kind: (steps, rows) last kept
        self._longest: int | None = None  # the longest row's context (a batch's), this step
        #: per row of a batch: [accepted, predicted] drafted tokens so far (row_factor)
        self._row_tokens: dict[Any, list[float]] = {}
        #: per row (None: the one sequence): whether its last step drafted and had all its
        #: drafts accepted (None after a step without drafting) -- the root's state
        self._after: dict[Any, bool | None] = {}
        self._last_row: Any = None  # the row observed last (a lone sequence's key)
        #: the spread of rows' factors and the rows behind it: the default, or an earlier run's
        self._row_spread = (rules.default_row_spread, 0.0)
        self._spreads: list[float] = []  # factors of this run's rows that have left (keep)
        self._learned = 0  # steps learned from (the decision is kept while this is unchanged)
        #: observations that changed the rank estimate (a subset of ``_learned``); while it and
        #: the rows' states are unchanged, the candidates and their expected tokens are too
        self._profile_version = 0
        self._shapes: tuple[Any, dict[str, tuple[TreeShape, float]]] | None = None
        self._decided: tuple[tuple[int, int, bool], TreeShape | None] | None = None
        self._chosen: tuple[CostModel, TreeShape | None, int] | None = None
        self._epoch = self.curves.measurements
        self._plain_run = 0  # steps in a row without drafting
        self._can_pay = True  # drafting can pay under the best plausible acceptance
        self._ever_drafted = False  # the draft session has been fed (else it prefills lazily)
        self._catchup = 0  # tokens the draft must catch up on in the step just chosen
        self._start: int | None = None  # the context's length at the first step (horizon)
        self.elapsed = 0.0  # seconds of the steps observed so far (the run's time)
        self.explore_spent = 0.0  # predicted seconds lost to exploration steps so far
        #: new tokens per row the run may generate (its ``max_new_tokens``): the exploration
        #: budget is a share of the run's time, taken as the larger of the time so far and the
        #: predicted time of the whole run at plain decoding's rate (None: the time so far)
        self.horizon = horizon
        self._projected = 0.0  # predicted seconds of the whole run at plain decoding's rate
        # the online observations already folded into the store (keep_profile)
        self._kept_counts: list[np.ndarray] = []
        self._kept_trials: list[int] = []
        self._kept_steps = 0

    def _supported(self, shape: TreeShape) -> bool:
        try:
            self.method.check_shape(shape)
        except UnsupportedTreeError:
            return False
        return True

    def depth_probs(self, rows: Sequence[Any] | None = None) -> list[Any]:
        """The per-depth estimate for a step of ``rows`` (batch row keys; None: the row
        observed last, a lone sequence), from each row's state (:class:`OnlineProfile`)."""
        if self.fixed_probs is not None:
            return self.fixed_probs
        assert self.online is not None
        return self.online.depth_probs(self._states(rows))

    def _states(self, rows: Sequence[Any] | None) -> list[bool | None]:
        """The root state of each of ``rows`` (None: the row observed last)."""
        keys = [self._last_row] if rows is None else list(rows)
        if not self.rules.markov_root:
            return [None] * len(keys)
        return [self._after.get(k) for k in keys]

    def predicted_shapes(
        self, rows: Sequence[Any] | None = None
    ) -> dict[str, tuple[TreeShape, float]]:
        """Each candidate tree with its expected tokens per row under the estimate for ``rows``
        (:meth:`depth_probs`, :meth:`candidates`), kept while no observation has changed the
        estimate: a step without drafting changes only the timing, and recomputing the optimal
        trees and their expectations after every such step was most of what auto added to
        plain decoding's loop."""
        key = (self._profile_version, tuple(self._states(rows)))
        if self._shapes is None or self._shapes[0] != key:
            probs = self.depth_probs(rows)
            shapes = {
                spec: (shape, expected_tokens(shape, probs))
                for spec, shape in self.candidates(probs).items()
            }
            self._shapes = (key, shapes)
        return self._shapes[1]

    def observed(self, depth: int) -> int:
        """The fewest observations of the online estimate at any of depths 1..``depth`` (0
        with a fixed profile, or where a depth was never observed): how well a tree of that
        depth's prediction is founded (:func:`~ersd.auto.policy.smallest_near_best`)."""
        trials = self.online.trials if self.online is not None else []
        return min(trials[:depth]) if 0 < depth <= len(trials) else 0

    def candidates(self, probs: list[Any]) -> dict[str, TreeShape]:
        """Chains, and (ERSD at T > 0) optimal trees of :data:`.rules.TREE_SIZES` nodes under
        ``probs`` (a tree equal to an earlier candidate is left out)."""
        out = dict(self.chains)
        sizes = [k for k in TREE_SIZES if k <= self.auto.max_nodes]
        if self.ranked and sizes:
            seen = {s.paths for s in out.values()}
            order = tunstall_order(probs, sizes[-1])
            for k in sizes:
                shape = TreeShape(tuple(sorted(order[:k], key=lambda t: (len(t), t))))
                if shape.paths not in seen and self._supported(shape):
                    seen.add(shape.paths)
                    out[f"optimal:{k}"] = shape
        return out

    def costs_at(self, context: list[int], batch: int) -> CostModel:
        if self.costs is not None:
            return self.costs
        if batch not in self._measured:
            self._measured[batch] = measured_costs(
                self.target, self.draft_model, context, batch, self.curves
            )
        return self._measured[batch]

    def _forward_parts(self, costs: CostModel, shape: TreeShape, batch: int) -> tuple[float, float]:
        """Predicted (target, draft) forward seconds of a step with ``shape`` (uncorrected)."""
        key = (shape.paths, batch)  # the costs at one batch size never change
        if key not in self._parts:
            target = costs.target_cost(shape.num_nodes + 1, batch)
            draft = costs.step_time(shape, batch) - target - costs.overhead * batch
            self._parts[key] = (target, draft)
        return self._parts[key]

    def _step_time(self, costs: CostModel, shape: TreeShape, batch: int) -> float:
        """Predicted seconds of a drafting step, corrected by the run's own steps."""
        target, draft = self._forward_parts(costs, shape, batch)
        t, plain = self.timing["spec"], self.timing["plain"]
        overhead = t.overhead
        if overhead is None:  # not timed yet: at least what a plain step spends outside its
            overhead = max(costs.overhead, plain.overhead or 0.0)  # forward (it does all that)
        ratio = self._target_ratio("spec", (shape.num_nodes + 1, batch))
        return ratio * target + t.draft_ratio * draft + overhead * batch

    def _target_ratio(self, kind: str, size: tuple[int, int] = (1, 1)) -> float:
        """The target's measured / predicted forward time for ``kind`` of step with ``size``
        (tokens per row, rows: :meth:`StepTiming.target_at`); a kind not timed yet borrows
        the other kind's (one model, one machine: a curve measured in other conditions is off
        for both alike)."""
        own = self.timing[kind]
        other = self.timing["plain" if kind == "spec" else "spec"]
        return (own if own.steps or not other.steps else other).target_at(size)

    def _plain_rate(self, costs: CostModel, batch: int) -> float:
        """Predicted tokens/s over the batch without drafting, corrected likewise."""
        t = self.timing["plain"]
        overhead = costs.overhead_plain if t.overhead is None else t.overhead
        return batch / (
            self._target_ratio("plain", (1, batch)) * costs.target_cost(1, batch) + overhead * batch
        )

    def _unseen(self, context: list[int]) -> int:
        """Tokens the draft session has not been fed yet: the whole context before the first
        drafting step (sessions prefill lazily, on their first forward; in a batch, the longest
        row's, as the rows are fed as one padded forward), else one per row and plain step
        since the last drafting step."""
        if self._ever_drafted:
            return self._plain_run
        return max(len(context), self._longest or 0)

    def _seed_timing(self, batch: int) -> None:
        """Start the timing corrections of a kind not timed yet from the cost store's entry for
        the pair at ``batch`` rows (once per batch size; measured curves only: a stored
        correction is relative to this machine's measured curve, not to a given cost model)."""
        if batch in self._seeded:
            return
        self._seeded.add(batch)
        store = self.curves.store
        if self.costs is not None or store is None or self.draft_model is None:
            return
        stored_timing = store.get_timing(self.target, self.draft_model, batch)
        for kind, stored in stored_timing.items():
            if kind == "rows":
                self._row_spread = (stored[0], stored[1])
            elif self.timing[kind].steps == 0:
                self.timing[kind].seed(stored)

    def keep_timing(self) -> bool:
        """Keep this run's timing corrections in the cost store (``Rules.keep_timing_after``),
        each kind under the batch size it was timed at most, unless nothing was timed (and no
        row left) since it was last kept -- a batch's rows finishing in one step would
        otherwise write the same entry once per row; returns whether anything was written."""
        store = self.curves.store if self.curves.learn else None
        if self.costs is not None or store is None or self.draft_model is None:
            return False
        wrote = False
        for kind, timing in self.timing.items():
            counts = {b: n for (k, b), n in self._timed.items() if k == kind}
            if not counts:
                continue
            batch = max(counts, key=lambda b: counts[b])
            state = (sum(counts.values()), len(self._spreads))
            enough = counts[batch] >= self.rules.keep_timing_after
            if enough and self._timed_kept.get(kind) != state:
                self._timed_kept[kind] = state
                keep = {kind: timing.stored()}
                if kind == "spec" and batch > 1 and len(self._spreads) >= 2:
                    keep["rows"] = list(self.row_spread(pstdev(self._spreads), len(self._spreads)))
                store.put_timing(self.target, self.draft_model, batch, keep)
                wrote = True
        return wrote

    def row_spread(self, spread: float, rows: float) -> tuple[float, float]:
        """The spread of rows' factors and the measured rows behind it: the kept one (or
        ``Rules.default_row_spread``, weighted as ``row_spread_prior_rows`` rows) pooled with
        ``spread`` over ``rows`` more rows (variances weighted by rows)."""
        old, behind = self._row_spread
        weight = behind if behind > 0 else self.rules.row_spread_prior_rows
        pooled = math.sqrt((weight * old**2 + rows * spread**2) / (weight + rows))
        return pooled, min(behind + rows, self.rules.row_spread_max_rows)

    def row_factor(self, row: Any) -> float:
        """A batch row's acceptance relative to the pool's: ``(accepted + W) / (predicted + W)``
        drafted tokens over its drafting steps so far (``Rules.row_prior_tokens``)."""
        accepted, predicted = self._row_tokens.get(row, (0.0, 0.0))
        w = self.rules.row_prior_tokens
        return (accepted + w) / (predicted + w)

    def forget_row(self, row: Any) -> None:
        """A row left the batch: its factor joins the spread kept for the next run (if it
        drafted enough to say), and its key is dropped (ids are reused)."""
        self._after.pop(row, None)
        tokens = self._row_tokens.pop(row, None)
        if tokens is not None and tokens[1] >= self.rules.row_spread_after:
            self._spreads.append(tokens[0] / tokens[1])

    def _finish_rates(
        self,
        costs: CostModel,
        predicted: list[Candidate],
        rows: Sequence[tuple[Any, int]],
    ) -> tuple[list[Candidate], float]:
        """The candidates' and plain decoding's rates over the rest of a batch's run (its rows'
        ``(key, tokens left)``): the tokens left over the seconds until the last row is done
        (:func:`batch_finish_seconds`), each row's expected tokens per step scaled by its own
        acceptance (:meth:`row_factor`), plus, for a row with few observations, its expected
        place among the batch's rows (:func:`order_statistics`, the rows ranked by their
        factors so far) times the spread of rows' factors (:meth:`row_spread`).  A candidate's
        tokens are restated so that tokens / seconds is that rate (its seconds stay one
        step's)."""
        left = [max(int(n), 1) for _, n in rows]
        total = float(sum(left))
        spread = self._row_spread[0]
        own = [self.row_factor(key) for key, _ in rows]
        ranked = sorted(range(len(rows)), key=lambda i: own[i])
        factors = [0.0] * len(rows)
        for z, i in zip(order_statistics(len(rows)), ranked, strict=True):
            seen = self._row_tokens.get(rows[i][0], (0.0, 0.0))[1]
            unsure = self.rules.row_prior_tokens / (seen + self.rules.row_prior_tokens)
            factors[i] = max(own[i] + z * spread * unsure, 0.0)
        plain = total / batch_finish_seconds(left, lambda b: b / self._plain_rate(costs, b))
        out = []
        for spec, shape, tokens, seconds, observed in predicted:
            gain = tokens / len(rows) - 1.0  # drafted tokens accepted per step, pooled
            steps = [
                n / min(1.0 + f * gain, 1.0 + shape.depth)
                for n, f in zip(left, factors, strict=True)
            ]
            finish = batch_finish_seconds(steps, functools.partial(self._step_time, costs, shape))
            out.append(Candidate(spec, shape, total / finish * seconds, seconds, observed))
        return out, plain

    def _run_state(self, costs: CostModel, context: list[int], batch: int) -> RunState:
        """The run so far, as :func:`~ersd.auto.policy.decide` takes it.  The draft's catch-up
        is on the tokens it has not seen -- on the first drafting step its whole prompt (lazy
        prefill); the tokens left are the :attr:`horizon` less the tokens generated since the
        first step, per row; the run's time is the time so far or, with a horizon, the
        predicted time of the whole run at plain decoding's rate if larger (so a run that
        states its length can afford its first exploring step early)."""
        catchup = self._unseen(context)
        draft = self.timing["spec"].draft_ratio * costs.draft_cost(catchup, batch)
        if self._start is None:
            self._start = len(context)
        left = None
        if self.horizon is not None:
            done = len(context) - self._start
            left = float(batch * max(max(self.horizon, 1) - done, 1))
        return RunState(
            batch=batch,
            plain_run=self._plain_run,
            ever_drafted=self._ever_drafted,
            explore_spent=self.explore_spent,
            run_seconds=max(self.elapsed, self._projected),
            catchup_seconds=draft if catchup > 1 else 0.0,
            tokens_left=left,
        )

    def choose(
        self,
        context: list[int],
        batch: int = 1,
        longest: int | None = None,
        rows: Sequence[tuple[Any, int]] | None = None,
    ) -> TreeShape | None:
        """This step's tree (None: no drafting) for a row with committed ``context`` among
        ``batch`` live rows; the decision is kept in :attr:`last`.  In a batch: ``longest``, the
        longest row's context length, and ``rows``, each live row's ``(key, tokens it may
        still emit)`` -- the rates are then over the rest of the batch's run
        (:meth:`_finish_rates`), not one step's."""
        self._longest = longest
        explore = self._plain_run >= self.rules.explore_after and self._can_pay
        cached = self._decided  # kept while nothing was learned (unless it is time to explore)
        fresh = cached is not None and cached[0] == (batch, self._learned, rows is not None)
        if cached is not None and fresh and not (explore and cached[1] is None):
            return self._repeat(cached[1], context, batch)
        measured = self.curves.measure_seconds
        costs = self.costs_at(context, batch)
        measured = self.curves.measure_seconds - measured
        self._seed_timing(batch)
        shapes = self.predicted_shapes([k for k, _ in rows] if rows is not None else None)
        plain = self._plain_rate(costs, batch)
        if self.horizon is not None:  # plain is over the batch: a row's rate is plain / batch
            self._projected = self.horizon * batch / plain
        predicted = [
            Candidate(
                spec,
                shape,
                batch * tokens,
                self._step_time(costs, shape, batch),
                self.observed(shape.depth),
            )
            for spec, (shape, tokens) in shapes.items()
        ]
        step_tokens = {c.spec: c.tokens / batch for c in predicted}
        if rows is not None and len(rows) == batch > 1 and self.rules.row_factors:
            predicted, plain = self._finish_rates(costs, predicted, rows)
        d = decide(predicted, plain, self._run_state(costs, context, batch), self.rules)
        self._can_pay = d.can_pay
        if d.explore:
            self.explore_spent += d.lost
        best = d.best
        drafts = d.shape is not None
        self.last = Choice(
            tree=d.spec,
            predicted=best.rate if drafts and best else plain,
            target_only=plain,
            best_tree=best.spec if best else None,
            best_tree_predicted=best.rate if best else None,
            batch=batch,
            predicted_tokens=best.tokens if drafts and best else float(batch),
            predicted_seconds=best.seconds if drafts and best else batch / plain,
            explore=d.explore,
            measure_seconds=measured,
            can_pay=d.can_pay,
            step_tokens=step_tokens[best.spec] if drafts and best else 1.0,
            why=d.why,
        )
        self._decided = None if d.explore else ((batch, self._learned, rows is not None), d.shape)
        self._chosen = (costs, d.shape, batch)
        return self._count(d.shape, context)

    def _repeat(self, chosen: TreeShape | None, context: list[int], batch: int) -> TreeShape | None:
        """The last decision again (``chosen``), without deciding: nothing measured or explored
        in this step."""
        self._chosen = (self._chosen[0], chosen, batch) if self._chosen else None
        if self.last is not None and (self.last.measure_seconds or self.last.explore):
            self.last = replace(self.last, measure_seconds=0.0, explore=False)
        return self._count(chosen, context)

    def _count(self, chosen: TreeShape | None, context: list[int]) -> TreeShape | None:
        self._catchup = self._unseen(context) if chosen is not None else 0
        if chosen is not None:
            self._ever_drafted = True
        self._plain_run = 0 if chosen is not None else self._plain_run + 1
        return chosen

    def observe_times(
        self,
        batch: int,
        draft: float,
        target: float,
        total: float,
        *,
        prefill: bool = False,
        step: TreeShape | bool | None = False,
    ) -> None:
        """Learn the step time of the step just verified (``batch`` rows; its draft and target
        forward seconds and its total seconds) for the online correction.  ``step``: in a
        batch, the largest tree any row drafted (None: no row drafted) — the shared forwards
        cost what it costs, whatever this row chose; by default this row's own choice.
        Skipped: a step during which cost curves were measured, and one whose forwards included
        a prompt's prefill (``prefill``: a sequence's first step, a row joining the batch)."""
        self.elapsed += total
        epoch, self._epoch = self._epoch, self.curves.measurements
        if self._chosen is None or epoch != self.curves.measurements or batch < 1 or prefill:
            return
        costs, shape, b = self._chosen
        if b != batch:
            return
        if step is not False:
            shape = step if isinstance(step, TreeShape) else None
        overhead = max(total - draft - target, 0.0) / batch
        if shape is None:
            kind = "plain"
            predicted_target = costs.target_cost(1, batch)
            ratio = target / max(predicted_target, 1e-9)
            self.timing["plain"].update(ratio, 1.0, overhead, (1, batch))
        elif self._catchup > 2:  # the draft's forwards fed tokens of plain steps (or its
            return  # prompt: lazy prefill): not what a drafting step costs
        else:
            kind = "spec"
            pt, pd = self._forward_parts(costs, shape, batch)
            dr = draft / pd if pd > 0 else 1.0
            size = (shape.num_nodes + 1, batch)
            self.timing["spec"].update(target / max(pt, 1e-9), dr, overhead, size)
        self._timed[kind, batch] = self._timed.get((kind, batch), 0) + 1
        self._learned += 1  # the decision may change

    def keep_profile(self) -> bool:
        """Fold the rank observations made since the last call into the cost store's profile
        of this pair (method, temperature), so that the next run -- in this process or another
        -- starts from them instead of the generic prior (a run without a stored profile may
        otherwise never afford its first drafting step).  Kept only from
        ``Rules.keep_profile_after`` drafting steps on; returns whether anything was written.
        The run's timing corrections are kept too (:meth:`keep_timing`)."""
        self.keep_timing()
        online, store = self.online, (self.curves.store if self.curves.learn else None)
        if online is None or store is None or self.draft_model is None:
            return False
        if online.steps - self._kept_steps < self.rules.keep_profile_after:
            return False
        kept_c, kept_n = self._kept_counts, self._kept_trials
        counts = [c - (kept_c[d] if d < len(kept_c) else 0) for d, c in enumerate(online.counts)]
        trials = [n - (kept_n[d] if d < len(kept_n) else 0) for d, n in enumerate(online.trials)]
        store.merge_profile(
            self.target,
            self.draft_model,
            _method_name(self.method),
            self.temperature,
            [list(map(float, c)) for c in counts],
            trials,
        )
        self._kept_counts = [c.copy() for c in online.counts]
        self._kept_trials = list(online.trials)
        self._kept_steps = online.steps
        return True

    @property
    def learns_beyond(self) -> bool:
        """Whether :meth:`observe_beyond` learns anything: an online estimate whose observations
        are ranks (ERSD) or deterministic acceptances (temperature 0, where a drafted token is
        accepted exactly when it is the target's)."""
        if self.online is None or not self.rules.beyond:
            return False
        return self.ranked or self.temperature == 0.0

    def observe_beyond(self, depth: int, rank: int | None) -> None:
        """The last step's bonus token, one depth below its fully accepted path, and its rank in
        the draft's order there (:attr:`ersd.drafting.Proposal.beyond`): an observation of
        ``depth`` drafting it would have made, seen at no forward's cost.  While auto drafts
        short chains in an easy stretch, these are its only observations of the depths below."""
        if not self.learns_beyond:
            return
        assert self.online is not None
        self.online.observe_beyond(depth, rank)  # ignores the root (depth 1), never below a path
        self._learned += 1
        self._profile_version += 1

    def observe(
        self, ranks: list[int], accepted: int, depth: int, row: Any = None
    ) -> dict[str, Any] | None:
        """Learn from a verified step (its ranks, accepted drafts and drafted depth; ``row``:
        the batch row's key, for :meth:`row_factor`); returns the step's decision as a dict
        (for :attr:`ersd.StepRecord.choice`)."""
        last = self.last
        if row is not None and depth > 0 and last is not None and last.tree != "none":
            tokens = self._row_tokens.setdefault(row, [0.0, 0.0])
            tokens[0] += accepted
            tokens[1] += max(last.step_tokens - 1.0, 0.0)
            self._learned += 1  # the batch's finish time may change the decision
        self._last_row = row
        state = self._after.get(row)
        if self.online is not None and depth > 0:
            self._learned += 1
            self._profile_version += 1
            if self.ranked:
                self.online.observe_ranks(ranks, state)
            else:
                self.online.observe_chain(accepted, depth, state)
        after = accepted >= depth if depth > 0 else None
        if after != state:
            self._after[row] = after
            self._learned += 1  # the next step's root estimate changes
        return self.last.to_dict() if self.last is not None else None


__all__ = ["Choice", "TreeChooser"]
