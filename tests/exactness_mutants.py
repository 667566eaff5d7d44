"""Deliberately broken variants ("mutants") the exactness suite must reject.

Subclasses of the methods overriding one hook; a context that keys the races by the last token
only; and ``logits_to_probs`` with one bug in its filtering path (temperature, top-k, top-p,
min-p), patched into every ersd module that uses it.  Used by ``tests/test_exactness.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace

import torch

import ersd
import ersd.race
from ersd.methods.base import NodeDecision, NodeNoise
from ersd.methods.ersd import ERSD
from ersd.methods.gls import GumbelListSampling
from ersd.methods.rejection import lane_uniform
from ersd.methods.rrs_wor import RRSWithoutReplacement
from ersd.methods.sd import SpeculativeSampling
from ersd.methods.spechub import SpecHub
from ersd.methods.specinfer import SpecInfer
from ersd.methods.spectr import SpecTr
from ersd.probs import logits_to_probs as library_logits_to_probs
from ersd.probs import plain_temperature as library_plain_temperature
from ersd.race import STREAM_RACE, _mix64, race_winner, root_key


class SDWrongDraftTemperature(SpeculativeSampling):
    """Accepts with ``p / q'`` where ``q'`` is the draft at half the temperature (``q^2``)."""

    name = "mutant-sd-wrong-q"

    def acceptance_probability(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
    ) -> float:
        q2 = draft_probs**2 / (draft_probs**2).sum()
        return super().acceptance_probability(target_probs, q2, token)


class SDSharedNoise(SpeculativeSampling):
    """Reuses the draft lanes' uniforms as the acceptance coins."""

    name = "mutant-sd-shared-noise"

    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        return [lane_uniform(noise, k) for k in range(n)]


class SpecInferSharedNoise(SpecInfer):
    name = "mutant-specinfer-shared-noise"

    def verify_uniforms(self, noise: NodeNoise, n: int) -> list[float]:
        return [lane_uniform(noise, k) for k in range(n)]


class SDNoResidual(SpeculativeSampling):
    """Samples the correction token from ``p`` instead of ``norm(max(p - q, 0))``."""

    name = "mutant-sd-no-residual"

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return target_probs


class SpecInferStaleResidual(SpecInfer):
    """Uses ``norm(max(p - q, 0))`` of the *original* ``p`` after every rejection (forgets
    that earlier children were rejected)."""

    name = "mutant-specinfer-stale-residual"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        self._p0 = target_probs
        return super().verify_node(target_probs, draft_probs, children, noise)

    def residual(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        return super().residual(self._p0, draft_probs)


class RRSWithoutRemoval(RRSWithoutReplacement):
    """Drafts without replacement but keeps ``q`` unchanged after a rejection (SpecInfer's rule
    on without-replacement drafts)."""

    name = "mutant-rrs-wor-keeps-q"

    def next_draft_probs(self, draft_probs: torch.Tensor, token: int) -> torch.Tensor:
        return draft_probs


class SpecTrRhoOne(SpecTr):
    """SpecTr with ``rho = 1`` whatever the number of drafts."""

    name = "mutant-spectr-rho-1"

    def compute_rho(
        self, target_probs: torch.Tensor, draft_probs: torch.Tensor, num_drafts: int
    ) -> float:
        return 1.0


class SpecHubNoHubResidual(SpecHub):
    """SpecHub whose residual forgets the hub's accepted mass (``r'(a) = p(a)``)."""

    name = "mutant-spechub-hub-residual"

    def residual(
        self, target_probs: torch.Tensor, pair_probs: torch.Tensor, hub: int, hub_mass: float
    ) -> torch.Tensor:
        return super().residual(target_probs, pair_probs, hub, 0.0)


class GLSCorrectionFromDraft(GumbelListSampling):
    """GLS that emits the first lane's draft winner instead of the target's token on a miss."""

    name = "mutant-gls-correction-from-draft"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        d = super().verify_node(target_probs, draft_probs, children, noise)
        if d.child is None:
            return NodeDecision(None, int(children[0]))
        return d


class ERSDCorrectionFromDraft(ERSD):
    """ERSD that emits the drafter's race winner (``argmin E / q``) on a miss."""

    name = "mutant-ersd-correction-from-draft"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        d = super().verify_node(target_probs, draft_probs, children, noise)
        if d.child is None:
            return NodeDecision(None, race_winner(draft_probs, noise.exponentials()))
        return d


class ERSDStaleBonus(ERSD):
    """ERSD whose bonus token reuses the race of the leaf's parent (a key not extended)."""

    name = "mutant-ersd-stale-bonus"

    def verify_node(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        children: Sequence[int],
        noise: NodeNoise,
    ) -> NodeDecision:
        self._parent = noise
        return super().verify_node(target_probs, draft_probs, children, noise)

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        return race_winner(target_probs, self._parent.exponentials(STREAM_RACE))


@contextmanager
def _races_keyed_by_last_token(seed: int) -> Iterator[None]:
    """Key every race after the prompt by (seed, last token) only, as text watermarks do.

    Patches ``extend_key`` in every loaded ersd module that uses it (the loop, the draft tree,
    the race module itself), so the mutant keeps working whichever module extends the keys.
    """
    original = ersd.race.extend_key
    salt = root_key(seed, [])
    users = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("ersd") and getattr(m, "extend_key", None) is original
    ]
    for m in users:
        m.extend_key = lambda key, token: _mix64(salt ^ _mix64(int(token) + 1))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in users:
            m.extend_key = original  # type: ignore[attr-defined]


