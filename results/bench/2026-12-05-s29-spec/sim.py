import json, sys
d = json.load(open(sys.argv[1]))
prompt, reply = d['prompt_ids'], d['tokens']
REACH = 64
def longest_match(h, ngram, sub=None):
    n = len(h)
    if ngram == 0 or n <= ngram: return None
    eq = (lambda a, b: a == b or (sub is not None and sub.get(a) == b))
    best = None
    for start in range(n - ngram - 1, -1, -1):
        if not all(eq(h[start+i], h[n-ngram+i]) for i in range(ngram)): continue
        end = start + ngram
        ln = ngram
        while ln < min(REACH, end) and eq(h[end-1-ln], h[n-1-ln]): ln += 1
        if best is None or ln > best[0]: best = (ln, end)
    return best
def drafts_of(h, ngram, k, sub=None, slack=0):
    m = longest_match(h, ngram, sub)
    if not m: return []
    ln, frm = m
    d = h[frm: min(frm + min(k, ln + slack), len(h))]
    if sub: d = [sub.get(t, t) for t in d]
    return d
def run(k, learn, cost_c=0.42, tile=6, slack=0, ngram=1, max_tokens=160):
    h = list(prompt); done = 0; passes = rows = acc = 0; sub = {} if learn else None; cost = 0.0
    while done < len(reply):
        h.append(reply[done]); done += 1
        if done == len(reply): break
        want = min(k, max_tokens - done)
        dr = drafts_of(h, ngram, want, sub, slack)[:want]
        n = 0
        while n < len(dr) and done + n < len(reply) and dr[n] == reply[done+n]: n += 1
        if learn and n < len(dr) and done + n < len(reply):
            sub[dr[n]] = reply[done+n] if dr[n] not in sub else sub[dr[n]]
            # learn from the raw source token: find what source token was drafted
        passes += 1; rows += 1 + len(dr); acc += n
        r = 1 + len(dr)
        cost += 1 + cost_c * (r - 1) + (0.3 if r > tile else 0)
        h.extend(reply[done:done+n]); done += n
    return passes, rows - passes, acc, len(reply) / cost
for learn in [False, True]:
    for k in [3,4,5,6,8]:
        for slack in [0, 1]:
            p, dr, a, s = run(k, learn, slack=slack)
            print(f"learn={learn} k={k} slack={slack}: passes {p} drafted {dr} accepted {a} model speedup(c=.42) {s:.2f}x")
