#!/bin/bash
# Session 51's second call, on the machine pick.sh warmed (its setup wrote /opt/models'
# llama31-8b-q4): the standing rows of #30 and #33/#34 on this card with today's defaults
# (MLX_GRAPH_MV_BITS on, the late norm's level 1), each part skipped when its time is gone:
#   run(carry=[".gpu/a", ".gpu/c"], command="bash .gpu/c/s51b.sh", timeout_s=590)
# 1. serve: `mlx serve` (the graph decoder), one client, 16 and 16 streaming clients, 128
#    tokens each (s50serve.sh's part).
# 2. spec: the draft-model row (succ 8B-shaped 4-bit target, succ5 135M-shaped bf16 draft,
#    K 4: runs end before each multiple of 5), measured cost a token against the ideal model.
# 3. trellis: the 8B's trellis-3 twin (L 8, blocks of 32, random codes) against its affine-4
#    model, `mlx benchmark --decoder auto`, one round.
# Output: $OUT/s51b.txt and $OUT/all.tgz.
export MLXS_GPURT_CACHE=/tmp/gpurt-cache
T0=$SECONDS
S=$OUT/s51b.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $S
[ -d /opt/models/llama31-8b-q4 ] || MODELS=llama31-8b-q4 WARM=" " PARTS=setup BUDGET_S=150 \
  TAG=setup0 bash .gpu/c/measure.sh > /dev/null 2>&1
mkdir -p $OUT/v
OUT=$OUT/v PARTS=serve SERVE_SIDES=graph SERVE_CLIENTS=1,16,16 MAX_BATCH=16 BUDGET_S=200 \
  TAG=serve bash .gpu/c/measure.sh >> $S 2>&1
echo "== serve done at $((SECONDS - T0)) s" | tee -a $S
mkdir -p $OUT/p
MODELS="succ-llama31-8b-q4 succ5-llama-135m-v128k-bf16" WARM=" " PARTS=setup \
  BUDGET_S=$((360 - SECONDS + T0)) TAG=setup OUT=$OUT/p bash .gpu/c/measure.sh > /dev/null 2>&1
echo "== spec setup at $((SECONDS - T0)) s" | tee -a $S
OUT=$OUT/p PARTS=spec SPEC_PAIRS="succ-llama31-8b-q4:succ5-llama-135m-v128k-bf16:4" \
  BUDGET_S=$((430 - SECONDS + T0)) TAG=spec bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "succ" $OUT/p/spec_table.md 2>/dev/null | tee -a $S
echo "== spec done at $((SECONDS - T0)) s" | tee -a $S
mkdir -p $OUT/t
OUT=$OUT/t PARTS=trellis TRELLIS_MODELS=llama31-8b-q4 TRELLIS_DECODERS=auto TRELLIS_ROUNDS=1 \
  TRELLIS_NEED=100 BUDGET_S=$((575 - SECONDS + T0)) TAG=trellis bash .gpu/c/measure.sh > /dev/null 2>&1
grep -h "== trellis round\|averages\|Averages\|decoder" $OUT/t/trellis.log 2>/dev/null | cut -c1-240 | tee -a $S
echo "== done at $((SECONDS - T0)) s" | tee -a $S
cd $OUT && tar czf /tmp/all.tgz --exclude=s51b.txt . && mv /tmp/all.tgz $OUT/all.tgz && \
  find . -mindepth 1 ! -name all.tgz ! -name s51b.txt -delete
