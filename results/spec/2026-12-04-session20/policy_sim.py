"""Draft-length policies for prompt lookup on the CPU decoder, replayed against the plain greedy
reply of SmolLM2-135M-Instruct (`plain_reply.json`: `mlx generate --decoder cpu --dtype f32
--json -m 160` on the copy-edit prompt of `cargo xtask bench spec --cli`) under a cost model of
one verification pass: `(1 - beta) * ceil(rows / 6) + beta * rows` one-token steps (the
AVX-512 int16 kernels take six rows a pass over each weight block; `beta` is what one more row
costs, 0.3-0.45 on this machine: results/bench/spec-rows.md, spec-cpu-tile6.md). A draft is
accepted up to its first token that differs from the reply, as verification does; plain
decoding costs one step a token.

The policies are mlx-engine's: `prompt_lookup_longest` (cpu_spec.rs) with `DraftLength` (fixed
or adaptive), and `prompt_lookup_by_context` (drafts capped at the matched context's length).

    python3 policy_sim.py > policy_sim.md
"""

import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
d = json.load(open(os.path.join(HERE, "plain_reply.json")))
PROMPT = d["prompt_ids"]
EOS = 2  # SmolLM2's <|im_end|>: the reply ends on it
REPLY = d["tokens"] + [EOS]
REACH = 64


def longest_match(h, ngram):
    n = len(h)
    if ngram == 0 or n <= ngram:
        return None
    tail = h[n - ngram :]
    best = None
    for start in range(n - ngram - 1, -1, -1):
        if h[start : start + ngram] != tail:
            continue
        end = start + ngram
        ln = ngram
        while ln < min(REACH, end) and h[end - 1 - ln] == h[n - 1 - ln]:
            ln += 1
        if best is None or ln > best[0]:
            best = (ln, end)
    return best


def lookup_longest(h, ngram, k):
    m = longest_match(h, ngram)
    return [] if m is None else h[m[1] : min(m[1] + k, len(h))]


def lookup_by_context(h, ngram, k):
    m = longest_match(h, ngram)
    return [] if m is None else h[m[1] : min(m[1] + min(k, m[0]), len(h))]


class DraftLength:
    def __init__(self, mx, adaptive):
        self.max, self.adaptive, self.cur = mx, adaptive, mx

    def want(self, room):
        return min(self.cur, room)

    def update(self, drafted, accepted):
        if not self.adaptive or drafted == 0:
            return
        cur = max(self.cur, drafted) + 2 if accepted == drafted else accepted + 1
        self.cur = max(1, min(cur, max(self.max, 1)))


def cost(rows, beta, tile=6):
    return (1 - beta) * math.ceil(rows / tile) + beta * rows


def replay(lookup, ngram, k, adaptive, beta):
    dl = DraftLength(k, adaptive)
    h, done = list(PROMPT), 0
    passes = drafted = accepted = 0
    total = 0.0
    while done < len(REPLY):
        h.append(REPLY[done])
        done += 1
        if done == len(REPLY):
            break
        want = dl.want(len(REPLY) - done)
        drafts = lookup(h, ngram, want)[:want]
        n = 0
        for a, b in zip(drafts, REPLY[done:]):
            if a != b:
                break
            n += 1
        dl.update(len(drafts), n)
        passes += 1
        drafted += len(drafts)
        accepted += n
        total += cost(1 + len(drafts), beta)
        h.extend(REPLY[done : done + n])
        done += n
    return passes, accepted, drafted, (len(REPLY) - 1) / total


def main():
    print(f"prompt {len(PROMPT)} tokens, reply {len(REPLY)} tokens (EOS included)\n")
    print("| policy | n-gram | K | adaptive | passes | accepted / drafted | "
          "speed-up, beta 0.3 | beta 0.35 | beta 0.4 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, fn in [("longest", lookup_longest), ("by context", lookup_by_context)]:
        for ngram in [1, 2, 3]:
            for k in [3, 4, 5]:
                for adaptive in [False, True]:
                    r = [replay(fn, ngram, k, adaptive, b) for b in (0.3, 0.35, 0.4)]
                    p, a, dr, _ = r[0]
                    print(f"| {name} | {ngram} | {k} | {adaptive} | {p} | {a} / {dr} | "
                          + " | ".join(f"{x[3]:.2f}x" for x in r) + " |")


if __name__ == "__main__":
    main()
