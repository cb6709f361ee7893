"""The library's rule with three knobs, every combination, on session 33's five replies (see
policy_sim.py): `l1` the most a one-token match drafts (0: none), `slack` drafts past the
matched length, `amb1` a one-token match drafts only when every earlier occurrence of that
token was followed by the same token; K the most drafts a pass. Best 12 by the bench reply and
best 8 by the geometric mean, per c. usage: policy_combos.py c [c ...]"""
import os, sys, math
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from policy_sim import *
files = sorted(glob.glob(os.path.join(REPLIES, "reply-*.json")))
files.sort(key=lambda f: "bench" not in f)
data = {os.path.basename(f)[6:-5]: load(f) for f in files}

def amb(h):
    t = h[-1]
    return len({h[s + 1] for s in range(len(h) - 1) if h[s] == t}) > 1

def mk(l1=1, slack=0, amb1=True, l2cap=None):
    def pol(h, k, ctx):
        m = longest_match(h)
        if not m: return [], None
        l, fr = m
        if l == 1:
            if amb1 and amb(h): return [], None
            d = min(k, l1)
        else:
            d = min(k, l + slack)
            if l2cap and l == 2: d = min(d, l2cap)
        return h[fr:fr + d], fr
    return pol

for c in [float(x) for x in sys.argv[1:]]:
    print("c", c)
    res = []
    for l1 in [0, 1]:
        for slack in [0, 1, 2]:
            for amb1 in [False, True]:
                for k in [3, 4, 5, 6, 8]:
                    if l1 == 0 and amb1: continue
                    r = [run(p, rp, mk(l1, slack, amb1), k, c) for p, rp in data.values()]
                    g = math.exp(sum(math.log(x[3]) for x in r) / len(r))
                    res.append((r[0][3], g, f"l1={l1} slack={slack} amb1={amb1} K={k}", r[0][:3], [round(x[3],3) for x in r]))
    res.sort(key=lambda x: -x[0])
    for x in res[:12]: print(f"  bench {x[0]:.3f} gmean {x[1]:.3f} {x[2]} {x[3]} {x[4]}")
    res.sort(key=lambda x: -x[1])
    print(" by gmean")
    for x in res[:8]: print(f"  bench {x[0]:.3f} gmean {x[1]:.3f} {x[2]} {x[3]} {x[4]}")
