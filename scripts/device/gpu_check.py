"""Device check of the HF adapter: exactness on CUDA (tiny models) and per-step time split on
random-weight models with the real SmolLM2 / Qwen2.5-Coder shapes (bf16, CUDA and CPU)."""

import json
import os
import sys
import time

import torch
import transformers
from tests.hf_tiny import MODELS, TREE_SPECS, run_random_session, tiny_config, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

import ersd
from ersd.models import hf
from ersd.race import RaceNoise, race_rank, race_ranking, race_winner, root_key

print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)

dev = os.environ.get("DEV", "cuda")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def plain_cuda(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq], device=dev)).logits[0, -1].float()


# ---- race noise is device independent: same winners / rankings / ranks on CUDA and CPU ------

V = 151936
noise = RaceNoise(V)
gen = torch.Generator().manual_seed(0)
mism = 0
for i in range(200):
    p = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 3, -1)
    p[torch.rand(V, generator=gen) < 0.3] = 0
    p = p / p.sum()
    e = noise.exponentials(root_key(1, [i]))
    pc = p.to(dev)
    a = (race_winner(p, e), race_ranking(p, e, 4), race_rank(p, e, 7))
    b = (race_winner(pc, e), race_ranking(pc, e, 4), race_rank(pc, e, 7))
    mism += a != b
print(f"race device independence: {200 - mism}/200 contexts identical on {dev} and cpu", flush=True)
assert mism == 0

# ---- exactness on CUDA -----------------------------------------------------------------------
for name in ["llama-sdpa", "llama-eager", "qwen2-sdpa"]:
    m = MODELS[name]().to(dev)
    for mode in ["auto", "paths"]:
        worst = 0.0
        for seed in range(4):
            h = hf.from_pretrained_model(m, tree_attention=mode)
            chk = run_random_session(m, h, seed, plain=plain_cuda)
            worst = max(worst, chk.worst)
        got = h.tree_attention
        print(f"cuda exactness {name:12s} {mode:6s} -> {got:6s} worst |diff| {worst:.2e}")

target_m = tiny_model("llama", 0).to(dev)
torch.manual_seed(0)
draft_m = AutoModelForCausalLM.from_config(tiny_config("llama", layers=1))
draft_m.load_state_dict(target_m.state_dict(), strict=False)
target, draft = hf.from_pretrained_model(target_m), hf.from_pretrained_model(draft_m.to(dev).eval())
for tree in TREE_SPECS:
    for seed in range(3):
        a = ersd.generate(target, None, [5, 17, 42], max_new_tokens=32, seed=seed)
        b = ersd.generate(target, draft, [5, 17, 42], max_new_tokens=32, seed=seed, tree=tree)
        assert a.tokens == b.tokens, (tree, seed)
    with torch.no_grad():
        ref = target_m.generate(
            torch.tensor([[9, 8, 7, 6]], device=dev),
            do_sample=False,
            max_new_tokens=20,
            pad_token_id=0,
        )[0, 4:].tolist()
    g = ersd.generate(target, draft, [9, 8, 7, 6], max_new_tokens=20, temperature=0, tree=tree)
    assert g.tokens == ref, tree
print("cuda drafter invariance + greedy == transformers generate: OK", flush=True)

# ---- per-step time split -----------------------------------------------------------------------
_orig_forward = hf.HFModel._forward


def synced_forward(self, *a, **k):  # CUDA is asynchronous: time the forward to completion
    out = _orig_forward(self, *a, **k)
    if self.device.type == "cuda":
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
    return out


hf.HFModel._forward = synced_forward


def build(cfg_file, device, dtype, seed):
    with open(cfg_file) as f:
        raw = json.load(f)
    d = {k: v for k, v in raw.items() if k not in ("_model_name_or_path", "architectures")}
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return hf.from_pretrained_model(m.eval())


def split(target, draft, tree, n, reps=3):
    rows = []
    for rep in range(reps):
        for m in (target, draft):
            m.forward_seconds = 0.0
        t0 = time.perf_counter()
        r = ersd.generate(
            target,
            draft if tree else None,
            list(range(100, 164)),
            max_new_tokens=n,
            seed=rep,
            tree=tree or "chain:1",
        )
        wall = time.perf_counter() - t0
        fwd_d, fwd_t = draft.forward_seconds, target.forward_seconds
        adapter = r.draft_time + r.target_time - fwd_d - fwd_t
        rows.append(
            (
                wall,
                fwd_d,
                fwd_t,
                adapter,
                wall - r.draft_time - r.target_time,
                r.target_calls,
                len(r.tokens),
            )
        )
    rows.sort()
    wall, fd, ft, ad, lp, calls, toks = rows[len(rows) // 2]  # the run of median wall time
    print(
        f"  {tree or 'target-only':48s} steps={calls:4.0f} tok/step={toks / calls:4.2f} "
        f"ms/step={1000 * wall / calls:7.2f} | draft fwd {fd / wall:6.1%} target fwd "
        f"{ft / wall:6.1%} adapter {ad / wall:5.1%} loop {lp / wall:5.1%} "
        f"(adapter {1000 * ad / calls:.2f} ms, loop {1000 * lp / calls:.2f} ms per step)",
        flush=True,
    )


TREES = [
    None,
    "chain:4",
    "multi:2x3",
    "paths:[[0],[1],[0,0],[1,0],[0,1],[0,0,0],[1,0,0],[0,0,0,0]]",
]
PLAN = [
    ("cuda", torch.bfloat16, [("qwen15", "qwen05"), ("smol", "smol")], 64),
    ("cpu", torch.bfloat16, [("smol", "smol")], 24),
]
if dev == "cpu":
    PLAN = [("cpu", torch.bfloat16, [("smol", "smol")], 6)]
for device, dtype, pairs, n in PLAN:
    if device == "cpu":
        torch.set_num_threads(2)  # like the 2-core dev machines
    for tcfg, dcfg in pairs:
        target = build(f"scripts/device/{tcfg}.json", device, dtype, 0)
        twin = hf.from_pretrained_model(target.hf_module)  # perfect draft: whole trees accepted
        other = build(f"scripts/device/{dcfg}.json", device, dtype, 1)  # random draft: rejections
        split(target, twin, None, n)  # warm-up
        for label, draft in [("twin draft", twin), ("independent draft", other)]:
            print(f"{device} {dtype} target={tcfg} {label} ({dcfg if draft is other else tcfg})")
            for tree in TREES if label == "twin draft" else TREES[1:3]:
                split(target, draft, tree, n)
        del target, twin, other
        if device == "cuda":
            torch.cuda.empty_cache()
    if "--quick" in sys.argv:
        break
