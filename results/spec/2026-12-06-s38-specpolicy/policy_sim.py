#!/usr/bin/env python3
"""Prompt-lookup drafting policies replayed on SmolLM2-135M Q4_1's greedy replies (session 33's
replies/: the bench's copy-edit prompt and four other editing/summarizing prompts), with a pass
of 1 + d rows costing 1 + c * d one-token steps (c measured: README section 1). A draft is
accepted up to its first token that differs from the reply; the EOS ends the reply (no pass for
the last token, as `CpuSpecSteps`). Plain decoding costs one step a token.

Policies (K: the most drafts a pass, `--num-draft-tokens`):
  base      the library's before this session (`prompt_lookup_drafts`): longest-context match
            of the last token, drafts min(K, matched length)
  oracle    base's candidate span cut to what the reply accepts, up to K (no lookup drafter
            over these matches does better)
  oracle-L  the same with the matched-length cap lifted (the span up to K)
  ramp2     min(K, 2 * matched length)
  minL=m    base, but a match shorter than m tokens drafts nothing
  tail      base, but a match of length 1 drafts only when every earlier occurrence of the
            token was followed by the same token (unambiguous)
  memo      base, but a draft stops before a history position where the output once left a
            draft copied across it (the copy diverged there last time): what
            `cpu_spec::LookupDrafter` drafts (session 38)
  ev        drafts the longest d <= K whose estimated probability of being accepted in full,
            p(L, i) per draft i given the matched length L, exceeds c (leave-one-reply-out:
            p estimated from the other four replies)

usage: policy_sim.py [c ...]"""
import glob, json, math, os, sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPLIES = os.path.join(HERE, "..", "..", "bench", "2026-12-05-s33-lookup", "replies")
EOS = 2


def longest_match(h, ngram=1, reach=64):
    n = len(h)
    if n <= ngram:
        return None
    tail, best = h[n - ngram:], None
    for s in range(n - ngram - 1, -1, -1):
        if h[s:s + ngram] != tail:
            continue
        end, l = s + ngram, ngram
        while l < min(reach, end) and h[end - 1 - l] == h[n - 1 - l]:
            l += 1
        if best is None or l > best[0]:
            best = (l, end)
    return best


class Ctx:
    """What a policy may remember across the passes of one reply."""
    def __init__(self):
        self.bad = set()  # source positions whose drafted token was rejected


def base(h, k, ctx, cap=lambda l, k: min(k, l), minl=1):
    m = longest_match(h)
    if not m or m[0] < minl:
        return [], None
    l, fr = m
    return h[fr:fr + cap(l, k)], fr


def ramp2(h, k, ctx):
    return base(h, k, ctx, cap=lambda l, k: min(k, 2 * l))


def nocap(h, k, ctx):
    return base(h, k, ctx, cap=lambda l, k: k)


def minl(m):
    return lambda h, k, ctx: base(h, k, ctx, minl=m)


def tail(h, k, ctx):
    d, fr = base(h, k, ctx)
    m = longest_match(h)
    if d and m[0] == 1:
        t = h[-1]
        follow = {h[s + 1] for s in range(len(h) - 1) if h[s] == t}
        if len(follow) > 1:
            return [], None
    return d, fr


def memo(h, k, ctx):
    d, fr = base(h, k, ctx)
    for i in range(len(d)):
        if fr + i in ctx.bad:
            return d[:i], fr
    return d, fr


def ev_policy(table, c):
    def pol(h, k, ctx):
        m = longest_match(h)
        if not m:
            return [], None
        l, fr = m
        lb = min(l, 8)
        d = 0
        for i in range(1, k + 1):
            a, n = table.get((lb, i), (0, 0))
            p = (a + 1) / (n + 2)  # Laplace
            if p <= c:
                break
            d = i
        return h[fr:fr + d], fr
    return pol


