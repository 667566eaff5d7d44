"""ERSD's drafter without the float64 softmax (issue 47 item 4): under race scheme v2 on the CPU
with temperature-only sampling, the drafter's children come from its logits
(:func:`ersd.race_v2.v2_ranking_from_logits`), the rank statistic is counted from them
(:func:`ersd.race_v2.v2_rank_from_logits`), and ``DraftTree.draft_probs`` holds the logits until
read (:class:`ersd.methods.base.DraftLogits`).

* Against the reference (the v2 race over ``logits_to_probs``) on random, sharp, flat, masked,
  bfloat16 and float64 rows, five vocabularies, three temperatures and 1-4 children: the same
  tokens (in order) and ranks, or None (never another answer), answered almost always.
* Constructed near-ties all fall back, and a variant without the gap (``LOGIT_GAP = 0``) answers
  wrong tokens and ranks on the same near-ties.
* ``ersd.generate`` and the batched engine give the same tokens, ranks, draft sizes and
  acceptances with the logits path as through the probabilities, under v1 and v2, for chains and
  trees, several seeds and settings (v1, top-p and greedy do not take it); under v2 with plain
  temperature no drafter softmax is computed.
* The ``draft_probs`` contract: a read gives float64 probabilities with the bits of the eager
  path (a float32 variant is rejected by the same check), kept after the first read; iteration,
  slices and pickling give tensors; logits overwritten in place are refused, not misread.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

import ersd
import ersd.drafting.model as drafting_model
import ersd.methods.base as methods_base
import ersd.race_v2 as race_v2
from ersd.batch import derive_seed, generate_batch
from ersd.drafting import ModelDrafter
from ersd.methods import DraftTree
from ersd.methods.base import DraftLogits, DraftProbs
from ersd.methods.ersd import ERSD
from ersd.methods.registry import get_method
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import RaceNoise, root_key
from ersd.race_v2 import LogitRow, v2_rank_from_logits, v2_ranking_from_logits
from ersd.tree import TreeShape
from tests.test_winner_from_logits import _near_ties, _rows


def _probs(row: torch.Tensor, t: float) -> torch.Tensor:
    return logits_to_probs(row, SamplingParams(temperature=t))


@pytest.mark.parametrize("vocab", [5, 64, 1000, 4099, 151936])
def test_ranking_and_rank_from_logits_are_the_references(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    noise = RaceNoise(vocab, scheme="v2")
    keys = 1 if vocab > 10000 else 4
    answered = total = 0
    for r, row in enumerate(_rows(vocab, g)):
        for t in (1.0, 0.7, 1.6):
            q = _probs(row, t)
            for j in range(keys):
                key = root_key(r, [j, vocab, 7])
                race = noise.lazy_race(key, 0)
                lrow = LogitRow(row, t)
                for m in (1, 2, 4):
                    got = v2_ranking_from_logits(race, lrow, m)
                    want = noise.ranking(key, q, m)
                    assert got is None or got == want, (r, t, j, m)
                    answered += got is not None
                    if (
                        got is not None
                    ):  # a strict order: the i-th has rank i + 1 (DraftLogits.ranked)
                        assert [noise.rank(key, q, y) for y in got] == list(range(1, len(got) + 1))
                    total += 1
                # ranks of the race's best tokens, of a target-like token and of random ones
                tokens = noise.ranking(key, q, 3)
                tokens += [int(x) for x in torch.randint(vocab, (2,), generator=g)]
                for y in tokens:
                    got_r = v2_rank_from_logits(race, lrow, y)
                    want_r = noise.rank(key, q, y)
                    assert got_r is None or got_r == want_r, (r, t, j, y)
                    answered += got_r is not None
                    total += 1
    assert answered >= 0.9 * total  # the fallback is for near-ties and dead tokens


def test_near_ties_fall_back_and_the_gap_is_what_keeps_them_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocab = 640
    noise = RaceNoise(vocab, scheme="v2")
    ties = _near_ties(vocab, 200)

    def answers() -> tuple[int, int, int]:
        fell_back = wrong = asked = 0
        for key, x in ties:
            q = _probs(x, 1.0)
            race, row = noise.lazy_race(key, 0), LogitRow(x, 1.0)
            got = v2_ranking_from_logits(race, row, 2)
            asked += 1
            fell_back += got is None
            wrong += got is not None and got != noise.ranking(key, q, 2)
            for y in noise.ranking(key, q, 2):  # the two tied tokens
                got_r = v2_rank_from_logits(race, row, y)
                asked += 1
                fell_back += got_r is None
                wrong += got_r is not None and got_r != noise.rank(key, q, y)
        return fell_back, wrong, asked

    fell_back, wrong, asked = answers()
    assert wrong == 0 and fell_back == asked  # every one of them is within the gap
    monkeypatch.setattr(race_v2, "LOGIT_GAP", 0.0)  # the broken variant: rounding ignored
    _, wrong, _ = answers()
    assert wrong > 0


VOCAB = 4099  # not a multiple of v2's 64-token blocks


def _pair(vocab: int = VOCAB) -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    """A target and a noisy draft over ``vocab`` tokens, shaped like a language model's rows (a
    Zipf-like background, a few strong tokens chosen by the last two tokens)."""
    g = torch.Generator().manual_seed(11)
    base = -torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    base = base[torch.randperm(vocab, generator=g)]
    wobble = torch.randn(vocab, generator=g) * 0.7

    def make(noisy: bool) -> ersd.FunctionModel:
        def fn(seqs: list[list[int]]) -> torch.Tensor:
            out = base.repeat(len(seqs), 1)
            for r, s in enumerate(seqs):
                h = (s[-1] * 1000003 + (s[-2] if len(s) > 1 else 7) * 9176 + len(s)) % vocab
                top = torch.tensor([(h * (k + 3) * 2654435761) % vocab for k in range(4)])
                out[r, top] = torch.tensor([6.0, 5.2, 4.9, 4.0])
            return out + wobble if noisy else out

        return ersd.FunctionModel(fn, vocab)

    return make(False), make(True)


def _steps(records: list) -> list[tuple]:
    return [(r.tokens, r.ranks, r.num_draft_tokens, r.num_accepted) for r in records]


def _generate(from_logits: bool, scheme: str, tree: str, seed: int, **kw: object) -> list[tuple]:
    target, draft = _pair()
    saved = drafting_model.FROM_LOGITS
    drafting_model.FROM_LOGITS = from_logits
    try:
        res = ersd.generate(
            target, draft, [3, 1, 4], max_new_tokens=40, tree=tree, seed=seed,
            race_scheme=scheme, **kw,
        )  # fmt: skip
    finally:
        drafting_model.FROM_LOGITS = saved
    return _steps(res.steps)


CASES = [
    ("v2", "chain:4", {}),
    ("v2", "multi:2x3", {"temperature": 0.8}),
    ("v2", "paths:[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]", {"temperature": 1.3}),
    ("v2", "chain:3", {"top_p": 0.9}),  # filtered: through the probabilities
    ("v2", "chain:3", {"temperature": 0}),  # greedy: the greedy rule
    ("v1", "chain:4", {}),  # v1: whole rows
    ("v1", "multi:2x3", {"temperature": 0.8}),
]


@pytest.mark.parametrize(("scheme", "tree", "kw"), CASES)
def test_generate_is_the_same_with_and_without_the_logits_path(
    scheme: str, tree: str, kw: dict
) -> None:
    accepted = 0
    for seed in range(4):
        got = _generate(True, scheme, tree, seed, **kw)
        assert got == _generate(False, scheme, tree, seed, **kw), seed
        accepted += sum(s[3] for s in got)
    assert accepted > 0  # drafts were accepted: the trees and ranks were exercised


def test_the_batched_engine_is_the_same_and_each_row_is_its_generate() -> None:
    target, draft = _pair()
    prompts = [[1, 2], [3, 4, 5], [7], [9, 9, 9, 2], [5], [8, 1]]
    kw = {"max_new_tokens": 32, "tree": "multi:2x2", "temperature": 0.9, "race_scheme": "v2"}
    runs = {}
    for flag in (True, False):
        drafting_model.FROM_LOGITS = flag
        try:
            runs[flag] = [_steps(r.steps) for r in generate_batch(target, draft, prompts, **kw)]
        finally:
            drafting_model.FROM_LOGITS = True
    assert runs[True] == runs[False]
    alone = ersd.generate(
        target,
        draft,
        prompts[2],
        seed=derive_seed(0, 2),
        **kw,  # type: ignore[arg-type]
    )
    assert [s[0] for s in runs[True][2]] == [r.tokens for r in alone.steps]


def test_no_drafter_softmax_under_v2_with_plain_temperature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, draft = _pair()
    calls = {"read": 0}
    real_probs = DraftLogits.probs

    def read(self):  # type: ignore[no-untyped-def]
        calls["read"] += 1
        return real_probs(self)

    monkeypatch.setattr(DraftLogits, "probs", read)
    softmaxes = {"n": 0}
    real_l2p = methods_base.logits_to_probs

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        softmaxes["n"] += 1
        return real_l2p(*a, **k)

    monkeypatch.setattr(methods_base, "logits_to_probs", counting)
    res = ersd.generate(
        target, draft, [3, 1, 4], max_new_tokens=40, tree="chain:4", race_scheme="v2"
    )
    assert res.num_draft_tokens > 0 and sum(len(s.ranks) for s in res.steps) > 0
    assert softmaxes["n"] == 0 and calls["read"] == 0  # ranks from the logits, nothing read
    # the same count rejects the eager path (the shortcut switched off)
    monkeypatch.setattr(drafting_model, "FROM_LOGITS", False)
    ersd.generate(target, draft, [3, 1, 4], max_new_tokens=40, tree="chain:4", race_scheme="v2")
    assert softmaxes["n"] > 0


def _proposal(from_logits: bool, params: SamplingParams) -> tuple[DraftTree, list[torch.Tensor]]:
    """A drafted multi:2x2 tree under v2, and the draft logits of its contexts with children."""
    _, draft = _pair()
    seen: list[torch.Tensor] = []
    real_fn = draft.fn

    def keeping(seqs: list[list[int]]) -> torch.Tensor:
        out = real_fn(seqs)
        seen.append(out)
        return out

    draft.fn = keeping
    session = ModelDrafter(draft).start_drafting([3, 1, 4])
    saved = drafting_model.FROM_LOGITS
    drafting_model.FROM_LOGITS = from_logits
    try:
        prop = session.propose(
            TreeShape.multi(2, 2), root_key(1, [3, 1, 4]), ERSD(), params,
            RaceNoise(VOCAB, scheme="v2"),
        )  # fmt: skip
    finally:
        drafting_model.FROM_LOGITS = saved
    return prop.tree, seen


def _same_bits(tree: DraftTree, eager: DraftTree) -> bool:
    """Every context's draft distribution: float64 and bit for bit the eager path's."""
    for ctx in range(1 + tree.num_nodes):
        a, b = tree.draft_probs[ctx], eager.draft_probs[ctx]
        if (a is None) != (b is None):
            return False
        if a is not None and (a.dtype != torch.float64 or not torch.equal(a, b)):
            return False
    return True


def test_draft_probs_reads_give_the_eager_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(temperature=0.9)
    tree, _ = _proposal(True, params)
    eager, _ = _proposal(False, params)
    assert (tree.tokens, tree.parents, tree.keys) == (eager.tokens, eager.parents, eager.keys)
    assert isinstance(tree.draft_probs, DraftProbs)
    held = [c for c in range(1 + tree.num_nodes) if tree.draft_probs.pending(c) is not None]
    assert held == [c for c in range(1 + tree.num_nodes) if tree.children[c]]
    assert not any(eager.draft_probs.pending(c) for c in range(1 + eager.num_nodes))
    assert _same_bits(tree, eager)
    assert all(tree.draft_probs.pending(c) is None for c in held)  # computed once, kept
    # iteration, slices and pickling give tensors, never the held logits
    tree2, _ = _proposal(True, params)
    assert all(q is None or isinstance(q, torch.Tensor) for q in tree2.draft_probs)
    tree3, _ = _proposal(True, params)
    assert all(q is None or isinstance(q, torch.Tensor) for q in tree3.draft_probs[:])
    tree4, _ = _proposal(True, params)
    back = pickle.loads(pickle.dumps(tree4))
    assert _same_bits(back, eager)
    # the broken variant: the held rows' softmax in float32 -- the same check rejects it
    monkeypatch.setattr(
        DraftLogits,
        "probs",
        lambda self: torch.softmax(self.logits.float() / 0.9, -1).to(torch.float64),
    )
    broken, _ = _proposal(True, params)
    assert not _same_bits(broken, eager)


def test_logits_overwritten_in_place_are_refused() -> None:
    tree, seen = _proposal(True, SamplingParams())
    assert tree.draft_probs.pending(0) is not None
    for out in seen:
        out.add_(1.0)  # a model that reuses its output buffer
    with pytest.raises(RuntimeError, match="overwritten in place"):
        tree.draft_probs[0]


def test_sharpened_and_other_rules_take_the_probability_path() -> None:
    _, draft = _pair()
    noise = RaceNoise(VOCAB, scheme="v2")
    logits = draft.fn([[3, 1, 4]])[0]
    p = SamplingParams()
    take = drafting_model.draft_from_logits
    assert take(logits, 2, 5, ERSD(), p, noise) is not None
    assert take(logits, 2, 5, ERSD(1.2), p, noise) is None  # a sharpened race
    assert take(logits, 2, 5, get_method("specinfer"), p, noise) is None
    assert take(logits, 2, 5, ERSD(), SamplingParams(top_k=20), noise) is None
    assert take(logits, 2, 5, ERSD(), p, RaceNoise(VOCAB)) is None  # v1
    got = take(logits, 2, 5, ERSD(), p, noise)
    assert got is not None and got[0] == noise.ranking(5, logits_to_probs(logits, p), 2)
    assert isinstance(got[1], DraftLogits) and math.isfinite(got[1].row.mx)


def test_ranks_counted_from_rough_scores_are_the_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank below which many tokens can score is counted from NumPy-log scores within 2^-40 of
    the exact ones (``race_v2.ROUGH_RANKS``, the window widened by as much): the references' ranks
    on flat and peaked rows at unlikely tokens, the rough path taken on most of them; a variant
    that leaves out tokens whose lower bound is half the limit counts wrong ranks, and one whose
    rough ``E`` comes from the wrong uniforms does too (mostly it finds the token's own score
    missing from the window and falls back: no answer)."""
    vocab = 6400
    g = torch.Generator().manual_seed(11)
    cases = []
    reference = RaceNoise(vocab, scheme="v2")
    for k in range(60):
        x = torch.randn(vocab, generator=g) * (0.5, 2.0, 4.0)[k % 3]
        key = root_key(k, [vocab, 11])
        for y in [int(i) for i in torch.randint(vocab, (3,), generator=g)]:
            cases.append((key, x, y, reference.rank(key, _probs(x, 1.0), y)))
    block_words = race_v2.V2Race.block_words
    used = {"n": 0}

    def counting(race: object, blocks: object) -> object:
        used["n"] += 1  # the rough path reads its tokens' block words, once a rank
        return block_words(race, blocks)  # type: ignore[arg-type]

    monkeypatch.setattr(race_v2.V2Race, "block_words", counting)

    def wrong_and_answered() -> tuple[int, int]:
        noise = RaceNoise(vocab, scheme="v2")  # nothing drawn yet
        wrong = answered = 0
        for key, x, y, want in cases:
            got = v2_rank_from_logits(noise.lazy_race(key, 0), LogitRow(x, 1.0), y)
            answered += got is not None
            wrong += got is not None and got != want
        return wrong, answered

    assert race_v2.ROUGH_RANKS
    wrong, answered = wrong_and_answered()
    assert wrong == 0 and answered >= 0.97 * len(cases)
    assert used["n"] >= 0.5 * len(cases)  # most took the rough path
    margin = race_v2._PRUNE_MARGIN
    monkeypatch.setattr(race_v2, "_PRUNE_MARGIN", -0.5)
    wrong, _ = wrong_and_answered()
    assert wrong > 0.3 * len(cases)
    monkeypatch.setattr(race_v2, "_PRUNE_MARGIN", margin)
    words = race_v2.v2_words
    monkeypatch.setattr(race_v2, "v2_words", lambda seed, index: words(seed ^ 1, index))
    wrong, _ = wrong_and_answered()
    assert wrong > 0
