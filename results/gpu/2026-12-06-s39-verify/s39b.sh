#!/bin/bash
# Session 39 (engineer verify), second call (optional, after s39.sh, the same warm H100): 4 rows
# a warp (MLX_GRAPH_BATCH_MV_ROWS=4, GraphOptions::rows_per_warp; bit-neutral) without and with
# MLX_GRAPH_MV_NB=1, rows 5 and 8 with the FFMA tiles at every width; the cost model's best
# build (cost_model.txt: 5-row step 5.46 ms predicted against 6.16 for MV_NB alone). ~2 x 80 s.
PARTS="thru" THRU_MODELS=llama31-8b-q4 ROWS="5 8" BREAKDOWN=${BREAKDOWN:-10} THRU_SIDES="ffma4 nb4" \
  THRU_S=120 BUDGET_S=250 TAG=thru4 bash .gpu/c/measure.sh
mkdir -p $OUT/c && mv $OUT/*.log $OUT/*.tgz $OUT/c/ 2>/dev/null
echo s39b-done at $SECONDS
