"""T = 0 agreement data for replay.py: for each eval prompt, the target's greedy text
(128 tokens) and, per position, whether the draft's greedy token given the true prefix is the
target's.

At T = 0 the text is the target's whatever the tree, and a drafted token is accepted exactly
when it agrees, so a chain of k drafted from position i accepts the run of agreements from i
(at most k): every tree's outcome can be replayed from these bits without the models.

The draft is fed as it drafts: its prompt in one forward, then one token per forward with its
cache.  (One forward over the whole text agreed less often: the int8 draft quantizes its
activations per forward, and a 250-row forward moved near-ties -- on HumanEval/2 it disagreed at
10 of the first 96 positions, fed as it drafts at 7.)

    OMP_NUM_THREADS=2 ../../../.venv/bin/python agreement.py 5 128 agree-128.json
"""

import json
import sys

import torch

import ersd
from ersd.bench.prompts import encode_prompt, load_prompts

target = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")
draft = ersd.load_model("qwen2.5-coder-0.5b", dtype="int8")
per, tokens, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {}
for s in ("mtbench", "humaneval", "math", "grounded"):
    for p in load_prompts([s], "eval", per):
        ctx = encode_prompt(target.tokenizer, p, "auto", 384)
        r = ersd.generate(
            target, draft, ctx, max_new_tokens=tokens, tree="chain:4", temperature=0.0
        )
        text = list(r.tokens)
        pred = []
        with torch.no_grad():  # the draft's greedy token at every position, fed as it drafts
            out_ = draft.hf_module(torch.tensor([list(ctx)]), use_cache=True)
            for tok in text:
                pred.append(int(out_.logits[0, -1].argmax()))
                out_ = draft.hf_module(
                    torch.tensor([[tok]]), past_key_values=out_.past_key_values, use_cache=True
                )
        agree = [int(a == b) for a, b in zip(pred, text, strict=True)]
        out[p.id] = {"set": s, "ctx": len(ctx), "text": text, "agree": agree}
        print(p.id, len(text), f"agreement {sum(agree) / len(agree):.3f}", flush=True)
        with open(path, "w") as f:
            json.dump(out, f)
