"""Many sequences at once: a continuous-batching engine and :func:`generate_batch`.

Every sequence runs the same four phases as :func:`ersd.generate` (:mod:`ersd.generation`), with
its own settings, seed and race keys; only the model forwards are shared: the drafts of all rows
are grown level by level with **one** draft forward per level, and the trees of all rows are
scored with **one** target forward per step (:func:`ersd.models.batch.score_many`).  Nothing a
row computes depends on the other rows, so each prompt's tokens are exactly what
:func:`ersd.generate` gives for it alone with the same seed and settings (batch invariance),
whatever the batch, the order, or when other rows join and leave.

Seeds: ``seeds=None`` or an ``int`` ``s`` gives prompt ``i`` the seed :func:`derive_seed` ``(s, i)``
(so equal prompts in one batch get independent samples); a list gives one seed per prompt.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ersd.auto import CurveCache
from ersd.drafting import Drafter, ModelDrafter, Proposal
from ersd.drafting.base import GrowingSession
from ersd.errors import ErsdError, GenerationInputError
from ersd.generation import (
    SequenceState,
    TreeSpec,
    as_drafter,
    settle,
    start_sequence,
    step_shape,
    target_call,
    verify,
)
from ersd.methods import DraftTree, Method, TreeVerification
from ersd.models.base import LanguageModel
from ersd.models.batch import score_many
from ersd.probs import SamplingParams
from ersd.race import RaceNoise, _mix64
from ersd.request import Request, Settings, check_target
from ersd.results import GenerationResult, StepRecord
from ersd.tree import TreeShape
from ersd.validation import check_seed
from ersd.verify_batch import batches, verify_many
from ersd.watermark.keyed import race_noise
from ersd.watermark.settings import Watermark

_MASK64 = (1 << 64) - 1


class RowPool:
    """Worker threads for the per-row work between a step's forwards, owned by one engine.

    The per-row work (the race noise -- NumPy's Philox fills run without the GIL -- and the
    probability, race and verification kernels of torch, one thread each for a single
    distribution) can then run on every core instead of one.  ``workers``: the number of
    threads (None, the default: 1, a serial loop).  Threads help only where the per-row kernels
    outweigh the interpreter's lock: each row's work is many small torch and NumPy calls, and
    two threads trading the GIL on every call wait on each other (on one 2-core AVX2 VM a batch
    of 8 chain:4 rows spent 7% of its decode steps outside the forwards serially and 14% side
    by side; on another, 5.7% and 5.6%: docs/batching.md).  The threads start on first use and
    end with :meth:`close`.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (threads, pool)

    def map(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        """``list(map(fn, *columns))``, on the worker threads when there are several rows and
        workers.  ``fn`` must touch only its own row's state: each result is then exactly what
        the serial loop gives."""
        n = 1 if self.workers is None else self.workers
        if min(len(c) for c in columns) < 2 or n < 2:
            return list(map(fn, *columns))
        if self._pool is None or self._pool[0] != n:
            self.close()
            self._pool = (n, ThreadPoolExecutor(n, thread_name_prefix="ersd-rows"))
        return list(self._pool[1].map(fn, *columns))

    def close(self) -> None:
        """End the worker threads (a later :meth:`map` starts new ones)."""
        if self._pool is not None:
            self._pool[1].shutdown(wait=True)
            self._pool = None


def row_map(
    fn: Callable[..., Any], *columns: Sequence[Any], workers: int | None = None
) -> list[Any]:
    """``list(map(fn, *columns))`` on a :class:`RowPool` of ``workers`` threads made for this
    call (an engine keeps its own pool across steps)."""
    pool = RowPool(workers)
    try:
        return pool.map(fn, *columns)
    finally:
        pool.close()


def derive_seed(seed: int, index: int) -> int:
    """The seed of prompt (or choice) ``index`` of a batch run with one ``seed``.

    ``splitmix64(seed XOR splitmix64(index + 1))``: a fixed, documented function, so a batch
    result can be reproduced one prompt at a time with
    ``ersd.generate(..., seed=derive_seed(s, i))``.
    """
    return _mix64((int(seed) & _MASK64) ^ _mix64(int(index) + 1))


def batch_seeds(seeds: int | Sequence[int] | None, n: int) -> list[int]:
    """Per-prompt seeds for ``n`` prompts (see the module docstring)."""
    if seeds is None:
        seeds = 0
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return [derive_seed(check_seed(seeds), i) for i in range(n)]
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence):
        raise GenerationInputError(
            f"seeds must be an int (one seed for the batch) or a list of {n} ints, got "
            f"{type(seeds).__name__}"
        )
    if len(seeds) != n:
        raise GenerationInputError(
            f"seeds has {len(seeds)} entries but there are {n} prompts; give one seed per prompt "
            "or a single int for the whole batch"
        )
    return [check_seed(s) for s in seeds]


