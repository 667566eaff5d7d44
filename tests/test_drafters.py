"""Model-free and hybrid drafters: look-ups, branches, budgets, corpus, specs, statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ersd
from ersd.drafting import (
    DrafterConfigError,
    HybridDrafter,
    LookupDrafter,
    SuffixDrafter,
    parse_drafter,
)
from ersd.drafting.grow import Budget, Continuation, grow_tree
from ersd.drafting.hybrid import CostModel, merge_trees
from ersd.drafting.suffix import SuffixTrie, read_corpus
from ersd.methods import GREEDY, DraftTree, get_method
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.tree import TreeShape, parse_tree
from tests.toy import mixed_draft, table_model

V = 30
NOISE = RaceNoise(V)


def propose(drafter, prompt, tree="chain:8", method="ersd", key=11):
    sess = drafter.start_drafting(prompt)
    rule = get_method(method)
    return sess, sess.propose(parse_tree(tree), key, rule, SamplingParams(1.0), NOISE).tree


def paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Token paths root-down of every node."""
    out = set()
    for node in range(tree.num_nodes):
        seq, n = [], node
        while n >= 0:
            seq.append(tree.tokens[n])
            n = tree.parents[n]
        out.add(tuple(reversed(seq)))
    return out


# --- lookup --------------------------------------------------------------------------------------


def test_lookup_continues_the_longest_match() -> None:
    # "5 6 7" was followed by 8 9 10; "6 7" alone also by 1 (elsewhere): the 3-gram wins
    prompt = [6, 7, 1, 2, 5, 6, 7, 8, 9, 10, 4, 5, 6, 7]
    _, tree = propose(LookupDrafter(n=3, k=3), prompt, "chain:8")
    assert tree.tokens == [8, 9, 10] and tree.num_nodes == 3  # k=3 caps the run
    _, tree = propose(LookupDrafter(n=2, k=3, branches=1), prompt, "chain:8")
    assert tree.tokens[0] in (1, 8)  # the 2-gram "6 7" has two followers, one kept


