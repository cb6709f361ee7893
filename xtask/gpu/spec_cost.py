"""The draft-model speculation cost table of spec_gpu.sh (issue #33's H200 row).
    python3 spec_cost.py spec.jsonl
For each (target, draft, K): the measured decode time a token, 1 / generation_tps of
`mlx generate --draft-model` (label `spec`: the graph decoder's speculation where both models
qualify; `mlxspec`: `--decoder mlx`, the MLX path's), against the ideal model: each
verification round costs one target pass and each drafted token one draft pass, both at the
single-token step time of the same model decoding alone (1 / generation_tps, the fastest run:
`graph-target`/`graph-draft` on the graph decoder for `spec` rows, `plain-target`/`plain-draft`
on the MLX path for `mlxspec` rows), so ideal = (rounds * t_target + drafted * t_draft) /
tokens. The issue's bound: measured within 15% of ideal (measured / ideal <= 1.15). `one
target pass per accepted run` alone (rounds * t_target / tokens) is given beside it. `same
tokens`: whether the run's tokens (all of them, hashed) equal the target's plain greedy run on
the graph decoder (`graph-target`); mlx_lm generate's rate with the same draft and K for
comparison where it ran. `spectc` rows (spec_gpu.sh's SPEC_TC=1): the graph decoder's speculation
with the target verifying on the tensor cores (MLX_GRAPH_SPEC_TENSOR_CORES=1; not in the worst
ratio: a measurement of what those tiles would save); `specseq` rows (SPEC_SEQ=1): with
MLX_GRAPH_SPEC_OVERLAP=0, the draft's catch-up step after a fully accepted round instead of its
extra step during verification (A/B against `spec`); `specr4` rows (SPEC_R4=1): the target's
verify kernels at 4 rows a warp (MLX_GRAPH_SPEC_ROWS=4; the rows' bits unchanged, A/B against
`spec`); `specmb2` rows (SPEC_MB2=1): the verify kernels at 128 registers and 2 chunks in
flight (MLX_GRAPH_SPEC_MIN_BLOCKS=2 MLX_GRAPH_SPEC_CHUNKS=2: two blocks an SM where the inputs
fit; the rows' bits unchanged, A/B against `spec`); `specr4mb2` rows (SPEC_R4MB2=1): the same at
4 rows a warp and 1 chunk in flight; `specring` rows (SPEC_RING=1,
older logs): with the FFMA row kernels' cp.async ring (MLX_GRAPH_MV_RING=1, since removed:
measured slower), their ideal from the models alone with it
(`graphring-target`/`graphring-draft`), `same tokens` against `graph-target` without it (not in
the worst ratio: an A/B against `spec`)."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
tps = {"graph": defaultdict(list), "mlx": defaultdict(list), "graphring": defaultdict(list)}
plain_tokens = {}
spec = defaultdict(list)
ref = defaultdict(list)
ref_plain = defaultdict(list)
for r in rows:
    words = r["label"].split()
    kind = words[0]
    if r.get("generation_tps") is None:
        continue
    if kind in ("plain-target", "plain-draft"):
        tps["mlx"][words[1]].append(r["generation_tps"])
    elif kind in ("graph-target", "graph-draft"):
        tps["graph"][words[1]].append(r["generation_tps"])
        if kind == "graph-target":
            plain_tokens[words[1]] = r.get("tokens_sha")
    elif kind in ("graphring-target", "graphring-draft"):
        tps["graphring"][words[1]].append(r["generation_tps"])
    elif kind in ("spec", "mlxspec", "spectc", "specseq", "specr4", "specmb2", "specr4mb2", "specring"):
        spec[(kind, words[1], words[2], words[3])].append(r)
    elif kind == "mlxlm-spec":
        ref[(words[1], words[2], words[3])].append(r["generation_tps"])
    elif kind == "mlxlm-plain-target":
        ref_plain[words[1]].append(r["generation_tps"])

best = {side: {m: max(v) for m, v in d.items()} for side, d in tps.items()}
print("| side | target | draft | K | decoder | tokens | rounds | drafted / accepted | ours tok/s "
      "| ideal tok/s | measured / ideal | target-only ideal tok/s | plain target tok/s "
      "| same tokens as plain graph | mlx_lm spec tok/s | mlx_lm plain tok/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
worst = None
for (kind, t, d, k), runs in spec.items():
    side = "mlx" if kind == "mlxspec" else "graphring" if kind == "specring" else "graph"
    med = best[side]
    if t not in med or d not in med:
        print(f"| {kind} | {t} | {d} | {k[1:]} | missing plain runs of {t} or {d} on the {side} side |")
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
        same = plain_tokens.get(t)
        same = "?" if same is None or r.get("tokens_sha") is None else ("yes" if same == r["tokens_sha"] else "NO")
        if kind == "spec":
            worst = max(worst or 0, meas / ideal)
        print(f"| {kind} | {t} | {d} | {k[1:]} | {r.get('decoder')} | {n} | {rounds} "
              f"| {drafted} / {r.get('accepted_draft_tokens')} "
              f"| {1 / meas:.1f} | {1 / ideal:.1f} | {meas / ideal:.3f} | {1 / only:.1f} "
              f"| {med[t]:.1f} | {same} | {statistics.median(rs) if rs else float('nan'):.1f} "
              f"| {statistics.median(rp) if rp else float('nan'):.1f} |")
print()
for side, d in best.items():
    for m, v in sorted(d.items()):
        where = {"graph": "graph decoder", "graphring": "graph decoder with MLX_GRAPH_MV_RING=1",
                 "mlx": "MLX path"}[side]
        print(f"- {m}: {v:.1f} tok/s alone on the {where} "
              f"(fastest of {len(tps[side][m])})")
if worst is not None:
    print(f"\nworst graph-speculation measured / ideal: {worst:.3f} (the issue's bound: 1.15)")