@dataclass
class Row:
    """One request in the engine: its settings, its sequence state and its records so far."""

    id: int
    settings: Settings
    seq: SequenceState
    records: list[StepRecord] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def result(self, label: str | None = None) -> GenerationResult:
        return GenerationResult.from_steps(
            self.records,
            method=label or self.settings.method.name,
            tree=self.settings.label,
            wall_time=time.perf_counter() - self.started,
            race_scheme=self.settings.noise.scheme,
        )

    def close(self) -> None:
        """Free the row's sessions (KV caches, batch slots) now, where they can be closed."""
        for sess in _sessions(self.seq):
            close = getattr(sess, "close", None)
            if callable(close):
                close()


@dataclass
class StepTimes:
    """Where one engine step's time went (seconds), for the time split of a batched run."""

    rows: int = 0
    draft: float = 0.0
    target: float = 0.0
    total: float = 0.0

    @property
    def other(self) -> float:
        return max(self.total - self.draft - self.target, 0.0)


class BatchEngine:
    """Continuous batching: requests join with :meth:`add`, every :meth:`step` advances each
    active request by one target call (one shared forward), finished requests leave.

    ``draft`` is a draft model, a :class:`~ersd.drafting.Drafter` or ``None``; each request picks
    its own method, tree (``None``: no drafting for it), sampling settings, seed and limits.
    """

    def __init__(self, target: LanguageModel, draft: Drafter | LanguageModel | None = None) -> None:
        check_target(target)
        self.target = target
        self.drafter = as_drafter(draft)
        self.noise = RaceNoise(target.vocab_size, cache_size=512)
        self._watermark_noise: dict[Watermark, RaceNoise] = {}  # one noise per watermark
        self._scheme_noise: dict[str, RaceNoise] = {}  # the other race schemes' noises
        self._rows: dict[int, Row] = {}
        self._ids = itertools.count()
        self.last_step = StepTimes()
        self._widest: TreeShape | None = None  # the largest tree of the current step
        self._choosers: dict[tuple[Any, ...], Any] = {}  # tree="auto": one chooser per group
        self.curves = CurveCache()  # tree="auto": the cost curves its choosers measure
        #: threads for the rows' work between forwards (None: torch's intra-op thread count)
        self.rows = RowPool()
        #: verify the ERSD rows of a step in one batched call (:mod:`ersd.verify_batch`); False
        #: walks every row node by node (the reference path; the same tokens)
        self.batched_verify = True

    @property
    def workers(self) -> int | None:
        """Threads for the rows' work between forwards (:class:`RowPool`; None: torch's)."""
        return self.rows.workers

    @workers.setter
    def workers(self, n: int | None) -> None:
        self.rows.workers = n

    def close(self) -> None:
        """Drop every request and end the engine's worker threads."""
        for rid in list(self._rows):
            self.cancel(rid)
        self.rows.close()

    def __enter__(self) -> BatchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def active(self) -> list[int]:
        return list(self._rows)

    def add(self, request: Request | Sequence[int], **keywords: Any) -> int:
        """Queue a :class:`~ersd.request.Request`; it joins at the next :meth:`step`.  Returns
        its id.  ``add(prompt, max_new_tokens=..., ...)`` builds the request from the keywords
        of :meth:`Request.of` (``tree=None``: no drafting for it)."""
        if not isinstance(request, Request):
            request = Request.of(request, **keywords)
        elif keywords:
            raise GenerationInputError(
                f"give add() a Request or a prompt with keywords, not both (got {sorted(keywords)})"
            )
        noise = self.noise
        if request.race_scheme != noise.scheme:  # one noise (and cache) per race scheme
            noise = self._scheme_noise.get(request.race_scheme) or self._scheme_noise.setdefault(
                request.race_scheme, request.noise(self.target.vocab_size, 512)
            )
        if request.watermark is not None:
            noise = self._watermark_noise.get(
                request.watermark
            ) or self._watermark_noise.setdefault(
                request.watermark, race_noise(self.target.vocab_size, request.watermark, 512)
            )
        settings = request.resolve(self.target, self.drafter, noise=noise, curves=self.curves)
        if settings.chooser is not None:  # tree="auto": one chooser per group of like rows
            settings = replace(settings, chooser=self._shared_chooser(settings))
        seq = start_sequence(self.target, request, settings)
        _expect_lengths(seq, len(request.prompt) + request.max_new_tokens + _tree_slack(settings))
        rid = next(self._ids)
        self._rows[rid] = Row(rid, settings, seq)
        return rid

    def _shared_chooser(self, settings: Settings) -> Any:
        """The chooser of the rows whose ``tree="auto"`` decision this row shares.

        The shared forwards of a step cost what its largest tree costs, so rows choosing apart
        give mixed steps (some rows drafting, others paying for it without drafting) that no
        row's prediction describes.  Rows with the same method, rule, temperature and auto
        settings therefore share one chooser: one decision per step for all of them, learned
        from all their verified steps (a pooled acceptance profile) and the step's time."""
        chooser = settings.chooser
        auto = chooser.auto
        profile = auto.profile if isinstance(auto.profile, str) else id(auto.profile)
        key = (
            settings.method.name,
            settings.rule.name,
            settings.params.temperature,
            auto.spec,
            profile,
            id(auto.costs),
            auto.max_nodes,
        )
        # the stored chooser holds its auto settings (profile, costs), so their ids stay unique
        return self._choosers.setdefault(key, chooser)

    def cancel(self, rid: int) -> None:
        """Drop a request now (its sessions and caches are freed)."""
        row = self._rows.pop(rid, None)
        if row is not None:
            row.close()

    def result(self, rid: int) -> GenerationResult:
        return self._rows[rid].result()

    def step(self) -> list[tuple[int, StepRecord, GenerationResult | None]]:
        """Advance every active request by one target call.

        Returns ``(id, record, result)`` per request; ``result`` is the finished request's
        :class:`GenerationResult` (it has left the engine), else ``None``.
        """
        rows = list(self._rows.values())
        if not rows:
            return []
        prefill = any(r.seq.steps == 0 for r in rows)  # a row's first step feeds its prompt
        self._widest = None  # set by _propose
        started = time.perf_counter()
        proposals, depths, draft_time = self._propose(rows)
        t0 = time.perf_counter()
        calls = [
            target_call(r.settings, r.seq, p.tree) for r, p in zip(rows, proposals, strict=True)
        ]
        logits = score_many(self.target, [r.seq.target for r in rows], calls)
        target_time = time.perf_counter() - t0
        scored = [lg[: 1 + p.tree.num_nodes] for p, lg in zip(proposals, logits, strict=True)]
        verdicts = self._verify(rows, proposals, scored)
        out: list[tuple[int, StepRecord, GenerationResult | None]] = []
        for row, prop, depth, lg, verdict in zip(
            rows, proposals, depths, scored, verdicts, strict=True
        ):
            rec = settle(
                row.settings,
                row.seq,
                prop,
                depth,
                lg,
                target_time=target_time,
                started=started,
                verdict=verdict,
            )
            row.records.append(rec)
            done = None
            if row.seq.finish_reason is not None:
                done = row.result()
                del self._rows[row.id]
                row.close()
                if row.settings.chooser is not None:  # tree="auto": keep what it learned
                    row.settings.chooser.forget_row(id(row.seq))
                    row.settings.chooser.keep_profile()
            out.append((row.id, rec, done))
        self.last_step = StepTimes(
            rows=len(rows),
            draft=draft_time,
            target=target_time,
            total=time.perf_counter() - started,
        )
        # tree="auto": correct each chooser's cost model by this step's time, once per chooser
        choosers = {id(c): c for r in rows if (c := r.settings.chooser) is not None}
        t = self.last_step
        for chooser in choosers.values():
            chooser.observe_times(
                len(rows), t.draft, t.target, t.total, prefill=prefill, step=self._widest
            )
        return out

    def _verify(
        self, rows: list[Row], proposals: list[Proposal], scored: list[torch.Tensor]
    ) -> list[TreeVerification]:
        """Every row's verdict: the ERSD rows in one batched call (:func:`verify_many`: on a
        device one host transfer for the step, on the CPU one batched call per tree level),
        the other rows node by node on the row pool.  The same verdicts either way."""
        verdicts: list[TreeVerification | None] = [None] * len(rows)
        many = [i for i, r in enumerate(rows) if self.batched_verify and batches(r.settings.rule)]
        if many:
            done = verify_many(
                [rows[i].settings.rule for i in many],  # type: ignore[misc]
                [rows[i].settings.params for i in many],
                [rows[i].settings.noise for i in many],
                [proposals[i].tree for i in many],
                [scored[i] for i in many],
            )
            for i, v in zip(many, done, strict=True):
                verdicts[i] = v
        rest = [i for i in range(len(rows)) if verdicts[i] is None]
        if rest:
            done = self.rows.map(
                verify,
                [rows[i].settings for i in rest],
                [proposals[i].tree for i in rest],
                [scored[i] for i in rest],
            )
            for i, v in zip(rest, done, strict=True):
                verdicts[i] = v
        return [v for v in verdicts if v is not None]

    def _propose(self, rows: list[Row]) -> tuple[list[Proposal], list[int], float]:
        """Every row's draft tree; model drafts grow level by level, one forward per level."""
        t0 = time.perf_counter()
        proposals: list[Proposal | None] = [None] * len(rows)
        depths = [0] * len(rows)
        growing: dict[int, Generator[Any, torch.Tensor, DraftTree]] = {}
        sessions: dict[int, GrowingSession] = {}  # the growing rows' draft sessions
        model = self.drafter.model if isinstance(self.drafter, ModelDrafter) else None
        decided: dict[int, TreeShape | None] = {}  # tree="auto": one decision per chooser
        longest = max(len(r.seq.target.committed) for r in rows)  # a padded draft prefill's
        for i, row in enumerate(rows):
            chooser = row.settings.chooser
            if chooser is not None and row.seq.drafter is not None:
                if id(chooser) not in decided:
                    # its rows' tokens left: a batch is done when its slowest row is
                    left = [
                        (id(r.seq), r.seq.allowed) for r in rows if r.settings.chooser is chooser
                    ]
                    decided[id(chooser)] = chooser.choose(
                        row.seq.target.committed, len(rows), longest, left
                    )
                shape = step_shape(row.settings, row.seq, len(rows), decided[id(chooser)])
            else:
                shape = step_shape(row.settings, row.seq, len(rows))
            drafter = row.seq.drafter
            if shape is None or drafter is None:
                proposals[i] = Proposal(DraftTree.empty(row.seq.key))
                continue
            depths[i] = shape.depth
            if self._widest is None or (shape.num_nodes, shape.depth) > (
                self._widest.num_nodes,
                self._widest.depth,
            ):
                self._widest = shape  # the step's largest tree: what its forwards cost
            s = row.settings
            if model is not None and grows(drafter):
                sessions[i] = drafter
                growing[i] = drafter.grow(shape, row.seq.key, s.rule, s.params, s.noise)
            else:
                proposals[i] = drafter.propose(shape, row.seq.key, s.rule, s.params, s.noise)
        if growing:
            assert model is not None
            pending = {i: next(g) for i, g in growing.items()}
            forwards = dict.fromkeys(growing, 0)
            # sessions that share state across rows (a dynamic drafter's predictor and counters)
            # draft one row at a time; plain model drafting works on the rows side by side
            side_by_side = all(sessions[i].parallel_grow for i in growing)
            first = True  # a grower reads the root row of its first call only
            while pending:
                idx = list(pending)
                outs = score_many(
                    model,
                    [sessions[i].session for i in idx],
                    [pending[i] for i in idx],
                    root=first,
                )
                first = False
                columns = ([growing[i] for i in idx], outs)
                sent = (
                    self.rows.map(_resume, *columns)
                    if side_by_side
                    else list(map(_resume, *columns))
                )
                for i, (call, tree) in zip(idx, sent, strict=True):
                    forwards[i] += 1
                    if tree is None:
                        pending[i] = call
                    else:
                        proposals[i] = Proposal(tree, forwards=forwards[i])
                        del pending[i]
        draft_time = time.perf_counter() - t0
        done = [p for p in proposals if p is not None]
        assert len(done) == len(rows)
        for p in done:
            if p.forwards:
                p.seconds = draft_time  # the shared forwards' time, as each row saw it
        return done, depths, draft_time