def test_lookup_branches_are_ranked_by_count_then_recency() -> None:
    # after "3": 4 twice, 5 once, 6 once (6 more recent than 5)
    prompt = [3, 4, 0, 3, 5, 0, 3, 4, 0, 3, 6, 0, 3]
    _, tree = propose(LookupDrafter(n=1, k=8, branches=3), prompt, "batch:3")
    assert [tree.tokens[k] for k in tree.children[0]] == [4, 6, 5]
    q = tree.draft_probs[0]
    assert q is not None and torch.isclose(q.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert q[4] == pytest.approx(0.5) and q[6] == pytest.approx(0.25)


def test_lookup_respects_every_budget() -> None:
    # "1" is followed by 2 (twice) and 5 (once): two branches, each a long run
    prompt = [1, 2, 3, 4, 9, 1, 5, 6, 7, 8, 9, 1, 2, 3, 4, 9, 1]
    for tree_spec, nodes, depth in [("chain:4", 4, 4), ("multi:2x3", 6, 3), ("chain:1", 1, 1)]:
        _, tree = propose(LookupDrafter(n=1, k=10), prompt, tree_spec)
        assert tree.num_nodes == nodes
        assert max(tree.depth_of(n) for n in range(tree.num_nodes)) == depth
        assert max(len(c) for c in tree.children) == (2 if "multi" in tree_spec else 1)
    _, tree = propose(LookupDrafter(n=1, k=2), prompt, "chain:8")
    assert tree.tokens == [2, 3]  # k caps the nodes
    _, tree = propose(LookupDrafter(n=1, k=10, branches=1), prompt, "multi:2x3")
    assert tree.num_nodes == 3  # branches=1 caps the branching


def test_no_match_proposes_nothing_and_the_step_is_a_plain_target_step() -> None:
    target = table_model(V, seed=0)
    _, tree = propose(LookupDrafter(), [1, 2, 3, 4], "chain:4")
    assert tree.num_nodes == 0
    res = ersd.generate(target, LookupDrafter(n=4, min_n=4), [1, 2, 3], max_new_tokens=3, seed=1)
    alone = ersd.generate(target, None, [1, 2, 3], max_new_tokens=3, seed=1)
    assert res.tokens == alone.tokens and res.target_calls == 3 and res.num_draft_tokens == 0


def test_lookup_index_learns_the_generated_text() -> None:
    sess, tree = propose(LookupDrafter(n=2, k=4), [1, 2, 3], "chain:4")
    assert tree.num_nodes == 0
    sess.observe([9, 1, 2], [])  # text: 1 2 3 9 1 2 -> "1 2" was followed by 3
    tree = sess.propose(TreeShape.chain(4), 5, get_method("ersd"), SamplingParams(1.0), NOISE).tree
    assert tree.tokens == [3, 9, 1, 2]


def test_rejection_methods_draw_children_from_q() -> None:
    # RRS-wor drafts without replacement from q over the proposal set: the set, in a keyed order
    prompt = [3, 4, 0, 3, 5, 0, 3, 6, 0, 3]
    orders = set()
    for key in range(40):
        _, tree = propose(LookupDrafter(n=1, branches=3), prompt, "batch:3", "rrs-wor", key)
        kids = [tree.tokens[k] for k in tree.children[0]]
        assert sorted(kids) == [4, 5, 6]
        orders.add(tuple(kids))
    assert len(orders) > 1  # not the deterministic ranking
    # SpecInfer draws i.i.d.: duplicates happen, and a duplicate is not expanded
    dup = 0
    for key in range(40):
        _, tree = propose(LookupDrafter(n=1, branches=3), prompt, "multi:3x2", "specinfer", key)
        kids = [tree.tokens[k] for k in tree.children[0]]
        expanded = [k for k in tree.children[0] if tree.children[DraftTree.context_of(k)]]
        assert len(expanded) == len(set(kids))
        dup += len(set(kids)) < len(kids)
    assert dup > 0


def test_grow_tree_goes_best_first() -> None:
    # root: a (0.9) and b (0.1); below a: a run; below b: a run.  Budget 4, branching 2: the
    # likely branch gets the nodes.
    table = {(): [(1, 0.9), (2, 0.1)], (1,): [(3, 1.0)], (2,): [(4, 1.0)], (1, 3): [(5, 1.0)]}

    def expand(state):
        return [Continuation(t, w, (*state, t)) for t, w in table.get(state, [])]

    tree, _ = grow_tree(expand, (), Budget(4, 4, 2), 0, GREEDY, NOISE)
    assert paths(tree) == {(1,), (2,), (1, 3), (1, 3, 5)}


def test_out_of_vocabulary_proposal_is_named() -> None:
    with pytest.raises(DrafterConfigError, match="outside the target's vocabulary"):
        propose(LookupDrafter(n=1), [100, 1, 100], "chain:2")


# --- suffix --------------------------------------------------------------------------------------


def test_suffix_trie_counts_substrings() -> None:
    trie = SuffixTrie(max_depth=3)
    trie.append([1, 2, 1, 2, 3])
    assert trie.root.children[1].count == 2
    assert trie.root.children[1].children[2].count == 2
    assert trie.root.children[1].children[2].children[3].count == 1
    assert 3 not in trie.root.children[1].children[2].children[3].children  # depth limit
    m, node = trie.longest_match([9, 1, 2], limit=2)
    assert m == 2 and node is trie.root.children[1].children[2]


def test_suffix_drafter_ranks_by_frequency_and_uses_the_corpus() -> None:
    prompt = [7, 8, 1, 7, 8, 2, 7, 8, 1, 0, 7, 8]
    _, tree = propose(SuffixDrafter(match=4, branches=2), prompt, "multi:2x2")
    assert [tree.tokens[k] for k in tree.children[0]] == [1, 2]
    # a corpus supplies continuations the prompt has never seen
    drafter = SuffixDrafter(match=4, corpus=[[20, 21, 22, 23, 24]])
    _, tree = propose(drafter, [5, 20, 21], "chain:4")
    assert tree.tokens == [22, 23, 24]


def test_read_corpus_formats(tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3\n\n4 5\n")
    assert read_corpus(ids) == [[1, 2, 3], [4, 5]]
    jl = tmp_path / "c.jsonl"
    jl.write_text(json.dumps([1, 2]) + "\n" + json.dumps({"ids": [3]}) + "\n")
    assert read_corpus(jl) == [[1, 2], [3]]
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    assert read_corpus(text, lambda s: [len(w) for w in s.split()]) == [[5, 5]]
    with pytest.raises(DrafterConfigError, match="no tokenizer"):
        read_corpus(text)
    with pytest.raises(DrafterConfigError, match="does not exist"):
        read_corpus(tmp_path / "missing.txt")
    bad = tmp_path / "b.jsonl"
    bad.write_text('[1, "x"]\n')
    with pytest.raises(DrafterConfigError, match="list of token ids"):
        read_corpus(bad)


# --- specs ---------------------------------------------------------------------------------------


def test_parse_drafter_specs(tmp_path: Path) -> None:
    d = parse_drafter("lookup:n=4,k=8,branches=3")
    assert isinstance(d, LookupDrafter) and (d.n, d.k, d.branches) == (4, 8, 3)
    assert isinstance(parse_drafter("suffix"), SuffixDrafter)
    corpus = tmp_path / "c.txt"
    corpus.write_text("1 2 3\n")
    s = parse_drafter(f"suffix:match=2,corpus={corpus}")
    assert isinstance(s, SuffixDrafter) and s.corpus is not None and s.corpus.length == 3
    model = table_model(V, seed=0)
    h = parse_drafter("lookup:policy=fallback+toy", load_model=lambda name: model)
    assert isinstance(h, HybridDrafter) and h.policy == "fallback" and h.vocab_size == V
    h = parse_drafter("lookup:model_depth=2+toy", load_model=lambda name: model)
    assert isinstance(h, HybridDrafter) and h.model_depth == 2 and h.policy == "auto"
    m = parse_drafter("toy", load_model=lambda name: model)
    assert isinstance(m, ersd.ModelDrafter)
    h = parse_drafter("lookup:policy=guided,guided=1+toy", load_model=lambda name: model)
    assert isinstance(h, HybridDrafter) and h.policy == "guided" and h.guided
    h = parse_drafter("lookup:guided=0+toy", load_model=lambda name: model)
    assert isinstance(h, HybridDrafter) and not h.guided


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("lookup:n=x", "must be an integer"),
        ("lookup:q=3", "unknown option 'q'"),
        ("lookup:n", "not key=value"),
        ("lookup:n=0", ">= 1"),
        ("lookup:n=2,min_n=3", "min_n=3 is larger"),
        ("lookup+suffix", "at most one model-free"),
        ("lookup+", "empty part"),
        ("lookup:policy=both", "only applies to a hybrid"),
        ("lookup:policy=often+toy", "unknown hybrid policy"),
        ("lookup:model_depth=0+toy", "model_depth must be an integer >= 1"),
        ("lookup:guided=yes+toy", "guided must be 0 or 1"),
        ("", "non-empty"),
    ],
)
def test_parse_drafter_errors_name_the_fix(spec: str, match: str) -> None:
    model = table_model(V, seed=0)
    with pytest.raises(DrafterConfigError, match=match):
        parse_drafter(spec, load_model=lambda name: model)


