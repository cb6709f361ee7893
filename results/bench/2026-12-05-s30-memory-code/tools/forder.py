#!/usr/bin/env python3
"""Symbol ordering file from function traces (ftrace.c) of BINARY. usage: order.py BINARY OUT TRACE...
The functions the traced runs executed, sorted by how many runs executed them (most first),
then by which runs did (the functions of one set of runs together), then by the order the first
of those runs executed them."""
import subprocess, sys, collections
binary, out, traces = sys.argv[1], sys.argv[2], sys.argv[3:]
names, size = collections.defaultdict(list), {}
for l in subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    p = l.split()
    if len(p) == 4 and p[2] in "tTwW" and int(p[1], 16) > 0:
        a = int(p[0], 16); names[a].append(p[3]); size[a] = int(p[1], 16)
info = {}  # address -> [runs, first position in the first run]
for ti, t in enumerate(traces):
    for pos, l in enumerate(x for x in open(t) if not x.startswith("#")):
        a = int(l, 16)
        if a in info: info[a][0].append(ti)
        else: info[a] = [[ti], pos]
order = sorted(info, key=lambda a: (-len(info[a][0]), info[a][0], info[a][1]))
open(out, "w").write("".join(n + "\n" for a in order for n in names.get(a, [])))
every = sum(size.get(a, 0) for a in info if len(info[a][0]) == len(traces))
print(f"{len(order)} functions, {sum(size.get(a, 0) for a in info)/2**20:.2f} MiB of code; "
      f"run by every trace: {every/2**20:.2f} MiB", file=sys.stderr)
