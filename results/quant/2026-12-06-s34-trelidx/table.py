"""The s34 table (engineer trelidx; s33 trelqual's table.py with the new rows): trellis-3 on
SmolLM2-135M with the new code `gauss8s` at L 12 (seeds 0-2) against today's default `1mad` at
L 12, s33's table codes `1mad8h` and `1mad8s` (engineer sbox's), affine-4 g64 and affine-3 g64;
default blocks (64), LDLQ with s30's 36k-token Hessian; s29's evaluator (4,096 tokens =
ppl_*.json, 16,384 = ppl32_*.json). Trellis-2 rows against affine-2 mixed_2_6 at the end. The rule
for the 3-bit default (s33's, unchanged) is checked at the end for gauss8s and gauss7s; it was
written here before any gauss8s perplexity existed, and gauss7s's row (added at 00:46, with
gauss8s's seed 0 known: 17.986) before any gauss7s perplexity existed.

Affine-3 g64 and mixed_2_6 are the lead's s33 rows (the exact path, `DEC=mlx`: the CPU decoder
refuses 3- and 6-bit affine), read from ../2026-12-05-s33-lead/ or, before the merge, from the
lead's worktree.

    python3 table.py > table.md
"""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
olds = [
    os.path.join(here, d)
    for d in (
        "../2026-12-05-s33-trelqual",
        "../2026-12-05-s33-sbox",
        "../2026-12-05-s33-lead",
        "/work/wt-lead/results/quant/2026-12-05-s33-lead",
        "../2026-12-05-s32-trellis-cpu",
        "../2026-12-05-s32-trellis",
        "../2026-12-05-s31-trellis",
        "../2026-12-05-s30-trellis",
        "../2026-12-05-s27-trellis",
    )
]


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


# (label, model name prefix or fixed name, seeds)
CONFIGS = [
    ("gauss7s, L 12, blocks 64 (proposed default)", "g7", (0, 1, 2)),
    ("gauss8s, L 12, blocks 64 (proposed default)", "g12", (0, 1, 2)),
    ("1mad, L 12, blocks 64 (today's default)", "m12", (0, 1, 2)),
    ("1mad8s, L 12, blocks 64 (s33 sbox)", "s12", (0, 1, 2)),
    ("1mad8h, L 12, blocks 64 (s33)", "h12", (0, 1, 2)),
]
T2 = [
    ("trellis-2, gauss8s, L 12, blocks 64", "t2g", (0,)),
    ("trellis-2, 1mad8s, L 12, blocks 64 (s33 sbox)", "t2s", (0,)),
    ("trellis-2, 1mad8h, L 12, blocks 64", "t2h", (0,)),
    ("trellis-2, 1mad, L 12, blocks 64 (row added at 22:55)", "t2m", (0,)),
    ("trellis-2, 1mad, L 8, blocks 32 (s32's t2-s0-g80)", "t2", (0,)),
]


def name(cfg, s):
    return f"{cfg}-s{s}-g80" if cfg in ("t3", "t2") else f"{cfg}-s{s}"


def cell(r, base):
    if r is None:
        return ["", ""]
    p, se, _ = r
    return [f"{p:.3f} ± {se:.3f}", f"{(p / base - 1) * 100:+.1f}%" if base else ""]


base = {n: ppl("smol-a4", n) for n in (8, 32)}
a3 = {n: ppl("smol-a3-deq", n) for n in (8, 32)}
a2 = {n: ppl("smol-a2mix-deq", n) for n in (8, 32)}
print("| row | 4,096 tokens | vs affine-4 | 16,384 tokens | vs affine-4 | files |")
print("|---|---|---|---|---|---|")
groups = {}
rows = [("affine-4 g64", "smol-a4", None), ("affine-3 g64 (dequantized, CPU decoder)", "smol-a3-deq", None)]
rows += [(f"{label}, seed {s}", name(cfg, s), label) for label, cfg, seeds in CONFIGS for s in seeds]
for label, nm, group in rows:
    cells, files = [], []
    for n in (8, 32):
        r = ppl(nm, n)
        cells += cell(r, base[n] and base[n][0])
        if r is None:
            continue
        files.append(f"`{r[2]}`")
        if group:
            groups.setdefault((group, n), []).append((r[0] / base[n][0] - 1) * 100)
    print(f"| {label} | " + " | ".join(cells) + " | " + ", ".join(files) + " |")