def test_model_part_needs_a_loader() -> None:
    with pytest.raises(DrafterConfigError, match="load_model"):
        parse_drafter("lookup+qwen2.5-coder-0.5b")


# --- hybrid --------------------------------------------------------------------------------------


def test_merge_trees_shares_common_prefixes() -> None:
    a = DraftTree.empty(3)
    c = a.add_child(0, 5)
    a.add_child(c, 6)
    b = DraftTree.empty(3)
    c = b.add_child(0, 5)
    b.add_child(c, 7)
    b.add_child(0, 8)
    for t in (a, b):
        for ctx in range(1 + t.num_nodes):
            if t.children[ctx]:
                t.draft_probs[ctx] = torch.ones(V, dtype=torch.float64) / V
    merged, (ma, mb) = merge_trees(3, [a, b])
    assert paths(merged) == {(5,), (5, 6), (5, 7), (8,)}
    assert ma[1] == mb[1]  # the shared node
    assert merged.keys[ma[2]] == a.keys[2] and merged.keys[mb[3]] == b.keys[3]


def test_cost_model_picks_the_cheapest_mix() -> None:
    costs = CostModel(step_seconds=0.1, model_seconds=0.05, model_tokens=1.5)
    costs.free_tokens[3], costs.free_hits[3] = 6.0, 0.95  # long confident matches: free only
    assert costs.choose(3, can_merge=True) == "free"
    costs.free_tokens[1], costs.free_hits[1] = 0.1, 0.05  # weak matches: add the model
    assert costs.choose(1, can_merge=True) == "both"
    assert costs.choose(1, can_merge=False) == "model"
    assert CostModel().choose(3, can_merge=False) == "model"  # unmeasured: measure the model


