#!/bin/bash
# Session 38, issue #30's prefill row: the dense prompt linears (MLX_PREFILL_DENSE, branch
# h25-prefill) on one warm H100 or H200, under 400 s. /opt/models already holds both models;
# .gpu/c is `cargo xtask gpu pack`'s bundle of a build with h25-prefill (its `mlx`).
#   check  xtask/gpu/prefill_dense_check.py with MLX's Python on the 8B (mlx_lm's model, every
#          QuantizedLinear patched to the blocked dense product): logits and KV cache bit for
#          bit against the stock forward at 511 rows, each forward's time and MLX peak (also
#          under MLX_PREFILL_DENSE_HEADROOM_MB's limit); then every 8B linear at 2-2,048 rows,
#          which elements differ, and the time of each below 512 rows -> $OUT/check.jsonl;
#   off    MLX_PREFILL_DENSE=0: measure.sh part bench, `mlx benchmark --decoder auto` (the
#          graph decoder decodes; the prompt through MLX's forward) and `mlx_lm benchmark`,
#          prompt 512, 128 tokens, 3 trials, ROUNDS=2, on the Llama-3.1-8B-shaped 4-bit model
#          and the 135M bfloat16 one (no quantized linears: the switch changes nothing there);
#   on     MLX_PREFILL_DENSE=1 (blocks of 32 MiB, chunks of 256 rows or more): graph side only;
#   onh    the same with MLX_PREFILL_DENSE_HEADROOM_MB=1536 (MLX's memory limit = the active
#          memory at the prompt's start + 1.5 GiB through the prompt; mlx-lm's 8B prompt
#          peaked 1.8 GB above the weights in s37): speed against peak memory.
# Each bench run's measure.sh writes under its own $OUT/off, $OUT/on, $OUT/onh (logs-NAME.tgz
# holds bench.log with the JSON lines of prompt_tps and peak_memory, and copy_bw.log; parts.log
# beside it); every run's averages are gathered in $OUT/s38p.txt.
echo "== s38p check at ${SECONDS} s" | tee -a $OUT/s38p.txt
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
LD_LIBRARY_PATH="$SITE/mlx/lib" timeout 80 python3 xtask/gpu/prefill_dense_check.py \
  /opt/models/llama31-8b-q4 > $OUT/check.jsonl 2> $OUT/check.err
echo "check rc=$?" | tee -a $OUT/s38p.txt
grep '"part": "model"' $OUT/check.jsonl | tee -a $OUT/s38p.txt; tail -3 $OUT/check.err
run() {  # NAME BUDGET_S SIDES ENV...
  local name=$1 budget=$2 sides=$3; shift 3
  echo "== s38p $name at ${SECONDS} s: $*" | tee -a $OUT/s38p.txt
  mkdir -p $OUT/$name
  env "$@" OUT=$OUT/$name PARTS=bench BENCH_MODELS="llama31-8b-q4 llama-135m-bf16" \
    BENCH_SIDES="$sides" ROUNDS=2 BUDGET_S=$budget TAG=$name bash .gpu/c/measure.sh
  tar xzf $OUT/$name/logs-$name.tgz -O ./bench.log 2> /dev/null \
    | grep '^== round\|"averages"\|Averages' | cut -c1-200 | tee -a $OUT/s38p.txt
}
mkdir -p /tmp/tr; run off 140 "graph mlxlm" MLX_PREFILL_DENSE=0 MLX_GRAPH_TRACE=/tmp/tr/off-%p.txt
run on 80 "graph" MLX_PREFILL_DENSE=1
run onh 80 "graph" MLX_PREFILL_DENSE=1 MLX_PREFILL_DENSE_HEADROOM_MB=1536
echo "s38p-done at ${SECONDS} s" | tee -a $OUT/s38p.txt
