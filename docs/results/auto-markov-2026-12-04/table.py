import json, sys, math, statistics as st
from collections import defaultdict
# usage: table.py LOG [VARIANT LABEL] -- the A/B's other auto configuration (default: this
# folder's auto-independent), as the ab.py runs of auto-markov-depths and auto-stale-depth name it
V,L=(sys.argv[2],sys.argv[3]) if len(sys.argv)>3 else ('auto-independent','indep')
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"prompt"')]
cell=defaultdict(dict)
for r in rows: cell[(r['prompt'],r['set'],r['temperature'],r['repeat'])][r['config']]=r
def t95(xs):
    n=len(xs); m=st.mean(xs)
    if n<2: return m,float('nan'),float('nan')
    from scipy.stats import t
    h=t.ppf(.975,n-1)*st.stdev(xs)/math.sqrt(n); return m,m-h,m+h
print("prompt T | auto %s c4 c6 | auto/%s | calls a/i"%(L,L))
ratios=defaultdict(list); best=defaultdict(lambda: defaultdict(list))
for k,c in sorted(cell.items()):
    if len(c)<4: continue
    a,i,c4,c6=(c[x]['rate'] for x in ('auto',V,'chain:4','chain:6'))
    print(k[0],k[2],"| %.2f %.2f %.2f %.2f | %.3f | %d/%d"%(a,i,c4,c6,a/i,c['auto']['target_calls'],c[V]['target_calls']))
    ratios[k[2]].append(a/i); ratios['all'].append(a/i)
    for cfg in ('auto',V,'chain:4','chain:6'):
        best[(k[1],k[2])][cfg].append(c[cfg]['rate'])
for t,xs in ratios.items(): print("auto/"+L, t, "n=%d mean %.3f [%.3f, %.3f]"%((len(xs),)+t95(xs)))
print("category T | auto÷best fixed | %s÷best fixed (best by mean)"%L)
for (s,t),d in sorted(best.items()):
    b=max(('chain:4','chain:6'),key=lambda x: st.mean(d[x]))
    print(s,t,b,"%.3f %.3f"%(st.mean([x/y for x,y in zip(d['auto'],d[b])]),st.mean([x/y for x,y in zip(d[V],d[b])])))
