#!/usr/bin/env python3
"""Replays prompt-lookup policies against plain greedy replies (`mlx generate --json` output:
`prompt_ids`, `tokens`, EOS appended where it stopped), as `spec_bench --simulate` does, for
cost curves given as pass costs in one-token steps by row count. The lookup is
`cpu_spec::longest_match` (the occurrence of the last `ngram` tokens whose match with the
tokens before it reaches furthest back, up to 64; the most recent on ties); a policy drafts
at most `min(K, matched length + slack)` of the tokens after it. Prints the predicted ratio
to plain decoding (tokens / summed pass costs) for each policy, reply and curve.

  simulate.py --costs NAME=1,1.2,1.4,... [--costs ...] REPLY.json [REPLY.json ...]
"""
import argparse, json

EOS = 2  # SmolLM2-Instruct's <|im_end|>

def longest_match(h, ngram):
    REACH = 64
    n = len(h)
    if ngram == 0 or n <= ngram:
        return None
    tail = h[n - ngram:]
    best = None
    for start in range(n - ngram - 1, -1, -1):
        if h[start:start + ngram] != tail:
            continue
        end = start + ngram
        ln = ngram
        while ln < min(REACH, end) and h[end - 1 - ln] == h[n - 1 - ln]:
            ln += 1
        if best is None or ln > best[0]:
            best = (ln, end)
    return best

def run(prompt, reply, max_tokens, ngram, k, slack, cost_of, oracle=False):
    h = list(prompt)
    done = passes = rows = 0
    cost = 0.0
    while done < len(reply):
        h.append(reply[done]); done += 1
        if done == len(reply):
            break
        want = min(k, max_tokens - done)
        m = longest_match(h, ngram)
        drafts = []
        if m and want > 0:
            ln, frm = m
            drafts = h[frm:min(frm + min(want, max(ln + slack, 0)), len(h))]
        n = 0
        while n < len(drafts) and done + n < len(reply) and drafts[n] == reply[done + n]:
            n += 1
        if oracle:
            drafts = drafts[:n]
        passes += 1; rows += 1 + len(drafts)
        cost += cost_of(1 + len(drafts))
        h.extend(reply[done:done + n]); done += n
    return passes, rows, cost

ap = argparse.ArgumentParser()
ap.add_argument("--costs", action="append", required=True)
ap.add_argument("--max-tokens", type=int, default=160)
ap.add_argument("replies", nargs="+")
a = ap.parse_args()
curves = []
for c in a.costs:
    name, v = c.split("=", 1)
    curves.append((name, [float(x) for x in v.split(",")]))

def coster(costs):
    def f(r):
        if r <= len(costs):
            return costs[r - 1]
        inc = costs[-1] - costs[-2]
        return costs[-1] + inc * (r - len(costs))
    return f

for path in a.replies:
    v = json.load(open(path))
    prompt, reply = v["prompt_ids"], list(v["tokens"])
    if v.get("finish_reason") == "stop":
        reply.append(EOS)
    print(f"## {path}: {len(reply)} tokens")
    for name, costs in curves:
        f = coster(costs)
        res = []
        for ngram in (1, 2, 3):
            for slack in (-1, 0, 1, 2, 64):
                for k in range(1, 9):
                    p, r, c = run(prompt, reply, a.max_tokens, ngram, k, slack, f)
                    res.append((len(reply) / c, f"ngram {ngram} slack {slack} K {k}: {p} passes {r} rows"))
        p, r, c = run(prompt, reply, a.max_tokens, 1, 8, 64, f, oracle=True)
        cur = [x for x in res if x[1].startswith("ngram 1 slack 0 K 4:")][0]
        res.sort(key=lambda x: -x[0])
        print(f"curve {name}: current (ngram 1 slack 0 K 4) {cur[0]:.2f}x; oracle K 8 {len(reply)/c:.2f}x; best:")
        for s, l in res[:5]:
            print(f"  {s:.2f}x  {l}")
