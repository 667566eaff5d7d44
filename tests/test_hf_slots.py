"""The HF adapter's persistent batched KV storage (``ersd/models/hf_slots.py``): sessions scored
in a batch keep their cache in a slot; a batched forward writes only the new tokens' K/V.

Contract for the storage: tree rows equal per-path plain forwards per row; a row's cache never
outgrows its committed sequence plus pending nodes (and equals the committed part after a commit);
a finished row frees its slot (closed by the engine, or collected); rows joining and leaving
mid-run keep their outputs; a slotted session scored alone equals a ``DynamicCache`` twin bit for
bit (the slot layout is the same, only the storage differs).
"""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
import torch

import ersd
from ersd.batch import BatchEngine
from ersd.models.batch import score_many
from ersd.models.hf import HFModel
from ersd.models.hf_slots import KEEP_BYTES, slot_store
from tests.backend_contract import BackendCase, Driver, random_parents, random_path
from tests.hf_tiny import tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hf_reference(model: Any, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.hf_module(input_ids=torch.tensor([seq])).logits[0, -1].float()


@pytest.fixture
def pair() -> tuple[HFModel, HFModel]:
    """Fresh models per test: each test sees its own slot storage."""
    return tiny_pair()  # type: ignore[no-any-return]


def live_slots(model: HFModel) -> int:
    store = slot_store(model)
    assert store is not None
    return store.used


def test_rows_equal_per_path_forwards_through_joins_leaves_and_compaction(pair) -> None:
    """Random trees for a changing set of rows: some calls cover a subset of the slotted rows
    (forcing compaction and eviction), rows leave (closed or collected) and fresh prompts join;
    every row equals its path's plain forward, caches stay within each row's sequence, slots
    are contiguous per call and counted exactly."""
    target, _ = pair
    case = BackendCase("hf-llama-slots", lambda: target, hf_reference)
    store = slot_store(target)
    assert store is not None
    rng = random.Random(5)
    moved_before = store.moved

    def new_driver() -> Driver:
        return Driver(case, target, [rng.randrange(300) for _ in range(rng.randrange(1, 14))])

    drivers = [new_driver() for _ in range(4)]
    for step in range(10):
        part = drivers if step % 3 else rng.sample(drivers, k=max(1, len(drivers) - 2))
        calls: list[tuple[list[int], list[int]]] = []
        for drv in part:
            par = random_parents(rng, len(drv.ptok), rng.randrange(0, 5))
            calls.append(([drv.token(rng) for _ in par], par))
        outs = score_many(target, [d.session for d in part], calls)
        slots = sorted(d.session._slot.slot for d in part if d.session._slot is not None)
        assert slots == list(range(slots[0], slots[0] + len(slots))) if slots else True
        for drv, (tokens, parents), rows in zip(part, calls, outs, strict=True):
            drv.check_scored(tokens, parents, rows)
            ref = drv.session._slot
            if ref is not None:
                assert ref.length == drv.session.cache_length
        for drv in drivers:
            if drv.ptok and rng.random() < 0.7:
                path = random_path(rng, drv.ppar)
                extra = [drv.token(rng) for _ in range(rng.choice([0, 1, 2]))]
                drv.commit([drv.ptok[i] for i in path] + extra, path)
                assert drv.session.cache_length <= len(drv.session.committed)
        assert live_slots(target) == sum(d.session._slot is not None for d in drivers)
        if step == 4:  # one row closed, one collected, two fresh prompts join
            drivers[0].session.close()
            gone = drivers[2]
            drivers = [drivers[1], drivers[3], new_driver(), new_driver()]
            del gone, part  # the only references left: the session is collected
            gc.collect()
            assert live_slots(target) == sum(d.session._slot is not None for d in drivers)
    assert store.moved > moved_before, "the subset calls should have moved rows between slots"
    del drivers, part, drv  # the last references to the sessions
    gc.collect()
    assert store.used == 0 and not store.owners, "the last session gave its slot back"
    kept = store.kv
    assert kept is not None and kept.nbytes <= KEEP_BYTES, "a small storage is kept"
    assert kept.shape[2] >= 4 and kept.shape[4] > 14
    kept[:, :, :, :, -1] = float("nan")  # what a broken row before could have left behind
    again = [new_driver() for _ in range(2)]
    for d in again:
        d.session.score([], [])
    store.arrange([d.session for d in again], 8)
    assert store.kv is kept, "the next batch reuses the kept storage"
    assert int(torch.count_nonzero(kept[:, :, 2:])) == 0 and not bool(kept.isnan().any()), (
        "reused storage is zeroed: no value of an earlier batch survives"
    )
    calls = [([d.token(rng)], [-1]) for d in again]
    outs = score_many(target, [d.session for d in again], calls)
    for d, call, rows in zip(again, calls, outs, strict=True):
        d.check_scored(*call, rows)
    del again, d
    gc.collect()
    store.trim()
    assert store.kv is None, "trim() frees the kept storage"


def test_slotted_session_alone_equals_dynamic_cache_twin(pair) -> None:
    """A session moved into a slot (next to others) and then scored alone gives exactly the rows
    of a twin on its own DynamicCache, through tree scores and path commits."""
    target, _ = pair
    prompt = [5, 17, 42, 8, 1, 2, 3, 4, 5, 6, 7, 8]
    others = [target.start([9] * k) for k in (3, 20)]
    sess, twin = target.start(prompt), target.start(prompt)
    for s in [*others, sess, twin]:
        s.score([], [])  # solo prefills on DynamicCaches
    store = slot_store(target)
    assert store is not None
    store.arrange([*others, sess], 40)
    assert sess._slot is not None and twin._slot is None
    for tokens, parents, commit, path in [
        ([4, 5, 6], [-1, 0, 0], [4, 6, 9], [0, 2]),
        ([7, 8], [-1, -1], [8], [1]),
        ([1, 2, 3, 4], [-1, 0, 1, 0], [1, 2, 3], [0, 1, 2]),
    ]:
        assert torch.equal(sess.score(tokens, parents), twin.score(tokens, parents))
        sess.commit(commit, path)
        twin.commit(commit, path)
        assert sess.cache_length == twin.cache_length
    assert torch.equal(sess.score([], []), twin.score([], []))


def test_finished_rows_free_their_slots(pair) -> None:
    """Rows finishing at different steps give their target and draft slots back at once; the
    storage is released when the last row leaves."""
    target, draft = pair
    engine = BatchEngine(target, draft)
    for i, n in enumerate([3, 9, 6, 14]):
        engine.add([5 + i, 17, 42], seed=i, max_new_tokens=n, method="ersd", tree="chain:2")
    steps = 0
    while engine.active:
        engine.step()
        steps += 1
        assert live_slots(target) <= len(engine.active)
        assert live_slots(draft) <= len(engine.active)
        if steps >= 2:
            assert live_slots(target) == len(engine.active)
    for model in (target, draft):
        store = slot_store(model)
        assert store is not None and store.used == 0
        assert store.kv is not None and store.kv.nbytes <= KEEP_BYTES  # kept for the next batch


def test_large_storage_is_released_with_its_last_session(pair, monkeypatch) -> None:
    """A storage above KEEP_BYTES is not kept once its last row leaves."""
    import ersd.models.hf_slots as hf_slots

    target, draft = pair
    monkeypatch.setattr(hf_slots, "KEEP_BYTES", 0)
    engine = BatchEngine(target, draft)
    for i in range(2):
        engine.add([5 + i, 17, 42], seed=i, max_new_tokens=4, method="ersd", tree="chain:2")
    while engine.active:
        engine.step()
    assert slot_store(target).kv is None and slot_store(draft).kv is None  # type: ignore[union-attr]


def test_closed_session_refuses_to_score(pair) -> None:
    target, _ = pair
    a, b = target.start([1, 2, 3]), target.start([4, 5])
    score_many(target, [a, b], [([6], [-1]), ([7], [-1])])
    assert a._slot is not None and live_slots(target) == 2
    a.close()
    assert live_slots(target) == 1 and a.cache_length == 0
    with pytest.raises(ersd.ErsdError, match="closed"):
        a.score([], [])
    b.close()


def test_rows_joining_mid_run_keep_their_outputs(pair) -> None:
    """Rows with different trees (so draft calls cover subsets of the rows) join at different
    steps and finish at different steps; every row's tokens equal its solo run."""
    target, draft = pair
    plan = [  # (step it joins, prompt, seed, max_new_tokens, tree)
        (0, [5, 17, 42], 3, 12, "chain:3"),
        (0, [7], 4, 5, "chain:1"),
        (2, [100, 3, 9, 250, 11, 12, 13, 14, 15, 16, 17], 5, 9, "multi:2x2"),
        (3, [31, 4], 6, 10, "chain:2"),
    ]
    engine = BatchEngine(target, draft)
    ids: dict[int, int] = {}
    got: dict[int, list[int]] = {}
    for step in range(60):
        for k, (at, prompt, seed, n, tree) in enumerate(plan):
            if at == step:
                ids[k] = engine.add(prompt, seed=seed, max_new_tokens=n, tree=tree)
        for rid, _rec, done in engine.step():
            if done is not None:
                got[rid] = done.tokens
        if len(got) == len(plan):
            break
    assert len(got) == len(plan)
    for k, (_, prompt, seed, n, tree) in enumerate(plan):
        solo = ersd.generate(target, draft, prompt, seed=seed, max_new_tokens=n, tree=tree)
        assert got[ids[k]] == solo.tokens, f"row {k} differs from its solo run"


def test_engine_rows_size_their_storage_once(pair) -> None:
    """The engine tells each row's sessions how long they may grow (prompt + max_new_tokens + one
    step's tree), so the storage is made wide enough when the rows join and never regrown (a
    regrowth copies every slot); without the hint the same run regrows.  Tokens are unchanged."""
    target, draft = pair
    prompts = [[5, 17, 42] * 12, [7] * 40, [100, 3, 9, 250] * 8]
    grows: list[tuple[str, int]] = []
    for model, name in ((target, "target"), (draft, "draft")):
        store = slot_store(model)
        assert store is not None
        real = store.reserve

        def spy(slots: int, columns: int, planned: int = 0, real=real, store=store, name=name):
            before = store.capacity
            real(slots, columns, planned)
            if store.capacity != before:
                grows.append((name, store.capacity))

        store.reserve = spy  # type: ignore[method-assign]

    def run(hint: bool) -> list[list[int]]:
        grows.clear()
        for model in (target, draft):
            slot_store(model).trim()  # type: ignore[union-attr]  # no storage kept from before
        engine = BatchEngine(target, draft)
        for i, p in enumerate(prompts):
            rid = engine.add(p, seed=i, max_new_tokens=60, tree="chain:3", temperature=1.0)
            if not hint:
                row = engine._rows[rid]
                row.seq.target.expected_length = row.seq.drafter.session.expected_length = 0
        done: dict[int, list[int]] = {}
        while engine.active:
            for rid, _rec, res in engine.step():
                if res is not None:
                    done[rid] = res.tokens
        return [done[k] for k in sorted(done)]

    hinted = run(hint=True)
    # made once per model, 40 + 60 + 4 columns wide (64-aligned), never regrown
    assert sorted(grows) == [("draft", 128), ("target", 128)], grows
    unhinted = run(hint=False)
    assert len(grows) > 2, "without the hint the storage should have regrown"
    assert hinted == unhinted
    for i, p in enumerate(prompts):
        solo = ersd.generate(
            target, draft, p, seed=i, max_new_tokens=60, tree="chain:3", temperature=1.0
        )
        assert hinted[i] == solo.tokens


def test_length_hint_reserves_at_most_twice_the_rows(pair) -> None:
    """A row allowed many more tokens than it holds does not reserve them all at once."""
    target, _ = pair
    a, b = target.start([1, 2, 3] * 10), target.start([4, 5])
    a.expect_length(100_000)
    for s in (a, b):
        s.score([], [])  # solo prefills; the batched call below gives them slots
    score_many(target, [a, b], [([6], [-1]), ([7], [-1])])
    store = slot_store(target)
    assert store is not None and 31 <= store.capacity <= 2 * 31 + 63  # 64-column alignment
    a.close()
    b.close()
