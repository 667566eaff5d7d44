"""The target's v2 race winner found from its logits (:func:`ersd.race_v2.v2_winner_from_logits`,
issue 47 item 4), without the float64 probabilities, against the reference: ``race_winner`` of
``logits_to_probs`` over the whole v2 row.

* On random, sharp, flat and masked rows, vocabularies that are and are not multiples of 64,
  float32 / bfloat16 / float64 logits and several temperatures, it answers the reference's token
  or None (never another token), and answers almost always.
* On constructed near-ties (two tokens whose scores differ by a few ulps, where the float64
  normaliser's rounding decides) it answers None or the reference's token; a deliberately broken
  variant without the gap (``LOGIT_GAP = 0``) answers a wrong token on the same near-ties.
* :func:`ersd.verify_batch.verify_many` with it equals the node-by-node walk, uses no float64
  target probabilities for temperature-only rows, and a batched engine's texts and ranks are the
  reference path's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ersd.race_v2 as race_v2
from ersd import verify_batch
from ersd.batch import BatchEngine
from ersd.methods import verify_tree
from ersd.methods.ersd import ERSD
from ersd.probs import SamplingParams, logits_to_probs, plain_temperature
from ersd.race import RaceNoise, race_winner, root_key
from ersd.verify_batch import verify_many
from tests.test_verify_batch import random_tree
from tests.toy import mixed_draft, table_model


def _reference(noise: RaceNoise, key: int, row: torch.Tensor, t: float) -> int:
    return race_winner(logits_to_probs(row, SamplingParams(temperature=t)), noise.exponentials(key))


def _rows(vocab: int, g: torch.Generator) -> list[torch.Tensor]:
    rows = [torch.randn(vocab, generator=g) * s for s in (0.5, 3.0, 12.0)]
    peaky = torch.randn(vocab, generator=g)
    peaky[torch.randint(vocab, (3,), generator=g)] += torch.tensor([14.0, 13.0, 12.5])
    rows.append(peaky)
    masked = torch.randn(vocab, generator=g) * 2
    masked[torch.rand(vocab, generator=g) < 0.5] = -math.inf
    masked[vocab // 2] = 1.0  # at least one finite logit
    rows.append(masked)
    rows.append(torch.zeros(vocab))  # flat: every block can win
    rows.append((torch.randn(vocab, generator=g) * 3).to(torch.bfloat16))
    rows.append(torch.randn(vocab, generator=g, dtype=torch.float64) * 4)
    return rows


@pytest.mark.parametrize("vocab", [5, 64, 1000, 4099, 151936])
def test_winner_from_logits_is_the_reference_token(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    noise = RaceNoise(vocab, scheme="v2")
    keys = 2 if vocab > 10000 else 6
    answered = total = 0
    for r, row in enumerate(_rows(vocab, g)):
        for t in (1.0, 0.7, 1.6):
            for j in range(keys):
                key = root_key(r, [j, vocab])
                got = noise.winner_from_logits(key, row, t)
                want = _reference(noise, key, row, t)
                assert got is None or got == want, (r, t, j)
                answered += got is not None
                total += 1
    assert answered >= 0.97 * total  # the fallback is for near-ties, not the common case


def _near_ties(vocab: int, count: int) -> list[tuple[int, torch.Tensor]]:
    """(key, float64 logits) where two tokens in different blocks score within a few ulps of
    each other in the race, far ahead of every other token."""
    out = []
    rng = np.random.default_rng(5)
    noise = RaceNoise(vocab, scheme="v2")
    for k in range(count):
        key = root_key(k, [1])
        e = noise.exponentials(key).numpy()
        i, j = int(rng.integers(0, 64)), int(rng.integers(64, vocab))
        x = torch.full((vocab,), -40.0, dtype=torch.float64)
        x[i] = 0.0
        # E_j / exp(x_j) = E_i / exp(x_i) up to a relative offset of a few ulps
        x[j] = math.log(e[j] / e[i]) + float(rng.integers(-4, 5)) * 2.0**-52
        out.append((key, x))
    return out


def test_near_ties_fall_back_and_the_gap_is_what_keeps_them_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocab = 640
    noise = RaceNoise(vocab, scheme="v2")
    ties = _near_ties(vocab, 200)
    fell_back = 0
    for key, x in ties:
        got = noise.winner_from_logits(key, x, 1.0)
        assert got is None or got == _reference(noise, key, x, 1.0)
        fell_back += got is None
    assert fell_back == len(ties)  # every one of them is within the gap
    # the broken variant: no gap, so the rounding of the normaliser is ignored
    monkeypatch.setattr(race_v2, "LOGIT_GAP", 0.0)
    wrong = 0
    for key, x in ties:
        got = noise.winner_from_logits(key, x, 1.0)
        wrong += got is not None and got != _reference(noise, key, x, 1.0)
    assert wrong > 0


def test_only_temperature_sampling_is_plain() -> None:
    assert plain_temperature(SamplingParams(temperature=0.8), 100) == 0.8
    assert plain_temperature(SamplingParams(top_k=100), 100) == 1.0  # top-k of the whole row
    assert plain_temperature(SamplingParams(top_k=40), 100) is None
    assert plain_temperature(SamplingParams(top_p=0.9), 100) is None
    assert plain_temperature(SamplingParams(min_p=0.05), 100) is None
    assert plain_temperature(SamplingParams(temperature=0), 100) is None
    v1 = RaceNoise(100)
    assert v1.winner_from_logits(1, torch.zeros(100), 1.0) is None  # v1 draws whole rows


SETTINGS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.2, top_p=0.9),
    SamplingParams(top_k=40, min_p=0.02),
]


def test_verify_many_from_logits_equals_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 3000
    noise = RaceNoise(vocab, scheme="v2")
    rows = []
    for i in range(12):
        p = SETTINGS[i % len(SETTINGS)]
        nodes, width = [(0, 1), (4, 1), (6, 2), (13, 3)][i % 4]
        beta = 1.0 if i % 3 else 1.3
        tree, lg = random_tree(200 + i, nodes, width, p, noise, beta)
        rows.append((ERSD(beta), p, tree, lg))
    calls = {"plain": 0, "filtered": 0}
    real = verify_batch.logits_to_probs

    def counting(logits: torch.Tensor, params: SamplingParams, **kw: bool) -> torch.Tensor:
        calls["plain" if plain_temperature(params, vocab) is not None else "filtered"] += 1
        return real(logits, params, **kw)

    monkeypatch.setattr(verify_batch, "logits_to_probs", counting)
    rules, params, trees, logits = (list(c) for c in zip(*rows, strict=True))
    got = verify_many(rules, params, [noise] * 12, trees, logits, "levels")
    assert calls["plain"] == 0 and calls["filtered"] > 0  # temperature-only rows: no softmax
    for i, (rule, p, tree, lg) in enumerate(rows):
        want = verify_tree(rule, tree, [logits_to_probs(x, p) for x in lg], noise)
        v = got[i]
        assert (v.accepted, v.tokens, v.ranks) == (want.accepted, want.tokens, want.ranks), i


def _engine_run(from_logits: bool, **kw: object) -> list[list[tuple[list[int], list[int]]]]:
    target = table_model(48, 0)
    draft = mixed_draft(target, table_model(48, 1), 0.6)
    saved = verify_batch.FROM_LOGITS
    verify_batch.FROM_LOGITS = from_logits
    try:
        engine = BatchEngine(target, draft)
        recs: dict[int, list[tuple[list[int], list[int]]]] = {}
        for i, prompt in enumerate([[1, 2], [3, 4, 5], [7], [9, 9, 9, 2]]):
            recs[engine.add(prompt, seed=i, max_new_tokens=24, race_scheme="v2", **kw)] = []
        while len(engine):
            for rid, rec, _ in engine.step():
                recs[rid].append((rec.tokens, rec.ranks))
    finally:
        verify_batch.FROM_LOGITS = saved
    return [recs[r] for r in sorted(recs)]


@pytest.mark.parametrize(
    "kw", [{"tree": "chain:4"}, {"tree": "multi:2x3", "temperature": 0.8}, {"tree": "chain:3"}]
)
def test_engine_texts_and_ranks_equal_the_reference_path(kw: dict) -> None:
    got = _engine_run(True, **kw)
    assert got == _engine_run(False, **kw)
    assert sum(len(r) for r in got) < 4 * 24  # drafts were accepted: multi-token steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_logits_to_probs_keeps_its_bits_and_the_callers_logits(dtype: torch.dtype) -> None:
    """The softmax written over logits_to_probs' own float64 temporary gives the bits of
    ``torch.softmax`` of the float64 logits (one row and a batch, several settings), and never
    writes over the caller's tensor (float64 logits are not copied by the conversion)."""
    g = torch.Generator().manual_seed(3)
    for shape in [(5000,), (4, 5000), (151936,)]:
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
        before = x.clone()
        for p in [SamplingParams(), SamplingParams(temperature=0.7), SamplingParams(top_k=50)]:
            ref = x.to(torch.float64)
            if p.temperature != 1.0:
                ref = ref / p.temperature
            if p.top_k is not None:
                kth = torch.topk(ref, p.top_k, dim=-1).values[..., -1:]
                ref = ref.masked_fill(ref < kth, float("-inf"))
            want = torch.softmax(ref, dim=-1)
            assert torch.equal(logits_to_probs(x, p), want)
            assert torch.equal(x, before)  # the caller's logits are untouched
