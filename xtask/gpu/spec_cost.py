"""The draft-model speculation cost table of spec_gpu.sh (issue #33's H200 row).
    python3 spec_cost.py spec.jsonl
For each (target, draft, K): the measured decode time a token, 1 / generation_tps of
`mlx generate --draft-model`, against the ideal model: each verification round costs one target
pass and each drafted token one draft pass, both at the single-token step time of the same
model decoding alone on the same path (1 / generation_tps of `mlx generate --decoder mlx`,
the fastest of the rounds: a first run on a fresh machine pays MLX's JIT), so ideal = (rounds * t_target + drafted * t_draft) / tokens. The
issue's bound: measured within 15% of ideal. `one target pass per accepted run` alone
(rounds * t_target / tokens) is given beside it; mlx_lm generate's rate with the same draft and
K for comparison."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
plain = defaultdict(list)
graph = {}
spec = defaultdict(list)
ref = defaultdict(list)
ref_plain = defaultdict(list)
for r in rows:
    words = r["label"].split()
    kind = words[0]
    if r.get("generation_tps") is None:
        continue
    if kind in ("plain-target", "plain-draft"):
        plain[words[1]].append(r["generation_tps"])
    elif kind == "graph-target":
        graph[words[1]] = r["generation_tps"]
    elif kind == "spec":
        spec[(words[1], words[2], words[3])].append(r)
    elif kind == "mlxlm-spec":
        ref[(words[1], words[2], words[3])].append(r["generation_tps"])
    elif kind == "mlxlm-plain-target":
        ref_plain[words[1]].append(r["generation_tps"])

med = {m: max(v) for m, v in plain.items()}
print("| target | draft | K | tokens | rounds | drafted / accepted | ours tok/s | ideal tok/s "
      "| measured / ideal | target-only ideal tok/s | plain target tok/s (MLX path) "
      "| mlx_lm spec tok/s | mlx_lm plain tok/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for (t, d, k), runs in spec.items():
    if t not in med or d not in med:
        continue
    tt, td = 1 / med[t], 1 / med[d]
    for r in runs:
        n = r["generation_tokens"]
        rounds = r.get("verification_passes") or 0
        drafted = r.get("draft_tokens") or 0
        meas = 1 / r["generation_tps"]
        ideal = (rounds * tt + drafted * td) / n
        only = rounds * tt / n
        rs = ref.get((t, d, k))
        rp = ref_plain.get(t)
        print(f"| {t} | {d} | {k[1:]} | {n} | {rounds} | {drafted} / {r.get('accepted_draft_tokens')} "
              f"| {1 / meas:.1f} | {1 / ideal:.1f} | {meas / ideal:.3f} | {1 / only:.1f} "
              f"| {med[t]:.1f} | {statistics.median(rs) if rs else float('nan'):.1f} "
              f"| {statistics.median(rp) if rp else float('nan'):.1f} |")
print()
for m, v in sorted(med.items()):
    g = graph.get(m)
    print(f"- {m}: {v:.1f} tok/s alone on the MLX path (fastest of {len(plain[m])})"
          + (f", {g:.1f} on the graph decoder" if g else ""))
