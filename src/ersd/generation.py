"""The generation loop in four phases: propose → score → verify → commit.

One step is one target call:

* :func:`propose` — the drafter builds this step's draft tree (cut to the tokens still allowed);
* :func:`score` — the target scores the root and every tree node in one forward pass;
* :func:`verify` — the method's rules walk the tree (:func:`ersd.methods.verify_tree`);
* :func:`commit` — the emitted tokens are cut at EOS / length / the context window and both the
  target session and the drafter keep exactly the accepted path.

:func:`step` chains the phases for one sequence; :func:`generate_stream` repeats it.  Models know
nothing about verification and methods know nothing about models: this module wires them.
Randomness comes only from keyed races (:mod:`ersd.race`) built from ``seed`` and the context,
so every run is a deterministic function of its arguments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ersd.drafting import Drafter, DraftSession, ModelDrafter, ModelDraftSession, Proposal
from ersd.errors import GenerationInputError, InvalidTreeSpecError
from ersd.methods import DraftTree, Method, TreeVerification, verify_tree
from ersd.models.base import LanguageModel, ModelSession
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import extend_key_many
from ersd.request import Request, Settings
from ersd.results import GenerationResult, StepRecord
from ersd.tree import TreeShape
from ersd.tree_spec import TreeArg
from ersd.verify_batch import batches, verify_many
from ersd.watermark.settings import Watermark

#: what ``tree=`` may be (kept for callers of the old name)
TreeSpec = TreeArg


@dataclass
class SequenceState:
    """One sequence being generated: its sessions, race key and how far it has got."""

    target: ModelSession
    drafter: DraftSession | None
    key: int  # race key of the committed context
    max_new_tokens: int
    max_length: int | None  # the target's context window (None: unbounded)
    emitted: int = 0
    steps: int = 0
    finish_reason: str | None = None  # set when the sequence is done

    @property
    def allowed(self) -> int:
        """Tokens this sequence may still emit (max_new_tokens and the context window)."""
        left = self.max_new_tokens - self.emitted
        if self.max_length is not None:
            left = min(left, self.max_length - len(self.target.committed))
        return left


# --- the four phases -------------------------------------------------------------------------


_ASK = object()  # step_shape: ask the chooser


def step_shape(
    settings: Settings, seq: SequenceState, batch: int = 1, chosen: Any = _ASK
) -> TreeShape | None:
    """This step's tree shape: the generation's shape (with ``tree="auto"``, the chooser's pick
    for ``batch`` live rows, or ``chosen`` when the batch already asked it this step) cut to the
    tokens the sequence may still emit, so that a fully accepted tree plus its bonus token fits
    (ERSD then stops at exactly the token target-only sampling stops at); ``None`` when nothing
    is drafted."""
    if seq.drafter is None:
        return None
    shape = settings.shape
    if settings.chooser is not None:
        shape = (
            chosen if chosen is not _ASK else settings.chooser.choose(seq.target.committed, batch)
        )
    return shape.truncated(seq.allowed - 1) if shape is not None else None


def propose(settings: Settings, seq: SequenceState, batch: int = 1) -> tuple[Proposal, int]:
    """Draft this step's tree; returns (proposal, depth of the shape used)."""
    shape = step_shape(settings, seq, batch)
    if shape is None or seq.drafter is None:
        return Proposal(DraftTree.empty(seq.key)), 0
    proposal = seq.drafter.propose(shape, seq.key, settings.rule, settings.params, settings.noise)
    return proposal, shape.depth


def target_call(
    settings: Settings, seq: SequenceState, tree: DraftTree
) -> tuple[list[int], list[int]]:
    """The target ``score`` call for ``tree``: its nodes, padded with throw-away children of the
    root (repeats of the last committed token) up to ``min_forward_tokens`` fed tokens."""
    tokens, parents = list(tree.tokens), list(tree.parents)
    pad = settings.min_forward_tokens - 1 - len(tokens)
    if pad > 0:
        tokens += [seq.target.committed[-1]] * pad
        parents += [-1] * pad
    return tokens, parents