#: :class:`GrowingSession`'s members (tests/test_batch.py checks them against the protocol)
GROWING_MEMBERS = ("grow", "observe", "parallel_grow", "propose", "session")


def grows(drafter: object) -> bool:
    """``isinstance(drafter, GrowingSession)`` without typing's protocol walk, which Python 3.11
    redoes on every call (~0.15 ms, once per row per step): the same test, every member present
    and no method set to None."""
    for name in GROWING_MEMBERS:
        value = getattr(drafter, name, _MISSING)
        if value is _MISSING or (value is None and name in _GROWING_METHODS):
            return False
    return True


_MISSING = object()
_GROWING_METHODS = frozenset({"grow", "observe", "propose"})


def _sessions(seq: SequenceState) -> tuple[Any, Any]:
    """The row's target session and its drafter's model session (or the draft session itself,
    for drafters without a model; None without a drafter)."""
    return seq.target, getattr(seq.drafter, "session", seq.drafter)


def _tree_slack(settings: Settings) -> int:
    """Cache entries a row's draft tree may add on top of its committed tokens in one step."""
    shape = settings.shape
    if settings.chooser is not None:
        nodes = int(settings.chooser.auto.max_nodes)
    else:
        nodes = shape.num_nodes if shape is not None else 0
    # a dynamic tree may be wider than its envelope chain: up to its budget of nodes
    nodes = max(nodes, int(getattr(settings.drafter, "budget", 0)))
    return nodes + settings.min_forward_tokens


