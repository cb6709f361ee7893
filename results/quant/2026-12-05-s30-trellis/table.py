"""Tabulates this folder's perplexity rows (ppl_*.json, `ppl.sh`: 4,096 tokens of Exodus, the s26-s29
protocol) with the earlier sessions' rows of the same protocol, against affine-4's 17.227:
python3 table.py > table.md"""
import glob
import json
import os

D = os.path.dirname(os.path.abspath(__file__))
A4 = 17.227
rows = [
    ("affine-4 g64 (s27)", "../2026-12-05-s27-trellis/ppl_smol-a4.json", "", ""),
    ("1mad, LDLQ damp 0.01 (s27)", "../2026-12-05-s27-trellis/ppl_smol-t3-l8-g32-refit.json", "0", "default"),
    ("1mad, LDLQ damp 0.01 (s28)", "../2026-12-05-s28-trellis/ppl_smol-t3-l8-g32-refit-seed1.json", "1", "default"),
    ("1mad8, LDLQ damp 0.01 (s28)", "../2026-12-05-s28-trellis/ppl_smol-t3-l8-g32-refit-i8.json", "0", "default"),
    ("1mad, default (s29)", "../2026-12-05-s29-trellis/ppl_t3-s2-base.json", "2", "default"),
]
KNOB = {"damp10": "MLX_TRELLIS_DAMP=0.1", "damp001": "MLX_TRELLIS_DAMP=0.001",
        "act": "MLX_TRELLIS_ORDER=act", "base": "default",
        "g80": "Genesis + 80 Days Hessians (36,271 tokens)",
        "unb": "unbiased row scales (MLX_TRELLIS_SCALE=unbiased)",
        "unbpost": "unbiased row scales set after coding (puzzle.py --unbias)",
        "g80-unb": "Genesis + 80 Days Hessians, unbiased row scales",
        "g12k": "Genesis + 80 Days Hessians (12,288 tokens)"}
for f in sorted(glob.glob(f"{D}/ppl_t3-s*.json")):
    n = os.path.basename(f)[4:-5]
    _, s, knob = n.split("-", 2)
    rows.append((f"1mad, {KNOB.get(knob, knob)} (s30)", os.path.basename(f), s[1:], KNOB.get(knob, knob)))


def last_json(p):
    for line in reversed(open(os.path.join(D, p)).read().splitlines()):
        if line.startswith("{"):
            return json.loads(line)


print("| model (trellis-3, L 8, blocks of 32, Genesis Hessians, refit) | seed | perplexity | std. error | vs affine-4 | file |")
print("|---|---|---|---|---|---|")
for name, p, seed, _ in rows:
    try:
        d = last_json(p)
    except (OSError, TypeError):
        continue
    if d is None:
        continue
    ppl = d["perplexity"]
    print(f"| {name} | {seed} | {ppl:.3f} | {d['standard_error']:.3f} | {100 * (ppl / A4 - 1):+.2f}% | `{p}` |")

# Per setting: every seed, the mean and the worst (the default's seeds 0 and 1 are s27's and s28's rows).
groups = {}
for name, p, seed, knob in rows:
    if not seed:
        continue
    try:
        d = last_json(p)
    except (OSError, TypeError):
        continue
    if d is None:
        continue
    key = "1mad8 default" if "1mad8" in name else ("1mad default" if knob == "default" else f"1mad {knob}")
    groups.setdefault(key, []).append((int(seed), d["perplexity"]))
print()
print("| setting | seeds: perplexity (vs affine-4) | mean | worst |")
print("|---|---|---|---|")
for k, v in groups.items():
    v.sort()
    ps = [x for _, x in v]
    mean = sum(ps) / len(ps)
    cells = ", ".join(f"{s}: {x:.3f} ({100 * (x / A4 - 1):+.1f}%)" for s, x in v)
    print(f"| {k} | {cells} | {mean:.3f} ({100 * (mean / A4 - 1):+.1f}%) | {100 * (max(ps) / A4 - 1):+.1f}% |")
