"""Model-free and hybrid drafters on the bundled SmolLM2-135M in float32: ERSD's text is the
target-only text whatever the drafter, greedy decoding is unchanged, and copying is accepted."""

from __future__ import annotations

import pytest

import ersd
from ersd.drafting import HybridDrafter, LookupDrafter, SuffixDrafter

pytest.importorskip("transformers")
pytestmark = [pytest.mark.realmodel, pytest.mark.usefixtures("one_torch_thread")]

#: an input-grounded prompt: what to write next is in the prompt
PROMPT = (
    "colors = ['red', 'green', 'blue', 'cyan', 'magenta', 'yellow', 'black', 'white']\n"
    "# the same list again:\n"
    "colors2 = ['red', 'green',"
)
NEW = 16


@pytest.fixture(scope="module")
def smol() -> dict[str, object]:
    target = ersd.load_model("smollm2-135m", dtype="float32")
    return {
        "target": target,
        "draft": ersd.load_model("smollm2-135m", dtype="float32", num_hidden_layers=6),
        "prompt": target.tokenizer.encode(PROMPT),
    }


def _drafters(draft) -> dict[str, object]:
    return {
        "lookup": LookupDrafter(n=3, k=8),
        "suffix": SuffixDrafter(match=6, k=8),
        "hybrid-auto": HybridDrafter(LookupDrafter(n=3, k=8), draft),
        "hybrid-both": HybridDrafter(LookupDrafter(n=3, k=8), draft, policy="both"),
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_ersd_text_is_drafter_invariant_on_real_weights(smol, seed: int) -> None:
    target, prompt = smol["target"], smol["prompt"]
    alone = ersd.generate(target, None, prompt, max_new_tokens=NEW, seed=seed)
    for i, (name, drafter) in enumerate(_drafters(smol["draft"]).items()):
        tree = ["chain:8", "multi:2x4"][(i + seed) % 2]
        res = ersd.generate(target, drafter, prompt, max_new_tokens=NEW, seed=seed, tree=tree)
        assert res.tokens == alone.tokens, (name, tree, seed)
        assert res.target_calls < len(alone.tokens), (name, "nothing was accepted")


def test_greedy_is_unchanged_and_copying_is_accepted(smol) -> None:
    target, prompt = smol["target"], smol["prompt"]
    alone = ersd.generate(target, None, prompt, max_new_tokens=NEW, temperature=0)
    drafter = LookupDrafter(n=3, k=8)
    res = ersd.generate(target, drafter, prompt, max_new_tokens=NEW, temperature=0, tree="chain:8")
    assert res.tokens == alone.tokens
    assert res.block_efficiency > 2.0  # the copied body is accepted in long runs
    # the drafter's own time is small next to the target's
    assert res.draft_time < 0.1 * res.target_time, (res.draft_time, res.target_time)


def test_hybrid_reports_both_sources_on_real_weights(smol) -> None:
    target, prompt = smol["target"], smol["prompt"]
    hybrid = HybridDrafter(LookupDrafter(n=3, k=8), smol["draft"], policy="both")
    ersd.generate(target, hybrid, prompt, max_new_tokens=NEW, seed=3, tree="chain:4")
    stats = hybrid.stats.as_dict()
    assert stats["lookup"]["accepted"] > 0 and stats["model"]["proposed"] > 0
    assert stats["model"]["seconds"] > stats["lookup"]["seconds"]
