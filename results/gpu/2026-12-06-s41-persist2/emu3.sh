#!/bin/bash
# Session 41, the last emulator runs (after emu.sh, same TMPDIR): the trace check's mutation
# (the split barrier's arrival noted in the neighbouring block's slot: the check must fail, the
# bits stay), and more rows with the levers together (srs: q/k/v biases and a tied 4-bit head,
# q4:make_qwen2; llama3 RoPE, make_llama3; q/k norms, make_qwen3, not taken: the kernels).
#   MLX_ORACLE_VENV=/work/oracle-venv bash results/gpu/2026-12-06-s41-persist2/emu3.sh
set -u
cd "$(dirname "$0")/../../.."
R=results/gpu/2026-12-06-s41-persist2/emu
mkdir -p $R
PY=${MLX_ORACLE_VENV:-/work/oracle-venv}/bin/python
T=${TMPDIR:-/tmp}/s41emu
FIX="dense_bf16_mha"
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
run mut_trace $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_TRACE=1 GRAPH_EMU_PERSIST_MUTATE=trace
cmp off_attn mut_trace mut_trace
FIX="q4:make_qwen2 make_llama3 make_qwen3"
run off_more $A
run srs_more $A GRAPH_EMU_PERSIST=2 GRAPH_EMU_PERSIST_SPLIT=1 GRAPH_EMU_PERSIST_SMEM=1 GRAPH_EMU_PERSIST_TRACE=1
cmp off_more srs_more srs_more
