"""Issue #30's peak-memory rows from a measure.sh/product.sh bench.log: per model and side, each
trial's peak, their mean (what `Averages` prints) and their largest (the process's peak: both
`mlx benchmark` and `mlx_lm benchmark` read a counter that never goes down within a process, so
the last trial's value is the run's peak), then ours against mlx-lm's both ways, and the
`[graph memory]` lines (MLX_GRAPH_MEMORY=1) of each graph run.

    python3 peak_table.py bench.log [more.log ...]

mlx-lm's first timed trial often reads lower than the later ones (8B, prompt 512: 5.44-5.49 GB,
then 6.347 GB in every later trial of session 31's logs): MLX's CUDA back-end keeps each
command graph's temporaries until that graph completes, so the peak depends on how far the host
runs ahead of the device, which is not the same in the first trials. A mean over three trials
is then not the process's peak; the largest is.
"""

import json
import re
import sys


def parse(paths):
    runs = {}  # (model, side) -> {"peaks": [...], "mem": [...]}
    cur = None
    for path in paths:
        for line in open(path, errors="replace"):
            m = re.match(r"== round \d+ (\S+) (\S+)", line)
            if m:
                cur = runs.setdefault((m.group(1), m.group(2)), {"peaks": [], "mem": []})
                continue
            # measure.sh's moe part: "== moe SIDE".
            m = re.match(r"== moe (\S+)", line)
            if m:
                cur = runs.setdefault(("qwen3-30b-a3b-q4", m.group(1)), {"peaks": [], "mem": []})
                continue
            if cur is None:
                continue
            if line.startswith('{"trial"'):
                cur["peaks"].append(json.loads(line)["peak_memory"])
            elif line.startswith("Trial "):
                p = re.search(r"peak_memory=([0-9.]+)", line)
                if p:
                    cur["peaks"].append(float(p.group(1)))
            elif line.startswith("[graph memory]"):
                cur["mem"].append(line.strip())
    return runs


def main():
    runs = parse(sys.argv[1:])
    models = []
    for m, _ in runs:
        if m not in models:
            models.append(m)
    print("| model | side | trials' peaks (GB) | mean | largest | mean / mlx-lm's mean | largest / mlx-lm's largest |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        ref = runs.get((m, "mlxlm"), {}).get("peaks") or None
        for (mm, side), r in runs.items():
            if mm != m or not r["peaks"]:
                continue
            p = r["peaks"]
            mean, top = sum(p) / len(p), max(p)
            if ref and side != "mlxlm":
                a = f"{mean / (sum(ref) / len(ref)):.3f}x"
                b = f"{top / max(ref):.3f}x"
            else:
                a = b = ""
            print(f"| {m} | {side} | {', '.join(f'{x:.3f}' for x in p)} | {mean:.3f} | {top:.3f} | {a} | {b} |")
    for (m, side), r in runs.items():
        for line in r["mem"]:
            print(f"{m} {side}: {line}")


if __name__ == "__main__":
    main()
