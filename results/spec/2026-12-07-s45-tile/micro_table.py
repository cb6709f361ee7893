"""Fastest time per (config, shape, m) of micro_ab.sh's raw.log (the default column: the
kernel the config routes to), as a markdown table."""
import re, sys, collections
best = collections.defaultdict(lambda: float("inf"))
cfgs, shapes = [], []
for line in open(sys.argv[1]):
    m = re.match(r"cfg=(\S+) round \d+ (\S+) m=(\d+): default ([\d.]+) us", line)
    if not m:
        continue
    c, s, n, t = m.group(1), m.group(2), int(m.group(3)), float(m.group(4))
    if c not in cfgs:
        cfgs.append(c)
    if s not in shapes:
        shapes.append(s)
    best[c, s, n] = min(best[c, s, n], t)
print("| shape | m | " + " | ".join(f"`{c}`" for c in cfgs) + " |")
print("|---|---|" + "---|" * len(cfgs))
for s in shapes:
    for n in range(1, 10):
        if (cfgs[0], s, n) not in best:
            continue
        b = best[cfgs[0], s, n]
        cells = [f"{best[c, s, n]:.1f}" + ("" if c == cfgs[0] else f" ({best[c, s, n] / b:.2f})") for c in cfgs]
        print(f"| {s} | {n} | " + " | ".join(cells) + " |")
