#!/bin/bash
# Session 41, more emulator runs (after emu.sh, whose kernels' dumps it compares against: run it
# first, with the same TMPDIR): the table in shared memory (GRAPH_EMU_PERSIST_SMEM=1:
# MLX_GRAPH_PERSIST_SMEM=1) with the split release/acquire barrier, both attention combines;
# with 6 chunks in flight and before the wait (GRAPH_EMU_BATCH=6: MLX_GRAPH_PERSIST_CHUNKS=6 on
# the device) against the kernels at the default 4; the same at grid 7 with the trace.
# MLX_GRAPH_PERSIST_MIN_BLOCKS is the device's (a launch bound, no emulator effect) and
# MLX_GRAPH_PERSIST_BLOCKS the grid (GRID 7 here).
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s41-persist2/emu2.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s41-persist2/emu
mkdir -p $R
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
FIX="dense_bf16_mha dense_bf16_untied q4:dense_bf16_untied"
T=${TMPDIR:-/tmp}/s41emu
run() {  # tag, env...
  local tag=$1; shift
  rm -rf $T/$tag && mkdir -p $T/$tag
  env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_ASYNC=1 GRAPH_EMU_DUMP=$T/$tag "$@" \
    nice -n 15 $PY xtask/gpu/graph_emulate.py $FIX > $R/$tag.log 2>&1
  echo "$tag rc=$?" | tee -a $R/$tag.log
}
cmp() {  # ref, new, out
  $PY xtask/gpu/dump_compare.py $T/$1 $T/$2 > $R/compare_$3.txt 2>&1
  echo "compare $1 $2 rc=$?" | tee -a $R/compare_$3.txt
}
A=GRAPH_EMU_ATTN_COMBINE=attention
run srs $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1
cmp off_attn srs srs
run srs_out GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1
cmp off_out srs_out srs_out
run srs_b6_g7_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 GRAPH_EMU_BATCH=6 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn srs_b6_g7_trace srs_b6_g7_trace
run p1_smem $A GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_SMEM=1
cmp off_attn p1_smem p1_smem
run sr_b6 $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_BATCH=6
cmp off_attn sr_b6 sr_b6
run sr_b6_g7_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_BATCH=6 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn sr_b6_g7_trace sr_b6_g7_trace
