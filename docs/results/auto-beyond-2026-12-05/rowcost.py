import time, statistics, torch, ersd
m = ersd.load_model("qwen2.5-coder-0.5b", dtype="bfloat16")
ids = list(range(1000, 1200))
s = m.start(ids); s.score([], [])
t = {"score": [], "score_previous": []}
for r in range(40):
    for kind in (("score", "score_previous") if r % 2 else ("score_previous", "score")):
        s.score([5], [-1]); s.commit([5, 6], [0])  # one fed node accepted... make a 2-token tail
        s.commit([], []) if False else None
        s2 = s
        s2.score([7], [-1]); s2.commit([7, 8], [])  # tail of two unfed tokens
        t0 = time.perf_counter()
        if kind == "score": s2.score([], [])
        else: s2.score_previous([], [])
        t[kind].append(time.perf_counter() - t0)
for k, v in t.items(): print(k, "median ms %.2f" % (1000 * statistics.median(v[4:])))
