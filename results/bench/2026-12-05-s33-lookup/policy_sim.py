#!/usr/bin/env python3
"""Prompt-lookup drafting policies replayed on greedy replies of SmolLM2-135M Q4_1 (`mlx generate
--json` outputs in replies/: the bench's copy-edit prompt and four other editing/summarizing
prompts, replies/prompts.py). A draft is accepted up to its first token that differs from the
reply (greedy verification); a pass of 1 + d rows costs 1 + c * d one-token steps, plus `pen`
per started tile of 6 rows past the first (the several-row kernels run up to 6 rows a pass
over each weight block). Plain decoding costs one step a token. The EOS ends the reply (as
`CpuSpecSteps`: no pass for the last token).

Policies: `base` = the library's (`cpu_spec::prompt_lookup_drafts`: longest-context match of
the last token, drafts at most the matched length and at most K); `oracle` = base's drafts cut
to the part the reply accepts (no drafter over these lookups does better); `ngram2` = a match of
2+ tokens required; `amb` = a match of <= 2 tokens drafts only if every earlier occurrence of it
was followed by the same token; `punct` = a draft stops after its first punctuation token unless
the match is 8+ tokens long; `adaptive` = `DraftLength` (after a miss, one more than accepted).

usage: policy_sim.py [c ...]"""
import glob, json, math, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
EOS = 2
PUNCT = {17, 28, 30, 42, 43, 47, 198, 1116}  # , . : ; ! ? \n \n\n in SmolLM2's vocabulary


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


def base(h, k, ngram=1):
    m = longest_match(h, ngram)
    return h[m[1]:m[1] + min(k, m[0])] if m else []


def ngram2(h, k):
    return base(h, k, 2)


def amb(h, k):
    m = longest_match(h)
    if not m:
        return []
    l, fr = m
    if l <= 2:
        n, tail = len(h), h[len(h) - l:]
        if len({h[s + l] for s in range(n - l) if h[s:s + l] == tail}) > 1:
            return []
    return h[fr:fr + min(k, l)]


def punct(h, k):
    m = longest_match(h)
    if not m:
        return []
    l, fr = m
    d = h[fr:fr + min(k, l)]
    if l >= 8:
        return d
    for i, t in enumerate(d):
        if t in PUNCT:
            return d[:i + 1]
    return d


def run(prompt, reply, policy, k, c, pen=0.5, oracle=False, adaptive=False):
    h, done, passes, rows, acc, cost, cur = list(prompt), 0, 0, 0, 0, 0.0, k
    while done < len(reply):
        h.append(reply[done])
        done += 1
        if done == len(reply):
            break
        d = policy(h, cur if adaptive else k)
        n = 0
        while n < len(d) and done + n < len(reply) and d[n] == reply[done + n]:
            n += 1
        if oracle:
            d = d[:n]
        if adaptive and d:
            cur = max(1, min(k, (max(cur, len(d)) + 2) if n == len(d) else n + 1))
        passes += 1
        rows += len(d)
        acc += n
        cost += 1 + c * len(d) + pen * (len(d) // 6)
        h.extend(reply[done:done + n])
        done += n
    return passes, rows, acc, len(reply) / cost


def load(f):
    d = json.load(open(f))
    r = list(d["tokens"])
    if d.get("finish_reason") == "stop":
        r.append(EOS)
    return d["prompt_ids"], r


def main():
    cs = [float(a) for a in sys.argv[1:]] or [0.325, 0.30, 0.245]
    files = sorted(glob.glob(os.path.join(HERE, "replies", "reply-*.json")))
    files.sort(key=lambda f: "bench" not in f)
    data = {os.path.basename(f)[6:-5]: load(f) for f in files}
    print("replies:", ", ".join(f"{n} ({len(r)} tokens)" for n, (_, r) in data.items()))
    pols = [("base", base, False, False), ("oracle", base, True, False),
            ("base+adaptive", base, False, True), ("ngram2", ngram2, False, False),
            ("amb", amb, False, False), ("punct", punct, False, False)]
    for c in cs:
        print(f"\nc = {c} (an extra verify row's cost in one-token steps); speedup per reply, "
              f"geometric mean; (passes, drafted, accepted) on the bench reply")
        for name, pol, orc, ad in pols:
            for k in [3, 4, 5, 8, 12]:
                r = [run(p, rp, pol, k, c, oracle=orc, adaptive=ad) for p, rp in data.values()]
                g = math.exp(sum(math.log(x[3]) for x in r) / len(r))
                print(f"  {name:<14} K={k:<2} " + " ".join(f"{x[3]:.3f}" for x in r)
                      + f"  gmean {g:.3f}  bench {r[0][:3]}")
    p, rp = data["bench"]
    print("\nthe c at which the bench reply reaches 1.8x (75 tokens, the EOS included):")
    for name, pol, orc in [("base K=4", base, False), ("oracle K=4", base, True),
                           ("oracle K=8", base, True), ("oracle K=12", base, True)]:
        k = int(name.split("=")[1])
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
