#!/bin/bash
# Draft-model speculation on the GPU (issue #33's H200 row), after product_setup.sh on the same
# warm machine with the echo/succ models of bench_models.py written (MODELS), carrying .gpu/c:
# an 8B-shaped 4-bit target with a 135M-shaped bfloat16 draft whose acceptance is forced by the
# weights (echo: every draft accepted; succ + succ5: runs end before each multiple of 5; a
# random draft: none accepted). Per pair: the target and the draft decoding alone on the MLX path
# (`mlx generate --decoder mlx`, the path speculation runs on), `mlx generate --draft-model` for
# each K of KS, and `mlx_lm generate --draft-model` for the same K, SPEC_TOKENS tokens each, into
# spec.jsonl; then spec_cost.py's table (measured time a token against the ideal model: one
# target pass a verification round plus one draft pass a drafted token).
set -x
C=.gpu/c
export PYTHONUNBUFFERED=1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH="$SITE/mlx/lib"
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
if [ -z "$MLX" ]; then
  mkdir -p /opt/bin && [ -x /opt/bin/mlx ] || { xz -dc $C/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx; }
  MLX=/opt/bin/mlx
fi
M=${MODELS_DIR:-/opt/models}
N=${SPEC_TOKENS:-256}
PROMPT="Count with me"
J=$OUT/spec.jsonl
one() {  # LABEL COMMAND...: the JSON line `mlx generate --json` prints, labelled
  local label=$1; shift
  timeout ${SPEC_S:-120} "$@" --json 2> $OUT/spec_err.tmp | python3 -c '
import json, sys
label = sys.argv[1]
for line in sys.stdin:
    try:
        o = json.loads(line)
    except ValueError:
        continue
    keep = {k: o.get(k) for k in ("generation_tokens", "generation_tps", "prompt_tps", "peak_memory_bytes", "decoder", "draft_tokens", "accepted_draft_tokens", "verification_passes")}
    keep["label"] = label
    keep["tokens_head"] = o.get("tokens", [])[:12]
    print(json.dumps(keep))
' "$label" | tee -a $J
  tail -2 $OUT/spec_err.tmp >> $OUT/spec_stderr.log
}
mlxlm() {  # LABEL ARGS...: mlx_lm generate's figures as a JSON line
  local label=$1; shift
  timeout ${SPEC_S:-120} python3 -m mlx_lm generate "$@" --prompt "$PROMPT" --max-tokens $N --verbose True 2>&1 | python3 -c '
import json, re, sys
label = sys.argv[1]
t = sys.stdin.read()
g = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", t)
p = re.search(r"Peak memory: ([\d.]+) GB", t)
print(json.dumps({"label": label, "generation_tokens": int(g.group(1)) if g else None,
  "generation_tps": float(g.group(2)) if g else None, "peak_memory_gb": float(p.group(1)) if p else None,
  "tail": t[-300:] if not g else ""}))
' "$label" | tee -a $J
}
# TARGET:DRAFT:K,K,...: with K + 1 a multiple of 5 every succ5 draft is accepted (the broken
# token is always the target's own); K = 6 accepts 4 of 6, K = 8 4 of 8.
for pair in ${SPEC_PAIRS:-echo-llama31-8b-q4:echo-llama-135m-v128k-bf16:2,4,8 succ-llama31-8b-q4:succ5-llama-135m-v128k-bf16:6,8 echo-llama31-8b-q4:llama-135m-v128k-bf16:4}; do
  IFS=: read -r T D KL <<< "$pair"
  # SPEC_ROUNDS rounds for a pair of three K or more (the echo pair), one for the others.
  rounds=${SPEC_ROUNDS:-2}; [ "$KL" != "${KL#*,*,}" ] || rounds=1
  for r in $(seq $rounds); do
    one "plain-target $T r$r" $MLX generate --model $M/$T --prompt "$PROMPT" --max-tokens $N --decoder mlx
    one "plain-draft $D r$r" $MLX generate --model $M/$D --prompt "$PROMPT" --max-tokens $N --decoder mlx
    [ -z "$SKIP_MLX_LM" ] && mlxlm "mlxlm-plain-target $T r$r" --model $M/$T
    [ $r = 1 ] && one "graph-target $T r$r" $MLX generate --model $M/$T --prompt "$PROMPT" --max-tokens $N --decoder auto
    for k in ${KL//,/ }; do
      one "spec $T $D k$k r$r" $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N
      [ -z "$SKIP_MLX_LM" ] && mlxlm "mlxlm-spec $T $D k$k r$r" --model $M/$T --draft-model $M/$D --num-draft-tokens $k
    done
  done
done
python3 $C/spec_cost.py $J | tee $OUT/spec_table.md
echo spec-done