def keyed_by_last_token(one: Callable[[int], list[int]], seed: int) -> list[int]:
    with _races_keyed_by_last_token(seed):
        return one(seed)


def _filter_mutant(bug: str) -> Callable[[torch.Tensor, ersd.SamplingParams], torch.Tensor]:
    """``logits_to_probs`` with one bug in its filtering path."""
    original = library_logits_to_probs

    def renorm(p: torch.Tensor) -> torch.Tensor:
        return p / p.sum(dim=-1, keepdim=True)

    def mutant(logits: torch.Tensor, params: ersd.SamplingParams) -> torch.Tensor:
        if params.greedy:
            return original(logits, params)
        if bug == "temperature-twice":
            return original(logits.to(torch.float64) / params.temperature, params)
        if bug == "top_k-off-by-one" and params.top_k is not None:
            return original(logits, replace(params, top_k=params.top_k + 1))
        if bug == "top_p-drops-boundary" and params.top_p is not None:
            p = original(logits, replace(params, top_p=None, min_p=None))
            sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
            drop = torch.cumsum(sorted_p, dim=-1) >= params.top_p  # the boundary token too
            drop[..., 0] = False
            p = renorm(p.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), 0.0))
            if params.min_p:
                p = renorm(p.masked_fill(p < params.min_p * p.max(-1, keepdim=True).values, 0))
            return p
        if bug == "min_p-absolute" and params.min_p:
            p = original(logits, replace(params, min_p=None))
            keep = (p >= params.min_p) | (p == p.max(dim=-1, keepdim=True).values)
            return renorm(p * keep)  # threshold min_p itself, not min_p * max p
        return original(logits, params)

    return mutant


@contextmanager
def _library_filters(fn: Callable[..., torch.Tensor]) -> Iterator[None]:
    """Replace ``logits_to_probs`` wherever ersd's modules imported it."""
    patched = [
        mod
        for name, mod in list(sys.modules.items())
        if (name == "ersd" or name.startswith("ersd."))
        and getattr(mod, "logits_to_probs", None) is library_logits_to_probs
    ]
    assert any(m.__name__ not in ("ersd", "ersd.probs") for m in patched), (
        "no ersd module uses logits_to_probs any more; update the filter mutants"
    )
    for mod in patched:
        mod.logits_to_probs = fn
    try:
        yield
    finally:
        for mod in patched:
            mod.logits_to_probs = library_logits_to_probs


@contextmanager
def _fast_temperature_twice() -> Iterator[None]:
    """The same bug on the path that takes the target's v2 winner from its logits
    (:func:`ersd.race_v2.v2_winner_from_logits`, given ``plain_temperature``'s T): T applied
    twice, ``logits / T / T``, is a temperature of ``T * T``."""
    patched = [
        mod
        for name, mod in list(sys.modules.items())
        if name.startswith("ersd.")
        and getattr(mod, "plain_temperature", None) is library_plain_temperature
        and name != "ersd.probs"
    ]

    def twice(params: ersd.SamplingParams, vocab_size: int) -> float | None:
        t = library_plain_temperature(params, vocab_size)
        return None if t is None else t * t

    for mod in patched:
        mod.plain_temperature = twice  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for mod in patched:
            mod.plain_temperature = library_plain_temperature  # type: ignore[attr-defined]


def with_filter_bug(bug: str) -> Callable[[], AbstractContextManager[None]]:
    @contextmanager
    def context() -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(_library_filters(_filter_mutant(bug)))
            if bug == "temperature-twice":  # the logits-space path reads T, not probabilities
                stack.enter_context(_fast_temperature_twice())
            yield

    context.__name__ = bug
    return context