def _expect_lengths(seq: SequenceState, tokens: int) -> None:
    """Tell the row's sessions how long they may grow (a backend's optional ``expect_length``
    hint: batched KV storage is then sized once instead of regrown)."""
    if seq.max_length is not None:
        tokens = min(tokens, seq.max_length)
    for sess in _sessions(seq):
        expect = getattr(sess, "expect_length", None)
        if callable(expect):
            expect(tokens)


def _resume(
    gen: Generator[Any, torch.Tensor, DraftTree], logits: torch.Tensor
) -> tuple[Any, DraftTree | None]:
    """Send one draft forward's logits to a growing tree: (its next call, None) or (None, tree)."""
    try:
        return gen.send(logits), None
    except StopIteration as done:
        return None, done.value


def generate_batch_stream(
    target: LanguageModel,
    draft: Drafter | LanguageModel | None,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    seeds: int | Sequence[int] | None = None,
    method: str | Method = "ersd",
    tree: TreeSpec = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    sampling: SamplingParams | None = None,
    max_batch_size: int | None = None,
    watermark: Watermark | None = None,
    race_scheme: str = "v1",
) -> Iterator[tuple[int, StepRecord]]:
    """Like :func:`generate_batch`, yielding ``(prompt index, record)`` per row per step."""
    drafter = as_drafter(draft)
    requests = batch_requests(
        target,
        drafter,
        prompts,
        batch_seeds(seeds, _count(prompts)),
        max_new_tokens=max_new_tokens,
        method=method,
        tree=tree if drafter is not None else None,
        sampling=sampling,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        eos_token_id=eos_token_id,
        watermark=watermark,
        race_scheme=race_scheme,
    )
    for index, rec, _ in run_requests(target, drafter, requests, max_batch_size):
        yield index, rec