print()
print("| configuration | tokens | seeds | mean vs affine-4 | worst | best | within 5%: mean / worst | worst below affine-3 |")
print("|---|---|---|---|---|---|---|---|")
for label, _, _ in CONFIGS:
    for n in (8, 32):
        v = groups.get((label, n), [])
        if not v:
            continue
        m, w = sum(v) / len(v), max(v)
        ok = lambda x: "yes" if x <= 5.0 else "no"
        below = "not measured"
        if a3[n]:
            below = "yes" if w < (a3[n][0] / base[n][0] - 1) * 100 else "no"
        print(f"| {label} | {512 * n:,} | {len(v)} | {m:+.1f}% | {w:+.1f}% | {min(v):+.1f}% | {ok(m)} / {ok(w)} | {below} |")
print()
# The rule (s33's, written there before the 1mad8h data, unchanged here before the gauss8s data):
# gauss8s / L 12 becomes the trellis default for 3 bits if,
# at 4,096 tokens (and at 16,384 tokens where measured), over seeds 0, 1 and 2 (all three
# measured at 4,096):
#   - its mean and its worst are within 5% of affine-4 g64 (<= +5.0%), and
#   - its worst is below affine-3 g64 (the lead's exact-path row; where affine-3 is not measured
#     at a length, that length's condition is reported as not checked, and the rule as
#     incomplete unless affine-3 is measured at 4,096).
# A 16,384-token evaluation with fewer than three seeds is checked on the seeds it has and
# reported as partial.
for lab in (CONFIGS[0][0], CONFIGS[1][0]):
    verdict, holds = [], True
    for n in (8, 32):
        v = groups.get((lab, n), [])
        if n == 8 and len(v) < 3:
            verdict.append(f"4,096 tokens: incomplete ({len(v)} of 3 seeds)")
            holds = None
            continue
        if not v:
            verdict.append(f"{512 * n:,} tokens: not measured")
            continue
        m, w = sum(v) / len(v), max(v)
        part = "" if len(v) == 3 else f" (partial: {len(v)} of 3 seeds)"
        ok5 = m <= 5.0 and w <= 5.0
        verdict.append(f"{512 * n:,} tokens{part}: mean {m:+.1f}%, worst {w:+.1f}% of affine-4 -> within 5%: {'yes' if ok5 else 'NO'}")
        if not ok5:
            holds = False
        if a3[n]:
            r3 = (a3[n][0] / base[n][0] - 1) * 100
            ok3 = w < r3
            verdict.append(f"{512 * n:,} tokens: worst {w:+.1f}% vs affine-3 g64 {r3:+.1f}% -> below: {'yes' if ok3 else 'NO'}")
            if not ok3:
                holds = False
        else:
            verdict.append(f"{512 * n:,} tokens: affine-3 g64 not measured (not checked)")
            if n == 8 and holds:
                holds = None
    print()
    print(f"Rule ({lab.split(',')[0]} / L 12 the 3-bit default: mean and worst over seeds 0-2 within 5% of affine-4, worst below affine-3; 4,096 tokens, and 16,384 where measured):")
    for x in verdict:
        print(f"- {x}")
    print(f"- **{'HOLDS' if holds else ('does not hold' if holds is False else 'incomplete')}**")
print()
print("Trellis-2 (target: below affine-2 mixed_2_6 by a margin the closing note states):")
print()
print("| row | 4,096 tokens | vs mixed_2_6 | 16,384 tokens | vs mixed_2_6 | files |")
print("|---|---|---|---|---|---|")
for label, nm in [("affine-2 mixed_2_6 (dequantized, CPU decoder)", "smol-a2mix-deq")] + [
    (f"{label}, seed {s}", name(cfg, s)) for label, cfg, seeds in T2 for s in seeds
]:
    cells, files = [], []
    for n in (8, 32):
        r = ppl(nm, n)
        cells += cell(r, a2[n] and a2[n][0])
        if r:
            files.append(f"`{r[2]}`")
    print(f"| {label} | " + " | ".join(cells) + " | " + ", ".join(files) + " |")
