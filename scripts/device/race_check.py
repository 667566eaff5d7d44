#!/usr/bin/env python
"""Device check of the races and the batched ERSD step (issue 28), with tiny random models.

Run on a lent GPU from the repository root (``DEV=cuda``, the default; ``scripts/device/run.sh``
style, no network, no weights):

    PYTHONPATH=src:. python scripts/device/race_check.py            # DEV=cuda
    DEV=cpu QUICK=1 PYTHONPATH=src:. python scripts/device/race_check.py   # the CUDA-free dry run

It checks, printing one line each and failing on the first mismatch:

1. **races**: :func:`ersd.race_torch.race_exponentials_torch` on the device equals the NumPy
   reference (:class:`ersd.race.RaceNoise`) bit for bit over whole 151,936-token races, every
   stream kind (tails and wedge rejections included: ~80 and ~1,600 per race), under race
   schemes v1 (Philox) and v2 (blocked splitmix64, :func:`ersd.race.unit_log`);
2. **plugin**: the vLLM plugin's row race (``ERSD_VLLM_NOISE=torch``, its Philox on the device)
   gives the NumPy backend's winners;
3. **verification**: :func:`ersd.verify_batch.verify_many` on the device (every context at once,
   one host transfer) gives the node-by-node walk's verdicts on the host, and reads the host at
   most once per step plus once per noise call;
4. **drafter invariance**: ERSD with two different drafts and chain/tree shapes emits exactly
   target-only sampling's tokens, batched on the device;
5. **exactness**: the first two tokens' joint law over many seeds against the target's exact law
   (chi-square, alpha = 1e-3), and a deliberately broken verifier (the draft's race winner) that
   the same test must reject;
6. **time**: the loop's non-forward milliseconds per step at B = 1 and 8 (chain:4 and multi:2x3,
   forwards synchronised and timed), batched verification against the node-by-node walk.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import numpy as np
import torch

import ersd
from ersd.batch import BatchEngine
from ersd.methods import verify_tree
from ersd.methods.ersd import ERSD
from ersd.probs import SamplingParams, logits_to_probs
from ersd.race import STREAM_DRAFT, STREAM_RACE, STREAM_RESIDUAL, STREAM_VERIFY, RaceNoise, root_key
from ersd.race_torch import race_exponentials_torch
from ersd.verify_batch import verify_many

DEV = torch.device(os.environ.get("DEV", "cuda"))
QUICK = os.environ.get("QUICK", "") == "1"
V = 151936


def say(msg: str) -> None:
    print(msg, flush=True)


def check(cond: bool, what: str) -> None:
    if not cond:
        say(f"FAIL: {what}")
        sys.exit(1)


def races() -> None:
    keys = [root_key(s, [1, s]) for s in range(2 if QUICK else 8)] + [0, (1 << 64) - 1]
    vocab = 20000 if QUICK else V
    for scheme in ("v1", "v2"):  # race schemes (docs/race-schemes.md)
        noise = RaceNoise(vocab, scheme=scheme)
        for stream in (STREAM_RACE, STREAM_DRAFT + 1, STREAM_VERIFY, STREAM_RESIDUAL):
            got = race_exponentials_torch(keys, vocab, stream, DEV, scheme=scheme)
            want = torch.stack([noise.exponentials(k, stream) for k in keys])
            check(got.device.type == DEV.type, "races drawn on the device")
            check(
                torch.equal(got.cpu(), want),
                f"{scheme} races on {DEV} equal NumPy's (stream {stream})",
            )
    say(
        f"1 races: {len(keys)} keys x 4 streams x {vocab} tokens on {DEV}, schemes v1 and v2: "
        "bit-identical to NumPy"
    )


def plugin() -> None:
    from ersd.integrations.vllm.params import parse_extra_args
    from ersd.integrations.vllm.rows import race_winners

    vocab = 20000 if QUICK else V
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(16, vocab, generator=g) * 3).to(DEV)
    p = parse_extra_args({"ersd_seed": 3, "ersd_temperature": 0.8})
    assert p is not None
    keys = [root_key(3, [r]) for r in range(16)]
    os.environ["ERSD_VLLM_NOISE"] = "numpy"
    want = race_winners(logits, keys, [p] * 16)
    os.environ["ERSD_VLLM_NOISE"] = "torch"
    got = race_winners(logits, keys, [p] * 16)
    os.environ.pop("ERSD_VLLM_NOISE")
    check(torch.equal(got.cpu(), want.cpu()), "the plugin's torch races give NumPy's winners")
    say(f"2 plugin: ERSD_VLLM_NOISE=torch on {DEV}: 16/16 winners equal the NumPy backend's")


def device_model(vocab: int, seed: int, dim: int = 64, scale: float = 3.0) -> ersd.FunctionModel:
    """Logits from the last two tokens through a random two-layer map, computed on DEV."""
    g = torch.Generator().manual_seed(seed)
    emb = (torch.randn(vocab, dim, generator=g)).to(DEV)
    emb2 = (torch.randn(vocab, dim, generator=g)).to(DEV)
    out = (torch.randn(dim, vocab, generator=g) * scale / math.sqrt(2 * dim)).to(DEV)

    def fn(seqs: list[list[int]]) -> torch.Tensor:
        a = torch.tensor([s[-1] for s in seqs], device=DEV)
        b = torch.tensor([s[-2] if len(s) > 1 else 0 for s in seqs], device=DEV)
        return torch.tanh(emb[a] + emb2[b]) @ out * 4

    return ersd.FunctionModel(fn, vocab)


def blend(target: ersd.FunctionModel, other: ersd.FunctionModel, w: float) -> ersd.FunctionModel:
    return ersd.FunctionModel(lambda s: target.fn(s) + w * other.fn(s), target.vocab_size)


def verification() -> None:
    from tests.test_verify_batch import _rows, count_reads

    noise = RaceNoise(3000)
    rules, params, noises, trees, logits = _rows(12, noise)
    dev_logits = [lg.to(DEV) for lg in logits]
    for t in trees:
        t.draft_probs = [q.to(DEV) if q is not None else None for q in t.draft_probs]
    with count_reads() as seen:
        got = verify_many(rules, params, noises, trees, dev_logits, "all")
    groups = len({(p, id(n)) for p, n in zip(params, noises, strict=True)})
    for t in trees:
        t.draft_probs = [q.cpu() if q is not None else None for q in t.draft_probs]
    for i, v in enumerate(got):
        want = verify_tree(
            rules[i], trees[i], [logits_to_probs(r, params[i]) for r in logits[i]], noise
        )
        check((v.tokens, v.ranks) == (want.tokens, want.ranks), f"row {i}'s verdict on {DEV}")
    check(len(seen) <= 1 + groups, f"host reads {len(seen)} <= {1 + groups}")
    nodes = sum(t.num_nodes for t in trees)
    say(
        f"3 verification: 12 rows, {nodes} nodes on {DEV}: verdicts equal the host walk's, "
        f"{len(seen)} host reads ({groups} noise calls + 1)"
    )


def invariance() -> None:
    vocab = 5000 if QUICK else 32000
    target = device_model(vocab, 0)
    drafts = [
        blend(target, device_model(vocab, 1), 0.5),
        blend(target, device_model(vocab, 2), 1.5),
    ]
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    n = 12 if QUICK else 32
    solo = ersd.generate_batch(target, None, prompts, max_new_tokens=n, seeds=7)
    for d in drafts:
        for tree in ("chain:4", "multi:2x3"):
            out = ersd.generate_batch(target, d, prompts, max_new_tokens=n, seeds=7, tree=tree)
            check([r.tokens for r in out] == [r.tokens for r in solo], f"invariance {tree}")
            check(
                sum(r.target_calls for r in out) < sum(r.target_calls for r in solo),
                "drafts were accepted",
            )
    say(f"4 drafter invariance on {DEV}: 2 drafts x chain:4, multi:2x3 = target-only tokens")


def _joint(target, draft, seeds: int, broken: bool) -> np.ndarray:
    vocab = target.vocab_size
    counts = np.zeros((vocab, vocab))
    prompts = [[1, 2]] * seeds
    engine = BatchEngine(target, draft)
    if broken:  # the draft's race winner instead of the target's: must be rejected
        engine.batched_verify = False
        rule = _DraftWinner()
    ids = {}
    for i, p in enumerate(prompts):
        kw = {"method": rule} if broken else {}
        ids[engine.add(p, max_new_tokens=2, seed=i, tree="chain:2", **kw)] = i
    toks: dict[int, list[int]] = {}
    while len(engine):
        for rid, rec, _ in engine.step():
            toks.setdefault(rid, []).extend(rec.tokens)
    for t in toks.values():
        counts[t[0], t[1]] += 1
    return counts


class _DraftWinner(ERSD):
    def verify_node(self, target_probs, draft_probs, children, noise):
        from ersd.methods import NodeDecision
        from ersd.race import race_winner

        y = race_winner(draft_probs, noise.exponentials_on(draft_probs.device))
        for j, c in enumerate(children):
            if c == y:
                return NodeDecision(j, y)
        return NodeDecision(None, y)


def exactness() -> None:
    from scipy import stats

    vocab = 6
    target = device_model(vocab, 3, dim=8, scale=2.0)
    draft = blend(target, device_model(vocab, 4, dim=8, scale=2.0), 1.0)
    p1 = logits_to_probs(target.fn([[1, 2]])[0].cpu(), SamplingParams())
    exact = np.zeros((vocab, vocab))
    for a in range(vocab):
        p2 = logits_to_probs(target.fn([[1, 2, a]])[0].cpu(), SamplingParams())
        exact[a] = float(p1[a]) * p2.numpy()
    seeds = 1500 if QUICK else 6000
    pvals = []
    for broken in (False, True):
        counts = _joint(target, draft, seeds, broken)
        expected = exact.flatten() * seeds
        pvals.append(stats.chisquare(counts.flatten(), expected).pvalue)
    check(pvals[0] > 1e-3, f"ERSD on {DEV} matches the target's law (p = {pvals[0]:.3g})")
    check(pvals[1] < 1e-3, f"the broken verifier is rejected (p = {pvals[1]:.3g})")
    say(
        f"5 exactness on {DEV}: {seeds} seeds, 2-token joint law: p = {pvals[0]:.3g} (ERSD), "
        f"{pvals[1]:.2g} (broken verifier, rejected at alpha = 1e-3)"
    )


def timing() -> None:
    vocab = 5000 if QUICK else V
    dim = 64 if QUICK else 1024
    target = device_model(vocab, 5, dim=dim)
    draft = blend(target, device_model(vocab, 6, dim=dim), 0.7)
    forward = [0.0]
    for m in (target, draft):
        fn = m.fn

        def timed(seqs, fn=fn):
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(seqs)
            if DEV.type == "cuda":
                torch.cuda.synchronize()
            forward[0] += time.perf_counter() - t0
            return out

        m.fn = timed
    tokens = 8 if QUICK else 32
    for b in (1, 8):
        prompts = [[i + 1, i + 2] for i in range(b)]
        for tree in ("chain:4", "multi:2x3"):
            res = {}
            for batched in (True, False, True, False):
                engine = BatchEngine(target, draft)
                engine.batched_verify = batched
                for i, p in enumerate(prompts):
                    engine.add(p, max_new_tokens=tokens, seed=i, tree=tree)
                engine.step()  # prefill
                steps, forward[0] = 0, 0.0
                t0 = time.perf_counter()
                while len(engine):
                    engine.step()
                    steps += 1
                wall = time.perf_counter() - t0
                res.setdefault(batched, []).append((wall - forward[0]) / max(steps, 1) * 1e3)
            say(
                f"6 time B={b} {tree} on {DEV}: non-forward ms/step batched "
                f"{statistics.median(res[True]):.1f}, node-by-node "
                f"{statistics.median(res[False]):.1f}"
            )


def main() -> None:
    say(
        f"torch {torch.__version__}, device {DEV}"
        + (f" ({torch.cuda.get_device_name()})" if DEV.type == "cuda" else "")
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    races()
    plugin()
    verification()
    invariance()
    exactness()
    timing()
    say("ALL OK")


if __name__ == "__main__":
    main()