def test_hybrid_reports_per_source_acceptance_and_is_drafter_invariant() -> None:
    target = table_model(V, seed=0)
    draft = mixed_draft(target, table_model(V, seed=1), 0.2)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    alone = ersd.generate(target, None, prompt, max_new_tokens=40, seed=2)
    for policy in ("auto", "both", "fallback"):
        hybrid = HybridDrafter(LookupDrafter(n=2, k=4), draft, policy=policy)
        res = ersd.generate(target, hybrid, prompt, max_new_tokens=40, seed=2, tree="chain:3")
        assert res.tokens == alone.tokens
        st = hybrid.stats.sources
        assert st["model"].proposed > 0 and st["model"].accepted > 0
        assert st["lookup"].steps > 0
        # one mix per proposal (a last step with room for one token proposes nothing)
        assert res.target_calls - 1 <= sum(hybrid.mixes.values()) <= res.target_calls
        # the last step is not observed (the sequence ended): its tokens are not counted
        observed = res.num_accepted_tokens - res.steps[-1].num_accepted
        assert sum(s.accepted for s in st.values()) >= observed
    assert hybrid.mixes["free"] > 0  # fallback: lookup alone whenever it matched


def test_hybrid_model_depth_keeps_the_model_shallow() -> None:
    target = table_model(V, seed=0)
    draft = mixed_draft(target, table_model(V, seed=1), 0.2)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    hybrid = HybridDrafter(LookupDrafter(n=2, k=8), draft, policy="both", model_depth=2)
    sess = hybrid.start_drafting(prompt)
    prop = sess.propose(TreeShape.chain(6), 9, get_method("ersd"), SamplingParams(1.0), NOISE)
    assert prop.forwards == 2  # the model drafted two levels
    assert max(prop.tree.depth_of(n) for n in range(prop.tree.num_nodes)) == 6  # lookup: six
    assert prop.tree.num_nodes <= 6 + 2


def test_lookup_drafter_accepts_a_copied_run_in_full() -> None:
    """A target that copies (repeats the prompt's cycle) accepts whole lookup runs."""

    def fn(seqs):
        out = torch.full((len(seqs), V), -10.0)
        for i, s in enumerate(seqs):
            out[i, (s[-1] % 5) + 1] = 10.0  # 1 -> 2 -> ... -> 5 -> 1
        return out

    target = ersd.FunctionModel(fn, V)
    drafter = LookupDrafter(n=2, k=8)
    res = ersd.generate(target, drafter, [1, 2, 3, 4, 5, 1, 2], max_new_tokens=40, tree="chain:8")
    assert res.block_efficiency > 7.0
    lookup = drafter.stats.sources["lookup"]
    assert lookup.accepted == res.num_accepted_tokens - res.steps[-1].num_accepted
    assert lookup.acceptance_rate > 0.9


