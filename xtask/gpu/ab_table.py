"""Summarises `ab.sh`'s ab.jsonl as a Markdown table: per model and side, the medians over
every trial of every round of prefill tok/s (prompt tokens / time to the first token) and decode
tok/s (tokens / time from the first token to the last), the decode rate as weight bytes per
second, the step phases of `--step-timing` (ms; graph build, async_eval, sync) and the primitive
counts of `--graph` (the first prefill chunk, the third decode step).

    python3 ab_table.py ab.jsonl [SIZES [COPY]]

SIZES is `ab.sh`'s sizes.txt (`du -b` of each model.safetensors: weight bytes per token); models
it does not list use the sizes below. COPY is `ab.sh`'s copy_bandwidth.txt (the copy measured in
the same run): with it, a second table gives per model and side the decode rate's spread over
the trials (min - max), its share of the copy's bandwidth, its ratio to mlx-lm's and the peak
memory (median; for the graph decoder, MLX's peak plus the decoder's device buffers).
"""
import re

import json
import os
import statistics
import sys

# Weight bytes per token (every parameter once), for when the model directory is not here.
WEIGHT_BYTES = {
    "llama-135m-q4": 76e6,
    "llama-135m-bf16": 269e6,
    "llama-8b-q4": 4.52e9,
    "llama-8b-q8": 8.54e9,
    "llama-8b-bf16": 16.06e9,
}
SIDES = ["mlx-lm", "ours-off", "ours-auto", "ours-percall", "ours-graph", "ours-graphplain", "ours-graph4",
         "ours-graphb8", "ours-graph1", "ours-graphalt", "ours-graphalt2", "ours-graphalt3",
         "ours-graphe1", "ours-graphe2", "ours-graphe3"]


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    sizes = dict(WEIGHT_BYTES)
    if len(sys.argv) > 2:
        for line in open(sys.argv[2]):
            size, path = line.split(None, 1)
            sizes[os.path.basename(os.path.dirname(path.strip()))] = int(size)
    names = list(dict.fromkeys(r["name"] for r in rows))
    print("| model | side | prefill tok/s | decode tok/s | decode GB/s | trials | "
          "step build / async_eval / sync ms (ours, uncompiled; compiled) | graph nodes prefill / step "
          "| tokens = mlx-lm's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        wbytes = sizes.get(name)
        ref_tokens = [r["tokens"] for r in rows if r["name"] == name and r["side"] == "mlx-lm"]
        for side in SIDES:
            rs = [r for r in rows if r["name"] == name and r["side"] == side]
            if not rs:
                continue
            trials = [t for r in rs for t in r["trials"]]
            pre = statistics.median(t["prompt_tps"] for t in trials)
            dec = statistics.median(t["generation_tps"] for t in trials)
            gbs = f"{dec * wbytes / 1e9:.0f}" if wbytes else "-"
            st = next((r["step_timing"] for r in rs if r.get("step_timing")), None)
            steps = "-"
            if st:
                parts = []
                for k in ("uncompiled", "compiled"):
                    v = st.get(k)
                    if v:
                        parts.append(f"{v['build_ms']:.2f} / {v['schedule_ms']:.2f} / {v['sync_ms']:.2f}")
                steps = "; ".join(parts)
            gr = next((r["graph"] for r in rs if r.get("graph")), None)
            nodes = "-"
            if gr:
                nodes = " / ".join(str((gr.get(k) or {}).get("nodes", "-")) for k in ("prefill", "step"))
            same = "-"
            if side != "mlx-lm" and ref_tokens:
                same = "yes" if all(r["tokens"] == ref_tokens[0] for r in rs) else "no"
            print(f"| {name} | {side} | {pre:,.0f} | {dec:.1f} | {gbs} | {len(trials)} | {steps} | {nodes} | {same} |")
    if len(sys.argv) > 3:
        copy = float(re.search(r"= (\d+) GB/s", open(sys.argv[3]).read()).group(1))
        print(f"\nCopy bandwidth in this run: {copy:,.0f} GB/s\n")
        print("| model | side | decode tok/s (median, min - max) | GB/s | share of copy | x mlx-lm "
              "| prefill x mlx-lm | peak GB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in names:
            wbytes = sizes.get(name)
            med = {}
            for side in SIDES:
                trials = [t for r in rows if r["name"] == name and r["side"] == side for t in r["trials"]]
                if trials:
                    med[side] = (statistics.median(t["generation_tps"] for t in trials),
                                 statistics.median(t["prompt_tps"] for t in trials), trials)
            for side, (dec, pre, trials) in med.items():
                ds = [t["generation_tps"] for t in trials]
                gbs = dec * wbytes / 1e9 if wbytes else None
                ref = med.get("mlx-lm")
                print(f"| {name} | {side} | {dec:.1f} ({min(ds):.1f} - {max(ds):.1f}) | "
                      f"{f'{gbs:,.0f}' if gbs else '-'} | {f'{100 * gbs / copy:.1f}%' if gbs else '-'} | "
                      f"{f'{dec / ref[0]:.2f}' if ref else '-'} | {f'{pre / ref[1]:.2f}' if ref else '-'} | "
                      f"{statistics.median(t['peak_memory_gb'] for t in trials):.2f} |")


main()
