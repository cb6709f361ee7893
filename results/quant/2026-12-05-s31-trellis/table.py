"""The s31 table: every trellis-3 row against affine-4 g64, on 4,096 (ppl_*.json, s29's
protocol) and 16,384 (ppl32_*.json) Exodus tokens. Rows missing a file are left blank.

    python table.py > table.md
"""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
s30 = os.path.join(here, "../2026-12-05-s30-trellis")
s27 = os.path.join(here, "../2026-12-05-s27-trellis")


def ppl(name, n):
    tag = "ppl" if n == 8 else f"ppl{n}"
    for d in (here, s30, s27):
        f = os.path.join(d, f"{tag}_{name}.json")
        if os.path.exists(f):
            try:
                j = json.loads(open(f).read().strip().splitlines()[-1])
                return j["perplexity"], j["standard_error"], os.path.relpath(f, here)
            except Exception:
                pass
    return None


ROWS = [("affine-4 g64", "smol-a4", "")]
ROWS += [(f"trellis-3, seed {s}", f"t3-s{s}-g80", "one seed") for s in range(9)]
ROWS += [(f"trellis-3, per-layer seed chosen from seeds {b}..{b + 2} (numpy)", f"t3-sel{b}-g80", "held-out choice, 3 seeds") for b in (0, 3, 6)]
ROWS += [(f"trellis-3, per-layer seed chosen from seeds {b}..{b + 2} (`mlx convert`)", f"t3-cvsel{b}-g80", "held-out choice by mlx convert") for b in (0, 3, 6)]
ROWS += [(f"trellis-3, per-layer seed chosen from seeds {p[0]} and {p[1]}", f"t3-sel{p}-g80", "held-out choice, 2 seeds") for p in ("12", "01", "02")]
ROWS += [("control: per-layer seed of the WORST held-out error among seeds 0..2", "t3-selmax0-g80", "control: worst"),
         ("control: per-layer seed drawn at random among seeds 0..2", "t3-selrnd0-g80", "control: random")]
ROWS.insert(1, ("affine-3 g64", "smol-a3", ""))

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
        rel = (p / base[n][0] - 1) * 100 if base[n] else float("nan")
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