def score(settings: Settings, seq: SequenceState, tree: DraftTree) -> tuple[torch.Tensor, float]:
    """One target forward over the root and every node of ``tree``: (logits, seconds)."""
    t0 = time.perf_counter()
    logits = seq.target.score(*target_call(settings, seq, tree))
    return logits[: 1 + tree.num_nodes], time.perf_counter() - t0


class _LazyProbs:
    """Rows of ``logits`` turned into probabilities only when the verifier looks at them."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams) -> None:
        self.logits = logits
        self.params = params
        self._rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, i: int) -> torch.Tensor:
        row = self._rows.get(i)
        if row is None:
            row = logits_to_probs(self.logits[i], self.params)
            self._rows[i] = row
        return row


def verify(settings: Settings, tree: DraftTree, logits: torch.Tensor) -> TreeVerification:
    """Walk ``tree`` with the rule: the accepted nodes and the tokens they emit.

    On a device, and on the CPU under race scheme v2 (whose target winners come from the logits
    without a float64 softmax where sampling is temperature only), ERSD's walk is
    :func:`ersd.verify_batch.verify_many`'s (every context at once, one host transfer); otherwise,
    and for the other rules, node by node (the same verdict)."""
    if batches(settings.rule) and (logits.device.type != "cpu" or settings.noise.lazy()):
        return verify_many(
            [settings.rule],  # type: ignore[list-item]
            [settings.params],
            [settings.noise],
            [tree],
            [logits],
        )[0]
    return verify_tree(settings.rule, tree, _LazyProbs(logits, settings.params), settings.noise)  # type: ignore[arg-type]


def commit(
    settings: Settings, seq: SequenceState, verdict: TreeVerification
) -> tuple[list[int], list[int]]:
    """Keep the emitted tokens allowed (EOS, length, window); returns (tokens, accepted nodes).

    Sets ``seq.finish_reason`` when the sequence is done; otherwise the target session and the
    drafter keep exactly the accepted path and the next token.
    """
    allowed = seq.allowed
    tokens = verdict.tokens[:allowed]
    for j, t in enumerate(tokens):
        if t in settings.eos:
            tokens = tokens[: j + 1]
            break
    accepted = verdict.accepted[: len(tokens)]
    seq.key = extend_key_many(seq.key, tokens)
    seq.emitted += len(tokens)
    if tokens[-1] in settings.eos:
        seq.finish_reason = "eos"
    elif seq.emitted >= seq.max_new_tokens:
        seq.finish_reason = "length"
    elif len(tokens) >= allowed:
        seq.finish_reason = "context"
    if seq.finish_reason is None:
        seq.target.commit(tokens, accepted)
        if seq.drafter is not None:
            seq.drafter.observe(tokens, accepted)
    return tokens, accepted


def settle(
    settings: Settings,
    seq: SequenceState,
    proposal: Proposal,
    depth: int,
    logits: torch.Tensor,
    *,
    target_time: float,
    started: float,
    verdict: TreeVerification | None = None,
) -> StepRecord:
    """Verify and commit a scored step; its record (``started``: the step's perf_counter).

    ``verdict``: :func:`verify`'s result when the caller already computed it (the batched engine
    verifies its rows side by side, then settles them one by one)."""
    if verdict is None:
        verdict = verify(settings, proposal.tree, logits)
    tokens, accepted = commit(settings, seq, verdict)
    seq.steps += 1
    rec = StepRecord(
        step=seq.steps - 1,
        tokens=tokens,
        num_draft_tokens=proposal.tree.num_nodes,
        num_accepted=len(accepted),
        draft_forwards=proposal.forwards,
        tree_depth=depth,
        ranks=verdict.ranks,
        draft_time=proposal.seconds,
        target_time=target_time,
        total_time=time.perf_counter() - started,
        finish_reason=seq.finish_reason,
        expected_tokens=proposal.expected_tokens,
    )
    if settings.chooser is not None:  # tree="auto": learn from this step, record the choice
        if proposal.beyond is not None:  # the last step's bonus, seen by this step's draft
            settings.chooser.observe_beyond(*proposal.beyond)
        rec.choice = settings.chooser.observe(
            verdict.ranks, len(verdict.accepted), depth, row=id(seq)
        )
    return rec


def step(settings: Settings, seq: SequenceState) -> StepRecord:
    """One target call for one sequence: propose, score, verify, commit."""
    started = time.perf_counter()
    proposal, depth = propose(settings, seq)
    logits, target_time = score(settings, seq, proposal.tree)
    rec = settle(settings, seq, proposal, depth, logits, target_time=target_time, started=started)
    if settings.chooser is not None:  # tree="auto": correct its cost model by this step's time
        settings.chooser.observe_times(
            1, rec.draft_time, rec.target_time, rec.total_time, prefill=rec.step == 0
        )
    return rec


# --- set-up ----------------------------------------------------------------------------------


def as_drafter(draft: Drafter | LanguageModel | None) -> Drafter | None:
    """``draft`` as a :class:`~ersd.drafting.Drafter`: a language model is wrapped."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, LanguageModel):
        return ModelDrafter(draft)
    raise GenerationInputError(
        "draft must be a Drafter, a model with .vocab_size and .start(prompt) (e.g. "
        f"ersd.load_model(...) or ersd.FunctionModel) or None, got {type(draft).__name__}"
    )


