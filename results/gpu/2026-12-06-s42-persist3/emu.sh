#!/bin/bash
# Session 42's layer loop (PS_LOOP: GRAPH_EMU_PERSIST_LOOP=1, MLX_GRAPH_PERSIST_LOOP=1 on the
# device) on the CPU emulator (xtask/gpu/graph_emulate.py), here, no GPU: whole steps' logits
# against the kernels' (the switches off), bit for bit (GRAPH_EMU_DUMP +
# xtask/gpu/dump_compare.py), three fixtures, grids of 4 and 7, with and without the trace (its
# slots and order checked: trace_in_order); then mutations that must be caught.
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s42-persist3/emu.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s42-persist3/emu
mkdir -p $R
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
FIX="dense_bf16_mha dense_bf16_untied q4:dense_bf16_untied"
T=${TMPDIR:-/tmp}/s42emu
mkdir -p $T
run() {  # tag, env...
  local tag=$1; shift
  rm -rf $T/$tag && mkdir -p $T/$tag
  env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_ASYNC=1 GRAPH_EMU_DUMP=$T/$tag "$@" \
    nice -n 15 $PY xtask/gpu/graph_emulate.py ${FIXS:-$FIX} > $R/$tag.log 2>&1
  echo "$tag rc=$?" | tee -a $R/$tag.log
  grep -h "persistent step" $R/$tag.log
}
cmp() {  # ref, new, out
  $PY xtask/gpu/dump_compare.py $T/$1 $T/$2 > $R/compare_$3.txt 2>&1
  echo "compare $1 $2 rc=$?" | tee -a $R/compare_$3.txt
  tail -2 $R/compare_$3.txt
}
A=GRAPH_EMU_ATTN_COMBINE=attention
L="GRAPH_EMU_PERSIST_LOOP=1"
[ -d $T/off_attn ] || run off_attn $A
# The layer loop with session 41's levers (=2, SPLIT, SMEM: srs), grid 4, no trace.
run srsl $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L
cmp off_attn srsl srsl
# The same, grid 7, with the trace (slots and order checked).
run srsl_g7_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn srsl_g7_trace srsl_g7_trace
# =1 (no split, the table in global memory), grid 4, with the trace.
run p1l_trace $A GRAPH_EMU_PERSIST=1 $L GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn p1l_trace p1l_trace
# Mutations (one fixture): a layer's last two row products swapped (deterministic: the bits
# differ), thread 0's barrier target not kept from phase to phase (its block leaves early: the
# trace's order check, grid 7).
FIXS=dense_bf16_mha run mut_loop_order $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_PERSIST_MUTATE=loop_order
cmp off_attn mut_loop_order mut_loop_order
FIXS=dense_bf16_mha run mut_loop_target $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_PERSIST_MUTATE=loop_target GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
# Other chunks in flight (MLX_GRAPH_PERSIST_CHUNKS=2, 1 and 6: GRAPH_EMU_BATCH) against the kernels
# at the default 4: the loads' count is not the sums' order.
run srsl_b2_g7_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_BATCH=2 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn srsl_b2_g7_trace srsl_b2_g7_trace
run srsl_b1 $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_BATCH=1
cmp off_attn srsl_b1 srsl_b1
run srsl_b6 $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 $L GRAPH_EMU_BATCH=6
cmp off_attn srsl_b6 srsl_b6
