"""A step's ERSD verification batched over rows (:mod:`ersd.verify_batch`) against the node-by-node
walk (:func:`ersd.methods.verify_tree`), and the host reads of the device schedule counted."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pytest
import torch

import ersd
from ersd.batch import BatchEngine
from ersd.methods import DraftTree, NodeDecision, NodeNoise, verify_tree
from ersd.methods.ersd import ERSD
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import RaceNoise, race_winner, root_key
from ersd.verify_batch import batches, verify_many
from tests.toy import mixed_draft, table_model

VOCAB = 3000


def random_tree(
    seed: int, nodes: int, width: int, params: SamplingParams, noise: RaceNoise, beta: float
) -> tuple[DraftTree, torch.Tensor]:
    """A drafted tree of about ``nodes`` nodes and the target's logits at its contexts.  Children
    are random, but at most contexts one of them is the target's race winner, so walks go deep,
    reject at random depths and reach leaves."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.empty(root_key(seed, [1, 2, 3]))
    logits = [torch.randn(VOCAB, generator=g) * 3]
    frontier = [DraftTree.ROOT]
    rule = ERSD(beta)
    while frontier and tree.num_nodes < nodes:
        ctx = frontier.pop(0)
        q = logits_to_probs(torch.randn(VOCAB, generator=g) * 3, params)
        tree.draft_probs[ctx] = q
        y = race_winner(logits_to_probs(logits[ctx], params), noise.exponentials(tree.keys[ctx]))
        kids = rule.draft(q, width, NodeNoise(noise, tree.keys[ctx]))
        if torch.rand(1, generator=g).item() < 0.7 and y not in kids:
            kids[int(torch.randint(len(kids), (1,), generator=g))] = y
        for tok in dict.fromkeys(kids):
            if tree.num_nodes >= nodes:
                break
            frontier.append(tree.add_child(ctx, tok))
            logits.append(torch.randn(VOCAB, generator=g) * 3)
    return tree, torch.stack(logits)


def _probs(logits: torch.Tensor, params: SamplingParams) -> list[torch.Tensor]:
    """Each context's probabilities from its own call, as the loop computes them."""
    return [logits_to_probs(row, params) for row in logits]


SETTINGS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.2, top_p=0.9),
    SamplingParams(top_k=40, min_p=0.02),
]


def _rows(n: int, noise: RaceNoise) -> tuple[list, list, list, list, list]:
    rules, params, noises, trees, logits = [], [], [], [], []
    for i in range(n):
        p = SETTINGS[i % len(SETTINGS)]
        beta = 1.0 if i % 3 else 1.3
        nodes, width = [(0, 1), (4, 1), (6, 2), (13, 3)][i % 4]
        tree, lg = random_tree(100 + i, nodes, width, p, noise, beta)
        rules.append(ERSD(beta))
        params.append(p)
        noises.append(noise)
        trees.append(tree)
        logits.append(lg)
    return rules, params, noises, trees, logits


@pytest.mark.parametrize(("mode", "via_torch"), [("levels", None), ("all", False), ("all", True)])
def test_batched_verdicts_equal_the_node_by_node_walk(mode: str, via_torch: bool | None) -> None:
    noise = RaceNoise(VOCAB)
    rules, params, noises, trees, logits = _rows(12, noise)
    got = verify_many(rules, params, noises, trees, logits, mode, noise_via_torch=via_torch)
    depths = set()
    for i, v in enumerate(got):
        probs = _probs(logits[i], params[i])
        want = verify_tree(rules[i], trees[i], probs, noise)
        assert (v.accepted, v.tokens, v.ranks) == (want.accepted, want.tokens, want.ranks), i
        last = v.accepted[-1] + 1 if v.accepted else 0
        depths.add((len(v.accepted), bool(trees[i].children[last])))
    # the walks stopped by rejection and by reaching leaves, at several depths
    assert len({d for d, _ in depths}) >= 3
    assert any(not leaf for _, leaf in depths) and any(leaf for _, leaf in depths)


