#!/usr/bin/env python3
"""Symbol ordering file from page traces (trace.c output) of a binary.
usage: order.py BINARY OUT TRACE... ; functions overlapping a touched page, in the order their
pages were first touched (traces concatenated in the order given), each once."""
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
seen, order, total = set(), [], 0
for t in traces:
    for l in open(t):
        if l.startswith("#"): continue
        pg = int(l, 16)
        i = bisect.bisect_right(starts, pg + 4095) - 1
        hits = []
        while i >= 0 and syms[i][0] > pg - (1 << 20):
            if syms[i][0] + syms[i][1] > pg: hits.append(syms[i])
            i -= 1
        # also the symbol straddling the page start
        for a, s, n in sorted(hits):
            if n not in seen and a + s > pg and a < pg + 4096:
                seen.add(n); order.append(n); total += s
open(out, "w").write("".join(n + "\n" for n in order))
print(f"{len(order)} symbols, {total/2**20:.2f} MiB of code", file=sys.stderr)
