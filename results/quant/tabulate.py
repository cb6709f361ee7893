#!/usr/bin/env python3
"""Collects the perplexity rows (`mlx perplexity --json` outputs y_ROW.json and the convert
logs conv_ROW.log in DIR) into smollm2_perplexity.json and a Markdown table on stdout."""
import json, re, sys, pathlib

d = pathlib.Path(sys.argv[1])
rows = ["f32", "affine4_d", "affine3_d", "mixed_2_6_d", "trellis4", "trellis3", "trellis2"]
out = []
for r in rows:
    f = d / f"y_{r}.json"
    if not f.exists():
        continue
    obj = None
    for line in f.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            obj = json.loads(line)
    if obj is None:
        continue
    bpw = None
    log = d / f"conv_{r.removesuffix('_d')}.log"
    if log.exists():
        m = re.search(r"with ([0-9.]+) bits per weight", log.read_text())
        bpw = float(m.group(1)) if m else None
    out.append({"row": r, "bits_per_weight": bpw, **obj})
json.dump(out, open(pathlib.Path(sys.argv[2]), "w"), indent=1)
print("| row | bits/weight | perplexity | std. error |")
print("| --- | --- | --- | --- |")
for o in out:
    ppl = o.get("perplexity"); se = o.get("standard_error", o.get("std_error"))
    print(f"| {o['row']} | {o['bits_per_weight'] or 32} | {ppl:.3f} | {se:.3f} |" if se is not None
          else f"| {o['row']} | {o['bits_per_weight']} | {ppl} | |")