def generate_batch(
    target: LanguageModel,
    draft: Drafter | LanguageModel | None,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    seeds: int | Sequence[int] | None = None,
    method: str | Method = "ersd",
    tree: TreeSpec = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    sampling: SamplingParams | None = None,
    max_batch_size: int | None = None,
    watermark: Watermark | None = None,
    race_scheme: str = "v1",
) -> list[GenerationResult]:
    """Generate for many prompts at once; one :class:`GenerationResult` per prompt, in order.

    Each prompt's tokens equal ``ersd.generate(target, draft, prompt, seed=seed_i, ...)`` with the
    same settings (see the module docstring for ``seeds``), for every tree kind (``dynamic:K``
    and ``auto`` included).  ``max_batch_size`` caps the rows run together; further prompts join
    as rows finish (continuous batching).  Every input is checked before anything runs.
    """
    drafter = as_drafter(draft)
    requests = batch_requests(
        target,
        drafter,
        prompts,
        batch_seeds(seeds, _count(prompts)),
        max_new_tokens=max_new_tokens,
        method=method,
        tree=tree if drafter is not None else None,
        sampling=sampling,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        eos_token_id=eos_token_id,
        watermark=watermark,
        race_scheme=race_scheme,
    )
    results: dict[int, GenerationResult] = {}
    for index, _, res in run_requests(target, drafter, requests, max_batch_size):
        if res is not None:
            results[index] = res
    return [results[i] for i in range(len(results))]


