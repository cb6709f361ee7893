"""The s32 table: trellis-3 on SmolLM2-135M, the three (code, L) choices for `mlx convert`'s
3-bit default, seeds 0-2 each, default blocks (64), LDLQ with s30's 36k-token Hessian, against
affine-4 g64, on 4,096 (ppl_*.json, s29's protocol) and 16,384 (ppl32_*.json) Exodus tokens;
s31's 1mad / L 8 / blocks of 32 rows (s30's models) for reference. The rule for the default
(the target: within 5% of affine-4) is checked at the end.

    python table.py > table.md
"""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
olds = [os.path.join(here, d) for d in ("../2026-12-05-s31-trellis", "../2026-12-05-s30-trellis", "../2026-12-05-s27-trellis")]


def ppl(name, n):
    tag = "ppl" if n == 8 else f"ppl{n}"
    for d in [here] + olds:
        f = os.path.join(d, f"{tag}_{name}.json")
        if os.path.exists(f):
            try:
                j = json.loads(open(f).read().strip().splitlines()[-1])
                return j["perplexity"], j["standard_error"], os.path.relpath(f, here)
            except Exception:
                pass
    return None


CONFIGS = [
    ("1mad8, L 8, blocks 64 (proposed default)", "i8l8"),
    ("1mad, L 12, blocks 64 (today's default)", "m12"),
    ("1mad, L 8, blocks 64", "m8"),
    ("1mad, L 8, blocks 32 (s30/s31 models)", "t3"),
    ("1mad8, L 8, blocks 32", "i8g32"),
]


def name(cfg, s):
    return f"t3-s{s}-g80" if cfg == "t3" else f"{cfg}-s{s}"


print("| row | 4,096 tokens | vs affine-4 | 16,384 tokens | vs affine-4 | files |")
print("|---|---|---|---|---|---|")
base = {n: ppl("smol-a4", n) for n in (8, 32)}
rows = [("affine-4 g64", "smol-a4", None)]
rows += [(f"{label}, seed {s}", name(cfg, s), label) for label, cfg in CONFIGS for s in range(3)]
groups = {}
for label, nm, group in rows:
    cells, files = [], []
    for n in (8, 32):
        r = ppl(nm, n)
        if r is None:
            cells += ["", ""]
            continue
        p, se, f = r
        files.append(f"`{f}`")
        rel = (p / base[n][0] - 1) * 100
        cells += [f"{p:.3f} ± {se:.3f}", f"{rel:+.1f}%"]
        if group:
            groups.setdefault((group, n), []).append(rel)
    print(f"| {label} | " + " | ".join(cells) + " | " + ", ".join(files) + " |")
print()
print("| configuration | tokens | seeds | mean vs affine-4 | worst | best | within 5%: mean / worst |")
print("|---|---|---|---|---|---|---|")
for label, _ in CONFIGS:
    for n in (8, 32):
        v = groups.get((label, n), [])
        if not v:
            continue
        m, w = sum(v) / len(v), max(v)
        ok = lambda x: "yes" if x <= 5.0 else "no"
        print(f"| {label} | {512 * n:,} | {len(v)} | {m:+.1f}% | {w:+.1f}% | {min(v):+.1f}% | {ok(m)} / {ok(w)} |")
print()
# The rule: 1mad8 / L 8 becomes the 3-bit default if, on both evaluations, each of its mean
# and worst over seeds 0-2 is within 5% of affine-4 wherever 1mad / L 12's is (it meets the
# target as well as today's default does), all three seeds of both measured.
a, b = CONFIGS[0][0], CONFIGS[1][0]
verdict = []
for n in (8, 32):
    va, vb = groups.get((a, n), []), groups.get((b, n), [])
    if len(va) < 3 or len(vb) < 3:
        verdict.append(f"{512 * n:,} tokens: incomplete ({len(va)} / {len(vb)} seeds)")
        continue
    for stat, f in (("mean", lambda v: sum(v) / len(v)), ("worst", max)):
        ya, yb = f(va), f(vb)
        holds = ya <= 5.0 or yb > 5.0
        verdict.append(f"{512 * n:,} tokens, {stat}: 1mad8/L8 {ya:+.1f}%, 1mad/L12 {yb:+.1f}% -> {'holds' if holds else 'FAILS'}")
print("Rule (1mad8 / L 8 within 5% wherever 1mad / L 12 is, mean and worst over seeds 0-2, both evaluations):")
for v in verdict:
    print(f"- {v}")
