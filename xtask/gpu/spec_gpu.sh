#!/bin/bash
# Draft-model speculation on the GPU (issue #33's H200 row), after product_setup.sh on the same
# warm machine with the echo/succ models of bench_models.py written (MODELS), carrying .gpu/c:
# an 8B-shaped 4-bit target with a 135M-shaped bfloat16 draft whose acceptance is forced by the
# weights (echo: every draft accepted; succ + succ5: runs end before each multiple of 5; a
# random draft: none accepted). Per pair: the target and the draft decoding alone on the graph
# decoder (`mlx generate --decoder auto`, once a model), `mlx generate --draft-model` for each K
# of KS (on a CUDA build with both models on the graph decoder: speculation as a graph-decoder
# mode, drafts and verification as graph steps; its JSON's `decoder` says "graph"), SPEC_TOKENS
# tokens each, into spec.jsonl (with a hash of every token, so that spec_cost.py checks the
# speculative tokens against plain greedy graph decoding's); then spec_cost.py's table
# (measured time a token against the ideal model: one target pass a verification round plus
# one draft pass a drafted token, at the graph decoder's own plain step times).
# SPEC_DECODER=graph passes `--decoder graph` to the speculating runs (`auto` speculates on the
# graph decoder too since session 30, where both models qualify).
# MLX_GRAPH_SPEC_PROFILE=1 (or 2: also each round) in the environment puts each speculating
# run's per-part times (catch-up, drafts, verify, rest: graph_speculative.rs) in
# spec_profile.log; SPEC_TC=1 adds a `spectc` run a K with MLX_GRAPH_SPEC_TENSOR_CORES=1 (the
# target verifies on the tensor cores: measuring only, its tokens are L3); SPEC_SEQ=1 adds a
# `specseq` run a K with MLX_GRAPH_SPEC_OVERLAP=0 (the draft's catch-up step, session 30's way);
# SPEC_R4=1 a `specr4` run a K with MLX_GRAPH_SPEC_ROWS=4 (the verify kernels at 4 rows a warp).
# SPEC_MB2=1 a `specmb2` run a K with MLX_GRAPH_SPEC_MIN_BLOCKS=2 MLX_GRAPH_SPEC_CHUNKS=2 (the
# verify kernels held to 128 registers: two blocks, 16 warps, an SM where the inputs fit);
# SPEC_R4MB2=1 a `specr4mb2` run a K with that at 4 rows a warp, 1 chunk in flight.
# MLX_GRAPH_SPEC_BREAKDOWN=REPS in the environment: each speculating run first times the
# target's kernels a step with one row and with its K + 1 (graph_speculative.rs; medians of 3
# alternations, before the timed generation), into spec_profile.log too.
# SPEC_MLX=1 adds the MLX path's side as before (`--decoder mlx` alone and speculating, and
# mlx_lm generate's, unless SKIP_MLX_LM): run 12's rows. About 3 minutes on a warm H200 with the
# default pairs and SPEC_ROUNDS=1 (each run loads its models: the 8B's 4.5 GB, page-cached
# after the first; each new decoder shape is one NVRTC compile of ~7 s, cached on disk).
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
    toks = o.get("tokens", [])
    keep["tokens_head"] = toks[:12]
    keep["tokens_n"] = len(toks)
    keep["tokens_sha"] = __import__("hashlib").sha1(json.dumps(toks).encode()).hexdigest()[:16]
    print(json.dumps(keep))
