"""The per-step work outside the forwards (issue 47 item 4): the cheaper paths give the same
values as their references, and a broken variant is rejected by the same checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ersd.race_v2 import V2_BLOCK, logit_block_max


def _reference_block_max(row: torch.Tensor) -> np.ndarray:
    """Each 64-token block's largest logit, widened to float64 entry by entry (NaN wins)."""
    x = row.to(torch.float64).numpy()
    out = []
    for b in range(0, x.shape[0], V2_BLOCK):
        block = x[b : b + V2_BLOCK]
        out.append(np.nan if np.isnan(block).any() else block.max())
    return np.array(out)


def _rows(vocab: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(vocab)
    plain = (torch.randn(vocab, generator=g) * 8).to(dtype)
    masked = plain.clone()
    masked[: vocab // 2] = float("-inf")
    nan = plain.clone()
    nan[vocab // 3] = float("nan")
    strided = (torch.randn(2 * vocab, generator=g) * 8).to(dtype)[::2]
    return [plain, masked, nan, strided, plain.clone().fill_(-3.25)]


@pytest.mark.parametrize("vocab", [64, 640, 151936, 1000, 151937])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_logit_block_max_equals_the_blockwise_maximum(vocab: int, dtype: torch.dtype) -> None:
    for row in _rows(vocab, dtype):
        got = logit_block_max(row)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, _reference_block_max(row))


def test_logit_block_max_check_rejects_a_broken_variant() -> None:
    """Maxima read from the wrong blocks (a transposed reshape) fail the same comparison."""
    row = _rows(151936, torch.float32)[0]

    def transposed(x: torch.Tensor) -> np.ndarray:
        return x.reshape(V2_BLOCK, -1).amax(0).numpy().astype(np.float64)

    assert not np.array_equal(transposed(row), _reference_block_max(row))


def test_lower_block_minima_bound_the_exact_ones() -> None:
    """The race's cheap block-minimum bounds are positive, never above the exact minima (on 400
    races' blocks and the extreme words: U = 2^-53, U near 1, U = 1), and tight (a relative
    2^-38), so they prune as the exact ones do."""
    from ersd import race_v2 as rv

    n = -(-151936 // V2_BLOCK)
    words = [rv._block_words(key, stream, n) for key in range(200) for stream in (0, 1)]
    top = np.uint64((1 << 53) - 1) << np.uint64(11)
    edges = np.array(
        [0, 63, 1 << 11, top, top - (np.uint64(1) << np.uint64(11)), top | np.uint64(63)]
        + [np.uint64((1 << 53) - 1 - k) << np.uint64(11) for k in range(1, 2000, 7)],
        dtype=np.uint64,
    )
    for x in [*words, edges]:
        exact, lower = rv._minima_of_words(x), rv._minima_lower(x)
        assert (lower > 0).all() and (lower <= exact).all()
        big = exact > 1e-300
        assert (lower[big] >= exact[big] * (1 - 2.0**-38)).all()
    np.testing.assert_array_equal(
        rv._block_words(7, 3, n), rv.v2_words(rv.v2_seed(7, 3, rv._TAG_BLOCK), np.arange(n))
    )


def _lazy_against_full(vocab: int, races: int) -> int:
    """How many of ``races`` random peaked rows' lazy v2 winner, 3 best and rank of the
    reference winner differ from the full row's (fresh races, so every bound is used)."""
    from ersd import race_v2 as rv
    from ersd.race import race_rank, race_ranking

    g = torch.Generator().manual_seed(vocab)
    wrong = 0
    for key in range(races):
        p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 6, -1)
        e = torch.from_numpy(rv.v2_exponentials(key, 0, vocab))
        ref_winner = int((e / p).numpy().argmin())
        ref_best = race_ranking(p, e, 3)
        q = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 6, -1)
        ref_rank = race_rank(q, e, ref_winner)
        got = (
            rv.v2_race_winner(rv.V2Race(key, 0, vocab), p.numpy()),
            rv.v2_race_ranking(rv.V2Race(key, 0, vocab), p.numpy(), 3),
            rv.v2_race_rank(rv.V2Race(key, 0, vocab), q.numpy(), ref_winner),
        )
        wrong += got != (ref_winner, ref_best, ref_rank)
    return wrong


def test_lazy_races_with_lower_bounds_equal_the_full_rows(monkeypatch) -> None:
    """Winners, rankings and ranks from the lower-bounded lazy races equal the full rows'; bounds
    4x above the minima (a broken variant) give wrong answers on the same rows."""
    from ersd import race_v2 as rv

    assert rv.LOWER_BOUNDS
    assert _lazy_against_full(6400, 150) == 0
    lower = rv._minima_lower
    monkeypatch.setattr(rv, "_minima_lower", lambda x: 4.0 * lower(x))
    assert _lazy_against_full(6400, 150) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_check_logits_decides_masked_rows_by_their_maxima(dtype: torch.dtype) -> None:
    """``check_logits`` accepts rows with masked (-inf) tokens and finite rows whose sum
    overflows, and still refuses a NaN, a +inf and a row of only -inf among masked rows, with
    its messages; a check of the whole tensor's maximum (a broken variant) accepts the last."""
    from ersd.errors import InvalidLogitsError
    from ersd.probs import check_logits

    base = torch.randn(6, 640, generator=torch.Generator().manual_seed(1)).to(dtype)
    masked = base.clone()
    masked[:, ::3] = float("-inf")
    check_logits(masked, 640)
    huge = torch.full((2, 640), torch.finfo(dtype).max, dtype=dtype)
    check_logits(huge, 640)  # every entry finite, the sum overflows
    cases = {"NaN": float("nan"), r"\+inf": float("inf")}
    for word, value in cases.items():
        bad = masked.clone()
        bad[4, 7] = value
        with pytest.raises(InvalidLogitsError, match=word):
            check_logits(bad, 640)
    dead = masked.clone()
    dead[2] = float("-inf")
    with pytest.raises(InvalidLogitsError, match="all -inf"):
        check_logits(dead, 640)
    assert bool(torch.isfinite(dead.amax()))  # what a whole-tensor maximum would have accepted


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_greedy_one_hot_is_the_float64_rows_first_argmax(dtype: torch.dtype) -> None:
    """Temperature 0 gives the one-hot of the first argmax of the float64 row (ties: the lowest
    id; masked tokens; 1-D and batched rows), without widening the row first; the last argmax
    (a broken variant) fails the same comparison on the tied rows."""
    from ersd.probs import SamplingParams, logits_to_probs

    g = torch.Generator().manual_seed(3)
    rows = (torch.randn(5, 1000, generator=g) * 4).to(dtype)
    rows[1, [10, 500, 999]] = 50.0  # a three-way tie
    rows[2, :300] = float("-inf")
    rows[3] = 0.0  # every token tied
    rows[4, [20, 700]] = float("nan")  # torch's argmax counts NaN as the largest: the first
    greedy = SamplingParams(temperature=0.0)

    def reference(x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        out = torch.zeros_like(x)
        return out.scatter_(-1, torch.argmax(x, dim=-1, keepdim=True), 1.0)

    def last_argmax(x: torch.Tensor) -> torch.Tensor:
        flipped = torch.argmax(x.to(torch.float64).flip(-1), dim=-1, keepdim=True)
        return torch.zeros(x.shape, dtype=torch.float64).scatter_(-1, x.shape[-1] - 1 - flipped, 1)

    got = logits_to_probs(rows, greedy)
    assert got.dtype == torch.float64 and torch.equal(got, reference(rows))
    for row in rows:
        assert torch.equal(logits_to_probs(row, greedy), reference(row))
    assert not torch.equal(last_argmax(rows), reference(rows))


def test_first_argmax_is_torchs_and_the_greedy_rule_uses_it() -> None:
    """``first_argmax`` gives torch's argmax (first maximum, NaN largest) on float32 / float64 /
    bfloat16 rows, 1-D and batched, strided; GreedyRule's node and bonus pick it."""
    from ersd.methods.base import GREEDY
    from ersd.probs import first_argmax

    g = torch.Generator().manual_seed(5)
    base = torch.randn(4, 3000, generator=g)
    base[1, [3, 2000]] = 9.0
    base[2, [100, 50]] = float("nan")
    base[3] = float("-inf")
    base[3, 2999] = -1.0
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = base.to(dtype)
        assert torch.equal(first_argmax(x), torch.argmax(x, dim=-1))
        assert torch.equal(first_argmax(x[:, ::2]), torch.argmax(x[:, ::2], dim=-1))
        for row in x:
            assert int(first_argmax(row)) == int(torch.argmax(row))
    assert [int(i) for i in first_argmax(base)] == [int(base[0].argmax()), 3, 50, 2999]
    p = torch.zeros(3000, dtype=torch.float64)
    p[1234] = 1.0
    assert GREEDY.bonus(p, None) == 1234  # type: ignore[arg-type]
    assert GREEDY.verify_node(p, p, [7, 1234], None).child == 1  # type: ignore[arg-type]


def _top_first_against_references(vocab: int, keys: int) -> tuple[int, int, int]:
    """(wrong, answered, drawn at once) over fresh races on peaked and flatter rows: the target's
    winner and a chain's child from the logits against ``race_winner`` / ``race_ranking`` on the
    float64 probabilities; "drawn at once": how often the largest logit's bound chose the blocks."""
    from ersd import race_v2 as rv
    from ersd.probs import SamplingParams, logits_to_probs
    from ersd.race import RaceNoise, root_key

    noise = RaceNoise(vocab, scheme="v2")
    g = torch.Generator().manual_seed(vocab + 1)
    calls = {"n": 0}
    helper = rv._blocks_below_top

    def counting(*a: object) -> np.ndarray | None:
        out = helper(*a)  # type: ignore[arg-type]
        calls["n"] += out is not None
        return out

    rv._blocks_below_top = counting  # restored below
    wrong = answered = 0
    try:
        for k in range(keys):
            row = torch.randn(vocab, generator=g) * (2.0 + 6.0 * (k % 3))
            t = (1.0, 0.7, 1.3)[k % 3]
            q = logits_to_probs(row, SamplingParams(temperature=t))
            key = root_key(k, [vocab, 3])
            want = noise.ranking(key, q, 1)[0]
            got = noise.winner_from_logits(key, row, t)
            child = rv.v2_ranking_from_logits(
                rv.V2Race(key, 0, vocab), rv.LogitRow(row, t), 1
            )  # a fresh race: nothing drawn yet
            for answer in (got, None if child is None else child[0]):
                if answer is not None:
                    answered += 1
                    wrong += answer != want
    finally:
        rv._blocks_below_top = helper
    return wrong, answered, calls["n"]


def test_a_single_winner_from_the_largest_logits_bound_is_the_reference(monkeypatch) -> None:
    """The target's winner and a chain's child found in one draw of the blocks within the largest
    logit's score (``race_v2.TOP_FIRST``) are the references' tokens on 240 fresh races at two
    vocabularies; a variant that draws only that token's own block answers wrong tokens."""
    from ersd import race_v2 as rv

    assert rv.TOP_FIRST
    for vocab in (6400, 151936):
        keys = 240 if vocab < 10000 else 30
        wrong, answered, used = _top_first_against_references(vocab, keys)
        assert wrong == 0 and answered >= 0.97 * 2 * keys
        assert used >= keys  # the one-draw path ran (most rows are peaked enough)
    monkeypatch.setattr(
        rv,
        "_blocks_below_top",
        lambda race, x, b, mx, t, bound: (np.array([b]), math.inf),
    )
    wrong, _, _ = _top_first_against_references(6400, 240)
    assert wrong > 0


def test_tokens_left_out_of_a_draw_cannot_win(monkeypatch) -> None:
    """The one draw keeps only the tokens whose score can be within the limit
    (``race_v2.PRUNE_TOKENS``): the same winners and children as the references on fresh races,
    with most tokens of the chosen blocks left out, mostly decided in Python floats
    (``race_v2.FEW_IN_PYTHON``; the arrays give the same answers); a variant that leaves out
    tokens whose lower bound is a tenth of the limit answers wrong tokens."""
    from ersd import race_v2 as rv

    assert rv.PRUNE_TOKENS
    seen = {"kept": 0, "of": 0, "few": 0}
    within = rv._scores_within

    def counting(race, x, t, mx, blocks, limit):  # type: ignore[no-untyped-def]
        out = within(race, x, t, mx, blocks, limit)
        seen["kept"] += out[0].size
        seen["of"] += rv._ids_of(blocks, x.shape[0]).size
        return out

    few = rv._few_within

    def counting_few(race, x, t, mx, blocks, limit):  # type: ignore[no-untyped-def]
        out = few(race, x, t, mx, blocks, limit)
        if out is not None:
            seen["few"] += 1
            seen["kept"] += len(out)
            seen["of"] += rv._ids_of(blocks, x.shape[0]).size
        return out

    monkeypatch.setattr(rv, "_scores_within", counting)
    monkeypatch.setattr(rv, "_few_within", counting_few)
    wrong, answered, used = _top_first_against_references(6400, 240)
    assert wrong == 0 and answered >= 0.97 * 2 * 240 and used >= 240
    assert seen["kept"] < 0.2 * seen["of"]  # the draw left most tokens out
    assert seen["few"] >= 240  # most answers came from the candidates in Python floats
    monkeypatch.setattr(rv, "FEW_IN_PYTHON", False)  # the arrays alone: the same answers
    assert _top_first_against_references(6400, 240)[:2] == (0, answered)
    monkeypatch.setattr(rv, "FEW_IN_PYTHON", True)
    monkeypatch.setattr(rv, "_scores_within", within)
    monkeypatch.setattr(rv, "_few_within", few)
    monkeypatch.setattr(rv, "_PRUNE_MARGIN", -0.9)
    wrong, _, _ = _top_first_against_references(6400, 240)
    assert wrong > 0
