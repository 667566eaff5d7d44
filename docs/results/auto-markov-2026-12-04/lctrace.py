"""llama.cpp: why auto does not explore on the grounded prompts (predicted loss vs budget)."""
import sys, time, tempfile
import ersd
from ersd.auto import CurveCache, TreeChooser
from ersd.cost_store import CostStore
from ersd.bench.prompts import encode_prompt, load_prompts
from ersd.tree import AutoTree
target = ersd.load_model("qwen2.5-coder-1.5b", backend="llamacpp", threads=2)
draft = ersd.load_model("qwen2.5-coder-0.5b", backend="llamacpp", threads=2)
tokens = int(sys.argv[1]); store = tempfile.mkdtemp()
prompts = [p for p in load_prompts(["grounded"], "eval", 2)]
ob = TreeChooser._budget_allows
def budget(self, cost):
    ok = ob(self, cost)
    print("   explore? lost %.3f spent %.3f budget %.3f (elapsed %.2f projected %.2f) -> %s" % (cost, self.explore_spent, 0.02 * max(self.elapsed, self._projected), self.elapsed, self._projected, ok), flush=True)
    return ok
TreeChooser._budget_allows = budget
curves = CurveCache(CostStore(store))
for p in prompts:
    enc = encode_prompt(target.tokenizer, p, "auto", 384)
    print(p.id, "prompt tokens", len(enc), flush=True)
    costs = None
    for cfg in ["auto", "chain:4", "plain"]:
        tree = AutoTree(costs=curves) if cfg == "auto" else ("chain:1" if cfg == "plain" else cfg)
        t0 = time.perf_counter()
        out = ersd.generate(target, draft if cfg != "plain" else None, enc, max_new_tokens=tokens, tree=tree, temperature=0.0, seed=0)
        wall = time.perf_counter() - t0
        print(p.id, cfg, "rate %.2f" % (len(out.tokens) / wall), "calls", len(out.steps), "first draft step draft_time %.3f" % next((s.draft_time for s in out.steps if s.tree_depth), 0), out.auto_choices, flush=True)
    from ersd.auto import measured_costs
    c = curves
# draft prefill prediction vs actual
from ersd.auto import measured_costs
cm = measured_costs(target, draft, enc, 1, curves)
print("draft curve", cm.draft, "target curve", cm.target)
for n in (64, 128, len(enc)):
    print("predicted draft_cost(%d) %.3f target_cost(%d) %.3f" % (n, cm.draft_cost(n, 1), n, cm.target_cost(n, 1)))
    s = draft.start(enc[:n]); t0 = time.perf_counter()
    from ersd.models.batch import score_many
    score_many(draft, [s], [([], [])]); print("  actual draft prefill %d: %.3f" % (n, time.perf_counter() - t0))
