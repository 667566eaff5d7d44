"""Helpers of the exactness suite: tiny table models, the target's exact sequence law, and a
goodness-of-fit test of an empirical sequence law against it.

The models are weight-free: next-token logits are a fixed table indexed by the last two tokens of
the context, so the target's law of a whole generated sequence of length ``L`` can be enumerated
exactly (``V ** L`` sequences).  Each factor comes from :func:`tests.reference_sampling.
reference_probs`, an independent implementation of temperature / top-k / top-p / min-p written
from their definitions — not the library's :func:`ersd.logits_to_probs`, which the generator
uses, so a bug there is caught rather than reproduced by the oracle.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from scipy import stats

import ersd
from tests.reference_sampling import reference_probs

#: significance level of every goodness-of-fit test of the suite
ALPHA = 1e-4
#: cells whose expected count is below this are pooled (the usual chi-square validity rule)
MIN_EXPECTED = 5.0

Seq = tuple[int, ...]


@dataclass(frozen=True)
class TableLM:
    """A weight-free language model: ``logits = table[second-to-last token, last token]``.

    ``table`` is ``[V, V, V]`` (float64).  A one-token context uses row 0 as the missing token.
    """

    table: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[-1])

    def logits(self, seq: Sequence[int]) -> torch.Tensor:
        return self.table[seq[-2] if len(seq) > 1 else 0, seq[-1]]

    def model(self) -> ersd.FunctionModel:
        v = self.vocab_size
        flat = self.table.reshape(v * v, v)
        rows = [flat[i : i + 1] for i in range(v * v)]  # precomputed: indexing is the hot path

        def fn(seqs: list[list[int]]) -> torch.Tensor:
            picked = [rows[(s[-2] if len(s) > 1 else 0) * v + s[-1]] for s in seqs]
            return torch.cat(picked) if len(picked) > 1 else picked[0].clone()

        return ersd.FunctionModel(fn, v)


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, vocab, vocab, generator=g, dtype=torch.float64) * scale


def make_target(vocab: int = 4, seed: int = 0) -> TableLM:
    return TableLM(random_table(vocab, seed))


def make_drafts(target: TableLM, seed: int = 100) -> dict[str, TableLM]:
    """Drafters that differ from ``target`` in several ways.

    * ``mild``        — target logits plus small noise (a good drafter);
    * ``bad``         — an unrelated random table;
    * ``adversarial`` — reversed preferences (negated target logits);
    * ``sparse``      — target logits with the target's favourite token masked (``q = 0`` where
      ``p`` is largest: every emission of that token must come from a correction);
    * ``onehot``      — all mass on the target's least likely token (a degenerate drafter: i.i.d.
      drafts all coincide, without-replacement drafting finds a single token).
    """
    t = target.table
    v = target.vocab_size
    g = torch.Generator().manual_seed(seed)
    mild = t + 0.6 * torch.randn(t.shape, generator=g, dtype=torch.float64)
    bad = random_table(v, seed + 1)
    sparse = t.clone()
    sparse.scatter_(-1, t.argmax(dim=-1, keepdim=True), float("-inf"))
    onehot = torch.full_like(t, float("-inf"))
    onehot.scatter_(-1, t.argmin(dim=-1, keepdim=True), 0.0)
    return {
        "mild": TableLM(mild),
        "bad": TableLM(bad),
        "adversarial": TableLM(-t),
        "sparse": TableLM(sparse),
        "onehot": TableLM(onehot),
    }


def exact_law(
    target: TableLM,
    prompt: Sequence[int],
    length: int,
    settings: Mapping[str, Any],
    eos_token_id: int | None = None,
) -> dict[Seq, float]:
    """The target's exact law of the generated sequence (``length`` tokens, or fewer ending in
    ``eos_token_id``) under sampling ``settings`` (``temperature``, ``top_k``, ``top_p``,
    ``min_p``), from the independent reference: every sequence of positive probability with its
    probability."""
    law: dict[Seq, float] = {}

    def walk(prefix: Seq, prob: float) -> None:
        if len(prefix) == length or (prefix and prefix[-1] == eos_token_id):
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        p = reference_probs(target.logits([*prompt, *prefix]).tolist(), **settings)
        for tok, pt in enumerate(p):
            if pt > 0:
                walk((*prefix, tok), prob * pt)

    walk((), 1.0)
    total = sum(law.values())
    assert abs(total - 1.0) < 1e-9, f"exact law sums to {total}"
    return law


@dataclass(frozen=True)
class FitResult:
    """Outcome of :func:`gof_test`."""

    pvalue: float
    statistic: float
    dof: int
    cells: int  # cells after pooling
    impossible: int  # samples of sequences with target probability 0

    def __str__(self) -> str:
        return (
            f"p={self.pvalue:.3g} (chi2={self.statistic:.1f}, dof={self.dof}, cells={self.cells}, "
            f"impossible={self.impossible})"
        )


def gof_test(counts: Counter[Seq], law: dict[Seq, float]) -> FitResult:
    """Pearson chi-square test of observed sequence ``counts`` against the exact ``law``.

    Cells whose expected count is below :data:`MIN_EXPECTED` are pooled into one cell (merged with
    the smallest remaining cell while that pooled cell is still too small).  A sample of a
    sequence that has probability 0 under the target is a certain rejection (p-value 0).
    """
    n = sum(counts.values())
    impossible = sum(c for s, c in counts.items() if law.get(s, 0.0) <= 0.0)
    if impossible:
        return FitResult(0.0, math.inf, 0, 0, impossible)
    cells = sorted(law, key=lambda s: law[s])
    big = [(counts.get(s, 0), n * law[s]) for s in cells if n * law[s] >= MIN_EXPECTED]
    small = [(counts.get(s, 0), n * law[s]) for s in cells if n * law[s] < MIN_EXPECTED]
    pooled = (sum(o for o, _ in small), sum(e for _, e in small))
    while pooled[1] < MIN_EXPECTED and big and small:
        o, e = big.pop(0)  # smallest remaining cell
        pooled = (pooled[0] + o, pooled[1] + e)
    obs = [o for o, _ in big] + ([pooled[0]] if small else [])
    exp = [e for _, e in big] + ([pooled[1]] if small else [])
    if len(obs) < 2:
        return FitResult(1.0, 0.0, 0, len(obs), 0)
    exp_t = torch.tensor(exp, dtype=torch.float64)
    exp_t = exp_t * (n / exp_t.sum())  # guard against rounding in the law's sum
    res = stats.chisquare(obs, exp_t.tolist())
    return FitResult(float(res.pvalue), float(res.statistic), len(obs) - 1, len(obs), 0)


def config_seed(*parts: object) -> int:
    """A fixed seed offset per configuration, so that different configurations use different
    (but reproducible) seeds."""
    return zlib.crc32(repr(parts).encode()) * 100_000


def sample_counts(run: Callable[[int], Sequence[int]], seeds: Iterable[int]) -> Counter[Seq]:
    """Counts of the sequences ``run(seed)`` returns over ``seeds``."""
    return Counter(tuple(run(s)) for s in seeds)


def greedy_reference(
    target: TableLM, prompt: Sequence[int], length: int, eos_token_id: int | None = None
) -> list[int]:
    """Greedy decoding of ``target`` (first argmax), written independently of the library."""
    out: list[int] = []
    while len(out) < length:
        tok = int(torch.argmax(target.logits([*prompt, *out])).item())
        out.append(tok)
        if tok == eos_token_id:
            break
    return out


def all_prompts(vocab: int, length: int) -> list[list[int]]:
    return [list(p) for p in itertools.product(range(vocab), repeat=length)]
