"""Medians of cpu_ab.sh's CPU time a decoded token (one thread, `mlx generate --decoder cpu`,
128 tokens) over the rounds of the given raw files, and each entry's speed against affine-4 (NA4).
usage: python3 speed.py cpu_raw1.txt cpu_raw2.txt ..."""
import re
import statistics
import sys

v = {}
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"round \d+ (\S+): .*per decoded token ([0-9.]+) ms", line)
        if m:
            v.setdefault(m.group(1), []).append(float(m.group(2)))
a4 = statistics.median(v["NA4"])
print(f"{' + '.join(sys.argv[1:])}")
for k, x in v.items():
    med = statistics.median(x)
    print(f"  {k}: median {med:.3f} ms CPU/token over {len(x)} (min {min(x):.3f}, max {max(x):.3f}); speed vs affine-4 {a4 / med:.3f}x")
if "NG7" in v and "NH12" in v:
    print(f"  gauss7s / 1mad8h CPU time: {statistics.median(v['NG7']) / statistics.median(v['NH12']):.3f}")
if "NG8" in v and "NH12" in v:
    print(f"  gauss8s / 1mad8h CPU time: {statistics.median(v['NG8']) / statistics.median(v['NH12']):.3f}")
