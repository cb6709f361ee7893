"""The memory of policy_sim.py's `memo` keyed three ways, on session 33's five replies: `pos`
the history position where the output left a copied draft (what `cpu_spec::LookupDrafter`
keeps), `tok2` / `tok3` the two / three tokens ending at that position (a divergence learned
at one occurrence of a phrase applies to all); `base` no memory. usage: memo_keys.py"""
import sys, math, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policy_sim as P
files = sorted(P.glob.glob(os.path.join(P.REPLIES, "reply-*.json")))
files.sort(key=lambda f: "bench" not in f)
data = {os.path.basename(f)[6:-5]: P.load(f) for f in files}

def run(prompt, reply, policy, k, c, keyf):
    h, done, passes, rows, acc, cost = list(prompt), 0, 0, 0, 0, 0.0
    bad = set()
    while done < len(reply):
        h.append(reply[done]); done += 1
        if done == len(reply): break
        m = P.longest_match(h)
        d, fr = ([], None) if not m else (h[m[1]:m[1] + min(k, m[0])], m[1])
        if keyf:
            for i in range(len(d)):
                if keyf(h, fr + i) in bad:
                    d = d[:i]; break
        n = 0
        while n < len(d) and done + n < len(reply) and d[n] == reply[done + n]: n += 1
        if n < len(d) and keyf: bad.add(keyf(h, fr + n))
        passes += 1; rows += len(d); acc += n; cost += 1 + c * len(d)
        h.extend(reply[done:done + n]); done += n
    return passes, rows, acc, len(reply) / cost

keys = {"base": None, "pos": lambda h, p: p, "tok2": lambda h, p: tuple(h[p-1:p+1]), "tok3": lambda h, p: tuple(h[p-2:p+1])}
for c in [0.44, 0.35, 0.27]:
    print("c", c)
    for name, kf in keys.items():
        for k in [3, 4, 5, 8]:
            r = [run(p, rp, None, k, c, kf) for p, rp in data.values()]
            g = math.exp(sum(math.log(x[3]) for x in r) / len(r))
            print(f"  {name:5} K={k} " + " ".join(f"{x[3]:.3f}" for x in r) + f" gmean {g:.3f} bench {r[0][:3]}")