' "$label" | tee -a $J
  { echo "## $label"; grep -v '^[[:space:]]*$' $OUT/spec_err.tmp | tail -6; } >> $OUT/spec_stderr.log
  # MLX_GRAPH_SPEC_PROFILE=1|2 in the environment: where the rounds' time went.
  # MLX_GRAPH_SPEC_BREAKDOWN=REPS: the target's kernels a step with 1 and with K + 1 rows.
  grep -h '^graph spec\|^\[graph verify breakdown\]' $OUT/spec_err.tmp | sed "s|^|$label: |" >> $OUT/spec_profile.log
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
declare -A seen
for pair in ${SPEC_PAIRS:-echo-llama31-8b-q4:echo-llama-135m-v128k-bf16:2,4,8 succ-llama31-8b-q4:succ5-llama-135m-v128k-bf16:4,8 echo-llama31-8b-q4:llama-135m-v128k-bf16:4}; do
  IFS=: read -r T D KL <<< "$pair"
  for r in $(seq ${SPEC_ROUNDS:-1}); do
    # Each model alone on the graph decoder, once a round (the table takes the fastest).
    for x in "graph-target $T" "graph-draft $D"; do
      set -- $x
      [ -n "${seen[$2 r$r]}" ] && continue
      seen[$2 r$r]=1
      one "$1 $2 r$r" $MLX generate --model $M/$2 --prompt "$PROMPT" --max-tokens $N --decoder auto
    done
    if [ -n "$SPEC_MLX" ]; then
      one "plain-target $T r$r" $MLX generate --model $M/$T --prompt "$PROMPT" --max-tokens $N --decoder mlx
      one "plain-draft $D r$r" $MLX generate --model $M/$D --prompt "$PROMPT" --max-tokens $N --decoder mlx
      [ -z "$SKIP_MLX_LM" ] && mlxlm "mlxlm-plain-target $T r$r" --model $M/$T
    fi
    for k in ${KL//,/ }; do
      one "spec $T $D k$k r$r" $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      # SPEC_SEQ=1: the same with the draft's catch-up step after a fully accepted round
      # instead of its extra step during verification (MLX_GRAPH_SPEC_OVERLAP=0), for A/B.
      [ -n "$SPEC_SEQ" ] && one "specseq $T $D k$k r$r" env MLX_GRAPH_SPEC_OVERLAP=0 $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      # SPEC_TC=1: the same with the target verifying on the tensor cores (K + 1 >= 4 rows).
      [ -n "$SPEC_TC" ] && one "spectc $T $D k$k r$r" env MLX_GRAPH_SPEC_TENSOR_CORES=1 $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      # SPEC_R4=1: the same with the target's verify kernels at 4 rows a warp (MLX_GRAPH_SPEC_ROWS=4:
      # each input value unpacked once for 4 rows; the rows' bits unchanged), for A/B.
      # SPEC_MB2=1: the verify kernels at 128 registers, 2 chunks in flight (two blocks an SM
      # where the inputs fit; results/gpu/2026-12-05-s32-rows), for A/B; the rows' bits unchanged.
      [ -n "$SPEC_MB2" ] && one "specmb2 $T $D k$k r$r" env MLX_GRAPH_SPEC_MIN_BLOCKS=2 MLX_GRAPH_SPEC_CHUNKS=2 $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      [ -n "$SPEC_R4MB2" ] && one "specr4mb2 $T $D k$k r$r" env MLX_GRAPH_SPEC_ROWS=4 MLX_GRAPH_SPEC_MIN_BLOCKS=2 MLX_GRAPH_SPEC_CHUNKS=1 $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      [ -n "$SPEC_R4" ] && one "specr4 $T $D k$k r$r" env MLX_GRAPH_SPEC_ROWS=4 $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --verbose true ${SPEC_DECODER:+--decoder $SPEC_DECODER}
      if [ -n "$SPEC_MLX" ]; then
        one "mlxspec $T $D k$k r$r" $MLX generate --model $M/$T --draft-model $M/$D --num-draft-tokens $k --prompt "$PROMPT" --max-tokens $N --decoder mlx
        [ -z "$SKIP_MLX_LM" ] && mlxlm "mlxlm-spec $T $D k$k r$r" --model $M/$T --draft-model $M/$D --num-draft-tokens $k
      fi
    done
  done
done
grep -h "decoder:" $OUT/spec_stderr.log | sort | uniq -c
python3 $C/spec_cost.py $J | tee $OUT/spec_table.md
echo spec-done
