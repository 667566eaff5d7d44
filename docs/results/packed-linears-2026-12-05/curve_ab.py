"""Full-model forward curve: oneDNN packed for 8 rows vs oneDNN plain layout, same process, interleaved."""
import time, statistics, torch, ersd
from ersd.models import cpu
torch.set_num_threads(2)
a = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32")  # packed (default now)
kinds = {type(m).__name__ + str(getattr(m, "packed", "")) for m in a.hf_module.modules() if isinstance(m, cpu.OneDNNLinear)}
print("loaded", kinds)
b = ersd.load_model("qwen2.5-coder-1.5b", dtype="float32", linear="torch")
n = 0
with torch.no_grad():
    for name, m in list(b.hf_module.named_modules()):
        for cname, child in list(m.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(m, cname, cpu.OneDNNLinear(child, packed=False)); n += 1
print("replaced", n)
prompt = list(range(1000, 1064))
res = {("packed", k): [] for k in (1,2,4,8,16)} | {("plain", k): [] for k in (1,2,4,8,16)}
for r in range(5):
    for k in (1,2,4,8,16):
        for name, m in (("packed", a), ("plain", b)) if r % 2 == 0 else (("plain", b), ("packed", a)):
            s = m.start(prompt); s.score([], [])
            toks = list(range(2000, 2000+k)); par = [-1] + list(range(k-1))
            t0 = time.perf_counter(); s.score(toks, par); res[(name,k)].append(time.perf_counter()-t0)
for k in (1,2,4,8,16):
    p = statistics.median(res[("packed",k)]); q = statistics.median(res[("plain",k)])
    print(f"{k:2d} tokens: packed {p:.3f} s  plain-layout {q:.3f} s  ratio {p/q:.3f}")
# logits agreement on one tree
s1 = a.start(prompt); s2 = b.start(prompt)
l1 = s1.score(list(range(2000,2006)), [-1,0,1,2,3,4]); l2 = s2.score(list(range(2000,2006)), [-1,0,1,2,3,4])
print("max |logit diff|", float((l1-l2).abs().max()), "argmax equal", bool((l1.argmax(-1)==l2.argmax(-1)).all()))