def start_sequence(target: LanguageModel, request: Request, settings: Settings) -> SequenceState:
    """Open the target session and the drafter's session of ``request``'s prompt."""
    ids = list(request.prompt)
    drafter = settings.drafter
    target_session = target.start(ids)
    session = drafter.start_drafting(ids) if drafter is not None else None
    if settings.chooser is not None and isinstance(session, ModelDraftSession):
        # tree="auto": learn how the depth below each fully accepted path would have fared
        session.observe_beyond = settings.chooser.learns_beyond
    return SequenceState(
        target=target_session,
        drafter=session,
        key=request.root_key(),
        max_new_tokens=request.max_new_tokens,
        max_length=getattr(target, "max_length", None),
    )


def run(target: LanguageModel, request: Request, settings: Settings) -> Iterator[StepRecord]:
    """Generate ``request`` with its resolved ``settings``: one record per target call."""
    seq = start_sequence(target, request, settings)
    while seq.finish_reason is None:
        yield step(settings, seq)
    if settings.chooser is not None:  # tree="auto": keep the pair's rank profile it learned
        settings.chooser.keep_profile()


def _check_tree_given(drafter: Drafter | None, tree: Any) -> None:
    """With a drafter, ``tree=None`` is a mistake (a request's None means "draft nothing")."""
    if drafter is not None and tree is None:
        raise InvalidTreeSpecError(
            "tree must be a spec string or a list of child-index paths, got None (NoneType); "
            "with a draft pass a tree such as 'chain:4' (draft=None samples from the target "
            "alone)",
            param="tree",
        )


# --- public API ------------------------------------------------------------------------------


def stream_request(
    target: LanguageModel, draft: Drafter | LanguageModel | None, request: Request
) -> Iterator[StepRecord]:
    """Generate a built :class:`~ersd.request.Request` (checked on construction), yielding one
    :class:`StepRecord` per target call.  ``draft=None`` (or a request with ``tree=None``)
    samples from the target alone; the request is checked against the models first."""
    yield from run(target, request, request.resolve(target, as_drafter(draft)))


def generate_request(
    target: LanguageModel,
    draft: Drafter | LanguageModel | None,
    request: Request,
    *,
    label: str | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
) -> GenerationResult:
    """Generate a built :class:`~ersd.request.Request`: what :func:`generate` returns for the
    same settings (same tokens, same statistics).  ``draft=None`` (or a request with
    ``tree=None``) samples from the target alone.  ``label`` names the result (default: the
    method's name); ``on_step`` is called with each :class:`StepRecord` as it is made (to stream
    the accepted text)."""
    t0 = time.perf_counter()
    settings = request.resolve(target, as_drafter(draft))
    steps: list[StepRecord] = []
    for rec in run(target, request, settings):
        steps.append(rec)
        if on_step is not None:
            on_step(rec)
    return GenerationResult.from_steps(
        steps,
        method=label or settings.method.name,
        tree=settings.label,
        wall_time=time.perf_counter() - t0,
        race_scheme=settings.noise.scheme,
    )


