#!/usr/bin/env python3
"""Expected `mlx benchmark --decoder auto` peaks once the kept decoder waits parked, computed
from session 35's logged figures (results/gpu/2026-12-06-s35-h100/call1/bench.log, lines
"[graph memory] ..." of MLX_GRAPH_MEMORY=1, and mlx_lm benchmark's trial lines).

For each graph run (the warm-up, then the trials) the log gives MLX's peak in each window (the
prompt, the decoder's build, the decode) and the decoder's bytes. The new accounting:
  - through the prompt a kept decoder holds only what it keeps parked: S = D - KV;
  - the build and the decode windows hold the whole decoder D' = S + region, the KV cache now
    in one parkable region rounded up to the driver's granularity (G = 2 MiB assumed);
  - the reported trial peak is the process's (as mlx-lm's mx.get_peak_memory()): the largest
    of every earlier run's (the warm-up's included) and MLX's own process peak.
Usage: expected.py BENCH_LOG  (prints one block a model, then the table rows)."""
import re
import sys

G = 2 << 20
log = open(sys.argv[1]).read().splitlines()

rows = {}
side = None
model = None
for line in log:
    m = re.match(r"== round \d+ (\S+) (\S+)", line)
    if m:
        model, side = m.group(1), m.group(2)
        rows.setdefault(model, {"graph": [], "mlxlm": [], "dec": None})
        continue
    if side == "graph":
        m = re.search(r"KV cache (\d+) B .*allocated (\d+) B", line)
        if m:
            rows[model]["dec"] = (int(m.group(1)), int(m.group(2)))
        m = re.match(r"\[graph memory\] (.*?): MLX live (\d+) B, .*peak (\d+) B \(window (\d+) B\)", line)
        if m:
            what, live, peak, window = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            if what == "the prompt starts":
                rows[model]["graph"].append({"windows": {}, "live0": live})
            rows[model]["graph"][-1]["windows"][what] = (window, peak)
    elif side == "mlxlm":
        m = re.match(r"Trial (\d+):.*peak_memory=([\d.]+)", line)
        if m:
            rows[model]["mlxlm"].append(float(m.group(2)))

table = []
for model, r in rows.items():
    kv, d = r["dec"]
    region = -(-kv // G) * G
    s = d - kv
    d_new = s + region
    print(f"== {model}: decoder {d} B (KV {kv} B -> region {region} B); parked {s} B; whole {d_new} B")
    reported = []
    so_far = 0
    mlx_so_far = 0
    for i, run in enumerate(r["graph"]):
        w = run["windows"]
        prompt = w["the prompt is in"][0]
        build = w["the decoder is ready"][0]
        decode = w["the run ends"][0]
        kept = s if i > 0 else 0
        run_peak = max(prompt + kept, build + d_new, decode + d_new)
        mlx_so_far = max(mlx_so_far, w["the run ends"][1])
        so_far = max(so_far, run_peak, mlx_so_far)
        tag = "warm-up" if i == 0 else f"trial {i}"
        print(f"  {tag}: MLX prompt window {prompt} B (+{kept} kept), build {build} B, decode {decode} B "
              f"(+{d_new}): this run {run_peak} B; reported {so_far} B")
        if i > 0:
            reported.append(so_far / 1e9)
    avg = sum(reported) / len(reported)
    ml = r["mlxlm"]
    ml_avg = sum(ml) / len(ml)
    print(f"  expected trials {', '.join(f'{x:.4f}' for x in reported)} GB, average {avg:.4f}; "
          f"mlx-lm {ml} average {ml_avg:.4f}: {avg / ml_avg:.3f}x by the averages, "
          f"{max(reported) / max(ml):.3f}x highest trial against highest trial")
    table.append((model, avg, ml_avg, max(reported), max(ml)))

print()
for model, avg, ml_avg, hi, ml_hi in table:
    print(f"| {model} | {avg:.4f} / {ml_avg:.4f} = {avg / ml_avg:.3f}x | {hi:.4f} / {ml_hi:.3f} = {hi / ml_hi:.3f}x |")
