#!/bin/bash
# Session 41's persistent step on the CPU emulator (xtask/gpu/graph_emulate.py), here, no GPU:
# whole steps' logits of each lever (and the trace) against the kernels (the switches off), bit
# for bit (GRAPH_EMU_DUMP + xtask/gpu/dump_compare.py); the attention combined by attention's
# last block (the device's default) and by the output projection; grids of 4 and 7 blocks; then
# mutations the comparison must catch.
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s41-persist2/emu.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s41-persist2/emu
mkdir -p $R
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
FIX="dense_bf16_mha dense_bf16_untied q4:dense_bf16_untied"
T=${TMPDIR:-/tmp}/s41emu
rm -rf $T && mkdir -p $T
run() {  # tag, env...
  local tag=$1; shift
  mkdir -p $T/$tag
  env GRAPH_EMU_SKIP_SAMPLER=1 GRAPH_EMU_MV_ASYNC=1 GRAPH_EMU_DUMP=$T/$tag "$@" \
    nice -n 15 $PY xtask/gpu/graph_emulate.py $FIX > $R/$tag.log 2>&1
  echo "$tag rc=$?" | tee -a $R/$tag.log
}
cmp() {  # ref, new, out
  $PY xtask/gpu/dump_compare.py $T/$1 $T/$2 > $R/compare_$3.txt 2>&1
  echo "compare $1 $2 rc=$?" | tee -a $R/compare_$3.txt
}
A=GRAPH_EMU_ATTN_COMBINE=attention
P=GRAPH_EMU_PERSIST
run off_attn $A
# Session 40's step with the trace (PS_TRACE): the trace checked, the bits the kernels'.
run p1_trace $A $P=1 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn p1_trace p1_trace
# The split barrier (PS_SPLIT), with and without the trace, grids 4 and 7.
run split $A $P=1 GRAPH_EMU_PERSIST_SPLIT=1
cmp off_attn split split
run split_trace_g7 $A $P=1 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_GRID=7
cmp off_attn split_trace_g7 split_trace_g7
# The split barrier by release/acquire with relaxed polls (PS_BARRIER_RA, PS_POLL_RELAXED).
run sra $A $P=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_POLL=1
cmp off_attn sra sra
run sra_g7_trace $A $P=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_POLL=1 GRAPH_EMU_PERSIST_GRID=7 GRAPH_EMU_PERSIST_TRACE=1
cmp off_attn sra_g7_trace sra_g7_trace
# Relaxed polls without the split (session 40's barrier otherwise).
run poll $A $P=1 GRAPH_EMU_PERSIST_POLL=1
cmp off_attn poll poll
# The attention combined by the output projection (matvec_attn_out phases).
run off_out
run sra_out $P=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_POLL=1
cmp off_out sra_out sra_out
# Mutations: the split barrier's waiters pass without waiting; one phase dropped.
run mut_barrier_split $A $P=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_POLL=1 GRAPH_EMU_PERSIST_MUTATE=barrier
cmp off_attn mut_barrier_split mut_barrier_split
run mut_skip_split $A $P=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_POLL=1 GRAPH_EMU_PERSIST_MUTATE=skip
cmp off_attn mut_skip_split mut_skip_split
