"""The loop's seams: Drafter objects, the four phases, the context window, sampling settings."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import ersd
from ersd import GenerationInputError
from ersd.drafting import Proposal
from ersd.generation import commit, propose, score, start_sequence, verify
from ersd.methods import GREEDY, DraftTree, Method, NodeNoise, rule_for
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.request import Request
from ersd.tree import TreeShape
from tests.toy import mixed_draft, table_model

V = 30


class FixedDrafter:
    """A model-free drafter: proposes a fixed token run as a chain (one-hot draft)."""

    vocab_size = None

    def __init__(self, run: Sequence[int]) -> None:
        self.run = list(run)
        self.observed: list[tuple[list[int], list[int]]] = []

    def start_drafting(self, prompt: Sequence[int]) -> FixedDrafter:
        return self

    def propose(
        self, shape: TreeShape, key: int, rule: Method, params: SamplingParams, noise: RaceNoise
    ) -> Proposal:
        tree = DraftTree.empty(key)
        ctx = DraftTree.ROOT
        for tok in self.run[: shape.depth]:
            q = torch.zeros(V, dtype=torch.float64)
            q[tok] = 1.0
            tree.draft_probs[ctx] = q
            ctx = tree.add_child(ctx, tok)
        return Proposal(tree)

    def observe(self, tokens: Sequence[int], accepted: Sequence[int]) -> None:
        self.observed.append((list(tokens), list(accepted)))


@pytest.fixture
def pair() -> tuple[ersd.FunctionModel, ersd.FunctionModel]:
    target = table_model(V, seed=0)
    return target, mixed_draft(target, table_model(V, seed=1), 0.3)


def test_a_drafter_that_is_not_a_model_drives_the_loop(pair) -> None:
    target, _ = pair
    base = ersd.generate(target, None, [1, 2], max_new_tokens=20, seed=4)
    drafter = FixedDrafter(base.tokens[:3])  # the first step's run is exactly right
    res = ersd.generate(target, drafter, [1, 2], max_new_tokens=20, seed=4, tree="chain:3")
    assert res.tokens == base.tokens  # ERSD: same text whatever the drafter
    assert res.steps[0].num_accepted == 3  # the right run is accepted in full
    assert drafter.observed[0] == (base.tokens[:4], [0, 1, 2])
    assert sum(len(t) for t, _ in drafter.observed) + len(res.steps[-1].tokens) == 20


@pytest.mark.parametrize("method", sorted(ersd.METHODS))
def test_every_method_accepts_a_one_hot_drafter(pair, method: str) -> None:
    target, _ = pair
    res = ersd.generate(
        target,
        FixedDrafter([3, 4]),
        [1, 2],
        max_new_tokens=8,
        seed=0,
        method=method,
        tree="chain:2",
    )
    assert len(res.tokens) == 8 and res.method == method


def test_a_model_is_wrapped_in_a_model_drafter(pair) -> None:
    target, draft = pair
    a = ersd.generate(target, draft, [1, 2], max_new_tokens=15, seed=2, tree="multi:2x2")
    b = ersd.generate(
        target, ersd.ModelDrafter(draft), [1, 2], max_new_tokens=15, seed=2, tree="multi:2x2"
    )
    assert a.tokens == b.tokens and a.target_calls == b.target_calls


def test_phases_compose_into_one_step(pair) -> None:
    target, draft = pair
    drafter = ersd.ModelDrafter(draft)
    request = Request([1, 2], max_new_tokens=10, seed=7, tree="chain:3")
    settings = request.resolve(target, drafter)
    seq = start_sequence(target, request, settings)
    proposal, depth = propose(settings, seq)
    assert depth == 3 and proposal.tree.num_nodes == 3 and proposal.forwards == 3
    logits, _ = score(settings, seq, proposal.tree)
    assert logits.shape == (4, V)
    verdict = verify(settings, proposal.tree, logits)
    tokens, accepted = commit(settings, seq, verdict)
    assert tokens == verdict.tokens and accepted == verdict.accepted
    assert seq.target.committed == [1, 2, *tokens] and seq.emitted == len(tokens)
    full = ersd.generate(target, draft, [1, 2], max_new_tokens=10, seed=7, tree="chain:3")
    assert full.tokens[: len(tokens)] == tokens


def test_greedy_is_a_typed_rule() -> None:
    meth = ersd.get_method("spectr")
    assert rule_for(meth, SamplingParams(0.0)) is GREEDY
    assert rule_for(meth, SamplingParams(0.5)) is meth
    logits = torch.tensor([0.0, 3.0, 3.0, -1.0])
    toks, _ = GREEDY.draft_children(logits, SamplingParams(0.0), 2, NodeNoise(RaceNoise(4), 0))
    assert toks == [1, 2]  # ties: lowest id first


def test_sampling_params_object_equals_keywords(pair) -> None:
    target, draft = pair
    kw = ersd.generate(target, draft, [1], max_new_tokens=12, seed=1, temperature=0.7, top_k=9)
    obj = ersd.generate(
        target, draft, [1], max_new_tokens=12, seed=1, sampling=SamplingParams(0.7, top_k=9)
    )
    assert kw.tokens == obj.tokens
    with pytest.raises(GenerationInputError, match="not both"):
        ersd.generate(
            target, draft, [1], max_new_tokens=2, temperature=0.5, sampling=SamplingParams(0.7)
        )


def test_padding_forwards_keeps_the_tokens(pair) -> None:
    target, _ = pair
    plain = ersd.generate(target, None, [1, 2], max_new_tokens=10, seed=3)
    padded = ersd.generate(
        target,
        None,
        [1, 2],
        max_new_tokens=10,
        seed=3,
        min_forward_tokens=2,
        label="target-only-2tok",
    )
    assert padded.tokens == plain.tokens and padded.method == "target-only-2tok"


@pytest.mark.parametrize("tree", ["chain:4", "multi:2x3", "chain:9"])
def test_context_window_stops_ersd_where_target_only_stops(tree: str) -> None:
    base = table_model(V, seed=0)
    target = ersd.FunctionModel(base.fn, V, max_length=12)
    draft = mixed_draft(target, table_model(V, seed=1), 0.2)
    alone = ersd.generate(target, None, [1, 2, 3], max_new_tokens=50, seed=5)
    spec = ersd.generate(target, draft, [1, 2, 3], max_new_tokens=50, seed=5, tree=tree)
    assert len(alone.tokens) == 9 and alone.finish_reason == "context"
    assert spec.tokens == alone.tokens and spec.finish_reason == "context"


def test_prompt_that_fills_the_window_is_refused() -> None:
    target = ersd.FunctionModel(table_model(V, seed=0).fn, V, max_length=4)
    with pytest.raises(GenerationInputError, match="context window is 4"):
        ersd.generate(target, None, [1, 2, 3, 4], max_new_tokens=3)


def test_finish_reasons(pair) -> None:
    target, draft = pair
    res = ersd.generate(target, draft, [1, 2], max_new_tokens=6, seed=0)
    assert res.finish_reason == "length" and res.steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in res.steps[:-1])
    eos = res.tokens[2]
    stop = ersd.generate(target, draft, [1, 2], max_new_tokens=6, seed=0, eos_token_id=eos)
    assert stop.finish_reason == "eos" and stop.tokens[-1] == eos


def test_bad_draft_object_is_named(pair) -> None:
    target, _ = pair
    with pytest.raises(GenerationInputError, match="draft must be a Drafter"):
        ersd.generate(target, object(), [1], max_new_tokens=2)  # type: ignore[arg-type]
