"""Verification alone at V = 151,936: verify_many (levels) against the node-by-node walk on the
row pool, B = 8 chain:4 trees with ~70% acceptance, noise pre-drawn (as the drafter leaves it)."""

import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from tests import test_verify_batch as T

from ersd.batch import RowPool
from ersd.generation import _LazyProbs
from ersd.methods import verify_tree
from ersd.probs import SamplingParams
from ersd.race import RaceNoise
from ersd.verify_batch import verify_many

T.VOCAB = 151936
noise = RaceNoise(T.VOCAB, cache_size=512)
rules, params, noises, trees, logits = [], [], [], [], []
for i in range(8):
    p = SamplingParams()
    tree, lg = T.random_tree(200 + i, 4, 1, p, noise, 1.0)
    rules.append(T.ERSD())
    params.append(p)
    noises.append(noise)
    trees.append(tree)
    logits.append(lg)
pool = RowPool()


def old():
    return pool.map(
        lambda r, t, lg, p: verify_tree(r, t, _LazyProbs(lg, p), noise),
        rules,
        trees,
        logits,
        params,
    )


def new():
    return verify_many(rules, params, noises, trees, logits)


assert [v.tokens for v in old()] == [v.tokens for v in new()]
res = {"old": [], "new": []}
for rep in range(10):
    for name, f in (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old)):
        t0 = time.perf_counter()
        f()
        res[name].append((time.perf_counter() - t0) * 1e3)
print(
    f"torch threads {torch.get_num_threads()}; accepted per row {[len(v.accepted) for v in new()]}"
)
for k, v in res.items():
    print(
        f"{k}: median {statistics.median(v):.1f} ms per B=8 chain:4 verification "
        f"(min {min(v):.1f}, max {max(v):.1f})"
    )
