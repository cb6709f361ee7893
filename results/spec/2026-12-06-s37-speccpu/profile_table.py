"""Per-part ms a pass of 1..N verify rows (`spec_bench --profile N` under MLX_CPU_PROFILE=1),
default kernels against MLX_CPU_LANE4=1, from profile-rows-2t.log (decode passes only)."""
import re, sys
cfg = None; rows = None; data = {}; skip = False; seen = {}
for line in open(sys.argv[1] if len(sys.argv) > 1 else "profile-rows-2t.log"):
    if line.startswith("=="):
        name = line.split()[1].rstrip(",")
        seen[name] = seen.get(name, 0) + 1
        cfg = (name, seen[name])
    m = re.match(r"cpu decoder profile: \d+ decode steps, ([\d.]+) rows a step", line)
    if m:
        rows = int(float(m.group(1))); skip = False
        continue
    if "prompt blocks" in line:
        skip = True
    m = re.match(r"cpu-profile (\w+)\s+([\d.]+) ms/step", line)
    if m and not skip and rows:
        data.setdefault((cfg, rows), {})[m.group(1)] = float(m.group(2))
parts = ["qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "elementwise"]
print("| kernels (round) | rows | " + " | ".join(parts) + " | pass (ms) | pass / 1-row pass |")
print("|---|---|" + "---|" * (len(parts) + 2))
for cfg in sorted({c for c, _ in data}, key=lambda c: (c[1], c[0])):
    one = sum(data.get((cfg, 1), {}).values())
    for r in range(1, 10):
        d = data.get((cfg, r))
        if not d:
            continue
        tot = sum(d.values())
        print(f"| {cfg[0]} ({cfg[1]}) | {r} | " + " | ".join(f"{d.get(p, 0):.2f}" for p in parts)
              + f" | {tot:.2f} | {tot / one:.2f} |")
