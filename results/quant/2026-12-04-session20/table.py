"""Tabulates the perplexity rows of this directory (ppl_*.json: `mlx perplexity`, the exact
path; cpu_ppl_*.json: `mlx perplexity --decoder cpu`, L3) as a Markdown table:
    python table.py DIR...   (this directory and ../2026-12-04-rerun-partial for the exact rows)"""
import glob
import json
import os
import sys

dirs = sys.argv[1:] or [os.path.dirname(__file__)]
rows = []
for f in sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*ppl_*.json"))):
    lines = [l for l in open(f) if l.startswith("{")]
    if not lines:
        continue
    j = json.loads(lines[-1])
    path = "cpu decoder (L3)" if os.path.basename(f).startswith("cpu_") else "exact (L1)"
    rows.append((j["model"], path, j["perplexity"], j["standard_error"]))
print("| row | scored by | perplexity | standard error |")
print("| --- | --- | --- | --- |")
for m, p, v, se in rows:
    print(f"| {m} | {p} | {v:.3f} | {se:.3f} |")
