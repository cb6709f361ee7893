#!/bin/bash
# Device call 2 for issue #15's prefill/decode comparison (after setup.sh): for each model of
# MODELS, ROUNDS rounds of three processes in turn, each one warmup and TRIALS trials of a
# PROMPT-token prompt and GEN greedy tokens: mlx-lm's generate_step (bench_mlx_lm.py), ours
# uncompiled (`bench_generate --compiled off`) and ours compiled with the step kept across
# trials (`--compiled auto`); round 1 also runs ours with a compiled step made per trial
# (`--compiled percall`, as the bench did before). R1_MODES replaces the modes of every round
# (a mode `graph` runs `--decoder graph`). Round 1 adds `--step-timing 32` to ours and `--graph`
# (primitive counts of the prefill and decode graphs) to both sides. One
# JSON line per process goes to $OUT/ab.jsonl (summarise with `python3 xtask/gpu/ab_table.py`),
# the copy bandwidth to $OUT/copy_bandwidth.txt. Models are written by bench_models.py into
# /tmp/bench-models; a model is skipped once the call has run BUDGET_S seconds, a round after
# the first once it has run ROUND_BUDGET_S.
# Carry .gpu-gpu (a folder with b/ = libmlx half two, bench_generate, the oracle scripts, env.sh).
set -x
G=${G:-.gpu-gpu/b}
source "$G/env.sh"
python3 -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' || exit 1
MODELS=${MODELS:-"llama-135m-q4 llama-135m-bf16 llama-8b-q4"}
ROUNDS=${ROUNDS:-3}; TRIALS=${TRIALS:-3}; PROMPT=${PROMPT:-512}; GEN=${GEN:-128}
BUDGET_S=${BUDGET_S:-330}; ROUND_BUDGET_S=${ROUND_BUDGET_S:-500}
python3 - <<'PY' 2>&1 | tee "$OUT/copy_bandwidth.txt"
import time, mlx.core as mx
x = mx.random.normal((256 * 1024 * 1024,)).astype(mx.bfloat16)  # 512 MB
mx.eval(x)
ts = []
for _ in range(20):
    t = time.perf_counter(); y = mx.array(x * 1); mx.eval(y); ts.append(time.perf_counter() - t)
ts.sort(); t = ts[len(ts) // 2]
print(f"copy (x * 1, bf16, 512 MB read + 512 MB written): median {t * 1e3:.3f} ms = {2 * x.nbytes / t / 1e9:.0f} GB/s")
PY
xz -d -k -f "$G/bench_generate.xz" && chmod +x "$G/bench_generate"
for alt in "$G"/bench_generate_alt*.xz; do
  if [ -f "$alt" ]; then xz -d -k -f "$alt" && chmod +x "${alt%.xz}"; fi
done
COMMON="--dtype keep --prompt-len $PROMPT --gen-len $GEN --trials $TRIALS --device ${DEVICE:-gpu}"
for m in $MODELS; do
  if [ "$SECONDS" -gt "$BUDGET_S" ]; then echo "skip $m: ${SECONDS}s spent"; continue; fi
  python3 "$G/bench_models.py" /tmp/bench-models "$m" || continue
  M=/tmp/bench-models/$m
  for r in $(seq 1 "$ROUNDS"); do
    if [ "$r" -gt 1 ] && [ "$SECONDS" -gt "$ROUND_BUDGET_S" ]; then echo "skip $m round $r: ${SECONDS}s spent"; break; fi
    # The requested modes (R1_MODES) run in every round; without them round 1 runs
    # `off auto percall` and the later rounds `off auto`.
    EXTRA=""; MODES=${R1_MODES:-"off auto"}; PYEXTRA=""
    if [ "$r" = 1 ]; then EXTRA="--step-timing 32 --graph"; MODES=${R1_MODES:-"off auto percall"}; PYEXTRA="--graph"; fi
    # SKIP_MLX_LM=1: ours only (mlx-lm's figures from another run of the same kind).
    if [ "${SKIP_MLX_LM:-0}" != 1 ]; then
      { timeout 200 python3 "$G/bench_mlx_lm.py" --model "$M" $COMMON $PYEXTRA | sed "s/^{/{\"side\": \"mlx-lm\", \"name\": \"$m\", \"round\": $r, /"; } >> "$OUT/ab.jsonl" 2>> "$OUT/ab.err"
    fi
    for c in $MODES; do
      # `graph`: the graph decoder (bench_generate --decoder graph), without the MLX-only extras.
      # `graphplain`: the same without programmatic dependent launch (MLX_GRAPH_PDL=0);
      # `graph4`: four rows a warp in the matrix-vector products (MLX_GRAPH_ROWS=4);
      # `graphb8`: eight chunks a row in flight (MLX_GRAPH_BATCH=8); `graph1`: one
      # matrix-vector block a multiprocessor (MLX_GRAPH_BLOCKS=1); `graphalt`: the graph
      # decoder of another build, carried as bench_generate_alt.xz (two builds side by side;
      # `graphaltN`: more, bench_generate_altN.xz);
      # `grapheN`: N of the chunks in flight loaded before the wait (MLX_GRAPH_EARLY=N).
      # TRACE=1: every graph mode also writes one step's timeline to
      # $OUT/trace-MODEL-MODE.txt (--graph-trace; summarise with trace_summary.py).
      PDL=1; ROWS=2; BATCH=""; BLOCKS=""; EARLY=""; BIN="$G/bench_generate"
      # GRAPH_EXTRA: more flags for the graph modes (say `--graph-breakdown 20`).
      case "$c" in
        graph) FLAGS="--decoder graph $GRAPH_EXTRA" ;;
        graphplain) FLAGS="--decoder graph $GRAPH_EXTRA"; PDL=0 ;;
        graph4) FLAGS="--decoder graph $GRAPH_EXTRA"; ROWS=4 ;;
        graphb8) FLAGS="--decoder graph $GRAPH_EXTRA"; BATCH=8 ;;
        graph1) FLAGS="--decoder graph $GRAPH_EXTRA"; BLOCKS=1 ;;
        graphalt|graphalt[0-9]) FLAGS="--decoder graph $GRAPH_EXTRA"; BIN="$G/bench_generate_${c#graph}" ;;
        graphe[1-8]) FLAGS="--decoder graph $GRAPH_EXTRA"; EARLY=${c#graphe} ;;
        *) FLAGS="--compiled $c $EXTRA" ;;
      esac
      case "$c" in graph*) [ "${TRACE:-0}" = 1 ] && FLAGS="$FLAGS --graph-trace $OUT/trace-$m-$c.txt" ;; esac
      { env MLX_GRAPH_PDL=$PDL MLX_GRAPH_ROWS=$ROWS ${BATCH:+MLX_GRAPH_BATCH=$BATCH} ${BLOCKS:+MLX_GRAPH_BLOCKS=$BLOCKS} ${EARLY:+MLX_GRAPH_EARLY=$EARLY} timeout 200 "$BIN" --model "$M" $COMMON $FLAGS | sed "s/^{/{\"side\": \"ours-$c\", \"name\": \"$m\", \"round\": $r, /"; } >> "$OUT/ab.jsonl" 2>> "$OUT/ab.err"
    done
    echo "$m round $r done at ${SECONDS}s"
  done
done
du -b /tmp/bench-models/*/model.safetensors | tee "$OUT/sizes.txt"
wc -l "$OUT/ab.jsonl"; tail -5 "$OUT/ab.err"
nvidia-smi --query-gpu=name,driver_version --format=csv
