#!/bin/bash
# Session 41, after the review (the lead): the trace's ORDER on the emulator. The host's
# timer (graph_decode.cu's gtime without __CUDA_ARCH__) is now a counter every read advances,
# and the emulator's trace check (trace_in_order in xtask/gpu/graph_emulate.py) asks each
# block's entry, arrival and departure a phase to come in the step's order (PS_SPLIT: the
# arrival, made at the end of the phase before, first), the end last, and no block to depart a
# barrier before every block has arrived. Two runs that must pass (=1, and =2 with SPLIT and
# SMEM, 7 blocks) and two mutations the check must catch (the waiters skipping the polls; the
# split arrival noted in the neighbouring block's slot).
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s41-persist2/emu4.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s41-persist2/emu
mkdir -p $R
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
T=${TMPDIR:-/tmp}/s41emu4
rm -rf $T && mkdir -p $T
FIX="dense_bf16_mha"
run() {  # tag, env...
  local tag=$1; shift
  mkdir -p $T/$tag
  env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_ASYNC=1 GRAPH_EMU_DUMP=$T/$tag "$@" \
    nice -n 15 $PY xtask/gpu/graph_emulate.py $FIX > $R/$tag.log 2>&1
  echo "$tag rc=$?" | tee -a $R/$tag.log
  grep -h "persistent step trace" $R/$tag.log
}
A=GRAPH_EMU_ATTN_COMBINE=attention
run order_p1_g7 $A GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_GRID=7
run order_srs_g7 $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_GRID=7
run order_mut_barrier $A GRAPH_EMU_PERSIST=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_MUTATE=barrier
run order_mut_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_MUTATE=trace
