"""Batched generation: batch invariance for every method, continuous batching, shared forwards."""

from __future__ import annotations

import pytest

import ersd
from ersd import GenerationInputError, VocabularyMismatchError
from ersd.batch import BatchEngine, batch_seeds, derive_seed
from tests.toy import mixed_draft, table_model

V = 30
PROMPTS = [[1, 2], [3], [4, 5, 6, 7], [1, 2], [9, 8, 7]]


@pytest.fixture
def pair() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = table_model(V, seed=0)
    return target, mixed_draft(target, table_model(V, seed=1), 0.3)


@pytest.mark.parametrize("method", sorted(ersd.METHODS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_row_equals_its_solo_run(pair, method: str, temperature: float) -> None:
    target, draft = pair
    tree = "chain:3" if method in ("sd",) else "multi:2x2"
    eos = 5  # rows finish at different steps
    batch = ersd.generate_batch(
        target,
        draft,
        PROMPTS,
        seeds=11,
        max_new_tokens=14,
        method=method,
        tree=tree,
        temperature=temperature,
        eos_token_id=eos,
    )
    for i, (prompt, res) in enumerate(zip(PROMPTS, batch, strict=True)):
        solo = ersd.generate(
            target,
            draft,
            prompt,
            seed=derive_seed(11, i),
            max_new_tokens=14,
            method=method,
            tree=tree,
            temperature=temperature,
            eos_token_id=eos,
        )
        assert res.tokens == solo.tokens, f"prompt {i}"
        assert res.target_calls == solo.target_calls
        assert res.finish_reason == solo.finish_reason


@pytest.mark.parametrize("workers", [None, 1, 3])
@pytest.mark.parametrize("method", ["ersd", "specinfer"])
def test_rows_worked_side_by_side_equal_their_solo_runs(
    pair, monkeypatch, method: str, workers: int | None
) -> None:
    """The engine can draft and verify its rows on worker threads (``row_map``); each row's
    tokens stay its solo run's, and the threads are really used when there are several (by
    default there is one: the rows are worked serially)."""
    import threading

    import ersd.batch as batch_mod

    target, draft = pair
    seen: set[str] = set()
    real_verify = batch_mod.verify

    def spy(*args):
        seen.add(threading.current_thread().name)
        return real_verify(*args)

    monkeypatch.setattr(batch_mod, "verify", spy)
    engine = BatchEngine(target, draft)
    engine.workers = workers
    # ERSD rows are verified in one batched call by default (tests/test_verify_batch.py); the
    # node-by-node walk on the row pool is what this test watches
    engine.batched_verify = False
    ids = [
        engine.add(p, max_new_tokens=12, seed=i, method=method, tree="multi:2x2", eos_token_id=5)
        for i, p in enumerate(PROMPTS)
    ]
    done: dict[int, ersd.GenerationResult] = {}
    for _ in range(40):
        done.update((rid, res) for rid, _, res in engine.step() if res is not None)
        if not len(engine):
            break
    assert set(done) == set(ids)
    for i, (rid, prompt) in enumerate(zip(ids, PROMPTS, strict=True)):
        solo = ersd.generate(
            target,
            draft,
            prompt,
            seed=i,
            max_new_tokens=12,
            method=method,
            tree="multi:2x2",
            eos_token_id=5,
        )
        assert done[rid].tokens == solo.tokens, f"prompt {i}"
    on_workers = any(name.startswith("ersd-rows") for name in seen)
    assert on_workers == ((workers or 1) > 1), seen


def test_row_map_keeps_order_and_raises() -> None:
    from ersd.batch import row_map

    assert row_map(lambda a, b: a * b, [1, 2, 3, 4], [5, 6, 7, 8], workers=2) == [5, 12, 21, 32]
    assert row_map(lambda a: a + 1, [1], workers=2) == [2]

    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("row 3")
        return x

    with pytest.raises(ValueError, match="row 3"):
        row_map(boom, [1, 2, 3, 4], workers=2)


def test_one_target_forward_per_step(pair) -> None:
    target, draft = pair
    before_t, before_d = target.forward_calls, draft.forward_calls
    engine = BatchEngine(target, draft)
    for i, p in enumerate(PROMPTS[:3]):
        engine.add(p, max_new_tokens=6, seed=i, tree="chain:3")
    engine.step()
    assert target.forward_calls - before_t == 1  # all rows' trees in one forward
    assert draft.forward_calls - before_d == 3  # one draft forward per tree level


def test_order_and_composition_do_not_matter(pair) -> None:
    target, draft = pair
    seeds = [5, 6, 7, 8, 9]
    a = ersd.generate_batch(target, draft, PROMPTS, seeds=seeds, max_new_tokens=10)
    order = [3, 0, 4, 1, 2]
    b = ersd.generate_batch(
        target,
        draft,
        [PROMPTS[i] for i in order],
        seeds=[seeds[i] for i in order],
        max_new_tokens=10,
    )
    for j, i in enumerate(order):
        assert b[j].tokens == a[i].tokens
    c = ersd.generate_batch(
        target, draft, PROMPTS, seeds=seeds, max_new_tokens=10, max_batch_size=2
    )  # rows join as others finish
    assert [r.tokens for r in c] == [r.tokens for r in a]


def test_rows_joining_mid_way_leave_others_unchanged(pair) -> None:
    target, draft = pair
    engine = BatchEngine(target, draft)
    first = engine.add(PROMPTS[0], max_new_tokens=12, seed=1)
    done: dict[int, ersd.GenerationResult] = {}
    late = None
    for n in range(40):
        if n == 2:
            late = engine.add(
                PROMPTS[2],
                max_new_tokens=12,
                seed=2,
                method="spectr",
                tree="multi:2x2",
                temperature=0.7,
            )
        for rid, _, res in engine.step():
            if res is not None:
                done[rid] = res
        if not len(engine):
            break
    assert set(done) == {first, late}
    assert (
        done[first].tokens
        == ersd.generate(target, draft, PROMPTS[0], seed=1, max_new_tokens=12).tokens
    )
    assert (
        done[late].tokens
        == ersd.generate(
            target,
            draft,
            PROMPTS[2],
            seed=2,
            max_new_tokens=12,
            method="spectr",
            tree="multi:2x2",
            temperature=0.7,
        ).tokens
    )


def test_target_only_rows_and_ersd_agree(pair) -> None:
    target, draft = pair
    spec = ersd.generate_batch(target, draft, PROMPTS, seeds=3, max_new_tokens=12)
    alone = ersd.generate_batch(target, None, PROMPTS, seeds=3, max_new_tokens=12)
    assert [r.tokens for r in spec] == [r.tokens for r in alone]  # drafter invariance


def test_seeds() -> None:
    assert batch_seeds([4, 5], 2) == [4, 5]
    derived = batch_seeds(7, 3)
    assert derived == [derive_seed(7, i) for i in range(3)] and len(set(derived)) == 3
    with pytest.raises(GenerationInputError, match="3 prompts"):
        batch_seeds([1, 2], 3)


def test_bad_batches_fail_before_anything_runs(pair) -> None:
    target, draft = pair
    with pytest.raises(GenerationInputError, match="non-empty list"):
        ersd.generate_batch(target, draft, [], max_new_tokens=3)
    calls = target.forward_calls
    with pytest.raises(GenerationInputError, match="prompt 1: .*outside"):
        ersd.generate_batch(target, draft, [[1], [V + 3]], max_new_tokens=3)
    with pytest.raises(GenerationInputError, match="seeds has 1"):
        ersd.generate_batch(target, draft, [[1], [2]], seeds=[1], max_new_tokens=3)
    small = ersd.FunctionModel(target.fn, V, max_length=4)
    with pytest.raises(GenerationInputError, match="prompt 1: .*context window"):
        ersd.generate_batch(small, None, [[1], [1, 2, 3, 4, 5]], max_new_tokens=3)
    other = table_model(V + 1, seed=2)
    with pytest.raises(VocabularyMismatchError):
        ersd.generate_batch(target, other, [[1]], max_new_tokens=3)
    assert target.forward_calls == calls


def test_growing_sessions_declare_the_protocol(pair) -> None:
    """The engine grows trees level by level only through the written GrowingSession protocol:
    model, dynamic and confidence-grown sessions offer it; a model-free drafter's does not."""
    from ersd.drafting import ConfidenceDrafter, DynamicDrafter, LookupDrafter
    from ersd.drafting.base import GrowingSession

    _, draft = pair
    growing = [ersd.ModelDrafter(draft), DynamicDrafter(draft, 4), ConfidenceDrafter(draft, 4)]
    for drafter in growing:
        session = drafter.start_drafting([1, 2])
        assert isinstance(session, GrowingSession), type(session).__name__
    assert not isinstance(LookupDrafter().start_drafting([1, 2]), GrowingSession)


def test_engine_growing_check_equals_the_protocol_check(pair) -> None:
    """The engine's cheap ``grows`` is ``isinstance(x, GrowingSession)``: its member list is the
    protocol's, and it agrees on real sessions and on objects missing a member or holding a
    None method (a check that looked at ``grow`` alone is rejected by the same cases)."""
    import types

    from ersd.batch import GROWING_MEMBERS, grows
    from ersd.drafting import ConfidenceDrafter, DynamicDrafter, LookupDrafter
    from ersd.drafting.base import GrowingSession

    members = set()
    for cls in GrowingSession.__mro__:
        if cls.__module__ == "ersd.drafting.base":
            members |= set(vars(cls).get("__annotations__", {}))
            members |= {k for k, v in vars(cls).items() if callable(v) and not k.startswith("_")}
    assert set(GROWING_MEMBERS) == members
    _, draft = pair
    drafters = [ersd.ModelDrafter(draft), DynamicDrafter(draft, 4), ConfidenceDrafter(draft, 4)]
    cases: list[object] = [d.start_drafting([1, 2]) for d in drafters]
    cases.append(LookupDrafter().start_drafting([1, 2]))
    full = {name: (lambda *a: None) for name in GROWING_MEMBERS}
    full.update(session=object(), parallel_grow=True)
    cases.append(types.SimpleNamespace(**full))
    for name in GROWING_MEMBERS:
        cases.append(types.SimpleNamespace(**{k: v for k, v in full.items() if k != name}))
        cases.append(types.SimpleNamespace(**{**full, name: None}))

    def grow_only(x: object) -> bool:
        return getattr(x, "grow", None) is not None

    assert [grows(x) for x in cases] == [isinstance(x, GrowingSession) for x in cases]
    assert [grow_only(x) for x in cases] != [isinstance(x, GrowingSession) for x in cases]
    assert sum(isinstance(x, GrowingSession) for x in cases) >= 4
