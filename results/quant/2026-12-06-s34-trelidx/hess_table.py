"""The LDLQ output error tr(dW H dW^T)/tr(W H W^T) of each code on each linear of the layers
hess.sh ran (3 bits, L 12, blocks 64), and each code's change against 1mad's (per matrix, then
the mean over matrices). usage: python3 hess_table.py"""
import glob
import re

rows = {}
for f in sorted(glob.glob("hess_l*_*.txt")):
    layer, code = re.match(r"hess_(l\d+)_(.+)\.txt", f).groups()
    for line in open(f):
        m = re.match(r"(\S+) \(\S+\) 3 bits: .* LDLQ [0-9.]+/([0-9.]+)", line)
        if m:
            rows.setdefault(code, {})[m.group(1)] = float(m.group(2))
codes = [c for c in ("1mad", "1mad8s", "gauss8s", "gauss7s") if c in rows]
mats = sorted(rows["1mad"])
print("| linear | " + " | ".join(codes) + " |")
print("|---|" + "---|" * len(codes))
for m in mats:
    cells = []
    for c in codes:
        v = rows[c].get(m)
        cells.append("" if v is None else f"{v:.5f}" + ("" if c == "1mad" else f" ({(v / rows['1mad'][m] - 1) * 100:+.1f}%)"))
    print(f"| {m} | " + " | ".join(cells) + " |")
for c in codes[1:]:
    d = [(rows[c][m] / rows["1mad"][m] - 1) * 100 for m in mats if m in rows[c]]
    print(f"\n{c} vs 1mad over {len(d)} linears: mean {sum(d) / len(d):+.1f}%, range {min(d):+.1f}% to {max(d):+.1f}%", end="")
print()
