"""Drafter invariance of ERSD (Kobus & Gündüz 2025, section "drafter invariance").

ERSD emits, at every realised context, the target's winner of the race keyed by (seed, context);
its output is therefore a deterministic function of (seed, prompt, target) and must equal
target-only race sampling, ``generate(target, None, ...)``, token for token, whatever the drafter
and the tree shape.  Checked here for 50 seeds x 6 drafters (good, unrelated, adversarial,
masked, one-hot, and a drafter returning fresh random logits on every call) x 4 tree shapes
(chain, multi, batch, paths), with and without top-k/top-p and with an EOS token, on V = 6, and
on V = 1000 with longer sequences.

The negative is checked too: every rejection-based method (and GLS, which is invariant only
given its drafts) changes its output with the drafter for some seed, and an ERSD variant whose
bonus token comes from a fresh stream (still exact, but not the shared race) is caught.
Some other mistakes keep the invariance: an ERSD whose drafter used its own race would still emit
the target's race winners (only slower); the sequence-law tests cover exactness separately.
"""

from __future__ import annotations

import pytest
import torch

import ersd
from ersd.methods.base import Method, NodeNoise
from ersd.methods.ersd import ERSD
from ersd.race import STREAM_RESIDUAL, race_winner
from tests.exactness_util import TableLM, make_drafts, make_target

SEEDS = range(50)
LENGTH = 12
PROMPT = [1, 2]
SHAPES = ["chain:4", "multi:3x2", "batch:4", "paths:[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]"]
FILTERS = {
    "plain": {"temperature": 1.0},
    "top_k3-top_p0.8": {"temperature": 0.8, "top_k": 3, "top_p": 0.8},
}

TARGET = make_target(6, seed=3)


def _random_drafter(vocab: int, seed: int) -> ersd.FunctionModel:
    """Fresh random logits on every call (not even a function of the context)."""
    g = torch.Generator().manual_seed(seed)

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        return torch.randn(len(seqs), vocab, generator=g) * 3.0

    return ersd.FunctionModel(fn, vocab)


def _drafters(target: TableLM) -> dict[str, ersd.FunctionModel]:
    out = {name: d.model() for name, d in make_drafts(target, seed=7).items()}
    out["random"] = _random_drafter(target.vocab_size, seed=11)
    return out


def _target_only(target: ersd.FunctionModel, seed: int, **kw: object) -> list[int]:
    return ersd.generate(target, None, PROMPT, seed=seed, **kw).tokens


@pytest.mark.parametrize("filters", list(FILTERS))
@pytest.mark.parametrize("shape", SHAPES)
def test_ersd_equals_target_only_race_sampling(shape: str, filters: str) -> None:
    kw: dict[str, object] = {"max_new_tokens": LENGTH, **FILTERS[filters]}
    target = TARGET.model()
    drafters = _drafters(TARGET)
    accepted = 0
    for seed in SEEDS:
        want = _target_only(target, seed, **kw)
        for name, draft in drafters.items():
            res = ersd.generate(target, draft, PROMPT, method="ersd", tree=shape, seed=seed, **kw)
            assert res.tokens == want, f"seed {seed}, drafter {name}, tree {shape}, {filters}"
            accepted += res.num_accepted_tokens
    assert accepted > 0  # the drafts were really used


def test_ersd_invariance_with_eos() -> None:
    target = TARGET.model()
    drafters = _drafters(TARGET)
    stopped = 0
    for seed in SEEDS:
        want = _target_only(target, seed, max_new_tokens=LENGTH, eos_token_id=0)
        stopped += len(want) < LENGTH
        for name, draft in drafters.items():
            got = ersd.generate(
                target,
                draft,
                PROMPT,
                tree="multi:2x3",
                seed=seed,
                max_new_tokens=LENGTH,
                eos_token_id=0,
            ).tokens
            assert got == want, f"seed {seed}, drafter {name}"
    assert stopped > 0  # EOS was really hit


def _large_vocab_models(
    vocab: int = 1000,
) -> tuple[ersd.FunctionModel, dict[str, ersd.FunctionModel]]:
    """A V = 1000 target (logits from the last two tokens) and three drafters."""
    g = torch.Generator().manual_seed(5)
    last = torch.randn(vocab, vocab, generator=g) * 2.5
    prev = torch.randn(vocab, vocab, generator=g)
    noise = torch.randn(vocab, vocab, generator=g)

    def logits(seqs: list[list[int]]) -> torch.Tensor:
        return torch.stack([last[s[-1]] + prev[s[-2] if len(s) > 1 else 0] for s in seqs])

    target = ersd.FunctionModel(logits, vocab)
    drafts = {
        "good": ersd.FunctionModel(
            lambda s: logits(s) + 0.5 * torch.stack([noise[x[-1]] for x in s]), vocab
        ),
        "adversarial": ersd.FunctionModel(lambda s: -logits(s), vocab),
        "random": _random_drafter(vocab, seed=13),
    }
    return target, drafts


@pytest.mark.parametrize("filters", list(FILTERS))
def test_ersd_invariance_large_vocabulary(filters: str) -> None:
    target, drafts = _large_vocab_models()
    kw: dict[str, object] = {"max_new_tokens": 40, **FILTERS[filters]}
    if filters != "plain":
        kw["top_k"] = 50
    accepted = 0
    for seed in range(6):
        want = _target_only(target, seed, **kw)
        for name, draft in drafts.items():
            for shape in ("chain:5", "multi:3x3", "paths:[[0],[1],[0,0],[0,1],[0,0,0],[1,0]]"):
                res = ersd.generate(target, draft, PROMPT, tree=shape, seed=seed, **kw)
                assert res.tokens == want, f"seed {seed}, drafter {name}, tree {shape}, {filters}"
                accepted += res.num_accepted_tokens
    assert accepted > 0


# --- the negative: the property is not automatic ------------------------------------------------


def _invariance_broken(method: str | Method, shape: str) -> bool:
    """True if some seed gives different output with two different drafters."""
    target = TARGET.model()
    drafts = make_drafts(TARGET, seed=7)
    good, bad = drafts["mild"].model(), drafts["adversarial"].model()
    for seed in SEEDS:
        kw = {"max_new_tokens": LENGTH, "method": method, "tree": shape, "seed": seed}
        if (
            ersd.generate(target, good, PROMPT, **kw).tokens
            != ersd.generate(target, bad, PROMPT, **kw).tokens
        ):
            return True
    return False


@pytest.mark.parametrize("method", [m for m in ersd.METHODS if m != "ersd"])
def test_other_methods_are_not_drafter_invariant(method: str) -> None:
    shape = "chain:4" if method == "sd" else "multi:2x2"
    assert _invariance_broken(method, shape), (
        f"{method} gave the same output with a good and an adversarial drafter for all "
        f"{len(SEEDS)} seeds; the rejection-based methods are not expected to be drafter invariant"
    )


class ERSDFreshBonus(ERSD):
    """Bonus token from an independent stream: still exact, but no longer the shared race."""

    name = "mutant-ersd-fresh-bonus"

    def bonus(self, target_probs: torch.Tensor, noise: NodeNoise) -> int:
        return race_winner(target_probs, noise.exponentials(STREAM_RESIDUAL))


def test_invariance_test_catches_a_fresh_bonus_stream() -> None:
    """Power of the invariance test: an exact ERSD variant whose bonus is not the shared race."""
    assert _invariance_broken(ERSDFreshBonus(), "chain:4")