def _count(prompts: Sequence[Sequence[int]]) -> int:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise GenerationInputError(
            "prompts must be a non-empty list of token-id lists (one per prompt)", param="prompt"
        )
    return len(prompts)


def batch_requests(
    target: LanguageModel,
    drafter: Drafter | None,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    **fields: Any,
) -> list[Request]:
    """One :class:`Request` per prompt (the keywords of :meth:`Request.of`, parsed once), every
    one checked against the models before anything runs."""
    requests: list[Request] = []
    for i, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
        try:
            req = (
                Request.of(prompt, seed=seed, **fields)
                if not requests
                else replace(requests[0], prompt=prompt, seed=seed)
            )
            req.check_models(target, drafter if req.tree is not None else None)
        except ErsdError as exc:
            raise type(exc)(f"prompt {i}: {exc}", param=exc.param) from None
        requests.append(req)
    return requests


def run_requests(
    target: LanguageModel,
    drafter: Drafter | None,
    requests: Sequence[Request],
    max_batch_size: int | None = None,
) -> Iterator[tuple[int, StepRecord, GenerationResult | None]]:
    """Run ``requests`` on one engine, at most ``max_batch_size`` rows at a time; yields
    ``(request index, record, result when finished)``."""
    if max_batch_size is not None and (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, int)
        or max_batch_size < 1
    ):
        raise GenerationInputError(
            f"max_batch_size must be an int >= 1, got {max_batch_size!r}", param="max_batch_size"
        )
    with BatchEngine(target, drafter) as engine:
        cap = max_batch_size or len(requests)
        waiting = list(range(len(requests)))
        index_of: dict[int, int] = {}
        while waiting or len(engine):
            while waiting and len(engine) < cap:
                i = waiting.pop(0)
                index_of[engine.add(requests[i])] = i
            for rid, rec, res in engine.step():
                yield index_of[rid], rec, res
