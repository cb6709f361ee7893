#!/bin/bash
# Session 39, the one call if only one comes (bundle from main with h26-chatkeep): setup; the
# device tests owed (the dense prompt, the trellis chat's kept decoder, the trellis follow rows
# with the seeded first-token check); the product bench (defaults) on the 8B and the 135M beside
# mlx_lm, one round; MLX_GRAPH_MV_STEAL=1's one-row step (thru on/steal).
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
PARTS="setup" MODELS="llama31-8b-q4 llama-135m-bf16 llama-135m-q4" BUDGET_S=200 TAG=setup bash .gpu/c/measure.sh
mkdir -p $OUT/s && mv $OUT/*.log $OUT/*.tgz $OUT/s/ 2>/dev/null
echo "== setup done at $SECONDS" | tee -a $OUT/s39.txt
PARTS=test TESTS="the_dense_prompt_follows_the_exact_prompt trellis_chat_keeps_its_decoder" TEST_S=100 \
  BUDGET_S=105 TAG=t bash .gpu/c/measure.sh
MLX_GRAPH_FOLLOW_ROWS=trellis3_b32,trellis3_hybrid_b64 PARTS=test TESTS=graph_decoder_follows_the_mlx_forward \
  TEST_S=75 BUDGET_S=80 TAG=t2 bash .gpu/c/measure.sh
grep -ah "dense prompt's\|test result\|panicked\|rc=\|^test \|turn" $OUT/graph_test.log | cut -c1-240 | tee -a $OUT/s39.txt
mkdir -p $OUT/t && mv $OUT/*.log $OUT/*.tgz $OUT/t/ 2>/dev/null
run() {  # NAME BUDGET_S SIDES MODELS ENV...
  local name=$1 budget=$2 sides=$3 models=$4; shift 4
  echo "== $name at ${SECONDS} s: $*" | tee -a $OUT/s39.txt
  mkdir -p $OUT/$name
  env "$@" OUT=$OUT/$name PARTS=bench BENCH_MODELS="$models" \
    BENCH_SIDES="$sides" BUDGET_S=$budget TAG=$name bash .gpu/c/measure.sh > /dev/null 2>&1
  tar xzf $OUT/$name/logs-$name.tgz -O ./bench.log 2> /dev/null \
    | grep '^== round\|"averages"\|Averages\|peak' | cut -c1-260 | tee -a $OUT/s39.txt
  tar xzf $OUT/$name/logs-$name.tgz -O ./copy_bw.log 2> /dev/null | tail -2 | tee -a $OUT/s39.txt
}
L=$((470 - SECONDS)); [ $L -gt 170 ] && L=170
run b $L "graph mlxlm" "llama31-8b-q4 llama-135m-bf16" ROUNDS=1
if [ $((575 - SECONDS)) -gt 125 ]; then
  PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="1" BREAKDOWN=20 THRU_SIDES="on steal" \
    BUDGET_S=$((575 - SECONDS)) TAG=thru bash .gpu/c/measure.sh > /dev/null 2>&1
  grep -h "==\|batched_throughput" $OUT/throughput.log | cut -c1-300 >> $OUT/s39.txt
fi
cd $OUT && tar czf all.tgz --exclude=all.tgz --exclude=s39.txt . && \
  find . -mindepth 1 ! -name all.tgz ! -name s39.txt -delete
echo s39c-done at $SECONDS | tee -a $OUT/s39.txt