def _keyword_request(
    drafter: Drafter | None, prompt: Sequence[int], tree: Any, **fields: Any
) -> Request:
    """The :class:`Request` of :func:`generate`'s keywords (no tree without a drafter)."""
    _check_tree_given(drafter, tree)
    return Request.of(prompt, tree=tree if drafter is not None else None, **fields)


def generate_stream(
    target: LanguageModel,
    draft: Drafter | LanguageModel | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    method: str | Method = "ersd",
    tree: TreeSpec = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    sampling: SamplingParams | None = None,
    min_forward_tokens: int = 1,
    watermark: Watermark | None = None,
    race_scheme: str = "v1",
) -> Iterator[StepRecord]:
    """Generate like :func:`generate`, yielding one :class:`StepRecord` per target call."""
    drafter = as_drafter(draft)
    request = _keyword_request(
        drafter,
        prompt,
        tree,
        max_new_tokens=max_new_tokens,
        seed=seed,
        method=method,
        sampling=sampling,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        eos_token_id=eos_token_id,
        min_forward_tokens=min_forward_tokens,
        watermark=watermark,
        race_scheme=race_scheme,
    )
    yield from stream_request(target, drafter, request)


def generate(
    target: LanguageModel,
    draft: Drafter | LanguageModel | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    method: str | Method = "ersd",
    tree: TreeSpec = "chain:4",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    sampling: SamplingParams | None = None,
    min_forward_tokens: int = 1,
    label: str | None = None,
    watermark: Watermark | None = None,
    race_scheme: str = "v1",
) -> GenerationResult:
    """Sample up to ``max_new_tokens`` tokens from ``target`` after ``prompt``.

    With a ``draft`` (a :class:`~ersd.drafting.Drafter`, or a draft model which is wrapped in a
    :class:`~ersd.drafting.ModelDrafter`), speculative sampling with ``method`` over draft trees
    of shape ``tree`` (see :mod:`ersd.tree_spec`; ``tree="auto"`` or an :class:`ersd.AutoTree`
    picks each step's tree, or no drafting, for the highest predicted tokens per second:
    :mod:`ersd.auto`; ``dynamic:K`` grows each step's tree: :mod:`ersd.drafting.dynamic`); with
    ``draft=None``, plain autoregressive sampling
    from the target with the same sampler and keyed races (one target call per token).
    Temperature 0 is greedy.  Sampling settings come as keywords or as one ``sampling=``
    :class:`~ersd.SamplingParams`.  Generation stops at EOS, after ``max_new_tokens`` or at the
    target's context window (``finish_reason`` "eos", "length", "context"), keeping every token.
    ``min_forward_tokens`` pads every target forward to that many fed tokens (throw-away nodes;
    the tokens are unchanged), ``label`` names the result (default: the method's name).
    ``watermark`` (an :class:`ersd.Watermark`) keys every race by a secret key and the last
    ``h`` generated tokens: every emitted token carries the mark :func:`ersd.watermark.detect`
    finds, the text keeps the target's exact law over keys, and ERSD keeps its acceptance and
    its drafter invariance (:mod:`ersd.watermark`, docs/watermark.md).
    ``race_scheme`` picks how the races are drawn: ``"v1"`` (NumPy's Philox, the default: every
    earlier seed's text) or ``"v2"`` (the blocked splitmix64 race, faster; docs/race-schemes.md);
    the result records it.
    The keywords make one :class:`ersd.request.Request`, checked before anything runs
    (:func:`generate_request` generates one built by the caller).
    """
    drafter = as_drafter(draft)
    request = _keyword_request(
        drafter,
        prompt,
        tree,
        max_new_tokens=max_new_tokens,
        seed=seed,
        method=method,
        sampling=sampling,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        eos_token_id=eos_token_id,
        min_forward_tokens=min_forward_tokens,
        watermark=watermark,
        race_scheme=race_scheme,
    )
    return generate_request(target, drafter, request, label=label)
