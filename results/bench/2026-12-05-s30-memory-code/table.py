#!/usr/bin/env python3
"""Medians of mem.sh output (ab-order.txt): per row and side. MB = 10^6 bytes."""
import sys, statistics as st, collections
mk = {"dense_f32": None, "SmolLM2-135M-Instruct.Q4_1.gguf": 113.1, "smollm2-360m-q4_0.gguf": 255.3, "smollm2-360m-q8_0.gguf": 412.6}
rows = collections.defaultdict(list)
for l in open(sys.argv[1] if len(sys.argv) > 1 else "ab-order.txt"):
    p = l.split()
    if len(p) < 12 or not p[0].isdigit(): continue
    rows[(p[1], p[2])].append(p)
print("| row | side | runs | peak MB (VmHWM) | peak / (model + KV) | binary text resident MiB | binary r-- MiB | RssAnon MiB | text pages / 64K windows | decode tok/s | prefill tok/s | text md5 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for (m, side), v in rows.items():
    med = lambda i: st.median(float(x[i]) for x in v)
    peak = med(3) * 1024 / 1e6
    r = f"{peak / mk[m]:.3f}" if mk.get(m) else ""
    pw = v[len(v) // 2][8].rstrip("w").replace(";", "")
    print(f"| {m} | {side} | {len(v)} | {peak:.1f} | {r} | {med(4)/1024:.2f} | {med(5)/1024:.2f} | {med(6)/1024:.1f} | {pw} | {med(9):.1f} | {med(10):.1f} | {','.join(sorted(set(x[11] for x in v)))} |")