def test_a_wrong_winner_is_caught() -> None:
    """The comparison above rejects a verifier that takes the winner of the draft's race."""
    noise = RaceNoise(VOCAB)
    rules, params, noises, trees, logits = _rows(8, noise)
    wrong = []
    for i in range(8):  # the draft's race in place of the target's: the text changes
        swapped = [
            q if q is not None else logits_to_probs(lg, params[i])
            for q, lg in zip(trees[i].draft_probs, logits[i], strict=True)
        ]
        wrong.append(torch.log(torch.stack(swapped)) * (params[i].temperature or 1.0))
    got = verify_many(rules, params, noises, trees, wrong, "all")
    want = [verify_tree(rules[i], trees[i], _probs(logits[i], params[i]), noise) for i in range(8)]
    assert [v.tokens for v in got] != [w.tokens for w in want]


class _Broken(ERSD):
    def verify_node(self, target_probs, draft_probs, children, noise) -> NodeDecision:
        return NodeDecision(0, children[0])  # accepts everything


def test_only_ersds_own_rules_are_batched() -> None:
    assert batches(ERSD()) and batches(ERSD(1.4))
    assert not batches(_Broken())
    assert not batches(ersd.methods.get_method("specinfer"))
    with pytest.raises(TypeError, match="ERSD rules only"):
        verify_many(
            [_Broken()],
            [SamplingParams()],
            [RaceNoise(VOCAB)],
            [DraftTree.empty(1)],
            [torch.zeros(1, VOCAB)],
        )


@contextlib.contextmanager
def count_reads() -> Iterator[list[str]]:
    """Count every read of a tensor's values by the host (what synchronises a device): ``item``,
    ``tolist``, ``numpy``, ``bool``/``int``/``float``/``index`` conversions."""
    seen: list[str] = []
    names = ["item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"]
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def wrap(name: str):
        orig = saved[name]

        def f(self, *a, **k):
            seen.append(name)
            return orig(self, *a, **k)

        return f

    for n in names:
        setattr(torch.Tensor, n, wrap(n))
    try:
        yield seen
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


@pytest.mark.parametrize("rows", [4, 12])
def test_device_schedule_reads_the_host_once_per_step(rows: int) -> None:
    """The "all" schedule with the torch races: one read for the verdicts and one per noise call
    (the ziggurat's tail values), whatever the number of nodes; the node-by-node walk, the
    deliberately broken variant here, reads per node and must exceed the bound."""
    noise = RaceNoise(VOCAB)
    rules, params, noises, trees, logits = _rows(rows, noise)
    groups = len({(p, id(n)) for p, n in zip(params, noises, strict=True)})
    nodes = sum(t.num_nodes for t in trees)
    with count_reads() as seen:
        verify_many(rules, params, noises, trees, logits, "all", noise_via_torch=True)
    assert len(seen) <= 1 + groups, seen
    with count_reads() as walk:
        for i in range(rows):
            verify_tree(rules[i], trees[i], _probs(logits[i], params[i]), noise)
    assert len(walk) > 1 + groups and nodes > 0


def _batch(
    engine_verify: bool, prompts: Sequence[list[int]], **kw
) -> list[list[tuple[list[int], list[int]]]]:
    target = table_model(48, 0)
    draft = mixed_draft(target, table_model(48, 1), 0.6)
    engine = BatchEngine(target, draft)
    engine.batched_verify = engine_verify
    engine.workers = 1
    recs: dict[int, list] = {}
    for i, p in enumerate(prompts):
        recs[engine.add(p, seed=i, **kw)] = []
    while len(engine):
        for rid, rec, _ in engine.step():
            recs[rid].append((rec.tokens, rec.ranks))
    return [recs[r] for r in sorted(recs)]


@pytest.mark.parametrize(
    "kw",
    [
        {"tree": "chain:4", "temperature": 1.0},
        {"tree": "multi:2x3", "temperature": 0.8, "top_p": 0.9},
        {"tree": "chain:3", "temperature": 1.0, "watermark": "wm"},
    ],
)
def test_engine_rows_equal_the_reference_path(kw: dict) -> None:
    kw = dict(kw)
    if kw.get("watermark") == "wm":
        kw["watermark"] = ersd.Watermark(key=b"w" * 32, context_width=2)
    prompts = [[1, 2], [3, 4, 5], [7], [9, 9, 9, 2]]
    got = _batch(True, prompts, max_new_tokens=20, **kw)
    want = _batch(False, prompts, max_new_tokens=20, **kw)
    assert got == want
    assert sum(len(r) for r in got) < 4 * 20  # drafts were accepted: multi-token steps
