"""The s32 table: trellis-3 rows against affine-4 g64 on 4,096 (ppl_*.json, s29's protocol)
and 16,384 (ppl32_*.json) Exodus tokens, from this folder and s27/s30/s31's. Rows missing a
file are left blank.

    python table.py > table.md
"""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
dirs = [here] + [os.path.join(here, f"../2026-12-05-{s}-trellis") for s in ("s31", "s30", "s27")]


def ppl(name, n):
    tag = "ppl" if n == 8 else f"ppl{n}"
    for d in dirs:
        f = os.path.join(d, f"{tag}_{name}.json")
        if os.path.exists(f):
            try:
                j = json.loads(open(f).read().strip().splitlines()[-1])
                return j["perplexity"], j["standard_error"], os.path.relpath(f, here)
            except Exception:
                pass
    return None


ROWS = [("affine-4 g64", "smol-a4", ""), ("affine-3 g64", "smol-a3", ""), ("affine-2 mixed_2_6", "smol-a2mix", ""),
        ("trellis-2, seed 0", "t2-s0-g80", "")]
ROWS += [(f"trellis-3, seed {s}", f"t3-s{s}-g80", "one seed") for s in range(9)]
ROWS += [("`mlx convert --q-select-text`, seeds 0-2", "t3-cvtext0-g80", "loss choice by mlx convert"),
         ("`mlx convert --q-select-text`, seeds 3-5", "t3-cvtext3-g80", "loss choice by mlx convert")]
ROWS += [("whole-model loss choice among seeds 0-2 (6 groups of 5 blocks)", "t3-gr012-g80", "loss choice"),
         ("the same, candidates in the order 1, 2, 0", "t3-gr120-g80", "loss choice"),
         ("the same, candidates in the order 2, 0, 1", "t3-gr201-g80", "loss choice"),
         ("whole-model loss choice among seeds 3-5 (6 groups of 5 blocks)", "t3-gr345-g80", "loss choice"),
         ("control: random seed per group among seeds 0-2", "t3-rnd012-g80", "control: random per group"),
         ("control: random seed per group among seeds 3-5", "t3-rnd345-g80", "control: random per group"),
         ("s31: per-linear choice by held-out error among seeds 0-2", "t3-sel0-g80", ""),
         ("s31 control: random seed per linear among seeds 0-2", "t3-selrnd0-g80", "")]

print("| row | 4,096 tokens | vs affine-4 | 16,384 tokens | vs affine-4 | files |")
print("|---|---|---|---|---|---|")
base = {n: ppl("smol-a4", n) for n in (8, 32)}
groups = {}
for label, name, group in ROWS:
    cells, files = [], []
    for n in (8, 32):
        r = ppl(name, n)
        if r is None:
            cells += ["", ""]
            continue
        p, se, f = r
        files.append(f"`{f}`")
        rel = (p / base[n][0] - 1) * 100
        cells += [f"{p:.3f} ± {se:.3f}", f"{rel:+.1f}%"]
        if group:
            groups.setdefault((group, n), []).append(rel)
    if any(cells):
        print(f"| {label} | " + " | ".join(cells) + " | " + ", ".join(files) + " |")
print()
print("| rows | tokens | n | mean vs affine-4 | worst | spread (max - min) |")
print("|---|---|---|---|---|---|")
for (g, n), v in sorted(groups.items()):
    print(f"| {g} | {512 * n:,} | {len(v)} | {sum(v) / len(v):+.1f}% | {max(v):+.1f}% | {max(v) - min(v):.1f} points |")