def test_model_free_and_hybrid_drafters_in_a_batch() -> None:
    """generate_batch drives model-free sessions through propose: same texts as one by one."""
    target = table_model(V, seed=0)
    draft = mixed_draft(target, table_model(V, seed=1), 0.2)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4], [7, 8, 9]]
    alone = [
        ersd.generate(target, None, p, max_new_tokens=12, seed=s).tokens
        for s, p in enumerate(prompts)
    ]
    for drafter in (LookupDrafter(n=2), HybridDrafter(LookupDrafter(n=2), draft, policy="both")):
        out = ersd.generate_batch(
            target, drafter, prompts, max_new_tokens=12, seeds=[0, 1, 2], tree="chain:4"
        )
        assert [r.tokens for r in out] == alone


# --- guided model drafting -------------------------------------------------------------------


@pytest.mark.parametrize(("method", "temperature"), [("ersd", 1.0), ("sd", 1.0), ("ersd", 0.0)])
def test_a_guess_gives_the_model_tree_for_fewer_forwards(method: str, temperature: float) -> None:
    """``ModelDraftSession.grow(guess=...)``: whatever the guess, the chain is the one the draft
    drafts without it (same tokens, same recorded q); each guessed level the draft agrees with
    saves one forward."""
    draft = mixed_draft(table_model(V, seed=0), table_model(V, seed=1), 0.5)
    drafter = ersd.ModelDrafter(draft)
    rule = get_method(method) if temperature > 0 else GREEDY
    params = SamplingParams(temperature)
    prompt, shape, key = [3, 1, 4, 1, 5], TreeShape.chain(6), 21

    def run(guess: list[int]) -> ersd.drafting.Proposal:
        return drafter.start_drafting(prompt).propose(shape, key, rule, params, NOISE, guess)

    plain = run([])
    assert plain.forwards == 6  # the root, then one per level with a child
    own = plain.tree.tokens
    for good in range(6):
        wrong = (own[good] + 1) % V
        for guess in (own[:good], [*own[:good], wrong, *own[good + 1 :]]):
            prop = run(guess)
            assert prop.tree.tokens == own and prop.tree.parents == plain.tree.parents
            for a, b in zip(prop.tree.draft_probs, plain.tree.draft_probs, strict=True):
                assert (a is None and b is None) or torch.equal(a, b)
            assert prop.forwards == 6 - min(good, 5)  # the agreed levels need no forward
    assert run([*own, 0, 0]).forwards == 1  # a guess longer than the chain: one forward


def test_guided_hybrid_drafts_the_model_s_chains_for_fewer_forwards() -> None:
    """Policy ``guided`` under SD (which needs children drawn from the draft's q): the same
    tokens as model-only drafting with the same seed (same trees, same keyed noise), fewer draft
    forwards where the text copies, and lookup credited with the guessed tokens it got accepted."""

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(seqs), V), -4.0)
        for i, s in enumerate(seqs):
            out[i, (s[-1] % 5) + 1] = 4.0  # mostly 1 -> 2 -> ... -> 5 -> 1
        return out

    target = ersd.FunctionModel(fn, V)
    draft = ersd.FunctionModel(fn, V)
    prompt = [1, 2, 3, 4, 5, 1, 2]
    kw = dict(max_new_tokens=40, tree="chain:6", method="sd", seed=3)
    model_only = ersd.generate(target, draft, prompt, **kw)
    hybrid = HybridDrafter(LookupDrafter(n=2, k=8), draft, policy="guided")
    guided = ersd.generate(target, hybrid, prompt, **kw)
    assert guided.tokens == model_only.tokens
    assert guided.draft_forwards < model_only.draft_forwards / 2
    assert hybrid.mixes["guided"] > 0 and set(hybrid.mixes) <= {"guided", "model"}
    assert hybrid.stats.sources["lookup"].accepted > 0
    off = HybridDrafter(LookupDrafter(n=2, k=8), draft, policy="guided", guided=False)
    unguided = ersd.generate(target, off, prompt, **kw)
    assert unguided.tokens == model_only.tokens
    assert unguided.draft_forwards == model_only.draft_forwards and off.mixes["guided"] == 0