def run(prompt, reply, policy, k, c, oracle=False):
    h, done, passes, rows, acc, cost = list(prompt), 0, 0, 0, 0, 0.0
    ctx = Ctx()
    while done < len(reply):
        h.append(reply[done])
        done += 1
        if done == len(reply):
            break
        d, fr = policy(h, k, ctx)
        d = d[:k]
        n = 0
        while n < len(d) and done + n < len(reply) and d[n] == reply[done + n]:
            n += 1
        if n < len(d) and fr is not None:
            ctx.bad.add(fr + n)
        if oracle:
            d = d[:n]
        passes += 1
        rows += len(d)
        acc += n
        cost += 1 + c * len(d)
        h.extend(reply[done:done + n])
        done += n
    return passes, rows, acc, len(reply) / cost


def acceptance_table(data, skip):
    """(matched length capped at 8, i) -> (times the first i tokens after the match were the
    reply's, times asked) over the replies other than `skip`, walking as base with K = 8."""
    t = defaultdict(lambda: [0, 0])
    for name, (p, r) in data.items():
        if name == skip:
            continue
        h, done = list(p), 0
        while done < len(r):
            h.append(r[done])
            done += 1
            if done == len(r):
                break
            m = longest_match(h)
            if not m:
                continue
            l, fr = m
            span = h[fr:fr + 8]
            n = 0
            while n < len(span) and done + n < len(r) and span[n] == r[done + n]:
                n += 1
            for i in range(1, len(span) + 1):
                if done + i > len(r):
                    break
                t[(min(l, 8), i)][1] += 1
                t[(min(l, 8), i)][0] += n >= i
            # advance as base (K = 4) would
            acc = min(n, min(4, l))
            h.extend(r[done:done + acc])
            done += acc
    return {k: tuple(v) for k, v in t.items()}


def load(f):
    d = json.load(open(f))
    r = list(d["tokens"])
    if d.get("finish_reason") == "stop":
        r.append(EOS)
    return d["prompt_ids"], r


def main():
    cs = [float(a) for a in sys.argv[1:]] or [0.47, 0.35, 0.27]
    files = sorted(glob.glob(os.path.join(REPLIES, "reply-*.json")))
    files.sort(key=lambda f: "bench" not in f)
    data = {os.path.basename(f)[6:-5]: load(f) for f in files}
    print("replies:", ", ".join(f"{n} ({len(r)} tokens)" for n, (_, r) in data.items()))
    for c in cs:
        print(f"\nc = {c}: speedup per reply (bench first), geometric mean; "
              f"(passes, drafted, accepted) on the bench reply")
        pols = [("base", base, False), ("oracle", base, True), ("oracle-L", nocap, True),
                ("ramp2", ramp2, False), ("minL=2", minl(2), False), ("tail", tail, False),
                ("memo", memo, False), ("ev", None, False)]
        for name, pol, orc in pols:
            for k in [2, 3, 4, 5, 6, 8]:
                r = []
                for rn, (p, rp) in data.items():
                    pl = pol or ev_policy(acceptance_table(data, rn), c)
                    r.append(run(p, rp, pl, k, c, oracle=orc))
                g = math.exp(sum(math.log(x[3]) for x in r) / len(r))
                print(f"  {name:<9} K={k:<2} " + " ".join(f"{x[3]:.3f}" for x in r)
                      + f"  gmean {g:.3f}  bench {r[0][:3]}")
    p, rp = data["bench"]
    print("\nthe largest c at which the bench reply reaches 1.8x:")
    for name, pol, orc, k in [("base K=4", base, False, 4), ("oracle K=4", base, True, 4),
                              ("oracle-L K=8", nocap, True, 8),
                              ("oracle-L K=16", nocap, True, 16)]:
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if run(p, rp, pol, k, mid, oracle=orc)[3] >= 1.8:
                lo = mid
            else:
                hi = mid
        print(f"  {name}: c <= {lo:.3f}")


if __name__ == "__main__":
    main()
