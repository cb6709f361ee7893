#!/usr/bin/env python3
"""Symbol ordering file from page traces (trace.c) of BINARY. usage: order.py BINARY OUT TRACE...
Every function that overlaps a page some trace touched, sorted by how many traces touch it
(most first), then by which traces touch it (functions of one set together), then by first-touch order in it: the code
every run needs sits together at the front; what only some workloads run follows, grouped."""
import subprocess, sys, bisect
binary, out, traces = sys.argv[1], sys.argv[2], sys.argv[3:]
syms = []
for l in subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    p = l.split()
    if len(p) == 4 and p[2] in "tTwW":
        a, s = int(p[0], 16), int(p[1], 16)
        if s > 0: syms.append((a, s, p[3]))
syms.sort()
starts = [a for a, _, _ in syms]
info = {}  # name -> [count, first trace, first position, size, traces]
for ti, t in enumerate(traces):
    here = set(); pos = 0
    for l in open(t):
        if l.startswith("#"): continue
        pg = int(l, 16); pos += 1
        i = bisect.bisect_right(starts, pg + 4095) - 1
        while i >= 0 and syms[i][0] > pg - (1 << 20):
            a, s, n = syms[i]
            if a + s > pg and n not in here:
                here.add(n)
                if n in info: info[n][0] += 1; info[n][4].append(ti)
                else: info[n] = [1, ti, pos, s, [ti]]
            i -= 1
order = sorted(info, key=lambda n: (-info[n][0], info[n][4], info[n][2]))
open(out, "w").write("".join(n + "\n" for n in order))
print(f"{len(order)} symbols, {sum(v[3] for v in info.values())/2**20:.2f} MiB of code; in every trace: "
      f"{sum(v[3] for v in info.values() if v[0]==len(traces))/2**20:.2f} MiB", file=sys.stderr)
